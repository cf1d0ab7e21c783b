// Speculative decoding on a decode node (docs/architecture.md, "Speculative decoding"): which
// drafter a request uses, how many tokens it drafts, and the draft model that runs beside the
// target. The decode loop (decode_service.cc) asks for drafts before each step, verifies them in
// the step's rows (model/speculative.h) and tells the request's Speculation what was accepted.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/model/engine.h"
#include "baton/model/engine_factory.h"
#include "baton/model/sampling.h"
#include "baton/v1/generation.pb.h"

namespace baton::decode_node {

enum class Drafter { kOff, kNgram, kDraft };

// --speculative-policy: kCost (the default) drafts as many tokens as pay for themselves at the
// costs the node measures; kAcceptance always drafts, as many as recent acceptance suggests.
enum class SpeculativePolicy { kCost, kAcceptance };
const char* SpeculativePolicyName(SpeculativePolicy policy);  // "cost" or "acceptance"

// A decode node's --speculative and --speculative-tokens, resolved against its model.
struct SpeculativeConfig {
  Drafter drafter = Drafter::kOff;
  std::string draft_dir;  // kDraft: the draft model's directory
  int64_t tokens = 0;     // K: tokens drafted per step at most (<= the model's max_backtrack)
  // true (--speculative-policy cost, the default): each request drafts as many tokens as pay
  // for themselves at the costs the node measures (Speculation::Plan), none when none do;
  // false (acceptance): it always drafts, as many as its recent acceptance suggests.
  bool price_drafts = true;
  // Prompt lookup's n-gram lengths (vLLM's prompt_lookup_min and prompt_lookup_max).
  int64_t lookup_min = 2;
  int64_t lookup_max = 4;
};

// "off", "ngram" or "draft:DIR", with --speculative-tokens `tokens` (0: the model's
// max_backtrack) and --speculative-policy `policy`. INVALID_ARGUMENT naming the flag and what
// is allowed.
absl::StatusOr<SpeculativeConfig> ParseSpeculative(const std::string& value, int64_t tokens,
                                                   SpeculativePolicy policy,
                                                   const ModelConfig& target);

// The draft model: any baton model with the target's vocabulary and special ids (the same
// tokenizer), run on the CPU (with the target's --weights) whatever the target's device.
class DraftModel;

// Seconds = fixed + per_row x rows, fitted to the last kWindow samples by the Theil-Sen
// estimator (the median of the pairwise slopes), which a few steps slowed by other work on the
// machine (a prefill, a scrape) do not move: what a decode step of the target costs.
class CostFit {
 public:
  static constexpr size_t kWindow = 64;
  void Add(double rows, double seconds);
  // The window holds samples of at least two sizes (so the two terms are told apart).
  bool ready() const { return ready_; }
  double At(double rows) const { return fixed_ + per_row_ * rows; }
  double per_row() const { return per_row_; }
  double fixed() const { return fixed_; }
  // A ready fit of the given terms (seconds), as a node reported them: what the cluster
  // simulation prices a decode node's steps with.
  static CostFit Line(double fixed, double per_row);

 private:
  void Refit();
  std::vector<std::pair<double, double>> samples_;  // a ring of kWindow
  size_t next_ = 0;
  int64_t added_ = 0;
  bool ready_ = false;
  double per_row_ = 0, fixed_ = 0;
};

// The decode node's costs, measured as it runs; a request's drafting is priced with them.
struct DraftCosts {
  CostFit target;  // a decode step by its rows (without replay pieces)
  // The same by the number of requests in the step: a row's cost at the batch a request is in
  // (a few more rows cost little beside a step that reads the weights for one request, and
  // more beside a larger batch's). Batches up to kMaxFittedBatch.
  std::map<int64_t, CostFit> by_batch;
  static constexpr int64_t kMaxFittedBatch = 256;
  void AddStep(int64_t requests, int64_t rows, double seconds);
  // The fit for steps of `requests` requests once it is ready, else the one over all steps.
  const CostFit& TargetFor(int64_t requests) const;
  // One drafting request's share of a draft model round (seconds), exponentially weighted, and
  // the rounds seen.
  double draft_share = 0;
  int64_t draft_rounds = 0;
  void AddDraftRound(double seconds, int64_t requests);
};

// One request's speculation: what it drafts with, how much, and what it has gained.
struct Speculation {
  Drafter drafter = Drafter::kOff;
  int64_t max_tokens = 0;  // K for this request
  // Tokens to draft next step while the costs are not known yet: one more after a step that
  // accepted every draft, one past the accepted run otherwise.
  int64_t next = 0;
  // The request's recent acceptance, per drafted token: accepted drafts and verdicts on drafts
  // (an accepted one, or the rejection that ends a run), exponentially weighted.
  double accepted_weight = 0, trials_weight = 0;
  int64_t steps = 0;    // steps that verified drafts
  int64_t planned = 0;  // steps planned
  // The draft model's state of this request and the positions of the context it holds.
  std::unique_ptr<model::SequenceState> draft_state;
  int64_t draft_length = 0;
  bool draft_unavailable = false;  // the draft model cannot hold this request (its context)
  uint32_t drafted = 0;
  uint32_t accepted = 0;  // accepted and sent
  // This step's proposal (and, from a draft model under sampling, the weights it drew from).
  std::vector<int32_t> draft;
  std::vector<model::KeptWeights> weights;

  // After a step that verified `k` drafts and accepted `accepted` of them.
  void Adapt(int64_t k, int64_t accepted);
  // Drafted tokens for the next step in a batch of `batch` requests, at most `limit`: the k
  // that maximises expected tokens per cost, (1 + a + ... + a^k) / (1 + k m), where a is the
  // request's acceptance and m what one more drafted token costs (a verify row, and a draft
  // model's round) against the request's share of a step. 0 when drafting does not pay, except
  // for one drafted token every kProbeSteps steps that keeps a current under prompt lookup; a
  // draft model that does not pay is dropped for the rest of the request (its state freed).
  int64_t Plan(const DraftCosts& costs, int64_t batch, int64_t limit);
  bool price_drafts = true;  // SpeculativeConfig::price_drafts
  double acceptance() const { return (accepted_weight + 1) / (trials_weight + 2); }
};

inline constexpr int64_t kProbeSteps = 24;

// The request's drafter and K: the sampling params' overrides, else the node's. A request
// cannot enable a method the operator did not:
// FAILED_PRECONDITION naming sampling.speculative for NGRAM or DRAFT on a node that runs
// --speculative off, and for DRAFT on a node without a draft model (as the router relays it).
absl::StatusOr<Speculation> SpeculationFor(const v1::SamplingParams& sampling,
                                           const SpeculativeConfig& node, bool has_draft_model);

// One request's part in a drafting round: its context (prompt and tokens so far; the last is the
// step's input, at position context.size() - 1), how many tokens to draft, and its sampling.
struct DraftJob {
  const std::vector<int32_t>* context = nullptr;
  Speculation* speculation = nullptr;
  int64_t tokens = 0;
  model::SamplingParams sampling;
  uint64_t step = 0;  // completion index of the step's first emitted token
};

// What one DraftModel::Propose call ran: batched draft-model steps (`rounds`) and the rows
// they fed, and the context rows it took in (prefill and catch-up, within its budget).
struct ProposeStats {
  int64_t rounds = 0;
  int64_t rows = 0;
  int64_t context_rows = 0;
};

class DraftModel {
 public:
  // INVALID_ARGUMENT naming --speculative when the model cannot draft for `target` (loaded
  // from `target_dir`).
  static absl::StatusOr<std::unique_ptr<DraftModel>> Load(const std::string& dir,
                                                          const std::string& target_dir,
                                                          const model::Engine& target,
                                                          const model::DeviceFlags& device,
                                                          int64_t tokens);

  // Fills each job's speculation->draft (and weights, when sampled) with up to job.tokens
  // tokens. First the draft model takes in the context it has not seen (a prefill the first
  // time, then decode runs), at most `context_rows` rows over all jobs: the decode loop's
  // per-step budget, so that a long prompt is taken in over several steps, as replay is, and
  // never stalls every stream at once. A job still behind after that, or whose request the
  // draft model cannot hold, gets no draft this time. Then one batched step per drafted
  // token. An engine failure is returned; the drafts are then empty.
  absl::Status Propose(std::span<DraftJob> jobs, int64_t context_rows,
                       ProposeStats* stats = nullptr);

  // After verification: the draft state keeps the positions whose tokens the target accepted.
  static void Settle(Speculation& speculation, int64_t context_before, int64_t k, int64_t accepted);

  const model::Engine& engine() const { return *engine_; }

 private:
  explicit DraftModel(std::unique_ptr<model::Engine> engine) : engine_(std::move(engine)) {}
  // Readies one job's draft state; false when the job drafts nothing this call.
  bool Admit(DraftJob& job);
  // Takes in up to `budget` rows of the jobs' unseen context, leaving to each the rows its
  // first drafting round feeds; spends `budget`.
  absl::Status TakeIn(std::span<DraftJob* const> jobs, int64_t& budget, ProposeStats& stats);
  // The drafting rounds of jobs that have taken in their context.
  absl::Status Draft(std::span<DraftJob* const> jobs, ProposeStats& stats);
  // One batched decode step of the draft model feeding rows[i] to jobs[i] (none: skipped);
  // logits [total rows, V] in order.
  absl::Status Feed(std::span<DraftJob* const> jobs, std::span<const std::span<const int32_t>> rows,
                    std::vector<float>& logits, ProposeStats& stats);
  std::unique_ptr<model::Engine> engine_;
};

// Prompt lookup's proposal for one job: ProposeByLookup over the last kLookupWindow tokens of
// its context, which bounds the scan every step makes on the decode loop.
inline constexpr size_t kLookupWindow = 8192;
void ProposeByLookup(const SpeculativeConfig& config, DraftJob& job);

}  // namespace baton::decode_node
