#include "prefill_call.h"

#include <algorithm>
#include <cstring>
#include <span>

#include "absl/strings/str_cat.h"
#include "baton/common/log.h"
#include "baton/common/rpc.h"
#include "baton/kvstore/chain.h"
#include "baton/kvstore/hit_policy.h"
#include "baton/transfer/transport.h"
#include "prefill_metrics.h"
#include "store_fleet.h"

namespace baton::prefill_node {
namespace {

// A request waiting for a staging slot is woken as soon as one frees (Staged notifies
// staging_free_). The wait is bounded as well only so that the request sees its caller go:
// gRPC's synchronous API has no callback on cancellation, so IsCancelled must be asked.
constexpr auto kStagingCancelPoll = std::chrono::milliseconds(20);

}  // namespace

PrefillCall::Active::Active(PrefillService& node, double work_ms) : node_(node), work_ms_(work_ms) {
  ++node_.active_;
  node_.active_peak_ = std::max(node_.active_peak_, node_.active_);
  node_.held_work_ms_ += work_ms_;
}

void PrefillCall::Active::Computing() {
  std::lock_guard<std::mutex> lock(node_.mutex_);
  computing_ = true;
  node_.computing_work_ms_ = work_ms_;
  node_.computing_since_ = Clock::now();
}

void PrefillCall::Active::Computed() {
  std::lock_guard<std::mutex> lock(node_.mutex_);
  node_.held_work_ms_ = std::max(0.0, node_.held_work_ms_ - work_ms_);
  work_ms_ = 0;
  if (computing_) node_.computing_work_ms_ = 0;
  computing_ = false;
}

PrefillCall::Active::~Active() {
  Computed();
  std::lock_guard<std::mutex> lock(node_.mutex_);
  if (--node_.active_ == 0) node_.idle_.notify_all();
}

PrefillCall::Staged::Staged(PrefillService& node) : node_(node) {
  ++node_.staged_;
}

PrefillCall::Staged::~Staged() {
  {
    std::lock_guard<std::mutex> lock(node_.mutex_);
    --node_.staged_;
  }
  node_.staging_free_.notify_one();
}

// Prefills run one at a time, in arrival order (prefill_service.h).
PrefillCall::ModelTurn::ModelTurn(PrefillService& node) : node_(node) {
  node_.metrics_->queue_depth.Increment();
  {
    std::lock_guard<std::mutex> lock(node_.mutex_);
    ++node_.queued_;
  }
  turn_.emplace(node_.model_turns_.Take());
  {
    std::lock_guard<std::mutex> lock(node_.mutex_);
    --node_.queued_;
  }
  node_.metrics_->queue_depth.Decrement();
  // The watchdog watches the model advance chunk by chunk from here (a request that holds it
  // without advancing is a wedged node).
  node_.watchdog_->Beat();
  node_.computing_ = true;
}

PrefillCall::ModelTurn::~ModelTurn() {
  node_.computing_ = false;  // the turn ends after this, as turn_ goes
}

PrefillCall::PrefillCall(PrefillService& node, grpc::ServerContext& context,
                         const v1::PrefillRequest& request, v1::PrefillResponse& reply,
                         const trace::Span& span, std::map<std::string, double>& stage_ms)
    : node_(node),
      context_(context),
      span_(span),
      stage_ms_(stage_ms),
      request_(request),
      generate_(request.request()),
      reply_(reply),
      start_(Clock::now()),
      tokens_(generate_.prompt_token_ids().begin(), generate_.prompt_token_ids().end()),
      prompt_len_(static_cast<int64_t>(tokens_.size())),
      layout_(node.model_.state_layout()) {}

absl::Status PrefillCall::Run() {
  static constexpr std::pair<Stage, const char*> kStages[] = {
      {&PrefillCall::Admit, "admit"},     {&PrefillCall::StageMemory, "stage_memory"},
      {&PrefillCall::LoadPrefix, "load"}, {&PrefillCall::Compute, "compute"},
      {&PrefillCall::Commit, "commit"},   {&PrefillCall::WriteBack, "write_back"}};
  for (const auto& [stage, name] : kStages) {
    const auto start = Clock::now();
    const absl::Status s = (this->*stage)();
    stage_ms_[name] += MillisSince(start);
    if (!s.ok()) return s;
  }
  Respond();
  return absl::OkStatus();
}

absl::Status PrefillCall::Admit() {
  absl::StatusOr<model::TruncationMode> mode = model::ModeFromProto(request_.mode());
  if (!mode.ok()) return mode.status();
  mode_ = *mode;
  if (absl::Status s = ValidatePrefillRequest(request_, node_.model_.config()); !s.ok()) return s;
  const double work_ms = node_.PredictedWorkMs(prompt_len_, request_.s_valid(), request_.keep(),
                                               mode_ != model::TruncationMode::kOff);
  {
    std::lock_guard<std::mutex> lock(node_.mutex_);
    if (node_.draining_) {
      log::Warn(span_.Ids(), "prefill refused: draining", {{"request_id", generate_.request_id()}});
      return absl::UnavailableError("the prefill node is draining (shutting down): use another");
    }
    active_.emplace(node_, work_ms);
  }
  if (request_.transport() == v1::TRANSPORT_UCX && node_.ucx_ == nullptr) {
    return absl::FailedPreconditionError(
        "transport: UCX was asked for and this prefill node has none");
  }
  if (request_.transport() != v1::TRANSPORT_UCX && request_.transport() != v1::TRANSPORT_GRPC) {
    return absl::InvalidArgumentError("transport: must be UCX or GRPC");
  }
  const v1::Split split = node_.options_.split == model::Split::kReplayOnDecode
                              ? v1::SPLIT_REPLAY_ON_DECODE
                              : v1::SPLIT_PREFILL_ALL;
  if (request_.split() != split) {
    return absl::FailedPreconditionError(
        absl::StrCat("split: the request is for ", v1::Split_Name(request_.split()),
                     " and this prefill node serves ", v1::Split_Name(split)));
  }
  replay_on_decode_ = split == v1::SPLIT_REPLAY_ON_DECODE;
  const int64_t boundary_rows =
      replay_on_decode_
          ? model::BoundaryRowCount(prompt_len_, mode_, request_.keep(), request_.s_valid())
          : 0;
  sizes_ = transfer::RegionSizesFor(layout_, tokens_.size(), split, boundary_rows);
  return transfer::CheckReservationSizes(request_.reservation(), sizes_);
}

// The state is computed straight into staging memory exposed for this request alone, with
// block KV contiguous, so that the decode node reads each region in one get. Staging memory is
// held from here through the commit, by a bounded number of requests.
absl::Status PrefillCall::StageMemory() {
  const auto wait_start = Clock::now();
  {
    std::unique_lock<std::mutex> lock(node_.mutex_);
    while (node_.staged_ >= node_.options_.max_staged_requests) {
      if (context_.IsCancelled()) {
        return absl::CancelledError("cancelled while waiting for staging");
      }
      node_.staging_free_.wait_for(lock, kStagingCancelPoll);
    }
    staged_.emplace(node_);
  }
  wait_ms_ += MillisSince(wait_start);
  absl::StatusOr<std::shared_ptr<transfer::Exposure>> exposure = transfer::Exposure::Create(
      *node_.staging_, sizes_, request_.decode_identity(), request_.decode_address());
  if (!exposure.ok()) return exposure.status();
  exposure_ = *std::move(exposure);
  page_buffer_.emplace(layout_, static_cast<int64_t>(sizes_.pages), exposure_->block_kv());
  // Under replay-on-decode no consumer ring is computed here; the boundary rows go straight
  // into their exposed region instead.
  state_.emplace(layout_, &*page_buffer_, exposure_->producer_swa(),
                 replay_on_decode_ ? nullptr : exposure_->consumer_swa());
  boundary_rows_ = {exposure_->boundary_rows(), sizes_.boundary_rows / sizeof(float)};
  return state_->EnsurePages(prompt_len_);
}

// A prefix hit loads [0, H) from the local block cache and the store; if that fails, the
// prefill computes producers and block KV over [0, H) itself, which gives the same result
// (DESIGN section 3, s_valid).
absl::Status PrefillCall::LoadPrefix() {
  route_ = node_.stores_->RouteFor(request_.stores());
  if (route_.empty() && node_.cache_ == nullptr) return absl::OkStatus();
  keys_ = kvstore::ChainKeys(node_.model_.fingerprint(), request_.tenant(), generate_.cache_salt(),
                             tokens_, layout_.block_size);
  if (request_.s_valid() == 0) return absl::OkStatus();
  load_ = node_.LoadPrefix(context_, span_, route_, keys_, request_.s_valid(), request_.tenant(),
                           generate_.cache_salt(), *state_);
  if (load_.ok) {
    cached_ = request_.s_valid();
    state_->length = cached_;
    node_.metrics_->loaded_blocks.Increment(static_cast<double>(cached_ / layout_.block_size));
  } else {
    log::Warn(span_.Ids(), "prefix load failed; computing the hit's blocks",
              {{"request_id", generate_.request_id()}, {"s_valid", request_.s_valid()}});
    node_.metrics_->load_failures.Increment();
  }
  return absl::OkStatus();
}

// Staging memory and the prefix load above run while another request may hold the model; the
// model itself runs one prefill at a time, and is this request's until its header is sealed.
absl::Status PrefillCall::Compute() {
  const model::PrefillOptions options = ModelOptions();
  const auto wait_start = Clock::now();
  model_turn_.emplace(node_);
  wait_ms_ += MillisSince(wait_start);
  if (context_.IsCancelled()) return absl::CancelledError("cancelled");
  const auto compute_start = Clock::now();
  active_->Computing();
  absl::StatusOr<model::PrefillResult> result = node_.ComputePrefill(tokens_, options, *state_);
  active_->Computed();
  compute_ms_ = MillisSince(compute_start);
  if (!result.ok()) return result.status();
  result_ = *std::move(result);
  prefill_ms_ = MillisSince(start_);
  if (replay_on_decode_) return absl::OkStatus();  // the decode node samples the first token
  const int64_t vocab = node_.model_.config().vocab_size;
  const std::span<const float> last_row(result_.logits.data() + result_.logits.size() - vocab,
                                        static_cast<size_t>(vocab));
  first_ = model::SampleToken(last_row, model::SamplingFromProto(generate_.sampling()),
                              request_.completed_tokens());
  if (context_.IsCancelled()) return absl::CancelledError("cancelled");
  return absl::OkStatus();
}

model::PrefillOptions PrefillCall::ModelOptions() {
  model::PrefillOptions options{.mode = mode_,
                                .keep = request_.keep(),
                                .s_valid = request_.s_valid(),
                                .chunk_size = node_.options_.token_budget};
  // A request whose caller went away (or whose deadline passed) computes no further chunk.
  options.cancelled = [this] {
    node_.watchdog_->Beat();
    return context_.IsCancelled();
  };
  if (!route_.empty() || node_.cache_ != nullptr) {
    // Producer rows of the blocks computed here, for the store and the local cache.
    producer_rows_.resize(layout_.producer_layers * 2 * prompt_len_ * layout_.kv_dim);
    options.on_producer_rows = [this](int64_t l, int64_t q_start, int64_t rows, const float* k,
                                      const float* v, int64_t stride) {
      const int64_t L = prompt_len_;
      for (int64_t j = 0; j < rows; ++j) {
        for (int kv = 0; kv < 2; ++kv) {
          std::memcpy(producer_rows_.data() + ((l * 2 + kv) * L + q_start + j) * layout_.kv_dim,
                      (kv == 0 ? k : v) + j * stride, sizeof(float) * layout_.kv_dim);
        }
      }
    };
  }
  if (replay_on_decode_) {
    // No consumer layer runs here: the boundary rows go to the decode node, which replays
    // them and computes any prompt logprobs (SealedCommit sends it the prompt for those).
    options.boundary_rows = boundary_rows_;
    return options;
  }
  // Prompt logprobs need every row's logits; the router only asks with truncation off.
  options.result_logits = WantsPromptLogprobs();
  if (options.result_logits) {
    // Chunk by chunk: a row's log-probability of the next prompt token, then its logits go.
    options.on_result_logits = [this](int64_t position, std::span<const float> logits) {
      if (position + 1 < prompt_len_) {
        reply_.add_prompt_logprobs(model::LogSoftmaxAt(logits, tokens_[position + 1]));
      }
    };
  }
  return options;
}

// Commits the header with its checksums; the decode node reads the exposed regions meanwhile.
absl::Status PrefillCall::Commit() {
  transfer_start_ = Clock::now();
  v1::DecodeNode::Stub& decode = node_.DecodeStub(request_.decode_address());
  const v1::CommitRequest commit = SealedCommit();
  model_turn_.reset();  // the next request may compute from now on
  auto client = grpc::ClientContext::FromServerContext(context_);
  trace::Inject(span_, *client);
  // The propagated deadline of the router's call still applies: the earlier of the two wins.
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(node_.options_.commit_timeout_ms);
  client->set_deadline(deadline);
  v1::CommitResponse committed;
  node_.exposures_.Add(exposure_);
  const grpc::Status status = decode.Commit(client.get(), commit, &committed);
  // The decode node has read the regions (or given up): stop exposing them. The UCX
  // registration ends with the last reference, once the write-back payloads are copied.
  node_.exposures_.Remove(exposure_->id());
  if (!status.ok()) return CommitFailed(status, deadline);
  const char* transport = transfer::TransportLabel(request_.transport());
  node_.metrics_->transfer_bytes.Add({{"transport", transport}})
      .Increment(static_cast<double>(transfer::StagingBytes(sizes_)));
  node_.metrics_->transfer_seconds.Add({{"transport", transport}}, metrics::TokenLatencyBuckets())
      .Observe(MillisSince(transfer_start_) / 1000);
  return absl::OkStatus();
}

v1::CommitRequest PrefillCall::SealedCommit() const {
  v1::CommitRequest commit;
  *commit.mutable_source() = exposure_->Source(request_.transport());
  *commit.mutable_header() = transfer::BuildHeader(request_, node_.model_.fingerprint(), result_,
                                                   first_, *state_, boundary_rows_);
  if (replay_on_decode_ && WantsPromptLogprobs()) {
    commit.mutable_header()->mutable_prompt_token_ids()->Assign(tokens_.begin(), tokens_.end());
  }
  if (!replay_on_decode_ && request_.first_logits()) {
    // Shadow verification: the served distribution of the first token (the decode node's own
    // rows give the rest).
    const int64_t vocab = node_.model_.config().vocab_size;
    commit.mutable_header()->mutable_first_logits()->Assign(result_.logits.end() - vocab,
                                                            result_.logits.end());
  }
  return commit;
}

bool PrefillCall::WantsPromptLogprobs() const {
  return generate_.prompt_logprobs() && mode_ == model::TruncationMode::kOff &&
         request_.s_valid() == 0;
}

absl::Status PrefillCall::CommitFailed(const grpc::Status& status,
                                       std::chrono::system_clock::time_point deadline) {
  // The decode node may not have noticed yet that this commit ended: its buffer is not
  // handed to another request until it must have (transfer/exposure.h, HoldBack).
  exposure_->HoldBack();
  // The decode node failed or refused, not this node: the router must not take this node
  // for lost when the decode node is (DESIGN section 6, faults).
  context_.AddTrailingMetadata(kFailedNodeKey, "decode");
  // gRPC turns the deadline into its own monotonic time at millisecond grain, so its
  // DEADLINE_EXCEEDED may come a little before `deadline` reads on the system clock.
  constexpr auto kClockSlack = std::chrono::milliseconds(20);
  const auto now = std::chrono::system_clock::now();
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && now + kClockSlack >= deadline &&
      context_.deadline() > now) {
    // --commit-timeout-ms ran out before the router's deadline: the decode node did not
    // answer (dead, wedged or cut off), and the request may go to another one. A
    // DEADLINE_EXCEEDED the decode node answered itself (its reservation expired during the
    // transfer) arrives before then and goes back as it is: that node is alive.
    return absl::UnavailableError(absl::StrCat("decode node did not answer the commit within ",
                                               node_.options_.commit_timeout_ms, " ms"));
  }
  return FromGrpcStatus(status);
}

// The prompt's full blocks that this prefill computed (the hit's blocks are stored already)
// are written back after the first token is on its way (WriteBackAfterAnswer).
absl::Status PrefillCall::WriteBack() {
  if (route_.empty() && node_.cache_ == nullptr) return absl::OkStatus();
  if (kvstore::WriteBackSteps(cached_ / layout_.block_size, static_cast<int64_t>(keys_.size()))
          .empty()) {
    return absl::OkStatus();
  }
  tenant_ = request_.tenant();
  cache_salt_ = generate_.cache_salt();
  write_back_pending_ = true;
  return absl::OkStatus();
}

// Copies of the blocks' payloads out of the state: into the local block cache at once, and to
// the store's write-back queue, whose own thread writes them.
void PrefillCall::WriteBackAfterAnswer() {
  std::vector<v1::BlockWrite> writes;
  for (const kvstore::WriteBackStep& step :
       kvstore::WriteBackSteps(cached_ / layout_.block_size, static_cast<int64_t>(keys_.size()))) {
    const bool block_kv = step.region == kvstore::Region::kBlockKv;
    std::string payload =
        block_kv ? transfer::BlockKvPayload(*state_, step.block)
                 : transfer::ProducerSwaPayload(layout_, producer_rows_, prompt_len_, step.block);
    const std::optional<Sha256Digest> parent =
        step.parent >= 0 ? std::optional<Sha256Digest>(keys_[step.parent]) : std::nullopt;
    if (node_.cache_ != nullptr) {
      node_.cache_->Put(keys_[step.block], parent, step.region, payload, tenant_, cache_salt_);
    }
    if (route_.empty()) continue;
    v1::BlockWrite& write = writes.emplace_back();
    write.set_key(kvstore::KeyBytes(keys_[step.block]));
    if (parent.has_value()) write.set_parent(kvstore::KeyBytes(*parent));
    write.set_region(block_kv ? v1::STORE_REGION_BLOCK_KV : v1::STORE_REGION_PRODUCER_SWA);
    write.set_payload(std::move(payload));
    write.set_model_fingerprint(node_.model_.fingerprint());
  }
  node_.metrics_->written_blocks.Increment(static_cast<double>(writes.size() / 2));
  node_.QueueWriteBack(std::move(writes), span_, std::move(route_));
}

// The transfer time runs to here: the commit, the decode node's reads of the state within it.
void PrefillCall::Respond() {
  // Under replay-on-decode the first token comes from the decode node's stream.
  reply_.set_first_token(replay_on_decode_ ? -1 : first_.token);
  reply_.set_first_logprob(replay_on_decode_ ? 0.0f : first_.logprob);
  reply_.mutable_usage()->set_cached_tokens(static_cast<uint32_t>(cached_));
  reply_.mutable_usage()->set_local_cached_tokens(
      load_.ok ? static_cast<uint32_t>(load_.local_blocks * layout_.block_size) : 0);
  reply_.set_load_ms(load_.local_ms + load_.store_ms);
  reply_.mutable_usage()->set_prompt_tokens(static_cast<uint32_t>(tokens_.size()));
  reply_.mutable_usage()->set_replayed_rows(static_cast<uint32_t>(result_.consumer_rows));
  reply_.set_prefill_ms(prefill_ms_);
  reply_.set_transfer_ms(MillisSince(transfer_start_));
  const double load_ms = load_.local_ms + load_.store_ms;
  // Parts of the stages, for the node's log line: the wait for the model (in compute) and the
  // load's two tiers.
  stage_ms_["model_wait"] = wait_ms_;
  stage_ms_["load_local"] = load_.local_ms;
  stage_ms_["load_store"] = load_.store_ms;
  node_.Observe({.prompt_len = prompt_len_,
                 .computed_rows = prompt_len_ - cached_,
                 .replayed_rows = replay_on_decode_ ? 0 : result_.consumer_rows,
                 .compute_ms = compute_ms_,
                 .load = load_,
                 .fixed_ms = MillisSince(start_) - wait_ms_ - load_ms - compute_ms_});
}

}  // namespace baton::prefill_node
