// The host side of a forward step, shared by every backend of the CED forward pass: option
// checks, the truncation plan and the order of the runs a prefill makes (DESIGN section 3), the
// per-row metadata of a decode step, and the StepPlan that the layer stack (engine.h) executes
// for either. A backend only executes a step plan; it never re-derives which row runs, which
// keys it sees, where it writes or which rows give logits.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "baton/common/model_config.h"
#include "baton/model/plan.h"
#include "baton/model/state.h"

namespace baton::model {

// Receives each producer layer's RoPE'd K and V rows as a chunk computes them, so that the
// prefix store can keep every full block's producer SWA rows (the ring keeps only the last C).
// k and v point at row 0 (position q_start); rows are `stride` floats apart, kv_dim wide.
// Host pointers (a device backend copies the rows out first).
using ProducerRowsCallback = std::function<void(int64_t layer, int64_t q_start, int64_t rows,
                                                const float* k, const float* v, int64_t stride)>;

struct PrefillOptions {
  TruncationMode mode = TruncationMode::kOff;
  int64_t keep = 0;
  // Consumer rows start here; positions [state.length, s_valid) run producers and the
  // boundary only (what a prefix hit of s_valid tokens would have loaded).
  int64_t s_valid = 0;
  int64_t chunk_size = 0;  // 0: one chunk
  // false: logits of the last prompt row only (serving); true: every row of the prompt's
  // result (rows >= s_valid; in compact only the retained rows, never a placeholder).
  bool result_logits = false;
  // With result_logits: when set, each result row's logits go here as its chunk finishes, in
  // position order, and PrefillResult keeps only the last row, so memory stays at one chunk's
  // rows (prompt logprobs of a long prompt never hold L x V floats).
  std::function<void(int64_t position, std::span<const float> logits)> on_result_logits;
  ProducerRowsCallback on_producer_rows;
  // Replay-on-decode (DESIGN section 6), on an engine that holds the producers only: the
  // prefill runs the producers and the block KV and no consumer layer (no logits), and writes
  // the boundary rows of [spec.replay_begin(), L) here, [rows, hidden_size] (host), sized by
  // BoundaryRowCount.
  std::span<float> boundary_rows;
  // Asked before each chunk: true stops the prefill there with CANCELLED (a request whose
  // client went away or whose deadline passed computes no further chunk). The state is then
  // incomplete and must be discarded.
  std::function<bool()> cancelled;
};

// Rows of boundary state a replay-on-decode prefill hands over: L - replay_begin().
int64_t BoundaryRowCount(int64_t prompt_len, TruncationMode mode, int64_t keep, int64_t s_valid);

// The status of a prefill stopped by PrefillOptions::cancelled before the run at `q_start`.
absl::Status PrefillCancelled(int64_t q_start, int64_t prompt_len);

struct PrefillResult {
  std::vector<int32_t> positions;  // rows whose logits follow, increasing
  std::vector<float> logits;       // [positions.size(), vocab_size]
  int64_t consumer_rows = 0;       // rows each consumer layer computed (plan total)
};

// One run of the layer stack over prompt rows [q_start, q_start + rows).
struct PrefillRun {
  int64_t q_start = 0;
  int64_t rows = 0;
  // Index into the plan's chunks; -1: positions before s_valid, producers and the boundary
  // only (no consumer rows, no logits).
  int64_t chunk = -1;
  // The chunk's consumer rows (indices into its consumer_positions) whose logits the result
  // takes, in order.
  std::vector<int64_t> logit_rows;
};

struct PrefillSchedule {
  TruncationPlan plan;
  std::vector<PrefillRun> runs;  // in order; the result's rows follow the runs' logit rows
};

// Ids outside [0, vocab_size) are INVALID_ARGUMENT, naming the first bad one.
absl::Status CheckTokenIds(const ModelConfig& config, std::span<const int32_t> tokens);

// Checks the prompt and the options against a state that already holds `state_length`
// positions and plans the prefill. The caller makes pages cover [0, L), executes the runs,
// then sets state.length = L and state.s_valid = options.s_valid.
absl::StatusOr<PrefillSchedule> SchedulePrefill(const ModelConfig& config,
                                                std::span<const int32_t> tokens,
                                                const PrefillOptions& options,
                                                int64_t state_length);

// A decode step's one row for a request whose state holds `length` positions.
struct DecodeRow {
  int32_t position = 0;  // = length
  int32_t swa_lo = 0;    // DecodeSwaLowerBound(position, W, s_valid)
  int32_t slot = 0;      // ring slot position % C (always written)
};

// `index` names the item in error messages.
absl::StatusOr<DecodeRow> ScheduleDecodeRow(const ModelConfig& config, int64_t index, int32_t token,
                                            int64_t length, int64_t s_valid);

// One run of the layer stack, planned on the host: a batch of segments (a run of consecutive
// positions of one request: a prefill chunk, one decode row, or a replay piece whose rows enter
// at the consumer layers), every per-row integer the kernels read, and each segment's page table.
struct StepSegment {
  float* producer_swa = nullptr;  // the request's rings (backend memory)
  float* consumer_swa = nullptr;
  int64_t q_start = 0;          // position of the segment's first row
  int64_t rows = 0;             // full rows: producers, boundary and block KV
  int64_t row_offset = 0;       // first full row within the step
  int64_t consumer_rows = 0;    // the segment's consumer rows (its last rows, or a chunk's plan)
  int64_t consumer_offset = 0;  // first consumer row within the step
  int64_t consumer_start = 0;   // position of the first consumer row (the SWA tail's start)
  int64_t page_table = 0;       // index in StepPlan::page_tables of the segment's first page
};

struct StepPlan {
  int64_t rows = 0;           // full rows over all segments
  // Replay rows (boundary rows handed over, host [replay_rows, hidden_size] at replay_input)
  // follow the full rows in the step's residual rows; consumer rows of replay pieces read them.
  int64_t replay_rows = 0;
  std::vector<const float*> replay_input;  // one pointer per replay segment, in segment order
  std::vector<int64_t> replay_input_rows;
  int64_t consumer_rows = 0;  // consumer rows over all segments
  int64_t logit_rows = 0;     // consumer rows whose logits the step returns
  std::vector<StepSegment> segments;

  // Every per-row integer in one array, so that a device backend uploads it at once. Each
  // field below is the offset of one [rows], [consumer_rows] or [logit_rows] section.
  std::vector<int32_t> ints;
  int64_t tokens = 0;              // [rows] token ids
  int64_t positions = 0;           // [rows]
  int64_t producer_lo = 0;         // [rows] ProducerLowerBound(pos, W)
  int64_t producer_slots = 0;      // [rows] ring slot, or -1 (RingSlotOfRunRow)
  int64_t consumer_source = 0;     // [consumer_rows] the full row each consumer row continues
  int64_t consumer_positions = 0;  // [consumer_rows]
  int64_t consumer_lo = 0;         // [consumer_rows] the plan's swa_lo
  int64_t consumer_slots = 0;      // [consumer_rows] the plan's ring slot, or -1
  int64_t logit_source = 0;        // [logit_rows] consumer row of each logits row

  // Every segment's block-KV pages (backend memory), concatenated.
  std::vector<float*> page_tables;
};

// The step of one prefill run over `state` (pages must cover the run).
StepPlan PlanPrefillStep(const ModelConfig& config, const PrefillSchedule& schedule,
                         const PrefillRun& run, std::span<const int32_t> tokens,
                         SequenceState& state);

// A piece of a replay (the replay-on-decode split, DESIGN section 6): the consumer layers over
// the boundary rows (the residual stream entering layer P) of positions
// [q_start, q_start + rows) of a prompt whose block KV over [0, L) and producer rings `state`
// already holds. The piece is a chunk of ReplaySpec(...)'s plan, so its SWA bounds and consumer
// ring writes are those a prefill chunk over the same rows would have (DESIGN section 3); the
// pieces of one prompt run in order and tile [spec.s_valid, L).
struct ReplayItem {
  SequenceState* state = nullptr;
  TruncationSpec spec;  // ReplaySpec of the prompt's truncation
  int64_t q_start = 0;
  int64_t rows = 0;
  const float* boundary = nullptr;  // host [rows, hidden_size]
  // true: the logits of every row of the piece (prompt logprobs; truncation off); false: of the
  // prompt's last row L - 1 only, when the piece holds it. Host [logit rows, vocab_size].
  bool all_logits = false;
  float* logits = nullptr;
};

// The plan a replay follows: the prompt's truncation with s_valid moved to its replay_begin()
// (same SWA bounds for every replayed row, since those rows are >= s_keep and >= s_valid).
// Checks the spec (ValidateTruncationSpec).
absl::StatusOr<TruncationSpec> ReplaySpec(const ModelConfig& config, int64_t prompt_len,
                                          TruncationMode mode, int64_t keep, int64_t s_valid);

// Logit rows a replay piece returns (ReplayItem::logits holds this many rows of vocab_size).
int64_t ReplayLogitRows(const ReplayItem& item);

// A decode step: for each state, token tokens[i] at position states[i]->length and the draft
// tokens drafts[i] (speculative decoding; at most max_backtrack) at the positions after it, then
// the replay pieces (each a chunk of its spec: PlanChunk). A state's rows form one segment, as a
// prefill chunk's would: each row sees the ring before the segment and the segment's rows up to
// itself, and every row writes its ring slot. Checks every row (ScheduleDecodeRow) and piece and
// makes pages cover the decode rows; errors name the item. The logit rows are every decode row's,
// state by state, then each piece's (ReplayLogitRows), in order.
absl::StatusOr<StepPlan> PlanDecodeStep(const ModelConfig& config,
                                        std::span<SequenceState* const> states,
                                        std::span<const int32_t> tokens,
                                        std::span<const ReplayItem> replay = {},
                                        std::span<const std::span<const int32_t>> drafts = {});

}  // namespace baton::model
