#include "baton/decode_node/decode_service.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "baton/common/log.h"
#include "baton/common/metrics.h"
#include "baton/common/rpc.h"
#include "baton/common/security.h"
#include "baton/common/wire_bounds.h"
#include "baton/kvstore/ttft_model.h"
#include "baton/model/speculative.h"
#include "baton/transfer/state_block.h"

namespace baton::decode_node {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMaxReservationTimeoutMs = 10 * 60 * 1000;
// A commit's read ends this long before the caller's deadline.
constexpr auto kCommitMargin = std::chrono::milliseconds(500);
// How often a wait looks at its caller's call and at memory freed late. Everything else that
// can end a wait (a token, a commit, a release, a drain) notifies; but gRPC's synchronous API
// says nothing when a client cancels or its deadline passes, and a slot freed by the last
// holder of a request (an in-flight step) returns to the pool without the lock.
constexpr auto kCallCheck = std::chrono::milliseconds(20);
// Replay rows a step takes when no stream is decoding (DecodeLoop).
constexpr int64_t kIdleReplayRows = 512;

using security::Role;

// The wire bounds of a reservation; past them the node refuses before it sizes any memory.
absl::Status ValidateReserve(const v1::ReserveRequest& request, const std::string& fingerprint,
                             const ModelConfig& config) {
  if (request.request_id().empty()) {
    return absl::InvalidArgumentError("request_id: must not be empty");
  }
  if (absl::Status s = CheckRequestId("request_id", request.request_id()); !s.ok()) return s;
  for (absl::Status s :
       {CheckBytes("prefill_identity", request.prefill_identity(), kMaxIdentityBytes),
        CheckBytes("prefill_address", request.prefill_address(), kMaxAddressBytes),
        CheckBytes("prefill_ucx_worker_address", request.prefill_ucx_worker_address(),
                   kMaxUcxAddressBytes)}) {
    if (!s.ok()) return s;
  }
  // Only "does not match": the node's own fingerprint is not the caller's to learn.
  if (request.model_fingerprint() != fingerprint) {
    return absl::FailedPreconditionError(
        "model_fingerprint: does not match the model this decode node serves");
  }
  const v1::SamplingParams& sampling = request.sampling();
  if (sampling.max_tokens() <= request.completed_tokens()) {
    return absl::InvalidArgumentError("sampling.max_tokens: must exceed completed_tokens");
  }
  if (absl::Status s = CheckSampling("sampling", sampling, config); !s.ok()) return s;
  if (!v1::Split_IsValid(request.split())) {
    return absl::InvalidArgumentError("split: must be PREFILL_ALL or REPLAY_ON_DECODE");
  }
  if (request.split() == v1::SPLIT_PREFILL_ALL
          ? request.boundary_rows() != 0
          : request.boundary_rows() > request.prompt_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "boundary_rows: ", request.boundary_rows(), "; it must be 0 under PREFILL_ALL and at most ",
        "prompt_tokens (", request.prompt_tokens(), ") under REPLAY_ON_DECODE"));
  }
  if (request.prompt_token_ids_size() != 0 &&
      static_cast<uint64_t>(request.prompt_token_ids_size()) != request.prompt_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt_token_ids: ", request.prompt_token_ids_size(), " ids; it must be empty or hold ",
        "prompt_tokens (", request.prompt_tokens(), ")"));
  }
  if (absl::Status s =
          model::CheckTokenIds(config, {request.prompt_token_ids().data(),
                                        static_cast<size_t>(request.prompt_token_ids_size())});
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_token_ids: ", s.message()));
  }
  return CheckSequenceLength("prompt_tokens", request.prompt_tokens(),
                             uint64_t{sampling.max_tokens()} - request.completed_tokens(), config);
}

// The plan a replay-on-decode StateBlock's replay follows (model::ReplaySpec of its header).
absl::StatusOr<model::TruncationSpec> ReplaySpecFor(const v1::StateHeader& h,
                                                    const ModelConfig& config) {
  absl::StatusOr<model::TruncationMode> mode = model::ModeFromProto(h.mode(), "header.mode");
  if (!mode.ok()) return mode.status();
  return model::ReplaySpec(config, h.prompt_len(), *mode, h.keep(), h.s_valid());
}

absl::Status NoReservation(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("reservation_id: no open reservation '", id, "'"));
}

}  // namespace

v1::FinishReason FinishReasonFor(int32_t token, uint32_t completion, uint32_t max_tokens,
                                 const std::set<int32_t>& stop_ids, bool ignore_eos,
                                 int64_t eos_token_id) {
  if (stop_ids.contains(token)) return v1::FINISH_REASON_STOP;
  if (!ignore_eos && token == eos_token_id) return v1::FINISH_REASON_EOS;
  if (completion >= max_tokens) return v1::FINISH_REASON_LENGTH;
  return v1::FINISH_REASON_UNSPECIFIED;
}

struct DecodeService::Metrics {
  prometheus::Family<prometheus::Counter>& requests = metrics::Counter(
      "baton_decode_requests_total",
      "Decode streams finished, by outcome (gRPC status name, or expired reservations)");
  prometheus::Counter& tokens =
      metrics::Counter("baton_decode_tokens_total", "Tokens sampled by decode steps").Add({});
  prometheus::Histogram& step_seconds =
      metrics::Histogram("baton_decode_step_seconds", "Time of one batched decode step")
          .Add({}, metrics::TokenLatencyBuckets());
  // The step-cost fit (DraftCosts::target) the node prices drafts with, for capacity plans
  // (`batonctl simulate --decode-rates step_fixed_ms=..,step_per_row_ms=..`).
  prometheus::Family<prometheus::Gauge>& step_cost = metrics::Gauge(
      "baton_decode_step_cost_ms",
      "The node's fit of a decode step's time: a fixed part and a part per row (0 until fitted)");
  prometheus::Gauge& step_fixed_ms = step_cost.Add({{"term", "fixed"}});
  prometheus::Gauge& step_per_row_ms = step_cost.Add({{"term", "per_row"}});
  // Replay-on-decode's measured rate, which the router prices replay with (LoadReport).
  prometheus::Gauge& replay_ms_per_gflop =
      metrics::Gauge("baton_decode_replay_ms_per_gflop",
                     "Replay-on-decode: time from a StateBlock's commit to its first token per "
                     "GFLOP of its replay (0 until a replay is measured)")
          .Add({});
  prometheus::Histogram& batch_size =
      metrics::Histogram("baton_decode_batch_size", "Requests in one decode step")
          .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256});
  prometheus::Counter& draft_tokens =
      metrics::Counter("baton_decode_draft_tokens_total",
                       "Tokens drafted for speculative decoding and verified by decode steps")
          .Add({});
  prometheus::Counter& accepted_draft_tokens =
      metrics::Counter("baton_decode_accepted_draft_tokens_total",
                       "Drafted tokens the target accepted (each saved one decode step)")
          .Add({});
  prometheus::Histogram& tokens_per_step =
      metrics::Histogram("baton_decode_tokens_per_step",
                         "Tokens a request gained in one decode step (1 without speculation; up "
                         "to the drafted tokens plus one with it)")
          .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 3, 4, 5, 6, 8, 12, 16});
  prometheus::Histogram& acceptance_rate =
      metrics::Histogram("baton_decode_acceptance_rate",
                         "Share of a finished request's drafted tokens that the target accepted")
          .Add({}, prometheus::Histogram::BucketBoundaries{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8,
                                                           0.9, 1.0});
  prometheus::Counter& replay_rows =
      metrics::Counter("baton_decode_replay_rows_total",
                       "Boundary rows replayed through the consumer layers (replay-on-decode)")
          .Add({});
  prometheus::Family<prometheus::Counter>& pulled_bytes =
      metrics::Counter("baton_transfer_pulled_bytes_total",
                       "StateBlock bytes read from prefill nodes into reservations, by transport");
  prometheus::Family<prometheus::Histogram>& pull_seconds = metrics::Histogram(
      "baton_transfer_pull_seconds", "Time to read one StateBlock's regions, by transport");
};

namespace {

// A request's block-KV pages in the engine's copy of the pool: the pool pages its host state
// (the transfer's target) holds, at the same offsets. The host state allocates and frees them.
class EnginePages : public model::PageAllocator {
 public:
  EnginePages(model::SequenceState& host, std::function<float*(float*)> in_engine)
      : host_(host), in_engine_(std::move(in_engine)) {}
  float* Allocate() override {
    if (!host_.EnsurePages((next_ + 1) * host_.layout().block_size).ok()) return nullptr;
    return in_engine_(host_.pages()[next_++]);
  }
  void Free(float*) override {}

 private:
  model::SequenceState& host_;
  std::function<float*(float*)> in_engine_;
  int64_t next_ = 0;
};

}  // namespace

struct DecodeService::Request {
  // The slot and unused page credit go back only when the last holder lets go: an in-flight
  // decode step keeps writing the rings of a request that was just cancelled.
  ~Request() {
    if (speculation.drafted > 0 && acceptance != nullptr) {
      acceptance->Observe(static_cast<double>(speculation.accepted) / speculation.drafted);
    }
    if (pool == nullptr) return;
    engine_state.reset();
    const int64_t used = static_cast<int64_t>(state->pages().size());
    state.reset();
    FreeBoundaryPages();
    pool->Unreserve(slot, reserved_pages - used - boundary_pages_taken);
  }
  // The boundary rows are replayed (or the request ends): their pages go back to the pool.
  void FreeBoundaryPages() {
    for (float* page : boundary_pages) pool->Free(page);
    boundary_pages.clear();
  }
  StatePool* pool = nullptr;
  prometheus::Histogram* acceptance = nullptr;  // observes the request's acceptance rate
  std::string id;          // the reservation id (random, chosen here)
  std::string request_id;  // the client's request id, for logs
  trace::Span span;  // the node's span of the request's trace, a child of the router's Reserve
  double wait_ms = 0, transfer_ms = 0;  // in the slot queue; reading the StateBlock
  // Who may use the reservation (certificate identities; empty without mutual TLS): the
  // router that reserved it streams and releases, the prefill node it named pushes and commits.
  std::string router_identity;
  std::string prefill_identity;
  std::string prefill_address;  // where the gRPC transport reads from
  std::string prefill_ucx_address;  // the UCX worker the prefill node registered (may be empty)
  Phase phase = Phase::kReserved;
  int64_t slot = -1;
  int64_t reserved_pages = 0;
  std::unique_ptr<model::SequenceState> state;  // in the pool: what transfers write
  // On a device engine, the state the decode steps run on (the pool's copy in the engine's
  // memory, staged in at commit); null on a host-memory engine, which runs on `state`.
  std::unique_ptr<EnginePages> engine_pages;
  std::unique_ptr<model::SequenceState> engine_state;
  model::SequenceState& computed() { return engine_state != nullptr ? *engine_state : *state; }
  uint32_t prompt_len = 0;
  model::SamplingParams sampling;
  uint32_t max_tokens = 0;
  std::set<int32_t> stop_ids;
  bool ignore_eos = false;
  uint32_t completion = 0;  // completion tokens so far, counting those before this node
  int32_t next_input = 0;
  std::vector<int32_t> tokens;  // tokens produced here after the first (which the router has)
  std::vector<float> logprobs;
  size_t streamed = 0;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  Clock::time_point deadline;  // reservation: commit by then; committed: attach by then
  bool attached = false;
  std::vector<float> logits;
  // Replay-on-decode: the reservation's split and most boundary rows; the pool pages the rows
  // land in (freed once replayed); the replay's plan and its next row; the prompt, when its
  // logprobs are asked for, and those computed so far.
  v1::Split split = v1::SPLIT_PREFILL_ALL;
  uint32_t boundary_rows = 0;
  std::vector<float*> boundary_pages;
  int64_t boundary_pages_taken = 0;
  model::TruncationSpec replay;
  int64_t replay_next = 0;
  std::vector<int32_t> prompt_tokens;
  std::vector<float> prompt_logprobs;
  Clock::time_point committed_at;
  double replay_ms = -1;  // set once the first token is sampled; sent with it
  bool replay_reported = false;
  // Speculative decoding: the prompt and every token since (the last is the next step's input,
  // at position context.size() - 1), kept when the router sent the prompt; and how the request
  // drafts (speculation.h).
  std::vector<int32_t> context;
  Speculation speculation;
};

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
  decode_thread_ = std::thread([this] { DecodeLoop(); });
  reap_thread_ = std::thread([this] { ReapLoop(); });
}

DecodeService::~DecodeService() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    requests_.clear();
  }
  changed_.notify_all();
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

std::shared_ptr<DecodeService::Request> DecodeService::Owned(const std::string& caller,
                                                             const std::string& id,
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
  std::unique_lock<std::mutex> lock(mutex_);
  draining_ = true;
  changed_.notify_all();
  log::Info("decode node draining", {{"requests", static_cast<int64_t>(requests_.size())}});
  changed_.wait_until(lock, deadline, [this] { return requests_.empty(); });
  if (!requests_.empty()) {
    log::Warn("drain timeout: requests are cut",
              {{"requests", static_cast<int64_t>(requests_.size())}});
  }
}

void DecodeService::Erase(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  requests_.erase(it);  // memory returns when the Request is destroyed
  changed_.notify_all();
}

grpc::Status DecodeService::Reserve(grpc::ServerContext* context, const v1::ReserveRequest* request,
                                    v1::Reservation* reply) {
  return ToGrpcStatus(TakeReservation(*context, *request, *reply));
}

absl::Status DecodeService::TakeReservation(grpc::ServerContext& context,
                                            const v1::ReserveRequest& request,
                                            v1::Reservation& reply) {
  if (absl::Status s = security::Authorize(context, {Role::kRouter}, "DecodeNode/Reserve");
      !s.ok()) {
    return s;
  }
  const ModelConfig& config = model_.config();
  if (absl::Status s = ValidateReserve(request, model_.fingerprint(), config); !s.ok()) return s;
  absl::StatusOr<Speculation> speculation =
      SpeculationFor(request.sampling(), options_.speculative, options_.draft_model != nullptr);
  if (!speculation.ok()) return speculation.status();
  const auto& sampling = request.sampling();
  const int64_t positions = int64_t{request.prompt_tokens()} +
                            (int64_t{sampling.max_tokens()} - request.completed_tokens());
  const int64_t B = config.kv_block_size;
  const transfer::RegionSizes sizes = transfer::RegionSizesFor(
      model_.state_layout(), request.prompt_tokens(), request.split(), request.boundary_rows());
  const int64_t pages = (positions + B - 1) / B + static_cast<int64_t>(sizes.boundary_pages);
  if (pages > pool_->total_pages()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request needs ", pages, " block-KV pages; the pool has ", pool_->total_pages()));
  }
  const auto wait_start = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  absl::StatusOr<int64_t> slot = WaitForSlot(context, request.request_id(), pages, lock);
  if (!slot.ok()) return slot.status();
  absl::StatusOr<std::shared_ptr<Request>> r =
      NewRequest(context, request, *slot, pages, positions);
  if (!r.ok()) return r.status();
  (*r)->wait_ms = std::chrono::duration<double, std::milli>(Clock::now() - wait_start).count();
  if (request.prompt_token_ids_size() > 0) {
    (*r)->context.assign(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
    (*r)->speculation = *std::move(speculation);
  }
  (*r)->acceptance = &metrics_->acceptance_rate;
  reply.set_reservation_id((*r)->id);
  transfer::SetReservationSizes(sizes, reply);
  requests_[(*r)->id] = *std::move(r);
  changed_.notify_all();  // the reaper waits for the first deadline
  return absl::OkStatus();
}

absl::StatusOr<int64_t> DecodeService::WaitForSlot(grpc::ServerContext& context,
                                                   const std::string& request_id, int64_t pages,
                                                   std::unique_lock<std::mutex>& lock) {
  if (draining_) {
    log::Warn(trace::StartServerSpan(context).Ids(), "reserve refused: draining",
              {{"request_id", request_id}});
    return absl::UnavailableError("the decode node is draining (shutting down): use another");
  }
  std::optional<int64_t> slot = pool_->TryReserve(pages);
  if (slot) return *slot;
  if (waiting_ >= options_.max_waiting) {
    return absl::ResourceExhaustedError("decode pools are full and the wait queue is at its bound");
  }
  ++waiting_;
  while (!slot && !stop_ && !draining_ && !context.IsCancelled() &&
         context.deadline() > std::chrono::system_clock::now()) {
    changed_.wait_for(lock, kCallCheck);
    slot = pool_->TryReserve(pages);
  }
  --waiting_;
  if (!slot && draining_) {
    return absl::UnavailableError(
        "the decode node began draining while the request waited for a slot");
  }
  if (!slot) {
    return absl::ResourceExhaustedError("decode pools stayed full until the request's deadline");
  }
  return *slot;
}

absl::StatusOr<std::shared_ptr<DecodeService::Request>> DecodeService::NewRequest(
    const grpc::ServerContext& context, const v1::ReserveRequest& request, int64_t slot,
    int64_t pages, int64_t positions) {
  auto r = std::make_shared<Request>();
  r->id = security::RandomId();
  r->request_id = request.request_id();
  r->span = trace::StartServerSpan(context);
  r->router_identity = security::PeerIdentity(context);
  r->prefill_identity = request.prefill_identity();
  r->prefill_address = request.prefill_address();
  r->prefill_ucx_address = request.prefill_ucx_worker_address();
  r->slot = slot;
  r->reserved_pages = pages;
  r->state = std::make_unique<model::SequenceState>(
      model_.state_layout(), pool_.get(), pool_->producer_ring(slot), pool_->consumer_ring(slot));
  r->pool = pool_.get();  // from here the slot returns to the pool with `r`
  if (absl::Status s = r->state->EnsurePages(positions); !s.ok()) return s;
  r->split = request.split();
  r->boundary_rows = request.boundary_rows();
  const transfer::RegionSizes sizes = transfer::RegionSizesFor(
      model_.state_layout(), request.prompt_tokens(), r->split, r->boundary_rows);
  for (uint64_t p = 0; p < sizes.boundary_pages; ++p) {
    float* page = pool_->Allocate();  // reserved above, so there is one
    if (page == nullptr) return absl::ResourceExhaustedError("no pool page for boundary rows");
    r->boundary_pages.push_back(page);
    ++r->boundary_pages_taken;
  }
  if (engine_pool_.data() != nullptr) {
    r->engine_pages = std::make_unique<EnginePages>(
        *r->state, [this](float* pool_address) { return InEngine(pool_address); });
    r->engine_state = std::make_unique<model::SequenceState>(
        model_.state_layout(), r->engine_pages.get(), InEngine(r->state->producer_swa()),
        InEngine(r->state->consumer_swa()));
    if (absl::Status s = r->engine_state->EnsurePages(positions); !s.ok()) return s;
  }
  const v1::SamplingParams& sampling = request.sampling();
  r->prompt_len = request.prompt_tokens();
  r->sampling = model::SamplingFromProto(sampling);
  r->max_tokens = sampling.max_tokens();
  r->stop_ids.insert(sampling.stop_token_ids().begin(), sampling.stop_token_ids().end());
  r->ignore_eos = sampling.ignore_eos();
  r->completion = request.completed_tokens();
  r->logits.resize(model_.config().vocab_size);
  // A caller may not hold memory past the node's own bound, whatever timeout it asks for.
  const uint32_t timeout_ms = std::min<uint32_t>(
      request.timeout_ms() > 0 ? request.timeout_ms() : 10000, kMaxReservationTimeoutMs);
  r->deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  return r;
}

grpc::Status DecodeService::Commit(grpc::ServerContext* context, const v1::CommitRequest* request,
                                   v1::CommitResponse* /*reply*/) {
  return ToGrpcStatus(CommitState(*context, *request));
}

absl::Status DecodeService::CommitState(grpc::ServerContext& context,
                                        const v1::CommitRequest& request) {
  if (absl::Status s = security::Authorize(context, {Role::kPrefill}, "DecodeNode/Commit");
      !s.ok()) {
    return s;
  }
  const v1::StateHeader& h = request.header();
  // Read from the worker the reservation names, never from one the Commit supplies.
  v1::RegionSource source = request.source();
  std::unique_lock<std::mutex> lock(mutex_);
  std::shared_ptr<Request> r =
      Owned(security::PeerIdentity(context), h.reservation_id(), Role::kPrefill);
  if (r == nullptr || r->phase != Phase::kReserved) return NoReservation(h.reservation_id());
  absl::StatusOr<transfer::Transport*> transport = CheckCommit(h, *r, source);
  if (!transport.ok()) {
    Erase(r->id);
    return transport.status();
  }
  // Read the regions into the reservation while it is live: by its deadline (and the
  // caller's). `r` keeps the memory until the transport has stopped writing, even when the
  // reservation expires or is released meanwhile; only then may it return to the pool.
  // The read also ends a little before the prefill node's commit call does, and at once when
  // that call is cancelled: the prefill node stops exposing the regions then.
  r->phase = Phase::kTransferring;
  const auto caller_deadline =
      Clock::now() +
      std::min<std::chrono::system_clock::duration>(
          context.deadline() - std::chrono::system_clock::now(), std::chrono::hours(1)) -
      kCommitMargin;
  const Clock::time_point deadline = std::min(r->deadline, caller_deadline);
  const transfer::RegionSpans into = transfer::SpansOf(
      *r->state, transfer::RegionSizesOf(h, model_.state_layout()), r->boundary_pages);
  lock.unlock();
  const auto transfer_start = Clock::now();
  absl::Status read = (*transport)->Read(source, r->prefill_address, into, deadline, [&context] {
    return context.IsCancelled();
  });
  if (absl::IsUnavailable(read) || absl::IsCancelled(read)) {
    // The transfer failed, not this node: ABORTED, which nobody takes for a lost node.
    read = absl::AbortedError(
        absl::StrCat("reading the StateBlock from the prefill node failed: ", read.message()));
  }
  const double transfer_seconds =
      std::chrono::duration<double>(Clock::now() - transfer_start).count();
  // The checksums run outside the node's lock (they read every byte; other streams go on):
  // nothing else touches a reservation while it is transferring.
  if (read.ok()) read = transfer::VerifyRegions(h, *r->state, r->boundary_pages);
  if (read.ok() && r->engine_state != nullptr) {
    // Whole and verified in the pool: staged into the engine's memory for the decode steps.
    read = model_.StageIn(model::StateCopies(*r->state, *r->engine_state, h.prompt_len()));
  }
  lock.lock();
  r->transfer_ms = transfer_seconds * 1000;
  return FinishCommit(r, h, source.transport(), transfer::StagingBytes(into.sizes), std::move(read),
                      transfer_seconds);
}

absl::StatusOr<transfer::Transport*> DecodeService::CheckCommit(const v1::StateHeader& h,
                                                                const Request& r,
                                                                v1::RegionSource& source) {
  if (absl::Status s = transfer::VerifyHeader(h, model_.fingerprint(), r.prompt_len,
                                              model_.config().vocab_size, r.split, r.boundary_rows);
      !s.ok()) {
    return s;
  }
  if (h.split() == v1::SPLIT_REPLAY_ON_DECODE) {
    // The replay's plan must exist for this model (keep >= C when truncated, and so on).
    absl::StatusOr<model::TruncationSpec> spec = ReplaySpecFor(h, model_.config());
    if (!spec.ok())
      return absl::InvalidArgumentError(absl::StrCat("header: ", spec.status().message()));
  }
  if (absl::Status s = CheckRequestId("source.exposure_id", source.exposure_id()); !s.ok()) {
    return s;
  }
  transfer::Transport* transport = source.transport() == v1::TRANSPORT_GRPC  ? grpc_transport_.get()
                                   : source.transport() == v1::TRANSPORT_UCX ? ucx_transport_.get()
                                                                             : nullptr;
  if (transport == nullptr) {
    return source.transport() == v1::TRANSPORT_UCX
               ? absl::FailedPreconditionError("source.transport: this decode node has no UCX")
               : absl::InvalidArgumentError("source.transport: must be UCX or GRPC");
  }
  if (source.transport() != v1::TRANSPORT_UCX) return transport;
  if (r.prefill_ucx_address.empty()) {
    return absl::FailedPreconditionError(
        "source.transport: UCX, but the prefill node registered no UCX worker address with "
        "the router");
  }
  if (!source.ucx_worker_address().empty() &&
      source.ucx_worker_address() != r.prefill_ucx_address) {
    return absl::PermissionDeniedError(
        "source.ucx_worker_address: differs from the worker the prefill node registered; the "
        "decode node reads only from that one");
  }
  source.set_ucx_worker_address(r.prefill_ucx_address);
  return transport;
}

absl::Status DecodeService::FinishCommit(const std::shared_ptr<Request>& r,
                                         const v1::StateHeader& h, v1::Transport transport,
                                         uint64_t bytes, absl::Status read,
                                         double transfer_seconds) {
  auto live = requests_.find(r->id);
  if (live == requests_.end() || live->second != r) {
    return absl::DeadlineExceededError(
        "reservation_id: the reservation expired or was released during the transfer; its "
        "memory was freed after the read stopped");
  }
  if (!read.ok()) {
    Erase(r->id);
    return read;
  }
  const char* transport_name = transfer::TransportLabel(transport);
  metrics_->pulled_bytes.Add({{"transport", transport_name}}).Increment(static_cast<double>(bytes));
  metrics_->pull_seconds.Add({{"transport", transport_name}}, metrics::TokenLatencyBuckets())
      .Observe(transfer_seconds);
  for (model::SequenceState* state : {r->state.get(), r->engine_state.get()}) {
    if (state == nullptr) continue;
    state->length = h.prompt_len();
    state->s_valid = h.s_valid();
  }
  r->deadline = Clock::now() + std::chrono::milliseconds(options_.attach_timeout_ms);
  r->committed_at = Clock::now();
  if (h.split() == v1::SPLIT_REPLAY_ON_DECODE) {
    // The consumer layers replay over the boundary rows in the decode loop, which samples the
    // first token at the end.
    r->replay = *ReplaySpecFor(h, model_.config());  // CheckCommit checked it
    r->replay_next = r->replay.s_valid;
    r->prompt_tokens.assign(h.prompt_token_ids().begin(), h.prompt_token_ids().end());
    r->phase = Phase::kReplaying;
    changed_.notify_all();
    return absl::OkStatus();
  }
  r->phase = Phase::kCommitted;
  // The first token was sampled by the prefill node; it counts, and may already finish.
  r->completion += 1;
  r->next_input = h.first_token();
  if (!r->context.empty()) r->context.push_back(h.first_token());
  r->finish = FinishReasonFor(h.first_token(), r->completion, r->max_tokens, r->stop_ids,
                              r->ignore_eos, model_.config().eos_token_id);
  if (r->finish != v1::FINISH_REASON_UNSPECIFIED) r->phase = Phase::kFinished;
  changed_.notify_all();
  return absl::OkStatus();
}

void DecodeService::Accept(Request& r, int32_t token, float logprob) {
  r.tokens.push_back(token);
  r.logprobs.push_back(logprob);
  r.completion += 1;
  r.next_input = token;
  if (!r.context.empty()) r.context.push_back(token);
  r.finish = FinishReasonFor(token, r.completion, r.max_tokens, r.stop_ids, r.ignore_eos,
                             model_.config().eos_token_id);
  if (r.finish != v1::FINISH_REASON_UNSPECIFIED) r.phase = Phase::kFinished;
}

// One piece of a request's replay in a step: its rows, gathered from the pool pages into one
// host buffer, and the logits the step returns for them.
struct DecodeService::ReplayPiece {
  std::shared_ptr<Request> request;
  model::ReplayItem item;
  std::vector<float> boundary;
  std::vector<float> logits;
};

DecodeService::ReplayPiece DecodeService::NextPiece(const std::shared_ptr<Request>& r,
                                                    int64_t rows) const {
  const int64_t d = model_.config().hidden_size, V = model_.config().vocab_size;
  ReplayPiece piece{.request = r};
  piece.boundary.resize(rows * d);
  // Row j of the handed-over rows is byte j * d * 4 of the pages counted back to back.
  const uint64_t page = sizeof(float) * model_.state_layout().page_floats();
  uint64_t from = sizeof(float) * (r->replay_next - r->replay.s_valid) * d;
  char* to = reinterpret_cast<char*>(piece.boundary.data());
  for (uint64_t left = sizeof(float) * rows * d; left > 0;) {
    const uint64_t n = std::min(left, page - from % page);
    std::memcpy(to, reinterpret_cast<const char*>(r->boundary_pages[from / page]) + from % page, n);
    to += n;
    from += n;
    left -= n;
  }
  piece.item = {.state = &r->computed(),
                .spec = r->replay,
                .q_start = r->replay_next,
                .rows = rows,
                .boundary = piece.boundary.data(),
                .all_logits = !r->prompt_tokens.empty()};
  piece.logits.resize(model::ReplayLogitRows(piece.item) * V);
  piece.item.logits = piece.logits.data();
  return piece;
}

void DecodeService::FinishPiece(ReplayPiece& piece) {
  Request& r = *piece.request;
  const model::ReplayItem& item = piece.item;
  const int64_t V = model_.config().vocab_size, L = item.spec.prompt_len;
  if (item.all_logits) {
    // A row's log-probability of the next prompt token (the last row's next token is sampled).
    for (int64_t j = 0; j < item.rows && item.q_start + j + 1 < L; ++j) {
      r.prompt_logprobs.push_back(
          model::LogSoftmaxAt({piece.logits.data() + j * V, static_cast<size_t>(V)},
                              r.prompt_tokens[item.q_start + j + 1]));
    }
  }
  r.replay_next += item.rows;
  if (r.replay_next < L) return;
  // The prompt's last row: the first token, sampled as the prefill node would have.
  const std::span<const float> last(piece.logits.data() + piece.logits.size() - V,
                                    static_cast<size_t>(V));
  const model::SampledToken first = model::SampleToken(last, r.sampling, r.completion);
  r.FreeBoundaryPages();
  r.replay_ms = std::chrono::duration<double, std::milli>(Clock::now() - r.committed_at).count();
  // The replay's rate as the router prices it: its whole time here (in the batch, with the
  // other requests' steps) over its work. Sums weighted by the work, a fifth forgotten each
  // time, as a prefill node folds its compute rate.
  const double gflop =
      kvstore::EstimatePrefillWork(model_.config(), L, L, r.replay.s_valid).replayed_gflop;
  if (gflop > 0) {
    replay_ms_sum_ = 0.8 * replay_ms_sum_ + r.replay_ms;
    replay_gflop_sum_ = 0.8 * replay_gflop_sum_ + gflop;
    ++replay_samples_;
    metrics_->replay_ms_per_gflop.Set(replay_ms_sum_ / replay_gflop_sum_);
  }
  r.phase = Phase::kCommitted;
  Accept(r, first.token, first.logprob);
}

void DecodeService::DecodeLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    watchdog_->Beat();
    std::vector<std::shared_ptr<Request>> batch;
    std::vector<ReplayPiece> pieces;
    for (auto& [id, r] : requests_) {
      if (r->phase == Phase::kCommitted &&
          static_cast<int64_t>(batch.size()) < options_.max_batch) {
        batch.push_back(r);
      }
    }
    // The row budget protects the running streams' inter-token latency; with none running, a
    // step replays up to kIdleReplayRows, so a lone prompt's first token is not held back.
    const int64_t replay_budget = batch.empty()
                                      ? std::max(options_.replay_rows_per_step, kIdleReplayRows)
                                      : options_.replay_rows_per_step;
    int64_t replay_rows = replay_budget;
    for (auto& [id, r] : requests_) {
      if (r->phase == Phase::kReplaying && replay_rows > 0) {
        const int64_t rows = std::min(replay_rows, r->replay.prompt_len - r->replay_next);
        pieces.push_back(NextPiece(r, rows));
        replay_rows -= rows;
      }
    }
    stepping_ = !batch.empty() || !pieces.empty();
    if (!stepping_) {
      // A commit, a release or the node's stop notifies.
      changed_.wait(lock);
      continue;
    }
    // Speculation: how many tokens each request drafts this step. A step emits at most k + 1
    // tokens, and never more than the request has left.
    std::vector<DraftJob> jobs(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      Request& r = *batch[i];
      const int64_t left = int64_t{r.max_tokens} - r.completion;
      jobs[i] = {
          .context = &r.context,
          .speculation = &r.speculation,
          .tokens = r.context.empty()
                        ? 0
                        : r.speculation.Plan(costs_, static_cast<int64_t>(batch.size()), left - 1),
          .sampling = r.sampling,
          .step = r.completion};
    }
    std::vector<model::ReplayItem> replay;
    for (const ReplayPiece& piece : pieces) replay.push_back(piece.item);
    lock.unlock();
    if (options_.inject_step_stall_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.inject_step_stall_ms));
    }
    const auto step_start = Clock::now();
    // The requests' contexts change only on this thread, so drafting reads them unlocked.
    std::vector<DraftJob> by_model;
    for (DraftJob& job : jobs) {
      job.speculation->draft.clear();
      job.speculation->weights.clear();
      if (job.tokens <= 0) continue;
      if (job.speculation->drafter == Drafter::kNgram) ProposeByLookup(options_.speculative, job);
      if (job.speculation->drafter == Drafter::kDraft) by_model.push_back(job);
    }
    if (!by_model.empty()) {
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
    const int64_t V = model_.config().vocab_size;
    std::vector<model::DecodeItem> items;
    int64_t decode_rows = 0;
    for (auto& r : batch) {
      decode_rows += 1 + static_cast<int64_t>(r->speculation.draft.size());
      const std::vector<int32_t>& draft = r->speculation.draft;
      r->logits.resize((1 + draft.size()) * V);
      items.push_back({.state = &r->computed(),
                       .token = r->next_input,
                       .logits = r->logits.data(),
                       .draft = draft});
    }
    const auto target_start = Clock::now();
    const absl::Status status = model_.Step(items, replay);
    const auto step_end = Clock::now();
    if (++cost_log_ % 256 == 0 && !batch.empty()) {
      log::Debug("speculation costs",
                 {{"batch", static_cast<int64_t>(batch.size())},
                  {"step_fixed_us", costs_.TargetFor(batch.size()).fixed() * 1e6},
                  {"step_per_row_us", costs_.TargetFor(batch.size()).per_row() * 1e6},
                  {"draft_share_us", costs_.draft_share * 1e6},
                  {"acceptance", batch[0]->speculation.acceptance()},
                  {"drafted", static_cast<int64_t>(batch[0]->speculation.draft.size())}});
    }
    if (status.ok() && replay.empty() && decode_rows > 0) {
      costs_.AddStep(static_cast<int64_t>(batch.size()), decode_rows,
                     std::chrono::duration<double>(step_end - target_start).count());
      if (costs_.target.ready()) {
        step_fixed_ms_.store(costs_.target.fixed() * 1e3);
        step_per_row_ms_.store(costs_.target.per_row() * 1e3);
        metrics_->step_fixed_ms.Set(step_fixed_ms_.load());
        metrics_->step_per_row_ms.Set(step_per_row_ms_.load());
      }
    }
    metrics_->step_seconds.Observe(std::chrono::duration<double>(step_end - step_start).count());
    metrics_->batch_size.Observe(static_cast<double>(batch.size()));
    if (!replay.empty()) {
      metrics_->replay_rows.Increment(static_cast<double>(replay_budget - replay_rows));
    }
    // Verification: the accepted drafts, then one token of the target's own; without a draft,
    // the one token an ordinary step samples.
    std::vector<model::Verdict> verdicts(batch.size());
    for (size_t i = 0; status.ok() && i < batch.size(); ++i) {
      Request& r = *batch[i];
      verdicts[i] = model::VerifyDraft(r.logits, r.speculation.draft, r.speculation.weights,
                                       r.sampling, r.completion);
    }
    lock.lock();
    auto fail = [&](Request& r) {
      log::Error("decode step failed",
                 {{"request_id", r.id}, {"error", std::string(status.message())}});
      r.finish = v1::FINISH_REASON_UNSPECIFIED;
      r.phase = Phase::kFinished;
    };
    for (size_t i = 0; i < batch.size(); ++i) {
      Request& r = *batch[i];
      if (!status.ok()) {
        fail(r);
        continue;
      }
      const model::Verdict& verdict = verdicts[i];
      Speculation& spec = r.speculation;
      const int64_t k = static_cast<int64_t>(spec.draft.size());
      const int64_t context_before = static_cast<int64_t>(r.context.size());
      // The step appended k + 1 rows; the rejected drafts' rows are taken back.
      r.computed().length -= k - verdict.accepted;
      int64_t emitted = 0;
      for (const model::SampledToken& token : verdict.tokens) {
        if (r.phase == Phase::kFinished) break;
        Accept(r, token.token, token.logprob);
        ++emitted;
      }
      metrics_->tokens.Increment(static_cast<double>(emitted));
      metrics_->tokens_per_step.Observe(static_cast<double>(emitted));
      if (r.phase != Phase::kFinished) {  // a request's last step may stop inside its tokens
        tokens_per_step_ = tokens_per_step_ <= 0 ? static_cast<double>(emitted)
                                                 : 0.99 * tokens_per_step_ + 0.01 * emitted;
      }
      if (k > 0) {
        // Accepted drafts that were sent (a stop may end the request inside them).
        const int64_t sent = std::min<int64_t>(verdict.accepted, emitted);
        spec.drafted += static_cast<uint32_t>(k);
        spec.accepted += static_cast<uint32_t>(sent);
        metrics_->draft_tokens.Increment(static_cast<double>(k));
        metrics_->accepted_draft_tokens.Increment(static_cast<double>(sent));
        spec.Adapt(k, verdict.accepted);
        if (spec.drafter == Drafter::kDraft) {
          DraftModel::Settle(spec, context_before, k, verdict.accepted);
        }
      }
    }
    for (ReplayPiece& piece : pieces) {
      if (!status.ok()) {
        fail(*piece.request);
        continue;
      }
      FinishPiece(piece);
    }
    changed_.notify_all();
  }
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
  std::unique_lock<std::mutex> lock(mutex_);
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
    const bool finished = r->phase == Phase::kFinished;
    if (r->streamed < r->tokens.size() || finished) {
      v1::DecodeOutput out;
      for (size_t i = r->streamed; i < r->tokens.size(); ++i) {
        out.add_token_ids(r->tokens[i]);
        out.add_logprobs(r->logprobs[i]);
      }
      if (r->replay_ms >= 0 && !r->replay_reported && !r->tokens.empty()) {
        // Replay-on-decode: the first token was sampled here; its replay's figures go with it.
        out.mutable_prompt_logprobs()->Assign(r->prompt_logprobs.begin(), r->prompt_logprobs.end());
        out.set_replay_ms(r->replay_ms);
        r->replay_reported = true;
        line->stage_ms["replay"] = r->replay_ms;
      }
      r->streamed = r->tokens.size();
      line->tokens = r->streamed;
      out.set_draft_tokens(r->speculation.drafted);
      out.set_accepted_draft_tokens(r->speculation.accepted);
      if (finished) out.set_finish_reason(r->finish);
      lock.unlock();
      bool written;
      {
        StreamWatch::Writing writing(*idle_watch_, context);
        written = writer->Write(out);
      }
      lock.lock();
      if (!written || finished) {
        Erase(r->id);
        if (!written) return absl::CancelledError("client went away");
        if (r->finish == v1::FINISH_REASON_UNSPECIFIED) {
          return absl::InternalError("decode step failed");
        }
        return absl::OkStatus();
      }
      continue;
    }
    // Each decode step notifies; the client's cancel is seen within kCallCheck.
    changed_.wait_for(lock, kCallCheck);
  }
}

grpc::Status DecodeService::Release(grpc::ServerContext* context, const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* reply) {
  if (absl::Status s = security::Authorize(*context, {Role::kRouter}, "DecodeNode/Release");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (Owned(security::PeerIdentity(*context), request->reservation_id(), Role::kRouter) !=
      nullptr) {
    Erase(request->reservation_id());
  }
  return grpc::Status::OK;
}

v1::LoadReport DecodeService::Load() const {
  std::lock_guard<std::mutex> lock(mutex_);
  v1::LoadReport load;
  load.set_active_requests(static_cast<uint32_t>(requests_.size()));
  load.set_queued_requests(static_cast<uint32_t>(waiting_));
  load.set_free_pages(pool_->free_pages());
  load.set_total_pages(pool_->total_pages());
  load.set_free_slots(static_cast<uint32_t>(pool_->free_slots()));
  load.set_total_slots(static_cast<uint32_t>(pool_->total_slots()));
  v1::DecodeRates& rates = *load.mutable_decode_rates();
  rates.set_step_fixed_ms(step_fixed_ms_.load());
  rates.set_step_per_row_ms(step_per_row_ms_.load());
  if (replay_gflop_sum_ > 0) rates.set_replay_ms_per_gflop(replay_ms_sum_ / replay_gflop_sum_);
  rates.set_replay_samples(replay_samples_);
  rates.set_tokens_per_step(tokens_per_step_);
  return load;
}

grpc::Status DecodeService::Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                                  v1::StatsResponse* reply) {
  if (absl::Status s = security::Authorize(*context, {Role::kRouter}, "DecodeNode/Stats");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  *reply->mutable_load() = Load();
  std::lock_guard<std::mutex> lock(mutex_);
  reply->set_reservations(static_cast<uint32_t>(requests_.size()));
  uint32_t transferring = 0;
  for (const auto& [id, r] : requests_) transferring += r->phase == Phase::kTransferring ? 1 : 0;
  reply->set_transferring(transferring);
  return grpc::Status::OK;
}

void DecodeService::ReapLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    // Until the first deadline of a reservation nobody streams; a new reservation, a commit
    // (which moves the deadline) and the node's stop notify.
    std::optional<Clock::time_point> next;
    for (const auto& [id, r] : requests_) {
      if (!r->attached && (!next.has_value() || r->deadline < *next)) next = r->deadline;
    }
    if (next.has_value()) {
      changed_.wait_until(lock, *next);
    } else {
      changed_.wait(lock);
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
