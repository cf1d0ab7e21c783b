#include "baton/model/forward_schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace baton::model {

absl::Status CheckTokenIds(const ModelConfig& config, std::span<const int32_t> tokens) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", i, " is ", tokens[i],
                       "; token ids must lie in [0, vocab_size) = [0, ", config.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PrefillSchedule> SchedulePrefill(const ModelConfig& config,
                                                std::span<const int32_t> tokens,
                                                const PrefillOptions& options,
                                                int64_t state_length) {
  if (tokens.empty()) return absl::InvalidArgumentError("prompt is empty; it needs >= 1 token");
  if (absl::Status s = CheckTokenIds(config, tokens); !s.ok()) return s;
  const int64_t L = static_cast<int64_t>(tokens.size());
  PlanRequest request;
  request.spec = {.prompt_len = L,
                  .keep = options.keep,
                  .mode = options.mode,
                  .window = config.sliding_window,
                  .max_backtrack = config.max_backtrack,
                  .s_valid = options.s_valid};
  if (absl::Status s = ValidateTruncationSpec(request.spec); !s.ok()) return s;
  if (state_length > options.s_valid) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state already holds ", state_length, " positions; prefill with s_valid = ",
        options.s_valid, " needs at most s_valid (a prefix hit loads exactly [0, s_valid))"));
  }
  if (options.chunk_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_size is ", options.chunk_size, "; it must be >= 0 (0: one chunk)"));
  }
  const int64_t chunk = options.chunk_size > 0 ? options.chunk_size : L;
  absl::StatusOr<std::vector<int64_t>> lens = EvenChunks(L - options.s_valid, chunk);
  if (!lens.ok()) return lens.status();
  request.chunk_lens = *std::move(lens);
  absl::StatusOr<TruncationPlan> plan = BuildTruncationPlan(request);
  if (!plan.ok()) return plan.status();

  PrefillSchedule schedule;
  schedule.plan = *std::move(plan);
  // Positions a prefix hit would have loaded: producers and the boundary only.
  for (int64_t start = state_length; start < options.s_valid; start += chunk) {
    schedule.runs.push_back({.q_start = start, .rows = std::min(chunk, options.s_valid - start)});
  }
  // The prompt's result: every row >= s_valid in off and mask, the retained rows in compact.
  const int64_t result_begin = options.mode == TruncationMode::kCompact
                                   ? std::max(request.spec.retained_begin(), options.s_valid)
                                   : options.s_valid;
  const std::vector<ChunkPlan>& chunks = schedule.plan.chunks;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ChunkPlan& chunk_plan = chunks[i];
    const int64_t m = static_cast<int64_t>(chunk_plan.consumer_positions.size());
    PrefillRun run{
        .q_start = chunk_plan.q_start, .rows = chunk_plan.q_len, .chunk = static_cast<int64_t>(i)};
    if (options.result_logits) {
      for (int64_t r = 0; r < m; ++r) {
        if (chunk_plan.consumer_positions[r] >= result_begin) run.logit_rows.push_back(r);
      }
    } else if (i + 1 == chunks.size()) {
      run.logit_rows.push_back(m - 1);
    }
    schedule.runs.push_back(std::move(run));
  }
  return schedule;
}

absl::StatusOr<DecodeRow> ScheduleDecodeRow(const ModelConfig& config, int64_t index, int32_t token,
                                            int64_t length, int64_t s_valid) {
  if (absl::Status s = CheckTokenIds(config, {&token, 1}); !s.ok()) return s;
  if (length < 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("decode item ", index, ": state holds no prompt; prefill first"));
  }
  return DecodeRow{
      .position = static_cast<int32_t>(length),
      .swa_lo = static_cast<int32_t>(DecodeSwaLowerBound(length, config.sliding_window, s_valid)),
      .slot = static_cast<int32_t>(length % config.ring_capacity())};
}

absl::Status PrefillCancelled(int64_t q_start, int64_t prompt_len) {
  return absl::CancelledError(absl::StrCat("prefill cancelled after ", q_start, " of ", prompt_len,
                                           " prompt rows"));
}

}  // namespace baton::model
