// Token sampling shared by prefill nodes (the first token) and decode nodes (the rest).
// A draw is a pure function of (logits, params, step): the random stream is seeded by
// (seed, step), so a request sampled partly on one node and partly on another, or
// re-prefilled after a lost node, draws exactly what an undisturbed run draws.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

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

// The tokens a sampled draw can take and their weights: for temperature > 0, the top_k cut,
// then the top_p prefix, highest logit first (ties by lower id), each weighted
// exp((logit - max) / temperature); for greedy, the argmax alone with weight 1. `total` is the
// weights' sum. Speculative decoding's verification (model/speculative.h) compares the target's
// and the draft's with exactly the weights SampleToken draws from.
struct KeptWeights {
  std::vector<int32_t> tokens;
  std::vector<double> weights;
  double total = 0;
};
KeptWeights KeepTokens(std::span<const float> logits, const SamplingParams& params);

// A uniform draw in [0, 1), a pure function of (seed, step, stream). Stream 0 is SampleToken's;
// speculative decoding takes its acceptance tests and residual draws from other streams, so that
// no two decisions share a number.
double SamplingUniform(uint64_t seed, uint64_t step, uint64_t stream = 0);

// The token at which the cumulative weight passes u * total (u in [0, 1)).
int32_t DrawFrom(const KeptWeights& kept, double u);

// `step` counts completion tokens from 0 (the prefill node's first token).
SampledToken SampleToken(std::span<const float> logits, const SamplingParams& params,
                         uint64_t step);

}  // namespace baton::model
