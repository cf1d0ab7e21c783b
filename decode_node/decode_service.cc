#include "baton/decode_node/decode_service.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "baton/common/log.h"
#include "baton/common/metrics.h"
#include "baton/common/rpc.h"
#include "baton/common/security.h"
#include "baton/kvstore/ttft_model.h"
#include "baton/model/speculative.h"
#include "decode_metrics.h"
#include "request.h"

namespace baton::decode_node {
namespace {

using Clock = std::chrono::steady_clock;
using security::Role;
// How often a stream handler looks at its client's call between its request's notifications:
// gRPC's synchronous API says nothing when a client cancels or its deadline passes.
constexpr auto kCallCheck = std::chrono::milliseconds(20);
// Replay rows a step takes when no stream is decoding (StepPolicy::idle_replay_rows).
constexpr int64_t kIdleReplayRows = 512;

}  // namespace

DecodeService::DecodeService(model::Engine& model, const DecodeOptions& options)
    : model_(model), options_(options) {
  const model::StateLayout layout = model.state_layout();
  const uint64_t bytes = StatePool::BytesFor(layout, options.slots, options.pages);
  if (options.use_ucx) {
    auto worker = transfer::UcxWorker::Create(
        {.peer_error_handling = options.ucx_peer_errors,
         .allow_unprotected_tcp = options.ucx_allow_unprotected_tcp});
    auto memory = worker.ok()
                      ? (*worker)->Allocate(bytes)
                      : absl::StatusOr<std::unique_ptr<transfer::UcxMemory>>(worker.status());
    if (memory.ok()) {
      ucx_ = *std::move(worker);
      ucx_memory_ = *std::move(memory);
    } else {
      log::Warn("UCX unavailable; serving the gRPC transport only",
                {{"error", std::string(memory.status().message())}});
    }
  }
  pool_ = std::make_unique<StatePool>(
      layout, options.slots, options.pages,
      ucx_memory_ != nullptr ? reinterpret_cast<void*>(ucx_memory_->address()) : nullptr);
  if (options.poison_freed_memory) pool_->EnablePoison();
  model::Backend& backend = model.backend();
  if (!backend.host_memory()) {
    engine_pool_ = model::BackendArray<char>(backend, pool_->bytes());
    if (engine_pool_.data() == nullptr) {
      status_ = absl::ResourceExhaustedError(
          absl::StrCat("no ", model::DeviceName(backend.device()), " memory for the state pool (",
                       pool_->bytes(), " bytes); lower --slots or --pages"));
    } else if (absl::Status pinned = backend.PinHost(pool_->base(), pool_->bytes()); !pinned.ok()) {
      log::Warn("state pool not page-locked; staging copies run slower",
                {{"error", std::string(pinned.message())}});
    }
  }
  auto with_faults = [&](std::unique_ptr<transfer::Transport> transport) {
    if (!options.transfer_faults.has_value()) return transport;
    return transfer::MakeFaultInjectingTransport(std::move(transport), *options.transfer_faults);
  };
  if (ucx_ != nullptr) ucx_transport_ = with_faults(transfer::MakeUcxTransport(*ucx_));
  grpc_transport_ = with_faults(transfer::MakeGrpcTransport());
  metrics_ = std::make_unique<Metrics>();
  idle_watch_ = std::make_unique<StreamWatch>(options.stream_idle_timeout, "decode");
  pool_collector_ = metrics::AddCollector([this] {
    const v1::LoadReport load = Load();
    const double pages = static_cast<double>(load.total_pages());
    const double used = pages - static_cast<double>(load.free_pages());
    const double slots = load.total_slots();
    auto gauge = [](const char* name, const char* help, double value) {
      return metrics::GaugeFamily(name, help, {{{}, value}});
    };
    return std::vector<prometheus::MetricFamily>{
        gauge("baton_decode_running", "Requests holding state on this node",
              load.active_requests()),
        gauge("baton_decode_queue_depth", "Reservations waiting for pool memory",
              load.queued_requests()),
        gauge("baton_pool_pages_used", "Block-KV pages in use", used),
        gauge("baton_pool_pages_capacity", "Block-KV pages in the pool", pages),
        gauge("baton_pool_slots_used", "State slots (rings) in use", slots - load.free_slots()),
        gauge("baton_pool_slots_capacity", "State slots in the pool", slots),
        gauge("baton_pool_usage_ratio", "Share of block-KV pages in use (0 to 1)",
              pages > 0 ? used / pages : 0),
        gauge("baton_pool_poison_violations",
              "Writes found in freed pool memory (counted with --poison-freed-memory only)",
              static_cast<double>(pool_->poison_violations()))};
  });
  watchdog_ = std::make_unique<Watchdog>("decode", std::chrono::milliseconds(options.watchdog_ms),
                                         [this] { return stepping_.load(); });
  if (backend.concurrent()) {
    shadows_ = std::make_unique<ShadowRunner>(
        model, options.fidelity_queue, std::chrono::milliseconds(options.fidelity_inject_stall_ms));
  }
  decode_thread_ = std::thread([this] { DecodeLoop(); });
  reap_thread_ = std::thread([this] { ReapLoop(); });
}

DecodeService::~DecodeService() {
  shadows_.reset();  // its last outcomes still reach the requests and metrics
  {
    absl::MutexLock lock(&mutex_);
    stop_ = true;
    for (auto& [id, r] : requests_) r->progress.SignalAll();
    requests_.clear();
  }
  work_.SignalAll();
  deadline_.SignalAll();
  freed_.SignalAll();
  decode_thread_.join();
  reap_thread_.join();
  if (engine_pool_.data() != nullptr) model_.backend().UnpinHost(pool_->base());
  pool_.reset();
  ucx_memory_.reset();
}

float* DecodeService::InEngine(float* pool_address) const {
  if (engine_pool_.data() == nullptr) return pool_address;
  const char* base = static_cast<const char*>(pool_->base());
  return reinterpret_cast<float*>(engine_pool_.data() +
                                  (reinterpret_cast<const char*>(pool_address) - base));
}

std::shared_ptr<Request> DecodeService::Owned(const std::string& caller, const std::string& id,
                                              Role role) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return nullptr;
  const Request& r = *it->second;
  // Another identity's reservation looks exactly like a missing one.
  const std::string& owner = role == Role::kPrefill ? r.prefill_identity : r.router_identity;
  if (security::Enabled() && caller != owner) return nullptr;
  return it->second;
}

void DecodeService::Drain(std::chrono::steady_clock::time_point deadline) {
  absl::MutexLock lock(&mutex_);
  draining_ = true;
  freed_.SignalAll();  // reservations waiting for memory are refused now
  log::Info("decode node draining", {{"requests", static_cast<int64_t>(requests_.size())}});
  const absl::Time until = absl::Now() + absl::FromChrono(deadline - Clock::now());
  while (!requests_.empty()) {
    if (freed_.WaitWithDeadline(&mutex_, until)) break;  // true: the deadline passed
  }
  if (!requests_.empty()) {
    log::Warn("drain timeout: requests are cut",
              {{"requests", static_cast<int64_t>(requests_.size())}});
  }
}

void DecodeService::Erase(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  it->second->progress.SignalAll();  // its stream ends
  requests_.erase(it);  // memory returns when the Request is destroyed
  freed_.SignalAll();
}

// One piece of a request's replay in a step: its rows, gathered from the pool pages into one
// host buffer, and the logits the step returns for them.
struct DecodeService::ReplayPiece {
  std::shared_ptr<Request> request;
  model::ReplayItem item;
  std::vector<float> boundary;
  std::vector<float> logits;
};

DecodeService::ReplayPiece DecodeService::GatherPiece(const std::shared_ptr<Request>& r,
                                                      int64_t rows) const {
  const int64_t d = model_.config().hidden_size, V = model_.config().vocab_size;
  const Generation& g = r->generation;
  ReplayPiece piece{.request = r};
  piece.boundary.resize(rows * d);
  // Row j of the handed-over rows is byte j * d * 4 of the pages counted back to back.
  const std::vector<float*>& pages = r->reservation.boundary_pages;
  const uint64_t page = sizeof(float) * model_.state_layout().page_floats();
  uint64_t from = sizeof(float) * (g.replay_next - g.replay.s_valid) * d;
  char* to = reinterpret_cast<char*>(piece.boundary.data());
  for (uint64_t left = sizeof(float) * rows * d; left > 0;) {
    const uint64_t n = std::min(left, page - from % page);
    std::memcpy(to, reinterpret_cast<const char*>(pages[from / page]) + from % page, n);
    to += n;
    from += n;
    left -= n;
  }
  piece.item = {.state = &r->reservation.computed(),
                .spec = g.replay,
                .q_start = g.replay_next,
                .rows = rows,
                .boundary = piece.boundary.data(),
                .all_logits = !g.prompt_tokens.empty()};
  piece.logits.resize(model::ReplayLogitRows(piece.item) * V);
  piece.item.logits = piece.logits.data();
  return piece;
}

void DecodeService::FinishPiece(ReplayPiece& piece) {
  Request& r = *piece.request;
  const int64_t L = r.generation.replay.prompt_len;
  if (!SettleReplay(r.generation, piece.item.rows, piece.logits, model_.config().vocab_size)) {
    return;
  }
  r.reservation.FreeBoundaryPages();
  const size_t V = static_cast<size_t>(model_.config().vocab_size);
  r.fidelity.Keep(r.generation.tokens.back(), std::span<const float>(piece.logits).last(V));
  InjectRingFault(r);
  r.replay_ms = std::chrono::duration<double, std::milli>(Clock::now() - r.committed_at).count();
  // The replay's rate as the router prices it: its whole time here (in the batch, with the
  // other requests' steps) over its work. Sums weighted by the work, a fifth forgotten each
  // time, as a prefill node folds its compute rate.
  const double gflop =
      kvstore::EstimatePrefillWork(model_.config(), L, L, r.generation.replay.s_valid)
          .replayed_gflop;
  if (gflop > 0) {
    replay_ms_sum_ = 0.8 * replay_ms_sum_ + r.replay_ms;
    replay_gflop_sum_ = 0.8 * replay_gflop_sum_ + gflop;
    ++replay_samples_;
    metrics_->replay_ms_per_gflop.Set(replay_ms_sum_ / replay_gflop_sum_);
  }
  r.phase = r.generation.finished() ? Phase::kFinished : Phase::kCommitted;
  MaybeShadow(piece.request);
}

void DecodeService::DecodeLoop() {
  const StepPolicy policy{.max_batch = options_.max_batch,
                          .replay_rows = options_.replay_rows_per_step,
                          .idle_replay_rows = kIdleReplayRows,
                          .replay_step_budget = options_.replay_step_budget};
  absl::MutexLock lock(&mutex_);
  int64_t steps = 0;
  while (!stop_) {
    watchdog_->Beat();
    const auto turn_start = Clock::now();
    // Plan: over the requests that decode or replay, in the node's order.
    std::vector<std::shared_ptr<Request>> held;
    std::vector<StepCandidate> candidates;
    for (auto& [id, r] : requests_) {
      if (r->phase != Phase::kCommitted && r->phase != Phase::kReplaying) continue;
      held.push_back(r);
      candidates.push_back({.work = r->phase == Phase::kCommitted ? StepCandidate::Work::kDecode
                                                                  : StepCandidate::Work::kReplay,
                            .generation = &r->generation});
    }
    const DecodePlan plan = PlanStep(candidates, policy, costs_, replay_costs_);
    stepping_ = !plan.empty();
    if (plan.empty()) {
      work_.Wait(&mutex_);  // a commit or the node's stop signals
      continue;
    }
    if (++cost_log_ % 256 == 0) {
      log::Debug("decode step", {{"plan", DescribePlan(plan)},
                                 {"step_fixed_us", costs_.target.fixed() * 1e6},
                                 {"step_per_row_us", costs_.target.per_row() * 1e6},
                                 {"draft_share_us", costs_.draft_share * 1e6},
                                 {"replay_row_us", replay_costs_.seconds_per_row * 1e6}});
    }
    RunStep(held, plan);
    // The turn's whole time, as the streams see it between tokens; the summary at once while
    // the log is short, then every 64 steps.
    if (logged_rows_ >= 0) {
      step_log_.Add(logged_rows_, logged_pieces_,
                    std::chrono::duration<double>(Clock::now() - turn_start).count());
      if (++steps % 64 == 0 || step_log_.size() < 256) Publish();
    }
  }
}

void DecodeService::Publish() {
  reported_ = step_log_.Summarize(costs_.target, replay_costs_.per_position);
  metrics_->step_fixed_ms.Set(reported_.fixed * 1e3);
  metrics_->step_per_row_ms.Set(reported_.per_row * 1e3);
  metrics_->replay_piece_fixed_ms.Set(reported_.piece_fixed * 1024e3);
  metrics_->replay_piece_row_ms.Set(reported_.piece_row * 1024e3);
  metrics_->step_stretch.Set(reported_.stretch);
  for (size_t q = 0; q < StepLog::kQuantiles.size(); ++q) {
    metrics_->step_stretch_quantiles[q]->Set(reported_.quantiles[q]);
  }
}

void DecodeService::RunStep(std::vector<std::shared_ptr<Request>>& held, const DecodePlan& plan) {
  std::vector<std::shared_ptr<Request>> batch;
  std::vector<DraftJob> jobs;
  for (const DecodePlan::Decode& d : plan.decode) {
    Generation& g = held[d.candidate]->generation;
    batch.push_back(held[d.candidate]);
    jobs.push_back({.context = &g.context,
                    .speculation = &g.speculation,
                    .tokens = d.drafts,
                    .sampling = g.sampling,
                    .step = g.completion});
  }
  std::vector<ReplayPiece> pieces;
  for (const DecodePlan::Replay& p : plan.replay) {
    pieces.push_back(GatherPiece(held[p.candidate], p.rows));
  }
  // Run: unlocked (request.h: what the decode thread owns during a step).
  mutex_.Unlock();
  if (options_.inject_step_stall_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.inject_step_stall_ms));
  }
  const auto step_start = Clock::now();
  ProposeDrafts(jobs);
  const int64_t V = model_.config().vocab_size;
  std::vector<model::DecodeItem> items;
  int64_t decode_rows = 0;  // an input row and the drafts proposed (at most those planned)
  for (const std::shared_ptr<Request>& r : batch) {
    const std::vector<int32_t>& draft = r->generation.speculation.draft;
    decode_rows += 1 + static_cast<int64_t>(draft.size());
    r->logits.resize((1 + draft.size()) * V);
    items.push_back({.state = &r->reservation.computed(),
                     .token = r->generation.next_input,
                     .logits = r->logits.data(),
                     .draft = draft});
  }
  std::vector<model::ReplayItem> replay;
  for (const ReplayPiece& piece : pieces) replay.push_back(piece.item);
  const auto target_start = Clock::now();
  const absl::Status status = model_.Step(items, replay);
  const auto step_end = Clock::now();
  metrics_->step_seconds.Observe(std::chrono::duration<double>(step_end - step_start).count());
  metrics_->batch_size.Observe(static_cast<double>(batch.size()));
  logged_rows_ = -1;
  if (status.ok()) {
    MeasureStep(static_cast<int64_t>(batch.size()), decode_rows, pieces,
                std::chrono::duration<double>(step_end - target_start).count());
  } else {
    log::Error("decode step failed",
               {{"plan", DescribePlan(plan)}, {"error", std::string(status.message())}});
  }
  // Verification: the accepted drafts, then one token of the target's own; without a draft,
  // the one token an ordinary step samples.
  std::vector<model::Verdict> verdicts(batch.size());
  for (size_t i = 0; status.ok() && i < batch.size(); ++i) {
    const Generation& g = batch[i]->generation;
    verdicts[i] = model::VerifyDraft(batch[i]->logits, g.speculation.draft, g.speculation.weights,
                                     g.sampling, g.completion);
  }
  // Settle: under the lock again.
  mutex_.Lock();
  for (size_t i = 0; i < batch.size(); ++i) {
    Request& r = *batch[i];
    const int64_t drafts = static_cast<int64_t>(r.generation.speculation.draft.size());
    if (status.ok()) SettleRequest(r, drafts, verdicts[i]);
    if (!status.ok()) r.phase = Phase::kFinished;  // finish UNSPECIFIED: the stream fails
    MaybeShadow(batch[i]);
    r.progress.SignalAll();
  }
  for (ReplayPiece& piece : pieces) {
    if (status.ok()) FinishPiece(piece);
    if (!status.ok()) piece.request->phase = Phase::kFinished;
    piece.request->progress.SignalAll();
  }
}

void DecodeService::ProposeDrafts(std::span<DraftJob> jobs) {
  std::vector<DraftJob> by_model;
  for (DraftJob& job : jobs) {
    job.speculation->draft.clear();
    job.speculation->weights.clear();
    if (job.tokens <= 0) continue;
    if (job.speculation->drafter == Drafter::kNgram) ProposeByLookup(options_.speculative, job);
    if (job.speculation->drafter == Drafter::kDraft) by_model.push_back(job);
  }
  if (by_model.empty()) return;
  ProposeStats drafted;
  const auto draft_start = Clock::now();
  // The draft model takes in new prompts a piece per step, as replay does.
  if (absl::Status s =
          options_.draft_model->Propose(by_model, options_.draft_rows_per_step, &drafted);
      !s.ok()) {
    // The target's step goes on undrafted; the requests stop drafting with the model.
    log::Warn("draft model step failed", {{"error", std::string(s.message())}});
  } else if (drafted.rounds > 0 && drafted.context_rows == 0) {
    // A round's cost per request drafting in it (the first round feeds a row or two more);
    // a step that also took in context says nothing about a round.
    const double seconds = std::chrono::duration<double>(Clock::now() - draft_start).count();
    costs_.AddDraftRound(seconds / drafted.rounds,
                         std::max<int64_t>(1, drafted.rows / drafted.rounds));
  }
}

void DecodeService::SettleRequest(Request& r, int64_t drafts, const model::Verdict& verdict) {
  const DecodeSettled settled = SettleDecode(r.generation, drafts, verdict);
  r.reservation.computed().length -= settled.taken_back;
  // Token j of the step's emitted ones was sampled from its row j (the input row's, then each
  // accepted draft's).
  const size_t V = static_cast<size_t>(model_.config().vocab_size);
  const size_t first = r.generation.tokens.size() - static_cast<size_t>(settled.emitted);
  for (size_t j = 0; j < static_cast<size_t>(settled.emitted); ++j) {
    r.fidelity.Keep(r.generation.tokens[first + j],
                    std::span<const float>(r.logits).subspan(j * V, V));
  }
  metrics_->tokens.Increment(static_cast<double>(settled.emitted));
  metrics_->tokens_per_step.Observe(static_cast<double>(settled.emitted));
  if (r.generation.finished()) {
    r.phase = Phase::kFinished;
  } else {  // a request's last step may stop inside its tokens: that one is not counted
    tokens_per_step_ = tokens_per_step_ <= 0 ? static_cast<double>(settled.emitted)
                                             : 0.99 * tokens_per_step_ + 0.01 * settled.emitted;
  }
  if (settled.drafted > 0) {
    metrics_->draft_tokens.Increment(static_cast<double>(settled.drafted));
    metrics_->accepted_draft_tokens.Increment(static_cast<double>(settled.accepted));
  }
}

void DecodeService::MeasureStep(int64_t requests, int64_t decode_rows,
                                std::span<const ReplayPiece> pieces, double target_seconds) {
  std::vector<PieceSize> sizes;
  for (const ReplayPiece& piece : pieces) {
    sizes.push_back({.prompt_len = piece.item.spec.prompt_len, .rows = piece.item.rows});
    metrics_->replay_rows.Increment(static_cast<double>(piece.item.rows));
  }
  FoldStepTime(costs_, replay_costs_, requests, decode_rows, sizes, target_seconds);
  logged_rows_ = decode_rows;
  logged_pieces_ = std::move(sizes);
}

grpc::Status DecodeService::Stream(grpc::ServerContext* context, const v1::StreamRequest* request,
                                   grpc::ServerWriter<v1::DecodeOutput>* writer) {
  if (absl::Status s = security::Authorize(*context, {Role::kRouter}, "DecodeNode/Stream");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  const auto start = Clock::now();
  StreamLog line;
  const grpc::Status status = ToGrpcStatus(RunStream(context, request, writer, &line));
  metrics_->requests.Add({{"outcome", metrics::OutcomeLabel(status.error_code())}}).Increment();
  if (line.span.trace_id.empty()) line.span = trace::StartServerSpan(*context);  // not found
  line.stage_ms["stream"] = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (status.ok()) {
    log::Info(line.span.Ids(), "stream finished",
              {{"request_id", line.request_id},
               {"reservation_id", request->reservation_id()},
               {"tokens", line.tokens},
               {"stage_ms", line.stage_ms}});
  } else {
    log::Warn(line.span.Ids(), "stream ended",
              {{"request_id", line.request_id},
               {"reservation_id", request->reservation_id()},
               {"code", metrics::OutcomeLabel(status.error_code())},
               {"error", status.error_message()},
               {"stage_ms", line.stage_ms}});
  }
  return status;
}

absl::Status DecodeService::RunStream(grpc::ServerContext* context,
                                      const v1::StreamRequest* request,
                                      grpc::ServerWriter<v1::DecodeOutput>* writer,
                                      StreamLog* line) {
  absl::MutexLock lock(&mutex_);
  std::shared_ptr<Request> r =
      Owned(security::PeerIdentity(*context), request->reservation_id(), Role::kRouter);
  if (r == nullptr || r->phase == Phase::kReserved || r->phase == Phase::kTransferring) {
    return absl::NotFoundError(
        absl::StrCat("reservation_id: no committed request '", request->reservation_id(), "'"));
  }
  line->request_id = r->request_id;
  line->span = r->span;
  line->stage_ms = {{"slot_wait", r->wait_ms}, {"transfer", r->transfer_ms}};
  r->attached = true;
  while (true) {
    const bool cancelled =
        context->IsCancelled() || stop_ || context->deadline() < std::chrono::system_clock::now();
    if (cancelled || !requests_.contains(r->id)) {
      Erase(r->id);
      return absl::CancelledError("stream cancelled; request freed");
    }
    // A client that asked for its shadow verification has it in the last output.
    const bool finished = r->phase == Phase::kFinished && !r->fidelity.pending;
    if (r->streamed < r->generation.tokens.size() || finished) {
      v1::DecodeOutput out;
      for (size_t i = r->streamed; i < r->generation.tokens.size(); ++i) {
        out.add_token_ids(r->generation.tokens[i]);
        out.add_logprobs(r->generation.logprobs[i]);
      }
      if (r->replay_ms >= 0 && !r->replay_reported && !r->generation.tokens.empty()) {
        // Replay-on-decode: the first token was sampled here; its replay's figures go with it.
        out.mutable_prompt_logprobs()->Assign(r->generation.prompt_logprobs.begin(),
                                              r->generation.prompt_logprobs.end());
        out.set_replay_ms(r->replay_ms);
        r->replay_reported = true;
        line->stage_ms["replay"] = r->replay_ms;
      }
      r->streamed = r->generation.tokens.size();
      line->tokens = r->streamed;
      out.set_draft_tokens(r->generation.speculation.drafted);
      out.set_accepted_draft_tokens(r->generation.speculation.accepted);
      if (finished) out.set_finish_reason(r->generation.finish);
      if (finished && r->fidelity.reply) *out.mutable_fidelity() = r->fidelity.result;
      const bool written = WriteUnlocked(context, writer, out);
      if (!written || finished) {
        Erase(r->id);
        if (!written) return absl::CancelledError("client went away");
        if (r->generation.finish == v1::FINISH_REASON_UNSPECIFIED) {
          return absl::InternalError("decode step failed");
        }
        return absl::OkStatus();
      }
      continue;
    }
    // The request's steps, its erasure and the node's stop signal; the client's cancel, which
    // the synchronous API does not signal, is seen within kCallCheck.
    r->progress.WaitWithTimeout(&mutex_, absl::FromChrono(kCallCheck));
  }
}

bool DecodeService::WriteUnlocked(grpc::ServerContext* context,
                                  grpc::ServerWriter<v1::DecodeOutput>* writer,
                                  const v1::DecodeOutput& out) {
  mutex_.Unlock();
  bool written;
  {
    StreamWatch::Writing writing(*idle_watch_, context);
    written = writer->Write(out);
  }
  mutex_.Lock();
  return written;
}

grpc::Status DecodeService::Release(grpc::ServerContext* context, const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* reply) {
  if (absl::Status s = security::Authorize(*context, {Role::kRouter}, "DecodeNode/Release");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::MutexLock lock(&mutex_);
  if (Owned(security::PeerIdentity(*context), request->reservation_id(), Role::kRouter) !=
      nullptr) {
    Erase(request->reservation_id());
  }
  return grpc::Status::OK;
}

v1::LoadReport DecodeService::Load() const {
  absl::MutexLock lock(&mutex_);
  v1::LoadReport load;
  load.set_active_requests(static_cast<uint32_t>(requests_.size()));
  load.set_queued_requests(static_cast<uint32_t>(waiting_));
  load.set_free_pages(pool_->free_pages());
  load.set_total_pages(pool_->total_pages());
  load.set_free_slots(static_cast<uint32_t>(pool_->free_slots()));
  load.set_total_slots(static_cast<uint32_t>(pool_->total_slots()));
  v1::DecodeRates& rates = *load.mutable_decode_rates();
  rates.set_step_fixed_ms(reported_.fixed * 1e3);
  rates.set_step_per_row_ms(reported_.per_row * 1e3);
  if (replay_gflop_sum_ > 0) rates.set_replay_ms_per_gflop(replay_ms_sum_ / replay_gflop_sum_);
  rates.set_replay_samples(replay_samples_);
  rates.set_tokens_per_step(tokens_per_step_);
  rates.set_replay_piece_fixed_ms(reported_.piece_fixed * 1024e3);
  rates.set_replay_piece_row_ms(reported_.piece_row * 1024e3);
  rates.set_step_stretch(reported_.stretch);
  rates.set_step_stretch_p10(reported_.quantiles[0]);
  rates.set_step_stretch_p50(reported_.quantiles[1]);
  rates.set_step_stretch_p90(reported_.quantiles[2]);
  rates.set_step_stretch_p99(reported_.quantiles[3]);
  *load.mutable_fidelity() = fidelity_report_;
  return load;
}

grpc::Status DecodeService::Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                                  v1::StatsResponse* reply) {
  if (absl::Status s = security::Authorize(*context, {Role::kRouter}, "DecodeNode/Stats");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  *reply->mutable_load() = Load();
  absl::MutexLock lock(&mutex_);
  reply->set_reservations(static_cast<uint32_t>(requests_.size()));
  uint32_t transferring = 0;
  for (const auto& [id, r] : requests_) transferring += r->phase == Phase::kTransferring ? 1 : 0;
  reply->set_transferring(transferring);
  return grpc::Status::OK;
}

void DecodeService::ReapLoop() {
  absl::MutexLock lock(&mutex_);
  while (!stop_) {
    // Until the first deadline of a reservation nobody streams; a new reservation, a commit
    // (which moves the deadline) and the node's stop notify.
    std::optional<Clock::time_point> next;
    for (const auto& [id, r] : requests_) {
      if (!r->attached && (!next.has_value() || r->deadline < *next)) next = r->deadline;
    }
    if (next.has_value()) {
      deadline_.WaitWithTimeout(&mutex_, absl::FromChrono(*next - Clock::now()));
    } else {
      deadline_.Wait(&mutex_);
    }
    const auto now = Clock::now();
    std::vector<std::string> expired;
    for (const auto& [id, r] : requests_) {
      if (!r->attached && now > r->deadline) expired.push_back(id);
    }
    for (const std::string& id : expired) {
      log::Warn("reservation expired; freed",
                {{"request_id", requests_.at(id)->request_id}, {"reservation_id", id}});
      metrics_->requests.Add({{"outcome", "expired"}}).Increment();
      Erase(id);
    }
  }
}

}  // namespace baton::decode_node
