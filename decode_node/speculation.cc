#include "baton/decode_node/speculation.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "baton/model/speculative.h"

namespace baton::decode_node {
namespace {

constexpr char kFlag[] = "--speculative";

std::string FileBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The token the draft model proposes from one row of its logits: its argmax under greedy, else a
// draw from its sampling weights, which verification needs as q.
void Pick(std::span<const float> row, DraftJob& job, uint64_t offset) {
  Speculation& s = *job.speculation;
  if (job.sampling.temperature <= 0.0f) {
    s.draft.push_back(model::Argmax(row));
    return;
  }
  model::KeptWeights kept = model::KeepTokens(row, job.sampling);
  const double u =
      model::SamplingUniform(job.sampling.seed, job.step + offset, model::kDraftStream);
  s.draft.push_back(model::DrawFrom(kept, u));
  s.weights.push_back(std::move(kept));
}

}  // namespace

const char* SpeculativePolicyName(SpeculativePolicy policy) {
  return policy == SpeculativePolicy::kCost ? "cost" : "acceptance";
}

absl::StatusOr<SpeculativeConfig> ParseSpeculative(const std::string& value, int64_t tokens,
                                                   SpeculativePolicy policy,
                                                   const ModelConfig& target) {
  SpeculativeConfig config;
  config.price_drafts = policy == SpeculativePolicy::kCost;
  if (value == "off") {
    config.drafter = Drafter::kOff;
  } else if (value == "ngram") {
    config.drafter = Drafter::kNgram;
  } else if (absl::StartsWith(value, "draft:") && value.size() > 6) {
    config.drafter = Drafter::kDraft;
    config.draft_dir = value.substr(6);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        kFlag, ": '", value, "' is unknown; allowed: off, ngram, draft:DIR (a model directory)"));
  }
  if (tokens < 0 || tokens > target.max_backtrack) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative-tokens: ", tokens, " must lie in [0, max_backtrack = ", target.max_backtrack,
        "] (drafted rows are taken back within the rings' W + max_backtrack + 1 slots; 0: ",
        "max_backtrack)"));
  }
  config.tokens = tokens > 0 ? tokens : target.max_backtrack;
  return config;
}

namespace {
constexpr double kFitDecay = 0.98;         // per sample of a cost fit
constexpr double kAcceptanceDecay = 0.95;  // per verdict of a request's acceptance
constexpr int64_t kWarmupSteps = 4;        // draft rounds before their cost is trusted
constexpr double kRequiredGain = 1.05;     // expected tokens per cost that drafting must reach
}  // namespace

void CostFit::Add(double rows, double seconds) {
  if (samples_.size() < kWindow) {
    samples_.emplace_back(rows, seconds);
  } else {
    samples_[next_] = {rows, seconds};
  }
  next_ = (next_ + 1) % kWindow;
  // Refit every 8 samples: 2,016 slopes at most.
  if (++added_ % 8 == 0) Refit();
}

CostFit CostFit::Line(double fixed, double per_row) {
  CostFit fit;
  fit.ready_ = true;
  fit.fixed_ = std::max(0.0, fixed);
  fit.per_row_ = std::max(0.0, per_row);
  return fit;
}

void CostFit::Refit() {
  std::vector<double> slopes;
  for (size_t i = 0; i < samples_.size(); ++i) {
    for (size_t j = i + 1; j < samples_.size(); ++j) {
      const double dx = samples_[j].first - samples_[i].first;
      if (dx != 0) slopes.push_back((samples_[j].second - samples_[i].second) / dx);
    }
  }
  // At least a tenth of the pairs differ in rows: else the slope is a guess.
  ready_ = samples_.size() >= 8 && slopes.size() * 10 >= samples_.size() * samples_.size() / 2;
  if (!ready_) return;
  auto median = [](std::vector<double>& v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  per_row_ = std::max(0.0, median(slopes));
  std::vector<double> intercepts;
  for (const auto& [x, y] : samples_) intercepts.push_back(y - per_row_ * x);
  fixed_ = std::max(0.0, median(intercepts));
}

void DraftCosts::AddStep(int64_t requests, int64_t rows, double seconds) {
  target.Add(static_cast<double>(rows), seconds);
  if (requests <= kMaxFittedBatch) by_batch[requests].Add(static_cast<double>(rows), seconds);
}

const CostFit& DraftCosts::TargetFor(int64_t requests) const {
  auto it = by_batch.find(requests);
  return it != by_batch.end() && it->second.ready() ? it->second : target;
}

void DraftCosts::AddDraftRound(double seconds, int64_t requests) {
  const double share = seconds / static_cast<double>(std::max<int64_t>(requests, 1));
  draft_share = draft_rounds == 0 ? share : kFitDecay * draft_share + (1 - kFitDecay) * share;
  ++draft_rounds;
}

void Speculation::Adapt(int64_t k, int64_t accepted_now) {
  if (k <= 0) return;
  ++steps;
  next = accepted_now == k ? std::min(max_tokens, k + 1) : std::max<int64_t>(1, accepted_now + 1);
  // j accepted drafts, and the rejection that ended the run if there was one.
  for (int64_t i = 0; i < k && i <= accepted_now; ++i) {
    accepted_weight = kAcceptanceDecay * accepted_weight + (i < accepted_now ? 1 : 0);
    trials_weight = kAcceptanceDecay * trials_weight + 1;
  }
}

int64_t Speculation::Plan(const DraftCosts& costs, int64_t batch, int64_t limit) {
  limit = std::min(limit, max_tokens);
  if (drafter == Drafter::kOff || limit <= 0 || draft_unavailable) return 0;
  ++planned;
  // Until the node has measured its costs, the request drafts by its acceptance alone.
  if (!price_drafts || !costs.target.ready() ||
      (drafter == Drafter::kDraft && costs.draft_rounds < kWarmupSteps)) {
    return std::min(next, limit);
  }
  batch = std::max<int64_t>(batch, 1);
  const CostFit& step = costs.TargetFor(batch);
  const double share = step.At(static_cast<double>(batch)) / batch;
  double extra = step.per_row();
  if (drafter == Drafter::kDraft) extra += costs.draft_share;
  const double m = share > 0 ? extra / share : 1;
  const double a = acceptance();
  // Drafting must beat drafting nothing by a margin: the fit's per-row cost is an estimate.
  int64_t best = 0;
  double best_rate = kRequiredGain, tokens = 1, power = 1;
  for (int64_t k = 1; k <= limit; ++k) {
    power *= a;
    tokens += power;
    const double rate = tokens / (1 + k * m);
    if (rate > best_rate) {
      best_rate = rate;
      best = k;
    }
  }
  if (best == 0 && drafter == Drafter::kDraft) {
    // A draft model that does not pay stops for the rest of the request: a probe would first
    // have to feed it every token since its last draft.
    draft_state.reset();
    draft_unavailable = true;
    drafter = Drafter::kOff;
    return 0;
  }
  if (best == 0 && planned % kProbeSteps == 0) best = 1;  // prompt lookup costs a row
  return best;
}

absl::StatusOr<Speculation> SpeculationFor(const v1::SamplingParams& sampling,
                                           const SpeculativeConfig& node, bool has_draft_model) {
  Speculation s;
  // A request chooses among the methods the operator enabled, never beyond them: `off` enables
  // none, `ngram` prompt lookup, `draft:DIR` both (prompt lookup needs nothing provisioned).
  const bool speculating = node.drafter != Drafter::kOff;
  switch (sampling.speculative()) {
    case v1::SPECULATIVE_OFF:
      s.drafter = Drafter::kOff;
      break;
    case v1::SPECULATIVE_NGRAM:
      if (!speculating) {
        return absl::FailedPreconditionError(
            "sampling.speculative: NGRAM, but this decode node runs --speculative off (its "
            "operator turned speculative decoding off); use OFF or DEFAULT");
      }
      s.drafter = Drafter::kNgram;
      break;
    case v1::SPECULATIVE_DRAFT:
      if (!speculating || !has_draft_model) {
        return absl::FailedPreconditionError(absl::StrCat(
            "sampling.speculative: DRAFT, but this decode node serves no draft model (it runs "
            "with --speculative draft:DIR for that); use ",
            speculating ? "NGRAM, OFF or DEFAULT" : "OFF or DEFAULT"));
      }
      s.drafter = Drafter::kDraft;
      break;
    default:
      s.drafter = node.drafter;
  }
  s.max_tokens = sampling.speculative_tokens() > 0 ? sampling.speculative_tokens() : node.tokens;
  if (s.max_tokens <= 0) s.drafter = Drafter::kOff;
  s.next = s.max_tokens;
  s.price_drafts = node.price_drafts;
  return s;
}

absl::StatusOr<std::unique_ptr<DraftModel>> DraftModel::Load(const std::string& dir,
                                                             const std::string& target_dir,
                                                             const model::Engine& target,
                                                             const model::DeviceFlags& device,
                                                             int64_t tokens) {
  auto bad = [&](auto... why) {
    return absl::InvalidArgumentError(absl::StrCat(kFlag, ": draft model ", dir, ": ", why...));
  };
  // The draft model runs on the CPU whatever the target's device: drafts are token ids, and a
  // small model's steps cost little there.
  const model::DeviceFlags on_cpu{.device = model::Device::kCpu, .weights = device.weights};
  absl::StatusOr<std::unique_ptr<model::Engine>> engine =
      model::LoadEngineOnDevice(dir, on_cpu, model::HeldLayers::kAll);
  if (!engine.ok()) return bad(engine.status().message());
  const ModelConfig& d = (*engine)->config();
  const ModelConfig& t = target.config();
  if (d.vocab_size != t.vocab_size || d.bos_token_id != t.bos_token_id ||
      d.eos_token_id != t.eos_token_id) {
    return bad("its vocabulary (", d.vocab_size, " tokens, bos ", d.bos_token_id, ", eos ",
               d.eos_token_id, ") is not the target's (", t.vocab_size, ", bos ", t.bos_token_id,
               ", eos ", t.eos_token_id, "); a draft model shares the target's tokenizer");
  }
  // Where both directories ship a tokenizer, it must be the same file.
  for (const char* name : {"tokenizer.model", "tokenizer.json"}) {
    const std::filesystem::path a = std::filesystem::path(dir) / name;
    const std::filesystem::path b = std::filesystem::path(target_dir) / name;
    if (std::filesystem::exists(a) && std::filesystem::exists(b) && FileBytes(a) != FileBytes(b)) {
      return bad("its ", name,
                 " differs from the target's; a draft model shares the target's "
                 "tokenizer");
    }
  }
  if (d.max_backtrack < tokens) {
    return bad("its max_backtrack (", d.max_backtrack, ") is below --speculative-tokens (", tokens,
               "): its rings cannot take back the drafted rows");
  }
  return std::unique_ptr<DraftModel>(new DraftModel(*std::move(engine)));
}

namespace {

// The context the draft model has not taken in: its last row is the step's input.
std::span<const int32_t> Unseen(const DraftJob& job) {
  return std::span<const int32_t>(*job.context).subspan(job.speculation->draft_length);
}

// The job drafts nothing more for this request (its state is freed).
void GiveUp(Speculation& s) {
  s.draft.clear();
  s.weights.clear();
  s.draft_state.reset();
  s.draft_unavailable = true;
}

}  // namespace

absl::Status DraftModel::Propose(std::span<DraftJob> jobs, int64_t context_rows,
                                 ProposeStats* stats) {
  ProposeStats local;
  ProposeStats& st = stats != nullptr ? *stats : local;
  std::vector<DraftJob*> active;
  for (DraftJob& job : jobs) {
    if (Admit(job)) active.push_back(&job);
  }
  int64_t budget = std::max<int64_t>(context_rows, 0);
  absl::Status status = TakeIn(active, budget, st);
  if (status.ok()) {
    // Round 1 feeds the rest of the unseen context: at most the rows one decode item takes.
    const size_t feed = static_cast<size_t>(1 + engine_->config().max_backtrack);
    std::erase_if(active, [&](DraftJob* job) {
      return job->speculation->draft_unavailable || Unseen(*job).size() > feed;
    });
    status = Draft(active, st);
  }
  if (!status.ok()) {
    for (DraftJob* job : active) GiveUp(*job->speculation);
  }
  return status;
}

bool DraftModel::Admit(DraftJob& job) {
  const ModelConfig& config = engine_->config();
  Speculation& s = *job.speculation;
  s.draft.clear();
  s.weights.clear();
  // The draft model's own rings take back at most its max_backtrack rows.
  job.tokens = std::min(job.tokens, config.max_backtrack);
  const int64_t context = static_cast<int64_t>(job.context->size());
  if (job.tokens <= 0 || s.draft_unavailable || context < 2) return false;
  if (context + job.tokens > config.max_position_embeddings) {
    // Past the draft model's context: the request goes on undrafted.
    GiveUp(s);
    return false;
  }
  if (s.draft_state == nullptr) {
    absl::StatusOr<std::unique_ptr<model::SequenceState>> state = engine_->NewState();
    if (!state.ok()) {
      GiveUp(s);
      return false;
    }
    s.draft_state = *std::move(state);
    s.draft_length = 0;
  }
  return true;
}

absl::Status DraftModel::TakeIn(std::span<DraftJob* const> jobs, int64_t& budget,
                                ProposeStats& stats) {
  const int64_t feed = 1 + engine_->config().max_backtrack;
  // A fresh state's first piece is one prefill (cheaper per row than decode runs); everything
  // but the step's input, as far as the budget goes.
  for (DraftJob* job : jobs) {
    Speculation& s = *job->speculation;
    if (s.draft_length > 0 || budget <= 0) continue;
    const int64_t rows = std::min<int64_t>(budget, static_cast<int64_t>(job->context->size()) - 1);
    const std::span<const int32_t> piece(job->context->data(), static_cast<size_t>(rows));
    absl::StatusOr<model::PrefillResult> prefilled =
        engine_->Prefill(piece, {.mode = model::TruncationMode::kOff}, *s.draft_state);
    if (!prefilled.ok()) {
      GiveUp(s);  // this request goes on undrafted; the others still draft
      continue;
    }
    s.draft_length = rows;
    budget -= rows;
    stats.context_rows += rows;
  }
  // The rest in decode runs the rings can take (a prompt longer than the first piece, or a
  // request that drafted nothing for a while), each leaving the rows its first round feeds.
  std::vector<float> logits;
  while (budget > 0) {
    std::vector<std::span<const int32_t>> rows(jobs.size());
    bool behind = false;
    for (size_t i = 0; i < jobs.size(); ++i) {
      const std::span<const int32_t> unseen = Unseen(*jobs[i]);
      const int64_t left = static_cast<int64_t>(unseen.size());
      if (jobs[i]->speculation->draft_unavailable || left <= feed || budget <= 0) continue;
      const int64_t n = std::min({feed, left - 1, budget});
      rows[i] = unseen.first(static_cast<size_t>(n));
      budget -= n;
      stats.context_rows += n;
      behind = true;
    }
    if (!behind) break;
    if (absl::Status s = Feed(jobs, rows, logits, stats); !s.ok()) return s;
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (!rows[i].empty()) jobs[i]->speculation->draft_length += rows[i].size();
    }
  }
  return absl::OkStatus();
}

absl::Status DraftModel::Draft(std::span<DraftJob* const> jobs, ProposeStats& stats) {
  const int64_t V = engine_->config().vocab_size;
  // Round 1 feeds the unseen context (1 or 2 rows, more after a catch-up) and drafts from its
  // last row; each later round feeds the previous draft.
  int64_t rounds = 0;
  for (DraftJob* job : jobs) rounds = std::max(rounds, job->tokens);
  std::vector<float> logits;
  for (int64_t r = 0; r < rounds; ++r) {
    std::vector<std::span<const int32_t>> rows(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i]->tokens <= r) continue;
      rows[i] = r == 0 ? Unseen(*jobs[i])
                       : std::span<const int32_t>(jobs[i]->speculation->draft).subspan(r - 1, 1);
    }
    if (absl::Status s = Feed(jobs, rows, logits, stats); !s.ok()) return s;
    int64_t offset = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      const int64_t n = static_cast<int64_t>(rows[i].size());
      if (n == 0) continue;
      offset += n;
      Pick({logits.data() + (offset - 1) * V, static_cast<size_t>(V)}, *jobs[i],
           static_cast<uint64_t>(r));
    }
  }
  return absl::OkStatus();
}

absl::Status DraftModel::Feed(std::span<DraftJob* const> jobs,
                              std::span<const std::span<const int32_t>> rows,
                              std::vector<float>& logits, ProposeStats& stats) {
  const int64_t V = engine_->config().vocab_size;
  int64_t total = 0;
  for (const auto& r : rows) total += static_cast<int64_t>(r.size());
  if (total == 0) return absl::OkStatus();
  logits.resize(static_cast<size_t>(total * V));
  std::vector<model::DecodeItem> items;
  int64_t offset = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (rows[i].empty()) continue;
    items.push_back({.state = jobs[i]->speculation->draft_state.get(),
                     .token = rows[i][0],
                     .logits = logits.data() + offset * V,
                     .draft = rows[i].subspan(1)});
    offset += static_cast<int64_t>(rows[i].size());
  }
  ++stats.rounds;
  stats.rows += total;
  return engine_->Decode(items);
}

void DraftModel::Settle(Speculation& s, int64_t context_before, int64_t k, int64_t accepted) {
  if (k <= 0 || s.draft_state == nullptr) return;
  // The draft state fed the step's input at context_before - 1 and drafts 1..k-1 after it; those
  // the target accepted stay, the rest are taken back.
  s.draft_length = context_before + std::min(accepted, k - 1);
  s.draft_state->length = s.draft_length;
}

void ProposeByLookup(const SpeculativeConfig& config, DraftJob& job) {
  // The last kLookupWindow tokens only: a scan costs O(window x n) each step of each request.
  const std::span<const int32_t> context(*job.context);
  const size_t window = std::min<size_t>(context.size(), kLookupWindow);
  job.speculation->draft = model::ProposeByLookup(context.last(window), job.tokens,
                                                  config.lookup_min, config.lookup_max);
  job.speculation->weights.clear();
}

}  // namespace baton::decode_node
