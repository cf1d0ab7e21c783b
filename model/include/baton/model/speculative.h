// Speculative decoding's host side (docs/architecture.md, "Speculative decoding"): proposing
// tokens by prompt lookup, and verifying drafted tokens against the target's logits of one
// decode step so that the output is the target's. Greedy requests keep the longest prefix of the
// draft that the target's argmax agrees with; sampled requests use speculative rejection
// sampling (Leviathan et al. 2023, Chen et al. 2023), whose output has exactly the target's
// distribution. For a point-mass draft (prompt lookup) the rule is carried out with the
// position's ordinary draw, so the tokens are those of a run without speculation; for a draft
// model's q they have the same law but not the same draws. Every random number is a
// SamplingUniform of (seed, step, stream).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "baton/model/sampling.h"

namespace baton::model {

// Prompt lookup (vLLM's n-gram drafter, `prompt_lookup_min`/`max`): the tokens that followed
// the latest earlier occurrence of the context's last n tokens, for the largest n in
// [min_n, max_n] that has one; at most `max_tokens`, none when nothing matches. O(context x
// max_n) per call.
std::vector<int32_t> ProposeByLookup(std::span<const int32_t> context, int64_t max_tokens,
                                     int64_t min_n, int64_t max_n);

// The outcome of verifying k drafted tokens: the first `accepted` drafts and then one token of
// the target's own (the correction at the first rejection, or the bonus after k acceptances),
// `accepted + 1` tokens in all, each with its log-probability under the target's logits.
struct Verdict {
  int64_t accepted = 0;
  std::vector<SampledToken> tokens;
};

// Verifies `draft` (k tokens) against `logits` ([k + 1, V]: row i is the target's distribution
// of the token after draft[i - 1], row 0 the one after the step's input token). `draft_weights`
// holds the draft's distribution each draft token was drawn from (k entries, KeepTokens of the
// draft model's logits under the same params), or is empty for a deterministic drafter (a point
// mass on each token, as prompt lookup's, verified with the ordinary draws). `step` is the
// completion index of the first token the verdict emits.
Verdict VerifyDraft(std::span<const float> logits, std::span<const int32_t> draft,
                    std::span<const KeptWeights> draft_weights, const SamplingParams& params,
                    uint64_t step);

// The streams of SamplingUniform that speculative decoding draws from (SampleToken's is 0).
inline constexpr uint64_t kAcceptStream = 1;    // the acceptance test of a draft token
inline constexpr uint64_t kResidualStream = 2;  // the correction after a rejection
inline constexpr uint64_t kDraftStream = 3;     // a draft model's own sample

}  // namespace baton::model
