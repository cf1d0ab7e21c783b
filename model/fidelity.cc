#include "baton/model/fidelity.h"

#include <algorithm>
#include <cmath>

namespace baton::model {
namespace {

std::vector<double> LogSoftmax(std::span<const float> logits) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(l - max);
  const double log_sum = std::log(sum) + max;
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - log_sum;
  return out;
}

}  // namespace

LogitsError CompareLogits(std::span<const float> reference, std::span<const float> variant) {
  const std::vector<double> p = LogSoftmax(reference), q = LogSoftmax(variant);
  LogitsError e;
  for (size_t i = 0; i < p.size(); ++i) {
    e.kl += std::exp(p[i]) * (p[i] - q[i]);
    e.max_abs = std::max(e.max_abs, std::abs(double{reference[i]} - variant[i]));
  }
  e.kl = std::max(0.0, e.kl);  // rounding can make an exact zero slightly negative
  e.top1 = Argmax(reference) == Argmax(variant);
  return e;
}

absl::StatusOr<std::vector<std::vector<float>>> TeacherForcedLogits(
    Engine& engine, std::span<const int32_t> prompt, std::span<const int32_t> continuation,
    const PrefillOptions& options, const std::function<void(const SequenceState&)>& after_prefill) {
  std::vector<std::vector<float>> rows;
  SequenceState state(engine.state_layout());
  absl::StatusOr<PrefillResult> result = engine.Prefill(prompt, options, state);
  if (!result.ok()) return result.status();
  if (after_prefill) after_prefill(state);
  if (continuation.empty()) return rows;
  const int64_t V = engine.config().vocab_size;
  rows.emplace_back(result->logits.end() - V, result->logits.end());
  for (size_t i = 0; i + 1 < continuation.size(); ++i) {
    std::vector<float> logits(V);
    const DecodeItem item{.state = &state, .token = continuation[i], .logits = logits.data()};
    if (absl::Status s = engine.Decode({&item, 1}); !s.ok()) return s;
    rows.push_back(std::move(logits));
  }
  return rows;
}

FidelitySummary CompareRuns(std::span<const std::vector<float>> reference,
                            std::span<const std::vector<float>> served) {
  FidelitySummary s;
  const size_t n = std::min(reference.size(), served.size());
  for (size_t i = 0; i < n; ++i) {
    const LogitsError e = CompareLogits(reference[i], served[i]);
    s.per_position.push_back(e);
    ++s.positions;
    s.top1_agreements += e.top1;
    s.kl_sum += e.kl;
    s.max_kl = std::max(s.max_kl, e.kl);
    s.max_logit_diff = std::max(s.max_logit_diff, e.max_abs);
    if (!e.top1 && s.first_disagreement < 0) s.first_disagreement = static_cast<int64_t>(i);
  }
  return s;
}

}  // namespace baton::model
