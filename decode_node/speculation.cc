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

absl::StatusOr<SpeculativeConfig> ParseSpeculative(const std::string& value, int64_t tokens,
                                                   const std::string& policy,
                                                   const ModelConfig& target) {
  SpeculativeConfig config;
  if (policy != "cost" && policy != "acceptance") {
    return absl::InvalidArgumentError(
        absl::StrCat("--speculative-policy: '", policy, "' is unknown; allowed: cost, acceptance"));
  }
  config.price_drafts = policy == "cost";
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
  switch (sampling.speculative()) {
    case v1::SPECULATIVE_OFF:
      s.drafter = Drafter::kOff;
      break;
    case v1::SPECULATIVE_NGRAM:
      s.drafter = Drafter::kNgram;
      break;
    case v1::SPECULATIVE_DRAFT:
      if (!has_draft_model) {
        return absl::FailedPreconditionError(
            "sampling.speculative: DRAFT, but this decode node serves no draft model (it runs "
            "with --speculative draft:DIR for that); use NGRAM or DEFAULT");
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
  const model::DeviceFlags on_cpu{.device = "cpu", .weights = device.weights};
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

absl::Status DraftModel::Propose(std::span<DraftJob> jobs, int64_t* rounds_run, int64_t* rows_fed) {
  model::Engine& engine = *engine_;
  const ModelConfig& config = engine.config();
  const int64_t V = config.vocab_size, feed = 1 + config.max_backtrack;
  std::vector<DraftJob*> active;
  for (DraftJob& job : jobs) {
    Speculation& s = *job.speculation;
    s.draft.clear();
    s.weights.clear();
    // The draft model's own rings take back at most its max_backtrack rows.
    job.tokens = std::min(job.tokens, config.max_backtrack);
    const int64_t context = static_cast<int64_t>(job.context->size());
    if (job.tokens <= 0 || s.draft_unavailable || context < 2) continue;
    if (context + job.tokens > config.max_position_embeddings) {
      // Past the draft model's context: the request goes on undrafted.
      s.draft_unavailable = true;
      s.draft_state.reset();
      continue;
    }
    if (s.draft_state == nullptr) {
      // The first draft: prefill everything but the step's input.
      absl::StatusOr<std::unique_ptr<model::SequenceState>> state = engine.NewState();
      if (!state.ok()) {
        s.draft_unavailable = true;
        continue;
      }
      const std::span<const int32_t> prompt(job.context->data(), context - 1);
      absl::StatusOr<model::PrefillResult> prefilled =
          engine.Prefill(prompt, {.mode = model::TruncationMode::kOff}, **state);
      if (!prefilled.ok()) {
        // This request goes on undrafted; the others still draft.
        s.draft_unavailable = true;
        continue;
      }
      s.draft_state = *std::move(state);
      s.draft_length = context - 1;
    }
    active.push_back(&job);
  }
  std::vector<float> logits;
  std::vector<model::DecodeItem> items;
  // Rows fed for each active job: the context it has not seen yet, then its own drafts.
  auto step = [&](auto rows_of) -> absl::Status {
    items.clear();
    std::vector<int64_t> offsets;
    int64_t total = 0;
    for (DraftJob* job : active) {
      const std::span<const int32_t> rows = rows_of(*job);
      offsets.push_back(total);
      total += static_cast<int64_t>(rows.size());
    }
    logits.resize(std::max<int64_t>(total, 1) * V);
    size_t i = 0;
    for (DraftJob* job : active) {
      const std::span<const int32_t> rows = rows_of(*job);
      if (!rows.empty()) {
        items.push_back({.state = job->speculation->draft_state.get(),
                         .token = rows[0],
                         .logits = logits.data() + offsets[i] * V,
                         .draft = rows.subspan(1)});
      }
      ++i;
    }
    if (items.empty()) return absl::OkStatus();
    if (rounds_run != nullptr) *rounds_run += 1;
    if (rows_fed != nullptr) *rows_fed += total;
    return engine.Decode(items);
  };
  auto fail = [&](absl::Status status) {
    for (DraftJob* job : active) {
      job->speculation->draft.clear();
      job->speculation->weights.clear();
      job->speculation->draft_state.reset();
      job->speculation->draft_unavailable = true;
    }
    return status;
  };
  // Catch up (a request that drafted nothing for a while) in runs the rings can take.
  auto unseen = [&](DraftJob& job) {
    const int64_t from = job.speculation->draft_length;
    return std::span<const int32_t>(*job.context).subspan(from);
  };
  while (true) {
    bool behind = false;
    for (DraftJob* job : active)
      behind = behind || static_cast<int64_t>(unseen(*job).size()) > feed;
    if (!behind) break;
    absl::Status s = step([&](DraftJob& job) {
      const std::span<const int32_t> rows = unseen(job);
      // Leave at least one row for the drafting step below.
      return static_cast<int64_t>(rows.size()) > feed ? rows.first(feed) : rows.first(0);
    });
    if (!s.ok()) return fail(s);
    for (DraftJob* job : active) {
      job->speculation->draft_length = job->speculation->draft_state->length;
    }
  }
  // Round 1 feeds the unseen context (1 or 2 rows) and drafts from its last row; each later
  // round feeds the previous draft.
  int64_t rounds = 0;
  for (DraftJob* job : active) rounds = std::max(rounds, job->tokens);
  for (int64_t r = 0; r < rounds; ++r) {
    absl::Status s = step([&](DraftJob& job) -> std::span<const int32_t> {
      if (job.tokens <= r) return {};
      if (r == 0) return unseen(job);
      return std::span<const int32_t>(job.speculation->draft).subspan(r - 1, 1);
    });
    if (!s.ok()) return fail(s);
    int64_t offset = 0;
    for (DraftJob* job : active) {
      int64_t rows = 0;
      if (job->tokens > r) rows = r == 0 ? static_cast<int64_t>(unseen(*job).size()) : 1;
      if (rows > 0) {
        const std::span<const float> last(logits.data() + (offset + rows - 1) * V,
                                          static_cast<size_t>(V));
        Pick(last, *job, static_cast<uint64_t>(r));
      }
      offset += rows;
    }
  }
  return absl::OkStatus();
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
