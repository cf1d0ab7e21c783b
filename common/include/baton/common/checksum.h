// Checksums (XXH3-64) of StateBlock regions (DESIGN section 4) and prefix-store values. A
// mismatch after a transfer fails that request cleanly.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>

namespace baton {

uint64_t Checksum(const void* data, uint64_t size);

// The checksum of several buffers taken back to back (block-KV pages).
uint64_t ChecksumPieces(std::span<const void* const> pieces, uint64_t piece_size,
                        uint64_t total_size);

// The checksum of byte strings taken back to back (a prefix-store value with its key).
uint64_t ChecksumParts(std::initializer_list<std::string_view> parts);

}  // namespace baton
