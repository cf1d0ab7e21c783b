// The decode node's step as plan -> run -> settle, the shape the engine's schedule
// (model/forward_schedule.h) and the router's stages have:
// - PlanStep decides what one step does from the requests' state and the node's policies: which
//   requests decode and how many tokens each drafts, and which rows of each replaying prompt
//   the step replays (within a row bound, and within a share of the streams' step time once the
//   node has measured what a replayed row costs);
// - DecodeService::DecodeLoop runs the plan on the engine;
// - SettleDecode and SettleReplay apply what the step returned to each request: the verdict on
//   its drafts, the finish rule token by token, the rows taken back, the replay's progress and,
//   at the prompt's end, its first token.
// The planner and the settles touch only what they are given (no model, lock, clock or thread),
// so tests/decode_node/decode_step_test.cc checks them as properties.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "baton/decode_node/speculation.h"
#include "baton/model/forward_schedule.h"
#include "baton/model/sampling.h"
#include "baton/model/speculative.h"
#include "baton/v1/node.pb.h"

namespace baton::decode_node {

// The one finish rule, for the first token (sampled by the prefill node) and every later one,
// in vLLM's order: a stop id finishes STOP, then the EOS id (unless ignore_eos) EOS, then the
// length limit LENGTH; UNSPECIFIED while the request goes on. `completion` counts `token`.
v1::FinishReason FinishReasonFor(int32_t token, uint32_t completion, uint32_t max_tokens,
                                 const std::set<int32_t>& stop_ids, bool ignore_eos,
                                 int64_t eos_token_id);

// What a request generates on this node, apart from where its state lives and who may use it
// (DecodeService's Request): its sampling and stop rule, the tokens so far, replay-on-decode's
// progress through the prompt, and its speculation. The decode thread writes it; the Request
// says which of its fields other threads read, and when.
struct Generation {
  model::SamplingParams sampling;
  uint32_t max_tokens = 0;
  std::set<int32_t> stop_ids;
  bool ignore_eos = false;
  int64_t eos_token_id = -1;
  uint32_t completion = 0;      // completion tokens so far, counting those before this node
  int32_t next_input = 0;       // the next step's input token
  std::vector<int32_t> tokens;  // produced here after the first (which the router has)
  std::vector<float> logprobs;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  // Speculative decoding: the prompt and every token since (the last is the next step's input,
  // at position context.size() - 1), kept when the router sent the prompt; and how the request
  // drafts (speculation.h).
  std::vector<int32_t> context;
  Speculation speculation;
  // Replay-on-decode: the replay's plan and its next row; the prompt, when its logprobs are
  // asked for, and those computed so far.
  model::TruncationSpec replay;
  int64_t replay_next = 0;
  std::vector<int32_t> prompt_tokens;
  std::vector<float> prompt_logprobs;

  // Appends a sampled token, which becomes the next input, and applies the finish rule; true
  // when it finished the request.
  bool Accept(int32_t token, float logprob);
  bool finished() const { return finish != v1::FINISH_REASON_UNSPECIFIED; }
  int64_t tokens_left() const { return int64_t{max_tokens} - completion; }
  int64_t replay_rows_left() const { return replay.prompt_len - replay_next; }
};

// A replay piece's size: the prompt length its rows attend over, and its rows.
struct PieceSize {
  int64_t prompt_len = 0;
  int64_t rows = 0;
};

// What a replay piece costs on this node, measured from the steps that ran one: the step's time
// less the streams' part (StreamsSeconds). A piece of r rows over a prompt of L positions costs a
// part of its own (global attention's pass over the prompt's block KV) and a part per row (the
// consumer layers' projections, attention), both growing with L; so a fit of a piece's seconds
// against its rows is kept per power-of-two band of L. DecodeLoop feeds it (FoldStepTime);
// PlanStep prices pieces with it.
struct ReplayCosts {
  std::map<int, CostFit> by_band;  // floor(log2 L) -> a piece's seconds against its rows
  // Over every band: a piece's seconds per prompt position against its rows, as if both parts
  // grew in proportion to L. It prices a band whose own fit is not ready yet, and it is what
  // the node reports (DecodeRates.replay_piece_fixed_ms and replay_piece_row_ms, at 1,024
  // positions) for the cluster simulation to step replay pieces with.
  CostFit per_position;
  // A row's share of its piece's seconds (moving average) and the length it was seen at: what
  // prices a piece while neither its band's fit nor the per-position fit is ready, in
  // proportion to the length (high for a longer prompt, so a budget holds).
  double seconds_per_row = 0;
  double length = 0;
  int64_t pieces = 0;
  // The streams' recent steps alone by their rows (moving averages).
  std::map<int64_t, double> streams_alone;
  void AddPiece(double seconds, PieceSize piece);
  bool ready() const { return pieces > 0; }
  // Costs that are the proportional line alone (per position, in seconds), as a node reported
  // them: what the cluster simulation plans a decode node's steps with.
  static ReplayCosts Proportional(double fixed_per_position, double row_per_position);
  double PieceSeconds(PieceSize piece) const;
  // The most rows of a piece over `prompt_len` whose cost fits in `seconds` (0 when none does).
  int64_t RowsWithin(double seconds, int64_t prompt_len) const;

 private:
  // The fit that prices a piece over `prompt_len` (its band's, else the per-position one, whose
  // terms are multiplied by `*scale`), or null while neither is ready.
  const CostFit* FitFor(int64_t prompt_len, double* scale) const;
};

// The streams' own step time at `decode_rows` rows in a step of `requests`: their recent steps
// of those rows alone, else the step-cost fit once ready; 0 when neither is known.
double StreamsSeconds(const DraftCosts& costs, const ReplayCosts& replay_costs, int64_t requests,
                      int64_t decode_rows);

// Folds one step's engine time into the fits the planner prices with: a step without replay
// into the streams' step fit (DraftCosts::AddStep, by its requests and rows) and their recent
// times alone; one with replay into ReplayCosts, less the streams' part (such a step is skipped
// while that is unknown; a step of replay alone counts whole), shared among its pieces in
// proportion to rows x length.
void FoldStepTime(DraftCosts& costs, ReplayCosts& replay_costs, int64_t requests,
                  int64_t decode_rows, std::span<const PieceSize> pieces, double seconds);

// The node's recent steps, as it reports its costs for the cluster simulation (DecodeRates):
// what a simulated step of the same work should take, and how the node's steps spread about
// that. A step's time here is its whole turn of the decode loop (plan, run, settle: the gap its
// streams see between tokens), so what shares the node's cores (other nodes' prefills on the
// same host) and the loop's own work are in it.
//
// Its costs come from its last kSteps steps alone, fitted at once by least squares: the
// planner's own fits (DraftCosts, ReplayCosts) follow the last few dozen steps, which is what
// a budget needs and not what a simulation of minutes of traffic should price with (a window of
// steps of one or two rows fits any slope).
class StepLog {
 public:
  static constexpr size_t kSteps = 4096;
  // The probabilities of the reported quantiles of a step's time over its priced time.
  static constexpr std::array<double, 4> kQuantiles = {0.1, 0.5, 0.9, 0.99};

  void Add(int64_t decode_rows, std::span<const PieceSize> pieces, double seconds);
  size_t size() const { return steps_.size(); }

  struct Summary {
    // The decode rows' line (seconds): least squares over the steps without replay, each term
    // at least 0; `fallback` (the planner's fit) while fewer than kFewest such steps differ
    // in rows (its slope) or are logged at all (both terms). ready: priced by either.
    bool line_ready = false;
    double fixed = 0, per_row = 0;
    // A replay piece over a prompt of L positions costs L x (piece_fixed + piece_row x rows):
    // least squares over the steps with replay, less their rows' line; `replay_fallback`'s
    // per-position fit while fewer than kFewest such steps are logged.
    bool pieces_ready = false;
    double piece_fixed = 0, piece_row = 0;
    // Over the steps these price: the sum of their times over the sum of their prices (0: none
    // priced), and kQuantiles of each step's time over its price, each step weighted by its
    // price (a short step stalled by a neighbour counts as little as it weighs).
    double stretch = 0;
    std::array<double, 4> quantiles{};
    // A step of `decode_rows` rows and `pieces` at these costs (0 when a term it needs is not
    // ready).
    double Price(int64_t decode_rows, std::span<const PieceSize> pieces) const;
  };
  static constexpr size_t kFewest = 8;
  Summary Summarize(const CostFit& fallback, const CostFit& replay_fallback) const;

 private:
  struct Step {
    double rows = 0;
    double positions = 0;      // sum of the pieces' prompt lengths
    double row_positions = 0;  // sum of their prompt lengths x rows
    double seconds = 0;
  };
  // Summarize's three parts, each over the steps logged: the rows' line (`out` from
  // `fallback` while too few steps differ), the replay pieces' costs about it, and the
  // stretch with its spread about both.
  void FitLine(const CostFit& fallback, Summary& out) const;
  void FitPieces(const CostFit& replay_fallback, Summary& out) const;
  void Spread(Summary& out) const;

  std::vector<Step> steps_;  // a ring of kSteps
  size_t next_ = 0;
};

// What one step may do (DecodeOptions).
struct StepPolicy {
  int64_t max_batch = 64;
  // Replay rows per step over all replaying requests: the bound while streams decode
  // (--replay-rows-per-step), and the rows a step takes when none does.
  int64_t replay_rows = 8;
  int64_t idle_replay_rows = 512;
  // While streams decode, the replay rows may add at most this share of the streams' step time
  // (--replay-step-budget; 0: the row bound alone). Applied once the node knows both the
  // streams' step (StreamsSeconds) and a replay piece's cost; at least one row a step, so a
  // replay ends.
  double replay_step_budget = 0;
  // Under a time budget, the rows a step with streams replays until the node has measured a
  // replay piece (within replay_rows): the first replay beside streams does not guess high.
  int64_t unpriced_replay_rows = 8;
};

// One request as the planner sees it: decoding (committed) or replaying its prompt.
struct StepCandidate {
  enum class Work { kDecode, kReplay };
  Work work = Work::kDecode;
  // Planning updates its speculation's own counters (Speculation::Plan) and nothing else.
  Generation* generation = nullptr;
};

// One step: the candidates that decode (by their index in PlanStep's span) and the tokens each
// drafts, and the rows each replaying candidate replays, in the order the engine runs them.
struct DecodePlan {
  struct Decode {
    size_t candidate = 0;
    int64_t drafts = 0;  // verify rows after the input row
  };
  struct Replay {
    size_t candidate = 0;
    int64_t first_row = 0;  // the prompt row the piece starts at
    int64_t rows = 0;
  };
  std::vector<Decode> decode;
  std::vector<Replay> replay;
  int64_t replay_budget = 0;  // rows the step could replay over all requests
  // The time the replay rows could add (ms), when the time budget applied; else -1.
  double replay_budget_ms = -1;
  bool empty() const { return decode.empty() && replay.empty(); }
  int64_t decode_rows() const;  // an input row and its drafts per decoding request
  int64_t replay_rows() const;
};

// Plans one step over `candidates` (in the order the node holds them): the first max_batch
// decoding ones, each drafting what Speculation::Plan prices at the batch's size, never more
// than the request has tokens left after the step's own; then the replaying ones in order, each
// taking what is left of the row budget (and of the time budget, StepPolicy), up to its
// prompt's end.
DecodePlan PlanStep(std::span<const StepCandidate> candidates, const StepPolicy& policy,
                    const DraftCosts& costs, const ReplayCosts& replay_costs);

// A plan on one line, for logs and tests: "decode 2 [0+3 4+0] replay 1 [2:128+8] budget 8 rows 3.1
// ms".
std::string DescribePlan(const DecodePlan& plan);

// What settling one decoding request's step gave.
struct DecodeSettled {
  int64_t taken_back = 0;  // rows of rejected drafts to take back from the request's state
  int64_t emitted = 0;     // tokens appended to Generation::tokens, to stream
  int64_t drafted = 0;     // drafts the step verified
  int64_t accepted = 0;    // of them, accepted and emitted (a stop may end the request inside)
};

// Applies a decoding request's verdict: the step appended an input row and `drafts` rows; the
// rejected drafts' rows are taken back; the verdict's tokens are accepted in order until the
// finish rule ends the request; the speculation learns what was accepted (and a draft model's
// state keeps only the accepted positions).
DecodeSettled SettleDecode(Generation& generation, int64_t drafts, const model::Verdict& verdict);

// Applies a replayed piece of `rows` prompt rows and the step's logits for it (every row's when
// the prompt's logprobs are asked for, else the prompt's last row's when the piece ends it; rows
// of `vocab` floats): the prompt logprobs, the replay's progress and, at the prompt's end, the
// first token, sampled as the prefill node would have. True when the replay ended.
bool SettleReplay(Generation& generation, int64_t rows, std::span<const float> logits,
                  int64_t vocab);

}  // namespace baton::decode_node
