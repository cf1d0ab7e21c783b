// How far a served model's next-token distributions are from the untruncated model's at the
// same positions (docs/fidelity.md): the comparison `batonctl approx-error` makes offline and a
// decode node's shadow verification makes of the requests it serves, with one arithmetic.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/model/engine.h"

namespace baton::model {

// One position: KL(reference || variant) of their softmaxes (nats, >= 0), whether their
// argmaxes agree, and the largest |logit difference|.
struct LogitsError {
  double kl = 0;
  bool top1 = true;
  double max_abs = 0;
};
LogitsError CompareLogits(std::span<const float> reference, std::span<const float> variant);

// The logits of each position of `continuation` under `options`, teacher-forced: row 0 is the
// prefill's last row (what predicts continuation[0]), row i > 0 the decode step fed
// continuation[i - 1]. As many rows as continuation has tokens; each vocab_size floats.
// `after_prefill`, when given, sees the state between the prefill and the first decode step.
absl::StatusOr<std::vector<std::vector<float>>> TeacherForcedLogits(
    Engine& engine, std::span<const int32_t> prompt, std::span<const int32_t> continuation,
    const PrefillOptions& options,
    const std::function<void(const SequenceState&)>& after_prefill = nullptr);

// A run of positions compared: what usage.fidelity and the decode node's metrics report.
struct FidelitySummary {
  int64_t positions = 0;
  int64_t top1_agreements = 0;
  double kl_sum = 0;
  double max_kl = 0;
  double max_logit_diff = 0;
  int64_t first_disagreement = -1;  // -1: none
  std::vector<LogitsError> per_position;
  double mean_kl() const { return positions > 0 ? kl_sum / static_cast<double>(positions) : 0; }
};
// Position i of `reference` against position i of `served`, over the positions both hold.
FidelitySummary CompareRuns(std::span<const std::vector<float>> reference,
                            std::span<const std::vector<float>> served);

}  // namespace baton::model
