#include "baton/common/checksum.h"

#include <xxhash.h>

#include <algorithm>

namespace baton {

uint64_t Checksum(const void* data, uint64_t size) {
  return XXH3_64bits(data, size);
}

uint64_t ChecksumPieces(std::span<const void* const> pieces, uint64_t piece_size,
                        uint64_t total_size) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  uint64_t left = total_size;
  for (const void* piece : pieces) {
    const uint64_t n = std::min(left, piece_size);
    XXH3_64bits_update(state, piece, n);
    left -= n;
    if (left == 0) break;
  }
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

uint64_t ChecksumParts(std::initializer_list<std::string_view> parts) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (std::string_view part : parts) XXH3_64bits_update(state, part.data(), part.size());
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

}  // namespace baton
