#include "baton/model/speculative.h"

#include <algorithm>

#include "baton/model/engine.h"

namespace baton::model {

std::vector<int32_t> ProposeByLookup(std::span<const int32_t> context, int64_t max_tokens,
                                     int64_t min_n, int64_t max_n) {
  const int64_t size = static_cast<int64_t>(context.size());
  min_n = std::max<int64_t>(min_n, 1);
  for (int64_t n = std::min(max_n, size - 1); n >= min_n && max_tokens > 0; --n) {
    const std::span<const int32_t> tail = context.subspan(size - n);
    // The latest occurrence that ends before the tail itself and is followed by a token.
    for (int64_t start = size - n - 1; start >= 0; --start) {
      if (!std::equal(tail.begin(), tail.end(), context.begin() + start)) continue;
      const int64_t from = start + n;
      const int64_t count = std::min(max_tokens, size - from);
      return {context.begin() + from, context.begin() + from + count};
    }
  }
  return {};
}

namespace {

// p(token) of a KeptWeights, normalised; 0 outside its kept tokens.
class Distribution {
 public:
  Distribution(const KeptWeights& kept, size_t vocab) : probs_(vocab, 0.0) {
    for (size_t i = 0; i < kept.tokens.size(); ++i) {
      probs_[kept.tokens[i]] = kept.weights[i] / kept.total;
    }
  }
  double operator()(int32_t token) const { return probs_[token]; }

 private:
  std::vector<double> probs_;
};

}  // namespace

Verdict VerifyDraft(std::span<const float> logits, std::span<const int32_t> draft,
                    std::span<const KeptWeights> draft_weights, const SamplingParams& params,
                    uint64_t step) {
  const size_t k = draft.size();
  const size_t vocab = logits.size() / (k + 1);
  auto row = [&](size_t i) { return logits.subspan(i * vocab, vocab); };
  Verdict verdict;
  auto emit = [&](size_t i, int32_t token) {
    verdict.tokens.push_back({token, LogSoftmaxAt(row(i), token)});
  };
  for (size_t i = 0; i < k; ++i) {
    const int32_t proposed = draft[i];
    if (params.temperature <= 0.0f) {
      // Greedy: the draft stands while it is the target's argmax.
      const int32_t target = Argmax(row(i));
      emit(i, target);
      if (target != proposed) return verdict;
      ++verdict.accepted;
      continue;
    }
    if (draft_weights.empty()) {
      // A point-mass draft: rejection sampling accepts it with probability p(d) and otherwise
      // draws from p without d. Drawing the position's token as an ordinary step does (stream
      // 0) and keeping the draft when they agree has exactly that law, and emits what a
      // non-speculative run with the same seed emits.
      const SampledToken drawn = SampleToken(row(i), params, step + i);
      verdict.tokens.push_back(drawn);
      if (drawn.token != proposed) return verdict;
      ++verdict.accepted;
      continue;
    }
    const KeptWeights target = KeepTokens(row(i), params);
    const Distribution p(target, vocab);
    // q: the draft model's own weights.
    std::vector<double> q_of(vocab, 0.0);
    const Distribution q(draft_weights[i], vocab);
    for (size_t x = 0; x < vocab; ++x) q_of[x] = q(static_cast<int32_t>(x));
    const double u = SamplingUniform(params.seed, step + i, kAcceptStream);
    if (q_of[proposed] > 0 && u * q_of[proposed] < p(proposed)) {
      // Accepted with probability min(1, p / q).
      emit(i, proposed);
      ++verdict.accepted;
      continue;
    }
    // Rejected: the correction comes from the residual max(0, p - q), normalised, which makes
    // the position's token exactly p-distributed.
    KeptWeights residual;
    for (int32_t x : target.tokens) {
      const double w = p(x) - q_of[x];
      if (w <= 0) continue;
      residual.tokens.push_back(x);
      residual.weights.push_back(w);
      residual.total += w;
    }
    const double v = SamplingUniform(params.seed, step + i, kResidualStream);
    // (A residual of zero mass arises only from rounding when p equals q; p itself is then the
    // residual's limit.)
    emit(i, residual.total > 0 ? DrawFrom(residual, v) : DrawFrom(target, v));
    return verdict;
  }
  // Every draft stood: the row after the last gives one more token, drawn as an ordinary step.
  const SampledToken bonus = SampleToken(row(k), params, step + k);
  verdict.tokens.push_back(bonus);
  return verdict;
}

}  // namespace baton::model
