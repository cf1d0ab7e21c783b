#include "baton/model/forward_schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "baton/common/ced_rules.h"

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

int64_t BoundaryRowCount(int64_t prompt_len, TruncationMode mode, int64_t keep, int64_t s_valid) {
  const TruncationSpec spec{
      .prompt_len = prompt_len, .keep = keep, .mode = mode, .s_valid = s_valid};
  return prompt_len - spec.replay_begin();
}

absl::StatusOr<TruncationSpec> ReplaySpec(const ModelConfig& config, int64_t prompt_len,
                                          TruncationMode mode, int64_t keep, int64_t s_valid) {
  TruncationSpec spec{.prompt_len = prompt_len,
                      .keep = keep,
                      .mode = mode,
                      .window = config.sliding_window,
                      .max_backtrack = config.max_backtrack,
                      .s_valid = s_valid};
  if (absl::Status s = ValidateTruncationSpec(spec); !s.ok()) return s;
  spec.s_valid = spec.replay_begin();
  return spec;
}

int64_t ReplayLogitRows(const ReplayItem& item) {
  if (item.all_logits) return item.rows;
  return item.q_start + item.rows == item.spec.prompt_len ? 1 : 0;
}

namespace {

// Builds a StepPlan segment by segment, then lays its integer sections out in one array.
class StepBuilder {
 public:
  explicit StepBuilder(const ModelConfig& config) : config_(config) {}

  // Full rows [q_start, q_start + rows) of `state` with tokens `tokens`; consumer rows are the
  // last consumer_rows of them, with the plan's positions, SWA bounds and ring slots; `logits`
  // lists the segment's consumer rows whose logits the step returns.
  void Add(SequenceState& state, int64_t q_start, int64_t rows, const int32_t* tokens,
           int64_t consumer_rows, const int32_t* consumer_positions, const int32_t* swa_lo,
           const int32_t* consumer_slots, std::span<const int64_t> logits) {
    const int64_t C = config_.ring_capacity(), W = config_.sliding_window;
    StepSegment seg{.producer_swa = state.producer_swa(),
                    .consumer_swa = state.consumer_swa(),
                    .q_start = q_start,
                    .rows = rows,
                    .row_offset = static_cast<int64_t>(tokens_.size()),
                    .consumer_rows = consumer_rows,
                    .consumer_offset = static_cast<int64_t>(consumer_positions_.size()),
                    .consumer_start = consumer_rows > 0 ? consumer_positions[0] : 0,
                    .page_table = static_cast<int64_t>(plan_.page_tables.size())};
    for (int64_t j = 0; j < rows; ++j) {
      const int64_t pos = q_start + j;
      tokens_.push_back(tokens[j]);
      positions_.push_back(static_cast<int32_t>(pos));
      producer_lo_.push_back(static_cast<int32_t>(ProducerLowerBound(pos, W)));
      producer_slots_.push_back(RingSlotOfRunRow(pos, q_start + rows, C));
    }
    for (int64_t r = 0; r < consumer_rows; ++r) {
      consumer_source_.push_back(static_cast<int32_t>(seg.row_offset + rows - consumer_rows + r));
      consumer_positions_.push_back(consumer_positions[r]);
      consumer_lo_.push_back(swa_lo[r]);
      consumer_slots_.push_back(consumer_slots[r]);
    }
    for (int64_t r : logits) logit_source_.push_back(static_cast<int32_t>(seg.consumer_offset + r));
    plan_.page_tables.insert(plan_.page_tables.end(), state.pages().begin(), state.pages().end());
    plan_.segments.push_back(seg);
  }

  // A replay piece: no full rows; its consumer rows continue the boundary rows handed over,
  // which the step places after its full rows.
  void AddReplay(const ReplayItem& item) {
    const ChunkPlan chunk = PlanChunk(item.spec, item.q_start, item.rows);
    const int64_t m = static_cast<int64_t>(chunk.consumer_positions.size());
    StepSegment seg{.producer_swa = item.state->producer_swa(),
                    .consumer_swa = item.state->consumer_swa(),
                    .q_start = item.q_start,
                    .rows = 0,
                    .row_offset = static_cast<int64_t>(tokens_.size()),
                    .consumer_rows = m,
                    .consumer_offset = static_cast<int64_t>(consumer_positions_.size()),
                    .consumer_start = chunk.consumer_positions[0],
                    .page_table = static_cast<int64_t>(plan_.page_tables.size())};
    for (int64_t r = 0; r < m; ++r) {
      replay_sources_.push_back(consumer_source_.size());
      consumer_source_.push_back(static_cast<int32_t>(plan_.replay_rows + r));
      consumer_positions_.push_back(chunk.consumer_positions[r]);
      consumer_lo_.push_back(chunk.swa_lo[r]);
      consumer_slots_.push_back(chunk.consumer_slots[r]);
    }
    for (int64_t r = item.all_logits ? 0 : m - ReplayLogitRows(item); r < m; ++r) {
      logit_source_.push_back(static_cast<int32_t>(seg.consumer_offset + r));
    }
    plan_.replay_rows += m;
    plan_.replay_input.push_back(item.boundary);
    plan_.replay_input_rows.push_back(m);
    plan_.page_tables.insert(plan_.page_tables.end(), item.state->pages().begin(),
                             item.state->pages().end());
    plan_.segments.push_back(seg);
  }

  StepPlan Finish() && {
    plan_.rows = static_cast<int64_t>(tokens_.size());
    // Replay rows sit after the full rows.
    for (size_t i : replay_sources_) consumer_source_[i] += static_cast<int32_t>(plan_.rows);
    plan_.consumer_rows = static_cast<int64_t>(consumer_positions_.size());
    plan_.logit_rows = static_cast<int64_t>(logit_source_.size());
    auto append = [&](const std::vector<int32_t>& section) {
      const int64_t offset = static_cast<int64_t>(plan_.ints.size());
      plan_.ints.insert(plan_.ints.end(), section.begin(), section.end());
      return offset;
    };
    plan_.tokens = append(tokens_);
    plan_.positions = append(positions_);
    plan_.producer_lo = append(producer_lo_);
    plan_.producer_slots = append(producer_slots_);
    plan_.consumer_source = append(consumer_source_);
    plan_.consumer_positions = append(consumer_positions_);
    plan_.consumer_lo = append(consumer_lo_);
    plan_.consumer_slots = append(consumer_slots_);
    plan_.logit_source = append(logit_source_);
    return std::move(plan_);
  }

 private:
  const ModelConfig& config_;
  StepPlan plan_;
  std::vector<int32_t> tokens_, positions_, producer_lo_, producer_slots_, consumer_source_,
      consumer_positions_, consumer_lo_, consumer_slots_, logit_source_;
  std::vector<size_t> replay_sources_;  // consumer_source_ entries that index replay rows
};

}  // namespace

StepPlan PlanPrefillStep(const ModelConfig& config, const PrefillSchedule& schedule,
                         const PrefillRun& run, std::span<const int32_t> tokens,
                         SequenceState& state) {
  StepBuilder step(config);
  const int32_t* chunk_tokens = tokens.data() + run.q_start;
  if (run.chunk < 0) {
    step.Add(state, run.q_start, run.rows, chunk_tokens, 0, nullptr, nullptr, nullptr, {});
  } else {
    const ChunkPlan& chunk = schedule.plan.chunks[run.chunk];
    step.Add(state, run.q_start, run.rows, chunk_tokens,
             static_cast<int64_t>(chunk.consumer_positions.size()), chunk.consumer_positions.data(),
             chunk.swa_lo.data(), chunk.consumer_slots.data(), run.logit_rows);
  }
  return std::move(step).Finish();
}

absl::StatusOr<StepPlan> PlanDecodeStep(const ModelConfig& config,
                                        std::span<SequenceState* const> states,
                                        std::span<const int32_t> tokens,
                                        std::span<const ReplayItem> replay,
                                        std::span<const std::span<const int32_t>> drafts) {
  StepBuilder step(config);
  if (!drafts.empty() && drafts.size() != states.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("drafts: ", drafts.size(), " lists for ", states.size(), " decode items"));
  }
  std::vector<int32_t> row_tokens;
  std::vector<int32_t> positions, swa_lo, slots;
  std::vector<int64_t> logit_rows;
  for (size_t i = 0; i < states.size(); ++i) {
    SequenceState* state = states[i];
    if (state == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("decode item ", i, " has no state"));
    }
    const std::span<const int32_t> draft = drafts.empty() ? std::span<const int32_t>() : drafts[i];
    // Drafted rows are written into the rings and may be taken back (DESIGN section 3's
    // backtracking): at most max_backtrack of them, so that the slots they overwrite lie outside
    // every window the accepted rows still read (docs/architecture.md, "Speculative decoding").
    if (static_cast<int64_t>(draft.size()) > config.max_backtrack) {
      return absl::InvalidArgumentError(absl::StrCat(
          "decode item ", i, ": ", draft.size(), " draft tokens; at most max_backtrack = ",
          config.max_backtrack, " (the rings hold W + max_backtrack + 1 slots)"));
    }
    const int64_t rows = 1 + static_cast<int64_t>(draft.size());
    row_tokens.assign(1, tokens[i]);
    row_tokens.insert(row_tokens.end(), draft.begin(), draft.end());
    positions.clear();
    swa_lo.clear();
    slots.clear();
    logit_rows.clear();
    for (int64_t r = 0; r < rows; ++r) {
      absl::StatusOr<DecodeRow> row = ScheduleDecodeRow(
          config, static_cast<int64_t>(i), row_tokens[r], state->length + r, state->s_valid);
      if (!row.ok()) return row.status();
      positions.push_back(row->position);
      swa_lo.push_back(row->swa_lo);
      slots.push_back(row->slot);
      logit_rows.push_back(r);
    }
    if (absl::Status s = state->EnsurePages(state->length + rows); !s.ok()) return s;
    step.Add(*state, state->length, rows, row_tokens.data(), rows, positions.data(), swa_lo.data(),
             slots.data(), logit_rows);
  }
  for (size_t i = 0; i < replay.size(); ++i) {
    const ReplayItem& item = replay[i];
    const int64_t L = item.spec.prompt_len;
    auto bad = [&](auto... what) {
      return absl::InvalidArgumentError(absl::StrCat("replay item ", i, ": ", what...));
    };
    if (item.state == nullptr) return bad("has no state");
    if (item.boundary == nullptr) return bad("has no boundary rows");
    if (absl::Status s = ValidateTruncationSpec(item.spec); !s.ok()) return bad(s.message());
    if (item.spec.window != config.sliding_window ||
        item.spec.max_backtrack != config.max_backtrack) {
      return bad("its plan's window and max_backtrack are not the model's (use ReplaySpec)");
    }
    if (item.rows < 1 || item.q_start < item.spec.s_valid || item.q_start > L - item.rows) {
      return bad("rows [", item.q_start, ", ", item.q_start + item.rows,
                 ") must be a non-empty range inside the replay range [", item.spec.s_valid, ", ",
                 L, ")");
    }
    if (item.state->length != L ||
        static_cast<int64_t>(item.state->pages().size()) * config.kv_block_size < L) {
      return bad("its state holds ", item.state->length, " positions; a replay needs the whole ",
                 "prompt's block KV and producer rings (", L, " positions) staged in");
    }
    step.AddReplay(item);
  }
  return std::move(step).Finish();
}

absl::Status PrefillCancelled(int64_t q_start, int64_t prompt_len) {
  return absl::CancelledError(
      absl::StrCat("prefill cancelled after ", q_start, " of ", prompt_len, " prompt rows"));
}

}  // namespace baton::model
