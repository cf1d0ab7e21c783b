// The router's prefix-hit policy (DESIGN section 5, steps 1 to 4), as a pure function so that
// serving and `batonctl simulate` run the same code.
#pragma once

#include <cstdint>

#include "baton/kvstore/prefix_index.h"

namespace baton::kvstore {

// ring: at most floor((L - C) / B) blocks (the documented L - 134 cap, block aligned);
// keep: floor((L - K) / B), so that a hit never reaches into the retained region.
enum class HitCap { kRing, kKeep };

struct HitPolicyInput {
  int64_t prompt_len = 0;      // L
  int64_t keep = 0;            // K of the effective truncation
  bool truncation_on = false;  // off (or prompt logprobs): no consumer SWA before H, no hit
  int64_t ring_capacity = 0;   // C
  int64_t window = 0;          // W
  int64_t block_size = 0;      // B
  HitCap cap = HitCap::kRing;
};

// h, the number of leading blocks to load: present block KV, capped, and qualified by the
// producer SWA rows of positions [max(0, hB - W + 1), hB), backing off one block at a time.
// H = h * B tokens are cached and s_valid = H.
int64_t HitBlocks(const HitPolicyInput& input, const ChainLookup& lookup);

}  // namespace baton::kvstore
