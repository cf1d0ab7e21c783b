// The router's prefix-hit policy (DESIGN section 5, steps 1 to 4) and the prefill node's store
// reads and write-back around it, as pure functions so that serving and `batonctl simulate` run
// the same code.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "baton/kvstore/prefix_index.h"

namespace baton::kvstore {

// ring: at most floor((L - C) / B) blocks (the documented L - 134 cap, block aligned);
// keep: floor((L - K) / B), so that a hit never reaches into the retained region;
// none: what a hit could be without a cap, floor((L - 1) / B) (the last prompt token is always
// computed, its logits give the first token), which `batonctl simulate` reports beside the cap.
enum class HitCap { kRing, kKeep, kNone };
absl::string_view HitCapName(HitCap cap);  // "ring", "keep", "none"
// The caps a deployment may choose, "ring" and "keep"; the error names `field`.
absl::StatusOr<HitCap> ParseHitCap(absl::string_view text, absl::string_view field);

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

// The store reads of a hit of h blocks, each of which touches its block: block KV of [0, h),
// then producer SWA of [FirstProducerBlock(hB, W, B), h).
struct HitReads {
  int64_t block_kv_end = 0;
  int64_t producer_swa_begin = 0;
  int64_t producer_swa_end = 0;
};
HitReads ReadsForHit(int64_t hit_blocks, int64_t window, int64_t block_size);

// The write-back of a prefill that loaded h of its prompt's n full blocks: blocks [h, n), each
// block KV then producer SWA, with the block before it as its chain parent (-1: none).
struct WriteBackStep {
  int64_t block = 0;
  int64_t parent = -1;
  Region region = Region::kBlockKv;
};
std::vector<WriteBackStep> WriteBackSteps(int64_t hit_blocks, int64_t full_blocks);

}  // namespace baton::kvstore
