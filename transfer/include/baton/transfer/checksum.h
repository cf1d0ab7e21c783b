// Region checksums for StateBlocks (DESIGN section 4): XXH3-64 over a region's bytes. A
// mismatch after a transfer fails that request cleanly.
#pragma once

#include <cstdint>
#include <span>

namespace baton::transfer {

uint64_t Checksum(const void* data, uint64_t size);

// The checksum of several buffers taken back to back (block-KV pages).
uint64_t ChecksumPieces(std::span<const void* const> pieces, uint64_t piece_size,
                        uint64_t total_size);

}  // namespace baton::transfer
