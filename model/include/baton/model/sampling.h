// Token sampling shared by prefill nodes (the first token) and decode nodes (the rest).
// A draw is a pure function of (logits, params, step): the random stream is seeded by
// (seed, step), so a request sampled partly on one node and partly on another, or
// re-prefilled after a lost node, draws exactly what an undisturbed run draws.
#pragma once

#include <cstdint>
#include <span>

#include "baton/v1/generation.pb.h"

namespace baton::model {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy
  int32_t top_k = 0;         // <= 0: no cut
  // >= 1 or <= 0: no cut. Else the shortest prefix of the top_k tokens (highest logit first,
  // ties by lower id) whose weight w reaches top_p * (their total weight).
  float top_p = 1.0f;
  uint64_t seed = 0;
};

// The wire's sampling fields (already checked: common/wire_bounds.h CheckSampling) as the
// sampler takes them: the one conversion both node kinds use.
SamplingParams SamplingFromProto(const v1::SamplingParams& sampling);

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;  // log-softmax of the model's logits (before temperature) at `token`
};

// log-softmax(logits)[token].
float LogSoftmaxAt(std::span<const float> logits, int32_t token);

// `step` counts completion tokens from 0 (the prefill node's first token).
SampledToken SampleToken(std::span<const float> logits, const SamplingParams& params,
                         uint64_t step);

}  // namespace baton::model
