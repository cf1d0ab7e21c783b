#include "baton/kvstore/hit_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "baton/common/ced_rules.h"

namespace baton::kvstore {

absl::string_view HitCapName(HitCap cap) {
  switch (cap) {
    case HitCap::kRing:
      return "ring";
    case HitCap::kKeep:
      return "keep";
    case HitCap::kNone:
      return "none";
  }
  return "unknown";
}

absl::StatusOr<HitCap> ParseHitCap(absl::string_view text, absl::string_view field) {
  for (HitCap cap : {HitCap::kRing, HitCap::kKeep}) {
    if (text == HitCapName(cap)) return cap;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": '", text, "' is unknown; allowed: ring, keep"));
}

int64_t HitBlocks(const HitPolicyInput& in, const ChainLookup& lookup) {
  if (!in.truncation_on || in.block_size <= 0) return 0;
  const int64_t reserve = in.cap == HitCap::kRing   ? in.ring_capacity
                          : in.cap == HitCap::kKeep ? in.keep
                                                    : 1;
  const int64_t cap = std::max<int64_t>(0, in.prompt_len - reserve) / in.block_size;
  int64_t h = std::min(lookup.block_kv_blocks, cap);
  while (h > 0) {
    const int64_t first_needed = FirstProducerBlock(h * in.block_size, in.window, in.block_size);
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

HitReads ReadsForHit(int64_t hit_blocks, int64_t window, int64_t block_size) {
  if (hit_blocks <= 0) return {};
  return {.block_kv_end = hit_blocks,
          .producer_swa_begin = FirstProducerBlock(hit_blocks * block_size, window, block_size),
          .producer_swa_end = hit_blocks};
}

std::vector<WriteBackStep> WriteBackSteps(int64_t hit_blocks, int64_t full_blocks) {
  std::vector<WriteBackStep> steps;
  for (int64_t b = std::max<int64_t>(0, hit_blocks); b < full_blocks; ++b) {
    steps.push_back({.block = b, .parent = b - 1, .region = Region::kBlockKv});
    steps.push_back({.block = b, .parent = b - 1, .region = Region::kProducerSwa});
  }
  return steps;
}

}  // namespace baton::kvstore
