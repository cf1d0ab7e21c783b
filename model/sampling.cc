#include "baton/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "baton/model/engine.h"

namespace baton::model {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

float LogSoftmaxAt(std::span<const float> logits, int32_t token) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (float l : logits) total += std::exp(static_cast<double>(l - max_logit));
  return static_cast<float>(logits[token] - max_logit - std::log(total));
}

KeptWeights KeepTokens(std::span<const float> logits, const SamplingParams& params) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  KeptWeights kept;
  if (params.temperature <= 0.0f) {
    kept.tokens = {Argmax(logits)};
    kept.weights = {1.0};
    kept.total = 1.0;
    return kept;
  }
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  // Highest logits first; ties by lower id so that the order is deterministic.
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  int32_t keep = params.top_k > 0 ? std::min(params.top_k, vocab) : vocab;
  std::vector<double>& probs = kept.weights;
  probs.resize(keep);
  const double max_scaled = logits[order[0]] / params.temperature;
  double total = 0;
  for (int32_t i = 0; i < keep; ++i) {
    probs[i] = std::exp(logits[order[i]] / params.temperature - max_scaled);
    total += probs[i];
  }
  if (params.top_p > 0.0f && params.top_p < 1.0f) {
    // The shortest prefix whose weight reaches top_p of the total, compared unnormalised: the
    // CUDA sampler asks the same question of its histograms (sampling.cu), and dividing each
    // weight by the total would round differently (20 tied logits at p 0.5 kept 11, not 10).
    const double target = static_cast<double>(params.top_p) * total;
    double cumulative = 0;
    for (int32_t i = 0; i < keep; ++i) {
      cumulative += probs[i];
      if (cumulative >= target) {
        keep = i + 1;
        break;
      }
    }
    total = std::accumulate(probs.begin(), probs.begin() + keep, 0.0);
  }
  order.resize(keep);
  probs.resize(keep);
  kept.tokens = std::move(order);
  kept.total = total;
  return kept;
}

double SamplingUniform(uint64_t seed, uint64_t step, uint64_t stream) {
  const uint64_t bits = SplitMix(seed ^ SplitMix(step + 1) ^ (stream == 0 ? 0 : SplitMix(~stream)));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

int32_t DrawFrom(const KeptWeights& kept, double u) {
  const double target = u * kept.total;
  double cumulative = 0;
  for (size_t i = 0; i < kept.tokens.size(); ++i) {
    cumulative += kept.weights[i];
    if (target < cumulative) return kept.tokens[i];
  }
  return kept.tokens.back();
}

SampledToken SampleToken(std::span<const float> logits, const SamplingParams& params,
                         uint64_t step) {
  if (params.temperature <= 0.0f) {
    const int32_t token = Argmax(logits);
    return {token, LogSoftmaxAt(logits, token)};
  }
  const int32_t chosen = DrawFrom(KeepTokens(logits, params), SamplingUniform(params.seed, step));
  return {chosen, LogSoftmaxAt(logits, chosen)};
}

SamplingParams SamplingFromProto(const v1::SamplingParams& sampling) {
  return {.temperature = sampling.temperature(),
          .top_k = static_cast<int32_t>(sampling.top_k()),
          .top_p = sampling.top_p() > 0 ? sampling.top_p() : 1.0f,
          .seed = sampling.seed()};
}

}  // namespace baton::model
