#include "baton/kvstore/hit_policy.h"

#include <algorithm>

namespace baton::kvstore {

int64_t HitBlocks(const HitPolicyInput& in, const ChainLookup& lookup) {
  if (!in.truncation_on || in.block_size <= 0) return 0;
  const int64_t reserve = in.cap == HitCap::kRing ? in.ring_capacity : in.keep;
  const int64_t cap = std::max<int64_t>(0, in.prompt_len - reserve) / in.block_size;
  int64_t h = std::min(lookup.block_kv_blocks, cap);
  while (h > 0) {
    const int64_t first_needed =
        std::max<int64_t>(0, h * in.block_size - in.window + 1) / in.block_size;
    bool qualified = true;
    for (int64_t b = first_needed; b < h; ++b) {
      qualified =
          qualified && b < static_cast<int64_t>(lookup.swa_present.size()) && lookup.swa_present[b];
    }
    if (qualified) break;
    --h;
  }
  return h;
}

}  // namespace baton::kvstore
