// The decode node's reservations and commits (decode_service.h): a slot and pages in the pool
// for a request the router reserves, and the read of its StateBlock into them at the prefill
// node's commit.
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "baton/common/log.h"
#include "baton/common/rpc.h"
#include "baton/common/security.h"
#include "baton/common/wire_bounds.h"
#include "baton/decode_node/decode_service.h"
#include "baton/transfer/state_block.h"
#include "decode_metrics.h"
#include "request.h"

namespace baton::decode_node {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMaxReservationTimeoutMs = 10 * 60 * 1000;
// A commit's read ends this long before the caller's deadline.
constexpr auto kCommitMargin = std::chrono::milliseconds(500);
// How often a reservation waiting for memory looks at its caller's call and at memory freed
// late. An erased request notifies; but gRPC's synchronous API says nothing when a client
// cancels or its deadline passes, and a slot freed by the last holder of a request (an
// in-flight step) returns to the pool without the lock.
constexpr auto kCallCheck = std::chrono::milliseconds(20);
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
  if (request.fidelity_tokens() > kMaxFidelityTokens) {
    return absl::InvalidArgumentError(absl::StrCat("fidelity_tokens: ", request.fidelity_tokens(),
                                                   "; at most ", kMaxFidelityTokens));
  }
  if (request.fidelity_tokens() > 0 && request.prompt_token_ids_size() == 0) {
    return absl::InvalidArgumentError(
        "prompt_token_ids: shadow verification (fidelity_tokens > 0) needs the prompt");
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

Reservation::~Reservation() {
  if (pool == nullptr) return;
  engine_state.reset();
  const int64_t used = static_cast<int64_t>(state->pages().size());
  state.reset();
  FreeBoundaryPages();
  pool->Unreserve(slot, reserved_pages - used - boundary_pages_taken);
}

void Reservation::FreeBoundaryPages() {
  for (float* page : boundary_pages) pool->Free(page);
  boundary_pages.clear();
}

Request::~Request() {
  const Speculation& s = generation.speculation;
  if (s.drafted > 0 && acceptance != nullptr) {
    acceptance->Observe(static_cast<double>(s.accepted) / s.drafted);
  }
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
  absl::MutexLock lock(&mutex_);
  absl::StatusOr<int64_t> slot = WaitForSlot(context, request.request_id(), pages);
  if (!slot.ok()) return slot.status();
  absl::StatusOr<std::shared_ptr<Request>> r =
      NewRequest(context, request, *slot, pages, positions);
  if (!r.ok()) return r.status();
  (*r)->wait_ms = std::chrono::duration<double, std::milli>(Clock::now() - wait_start).count();
  if (request.prompt_token_ids_size() > 0) {
    (*r)->generation.context.assign(request.prompt_token_ids().begin(),
                                    request.prompt_token_ids().end());
    (*r)->generation.speculation = *std::move(speculation);
  }
  (*r)->acceptance = &metrics_->acceptance_rate;
  StartFidelity(request, **r);
  reply.set_reservation_id((*r)->id);
  transfer::SetReservationSizes(sizes, reply);
  requests_[(*r)->id] = *std::move(r);
  deadline_.SignalAll();  // the reaper waits for the first deadline
  return absl::OkStatus();
}

absl::StatusOr<int64_t> DecodeService::WaitForSlot(grpc::ServerContext& context,
                                                   const std::string& request_id, int64_t pages) {
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
    freed_.WaitWithTimeout(&mutex_, absl::FromChrono(kCallCheck));
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

absl::StatusOr<std::shared_ptr<Request>> DecodeService::NewRequest(
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
  r->reservation.slot = slot;
  r->reservation.reserved_pages = pages;
  r->reservation.state = std::make_unique<model::SequenceState>(
      model_.state_layout(), pool_.get(), pool_->producer_ring(slot), pool_->consumer_ring(slot));
  r->reservation.pool = pool_.get();  // from here the slot returns to the pool with `r`
  if (absl::Status s = r->reservation.state->EnsurePages(positions); !s.ok()) return s;
  r->split = request.split();
  r->boundary_rows = request.boundary_rows();
  const transfer::RegionSizes sizes = transfer::RegionSizesFor(
      model_.state_layout(), request.prompt_tokens(), r->split, r->boundary_rows);
  for (uint64_t p = 0; p < sizes.boundary_pages; ++p) {
    float* page = pool_->Allocate();  // reserved above, so there is one
    if (page == nullptr) return absl::ResourceExhaustedError("no pool page for boundary rows");
    r->reservation.boundary_pages.push_back(page);
    ++r->reservation.boundary_pages_taken;
  }
  if (engine_pool_.data() != nullptr) {
    r->reservation.engine_pages = std::make_unique<EnginePages>(
        *r->reservation.state, [this](float* pool_address) { return InEngine(pool_address); });
    r->reservation.engine_state = std::make_unique<model::SequenceState>(
        model_.state_layout(), r->reservation.engine_pages.get(),
        InEngine(r->reservation.state->producer_swa()),
        InEngine(r->reservation.state->consumer_swa()));
    if (absl::Status s = r->reservation.engine_state->EnsurePages(positions); !s.ok()) return s;
  }
  const v1::SamplingParams& sampling = request.sampling();
  r->prompt_len = request.prompt_tokens();
  r->generation.sampling = model::SamplingFromProto(sampling);
  r->generation.max_tokens = sampling.max_tokens();
  r->generation.stop_ids.insert(sampling.stop_token_ids().begin(), sampling.stop_token_ids().end());
  r->generation.ignore_eos = sampling.ignore_eos();
  r->generation.completion = request.completed_tokens();
  r->generation.eos_token_id = model_.config().eos_token_id;
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
  std::shared_ptr<Request> r;
  transfer::Transport* transport = nullptr;
  Clock::time_point deadline;
  std::optional<transfer::RegionSpans> into;
  {
    absl::MutexLock lock(&mutex_);
    r = Owned(security::PeerIdentity(context), h.reservation_id(), Role::kPrefill);
    if (r == nullptr || r->phase != Phase::kReserved) return NoReservation(h.reservation_id());
    absl::StatusOr<transfer::Transport*> checked = CheckCommit(h, *r, source);
    if (!checked.ok()) {
      Erase(r->id);
      return checked.status();
    }
    transport = *checked;
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
    deadline = std::min(r->deadline, caller_deadline);
    into =
        transfer::SpansOf(*r->reservation.state, transfer::RegionSizesOf(h, model_.state_layout()),
                          r->reservation.boundary_pages);
  }
  // The read and the checksums run outside the node's lock (they read every byte; other
  // streams go on): nothing else touches a reservation while it is transferring.
  const auto transfer_start = Clock::now();
  absl::Status read = transport->Read(source, r->prefill_address, *into, deadline,
                                      [&context] { return context.IsCancelled(); });
  if (absl::IsUnavailable(read) || absl::IsCancelled(read)) {
    // The transfer failed, not this node: ABORTED, which nobody takes for a lost node.
    read = absl::AbortedError(
        absl::StrCat("reading the StateBlock from the prefill node failed: ", read.message()));
  }
  const double transfer_seconds =
      std::chrono::duration<double>(Clock::now() - transfer_start).count();
  if (read.ok())
    read = transfer::VerifyRegions(h, *r->reservation.state, r->reservation.boundary_pages);
  if (read.ok() && r->reservation.engine_state != nullptr) {
    // Whole and verified in the pool: staged into the engine's memory for the decode steps.
    read = model_.StageIn(
        model::StateCopies(*r->reservation.state, *r->reservation.engine_state, h.prompt_len()));
  }
  absl::MutexLock lock(&mutex_);
  r->transfer_ms = transfer_seconds * 1000;
  return FinishCommit(r, h, source.transport(), transfer::StagingBytes(into->sizes),
                      std::move(read), transfer_seconds);
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
  for (model::SequenceState* state :
       {r->reservation.state.get(), r->reservation.engine_state.get()}) {
    if (state == nullptr) continue;
    state->length = h.prompt_len();
    state->s_valid = h.s_valid();
  }
  r->deadline = Clock::now() + std::chrono::milliseconds(options_.attach_timeout_ms);
  r->committed_at = Clock::now();
  if (h.split() == v1::SPLIT_REPLAY_ON_DECODE) {
    // The consumer layers replay over the boundary rows in the decode loop, which samples the
    // first token at the end.
    r->generation.replay = *ReplaySpecFor(h, model_.config());  // CheckCommit checked it
    r->generation.replay_next = r->generation.replay.s_valid;
    r->generation.prompt_tokens.assign(h.prompt_token_ids().begin(), h.prompt_token_ids().end());
    r->phase = Phase::kReplaying;
    FidelityAtCommit(h, *r);
  } else {
    // The first token was sampled by the prefill node; it counts, and may already finish.
    Generation& g = r->generation;
    g.completion += 1;
    g.next_input = h.first_token();
    if (!g.context.empty()) g.context.push_back(h.first_token());
    g.finish = FinishReasonFor(h.first_token(), g.completion, g.max_tokens, g.stop_ids,
                               g.ignore_eos, g.eos_token_id);
    r->phase = g.finished() ? Phase::kFinished : Phase::kCommitted;
    InjectRingFault(*r);
    FidelityAtCommit(h, *r);
    MaybeShadow(r);
  }
  deadline_.SignalAll();  // the attach deadline
  work_.SignalAll();
  return absl::OkStatus();
}

}  // namespace baton::decode_node
