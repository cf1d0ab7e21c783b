#include "baton/prefill_node/prefill_service.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "baton/common/ced_rules.h"
#include "baton/common/checksum.h"
#include "baton/common/log.h"
#include "baton/common/metrics.h"
#include "baton/common/rpc.h"
#include "baton/common/security.h"
#include "baton/common/wire_bounds.h"
#include "baton/kvstore/chain.h"
#include "baton/kvstore/hit_policy.h"
#include "baton/model/sampling.h"
#include "baton/transfer/state_block.h"

namespace baton::prefill_node {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t PayloadBytes(const std::vector<v1::BlockWrite>& writes) {
  uint64_t bytes = 0;
  for (const v1::BlockWrite& w : writes) bytes += w.payload().size();
  return bytes;
}

double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace

absl::Status ValidatePrefillRequest(const v1::PrefillRequest& request, const ModelConfig& config) {
  const v1::GenerateRequest& generate = request.request();
  for (absl::Status s :
       {CheckRequestId("request.request_id", generate.request_id()),
        CheckRequestId("reservation.reservation_id", request.reservation().reservation_id()),
        CheckBytes("request.cache_salt", generate.cache_salt(), kMaxCacheSaltBytes),
        CheckBytes("tenant", request.tenant(), kMaxTenantBytes),
        CheckBytes("decode_identity", request.decode_identity(), kMaxIdentityBytes),
        CheckBytes("decode_address", request.decode_address(), kMaxAddressBytes),
        CheckSequenceLength("request.prompt_token_ids", generate.prompt_token_ids_size(), 0,
                            config),
        CheckSampling("request.sampling", generate.sampling(), config)}) {
    if (!s.ok()) return s;
  }
  if (request.s_valid() > static_cast<uint64_t>(generate.prompt_token_ids_size())) {
    return absl::InvalidArgumentError(absl::StrCat("s_valid: ", request.s_valid(),
                                                   " exceeds the prompt's ",
                                                   generate.prompt_token_ids_size(), " tokens"));
  }
  if (request.s_valid() % static_cast<uint64_t>(config.kv_block_size) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("s_valid: ", request.s_valid(), " is not a multiple of the block size B = ",
                     config.kv_block_size, " (a prefix hit is whole blocks)"));
  }
  return absl::OkStatus();
}

struct PrefillService::Metrics {
  prometheus::Family<prometheus::Counter>& requests = metrics::Counter(
      "baton_prefill_requests_total", "Prefill requests finished, by outcome (gRPC status name)");
  prometheus::Counter& tokens =
      metrics::Counter("baton_prefill_tokens_total", "Prompt tokens of finished prefills").Add({});
  prometheus::Histogram& seconds =
      metrics::Histogram(
          "baton_prefill_seconds",
          "Time a prefill request spent on this node, queueing and transfer included")
          .Add({}, metrics::LatencyBuckets());
  prometheus::Gauge& queue_depth =
      metrics::Gauge("baton_prefill_queue_depth", "Prefill requests waiting for the model").Add({});
  prometheus::Family<prometheus::Counter>& transfer_bytes = metrics::Counter(
      "baton_transfer_bytes_total", "StateBlock bytes moved to decode nodes, by transport");
  prometheus::Family<prometheus::Histogram>& transfer_seconds = metrics::Histogram(
      "baton_transfer_seconds", "Time to move one StateBlock and commit it, by transport");
  prometheus::Counter& loaded_blocks =
      metrics::Counter("baton_prefix_loaded_blocks_total",
                       "Blocks loaded from the prefix store instead of computed")
          .Add({});
  prometheus::Counter& written_blocks =
      metrics::Counter("baton_prefix_written_blocks_total",
                       "Blocks queued for writing back to the prefix store")
          .Add({});
  prometheus::Counter& load_failures =
      metrics::Counter("baton_prefix_load_failures_total",
                       "Prefix hits whose blocks could not be read from the store (an error, or "
                       "a block evicted since the lookup); they were computed instead")
          .Add({});
  prometheus::Counter& write_failures =
      metrics::Counter("baton_prefix_write_failures_total",
                       "Write-backs of blocks to the prefix store that failed")
          .Add({});
};

PrefillService::PrefillService(model::Engine& model, const PrefillOptions& options)
    : model_(model), options_(options), metrics_(std::make_unique<Metrics>()) {
  watchdog_ = std::make_unique<Watchdog>("prefill", std::chrono::milliseconds(options.watchdog_ms),
                                         [this] { return computing_.load(); });
  if (!options.kvstore_address.empty()) {
    kvstore_ = v1::KvStore::NewStub(
        security::InternalChannel(options.kvstore_address, security::Role::kKvstore));
    writer_ = std::thread([this] { WriteBackLoop(); });
  }
  if (options.use_ucx) {
    auto worker =
        transfer::UcxWorker::Create({.allow_unprotected_tcp = options.ucx_allow_unprotected_tcp});
    if (worker.ok()) {
      ucx_ = *std::move(worker);
      ucx_thread_ = std::thread([this] { UcxProgressLoop(); });
    } else {
      log::Warn("UCX unavailable; only the gRPC transport will work",
                {{"error", std::string(worker.status().message())}});
    }
  }
  staging_ = std::make_unique<transfer::StagingPool>(ucx_.get(), options.staging_cache_bytes);
  staging_collector_ = metrics::AddCollector([this] {
    auto gauge = [](const char* name, const char* help, double value) {
      return metrics::GaugeFamily(name, help, {{{}, value}});
    };
    return std::vector<prometheus::MetricFamily>{
        gauge("baton_prefill_exposures",
              "Computed states exposed for their decode node's read (commits in flight)",
              static_cast<double>(exposures_.size())),
        gauge("baton_prefill_running",
              "Prefills the model is computing now (one at a time: 0 or 1)",
              computing_.load() ? 1.0 : 0.0),
        gauge("baton_prefill_staging_buffers",
              "Idle staging buffers kept for their reader's next request",
              static_cast<double>(staging_->held()))};
  });
}

PrefillService::~PrefillService() {
  stop_progress_ = true;
  if (ucx_thread_.joinable()) ucx_thread_.join();
  {
    std::lock_guard<std::mutex> lock(write_mutex_);
    stop_writer_ = true;
  }
  write_ready_.notify_all();
  if (writer_.joinable()) writer_.join();
}

bool PrefillService::LoadPrefix(grpc::ServerContext& caller, const std::vector<Sha256Digest>& keys,
                                int64_t hit_tokens, model::SequenceState& state) {
  const model::StateLayout& layout = state.layout();
  const int64_t B = layout.block_size, C = layout.ring_capacity;
  const int64_t h = hit_tokens / B;
  if (kvstore_ == nullptr || h == 0 || static_cast<int64_t>(keys.size()) < h) return false;
  const kvstore::HitReads reads = kvstore::ReadsForHit(h, model_.config().sliding_window, B);
  auto read = [&](int64_t first, int64_t end, v1::StoreRegion region, uint64_t bytes,
                  const std::function<void(int64_t, const std::string&)>& use) {
    v1::ReadBlocksRequest request;
    for (int64_t b = first; b < end; ++b) request.add_keys(kvstore::KeyBytes(keys[b]));
    request.set_region(region);
    // The caller's cancellation and deadline carry over; the earlier deadline wins.
    auto context = grpc::ClientContext::FromServerContext(caller);
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto reader = kvstore_->ReadBlocks(context.get(), request);
    v1::StoredBlock block;
    int64_t b = first;
    bool ok = true;
    while (reader->Read(&block)) {
      if (!block.found() || block.payload().size() != bytes) ok = false;
      if (ok) use(b, block.payload());
      ++b;
    }
    return reader->Finish().ok() && ok && b == end;
  };
  const uint64_t page_bytes = sizeof(float) * layout.page_floats();
  const bool kv = read(
      0, reads.block_kv_end, v1::STORE_REGION_BLOCK_KV, page_bytes,
      [&](int64_t b, const std::string& payload) { transfer::LoadBlockKv(payload, b, state); });
  const uint64_t swa_bytes = sizeof(float) * layout.stored_swa_block_floats();
  const bool swa =
      kv && read(reads.producer_swa_begin, reads.producer_swa_end, v1::STORE_REGION_PRODUCER_SWA,
                 swa_bytes, [&](int64_t b, const std::string& payload) {
                   // The window needs only the rows the ring keeps: [H - C, H).
                   transfer::LoadProducerSwaRows(payload, b, hit_tokens - C, state);
                 });
  return kv && swa;
}

absl::StatusOr<model::PrefillResult> PrefillService::ComputePrefill(
    std::span<const int32_t> tokens, const model::PrefillOptions& options,
    model::SequenceState& state) {
  if (model_.backend().host_memory()) return model_.Prefill(tokens, options, state);
  // On a device the prefill runs on a copy of the state in the engine's memory: in with what
  // the prefix load put into the exposed memory, out with the whole prompt for the transfer.
  // The copy is one zeroed allocation (rings, then the prompt's pages), so no page of it
  // carries another request's rows.
  const model::StateLayout layout = model_.state_layout();
  const int64_t L = static_cast<int64_t>(tokens.size());
  const int64_t pages = (L + layout.block_size - 1) / layout.block_size;
  const int64_t ring_floats = layout.producer_swa_floats() + layout.consumer_swa_floats();
  model::BackendArray<float> memory(model_.backend(), ring_floats + pages * layout.page_floats());
  if (memory.data() == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("no ",
                                                     model::DeviceName(model_.backend().device()),
                                                     " memory for a prompt of ", L, " tokens"));
  }
  model::ContiguousPageAllocator page_memory(layout, pages, memory.data() + ring_floats);
  model::SequenceState computed(layout, &page_memory, memory.data(),
                                memory.data() + layout.producer_swa_floats());
  if (absl::Status s = computed.EnsurePages(L); !s.ok()) return s;
  if (absl::Status s = model_.StageIn(model::StateCopies(state, computed, state.length)); !s.ok()) {
    return s;
  }
  computed.length = state.length;
  absl::StatusOr<model::PrefillResult> result = model_.Prefill(tokens, options, computed);
  if (!result.ok()) return result;
  if (absl::Status s = model_.StageOut(model::StateCopies(computed, state, L)); !s.ok()) return s;
  state.length = computed.length;
  state.s_valid = computed.s_valid;
  return result;
}

void PrefillService::QueueWriteBack(std::vector<v1::BlockWrite> writes) {
  if (writes.empty()) return;
  const uint64_t bytes = PayloadBytes(writes);
  {
    std::lock_guard<std::mutex> lock(write_mutex_);
    // The store is behind: skip rather than grow.
    if (bytes >
        options_.write_back_bytes - std::min(options_.write_back_bytes, write_queue_bytes_)) {
      return;
    }
    write_queue_bytes_ += bytes;
    write_queue_.push_back(std::move(writes));
  }
  write_ready_.notify_one();
}

void PrefillService::WriteBackLoop() {
  std::unique_lock<std::mutex> lock(write_mutex_);
  while (true) {
    write_ready_.wait(lock, [this] { return stop_writer_ || !write_queue_.empty(); });
    if (write_queue_.empty()) return;
    std::vector<v1::BlockWrite> writes = std::move(write_queue_.front());
    write_queue_.pop_front();
    lock.unlock();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::WriteBlocksResponse written;
    auto writer = kvstore_->WriteBlocks(&context, &written);
    for (const v1::BlockWrite& w : writes) {
      if (!writer->Write(w)) break;
    }
    writer->WritesDone();
    if (grpc::Status s = writer->Finish(); !s.ok()) {
      log::Warn("prefix-store write failed", {{"error", s.error_message()}});
      metrics_->write_failures.Increment();
    }
    lock.lock();
    write_queue_bytes_ -= PayloadBytes(writes);  // counted until written
  }
}

void PrefillService::UcxProgressLoop() {
  while (!stop_progress_) {
    if (ucx_->Progress() == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

v1::LoadReport PrefillService::Load() const {
  std::lock_guard<std::mutex> lock(mutex_);
  v1::LoadReport load;
  load.set_active_requests(static_cast<uint32_t>(active_));
  load.set_queued_requests(static_cast<uint32_t>(queued_));
  return load;
}

v1::DecodeNode::Stub& PrefillService::DecodeStub(const std::string& address) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& stub = decode_stubs_[address];
  if (stub == nullptr) {
    stub = v1::DecodeNode::NewStub(security::InternalChannel(address, security::Role::kDecode));
  }
  return *stub;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* PrefillService::ReadRegions(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  const absl::Status allowed =
      security::Authorize(*context, {security::Role::kDecode}, "PrefillNode/ReadRegions");
  return exposures_.Stream(security::PeerIdentity(*context), *request, ToGrpcStatus(allowed));
}

grpc::Status PrefillService::Prefill(grpc::ServerContext* context,
                                     const v1::PrefillRequest* request,
                                     v1::PrefillResponse* reply) {
  if (absl::Status s =
          security::Authorize(*context, {security::Role::kRouter}, "PrefillNode/Prefill");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  const auto start = Clock::now();
  const grpc::Status status = Run(context, request, reply);
  metrics_->requests.Add({{"outcome", metrics::OutcomeLabel(status.error_code())}}).Increment();
  metrics_->seconds.Observe(MillisSince(start) / 1000);
  const std::string& id = request->request().request_id();
  if (status.ok()) {
    metrics_->tokens.Increment(request->request().prompt_token_ids_size());
    log::Info("prefill done", {{"request_id", id},
                               {"prompt_tokens", request->request().prompt_token_ids_size()},
                               {"cached_tokens", reply->usage().cached_tokens()},
                               {"replayed_rows", reply->usage().replayed_rows()},
                               {"prefill_ms", reply->prefill_ms()},
                               {"transfer_ms", reply->transfer_ms()}});
  } else {
    log::Warn("prefill failed", {{"request_id", id},
                                 {"code", metrics::OutcomeLabel(status.error_code())},
                                 {"error", status.error_message()}});
  }
  return status;
}

void PrefillService::Drain(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  draining_ = true;
  log::Info("prefill node draining", {{"requests", active_}});
  idle_.wait_until(lock, deadline, [this] { return active_ == 0; });
  if (active_ > 0) log::Warn("drain timeout: prefills are cut", {{"requests", active_}});
}

grpc::Status PrefillService::Run(grpc::ServerContext* context, const v1::PrefillRequest* request,
                                 v1::PrefillResponse* reply) {
  const auto start = Clock::now();
  const v1::GenerateRequest& generate = request->request();
  std::vector<int32_t> tokens(generate.prompt_token_ids().begin(),
                              generate.prompt_token_ids().end());
  absl::StatusOr<model::TruncationMode> mode = model::ModeFromProto(request->mode());
  if (!mode.ok()) return ToGrpcStatus(mode.status());
  if (absl::Status s = ValidatePrefillRequest(*request, model_.config()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (draining_) {
      log::Warn("prefill refused: draining", {{"request_id", generate.request_id()}});
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the prefill node is draining (shutting down): use another");
    }
    ++active_;
  }
  struct Done {
    PrefillService* self;
    ~Done() {
      std::lock_guard<std::mutex> lock(self->mutex_);
      if (--self->active_ == 0) self->idle_.notify_all();
    }
  } done{this};

  const v1::Reservation& reservation = request->reservation();
  if (request->transport() == v1::TRANSPORT_UCX && ucx_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "transport: UCX was asked for and this prefill node has none");
  }
  if (request->transport() != v1::TRANSPORT_UCX && request->transport() != v1::TRANSPORT_GRPC) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "transport: must be UCX or GRPC");
  }
  // The state is computed straight into staging memory exposed for this request alone, with
  // block KV contiguous, so that the decode node reads each region in one get.
  const model::StateLayout layout = model_.state_layout();
  const transfer::RegionSizes sizes = transfer::RegionSizesFor(layout, tokens.size());
  if (reservation.pages() != sizes.pages ||
      reservation.producer_swa_bytes() != sizes.producer_swa ||
      reservation.consumer_swa_bytes() != sizes.consumer_swa ||
      reservation.page_bytes() != sizes.page) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "reservation: its regions do not match this prompt and model");
  }
  // Staging memory is held from here through the commit, by a bounded number of requests.
  {
    std::unique_lock<std::mutex> lock(mutex_);
    while (staged_ >= options_.max_staged_requests) {
      if (context->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled while waiting for staging");
      }
      staging_free_.wait_for(lock, std::chrono::milliseconds(20));
    }
    ++staged_;
  }
  struct Staged {
    PrefillService* self;
    ~Staged() {
      {
        std::lock_guard<std::mutex> lock(self->mutex_);
        --self->staged_;
      }
      self->staging_free_.notify_one();
    }
  } staged{this};
  absl::StatusOr<std::shared_ptr<transfer::Exposure>> exposure = transfer::Exposure::Create(
      *staging_, sizes, request->decode_identity(), request->decode_address());
  if (!exposure.ok()) return ToGrpcStatus(exposure.status());
  model::ContiguousPageAllocator page_buffer(layout, static_cast<int64_t>(sizes.pages),
                                             (*exposure)->block_kv());
  model::SequenceState state(layout, &page_buffer, (*exposure)->producer_swa(),
                             (*exposure)->consumer_swa());
  const int64_t L = static_cast<int64_t>(tokens.size());
  if (absl::Status s = state.EnsurePages(L); !s.ok()) return ToGrpcStatus(s);
  model::PrefillOptions options{.mode = *mode,
                                .keep = request->keep(),
                                .s_valid = request->s_valid(),
                                .chunk_size = options_.token_budget};
  // A request whose caller went away (or whose deadline passed) computes no further chunk.
  options.cancelled = [this, context] {
    watchdog_->Beat();
    return context->IsCancelled();
  };
  // A prefix hit loads [0, H) from the store; if that fails, the prefill computes producers and
  // block KV over [0, H) itself, which gives the same result (DESIGN section 3, s_valid).
  std::vector<Sha256Digest> keys;
  int64_t cached = 0;
  if (kvstore_ != nullptr) {
    keys = kvstore::ChainKeys(model_.fingerprint(), request->tenant(), generate.cache_salt(),
                              tokens, layout.block_size);
    if (request->s_valid() > 0 && LoadPrefix(*context, keys, request->s_valid(), state)) {
      cached = request->s_valid();
      state.length = cached;
      metrics_->loaded_blocks.Increment(static_cast<double>(cached / layout.block_size));
    } else if (request->s_valid() > 0) {
      log::Warn("prefix load failed; computing the hit's blocks",
                {{"request_id", generate.request_id()}, {"s_valid", request->s_valid()}});
      metrics_->load_failures.Increment();
    }
  }
  // Producer rows of the blocks computed here, for the store: [P][2][L][kv_dim].
  std::vector<float> producer_rows;
  if (kvstore_ != nullptr) {
    producer_rows.resize(layout.producer_layers * 2 * L * layout.kv_dim);
    options.on_producer_rows = [&](int64_t l, int64_t q_start, int64_t rows, const float* k,
                                   const float* v, int64_t stride) {
      for (int64_t j = 0; j < rows; ++j) {
        for (int kv = 0; kv < 2; ++kv) {
          std::memcpy(producer_rows.data() + ((l * 2 + kv) * L + q_start + j) * layout.kv_dim,
                      (kv == 0 ? k : v) + j * stride, sizeof(float) * layout.kv_dim);
        }
      }
    };
  }
  // Prompt logprobs need every row's logits; the router only asks with truncation off.
  const bool prompt_logprobs =
      generate.prompt_logprobs() && *mode == model::TruncationMode::kOff && request->s_valid() == 0;
  options.result_logits = prompt_logprobs;
  if (prompt_logprobs) {
    // Chunk by chunk: a row's log-probability of the next prompt token, then its logits go.
    options.on_result_logits = [&](int64_t position, std::span<const float> logits) {
      if (position + 1 < L) {
        reply->add_prompt_logprobs(model::LogSoftmaxAt(logits, tokens[position + 1]));
      }
    };
  }
  // Staging memory and the prefix load above run while another request may hold the model;
  // the model itself runs one prefill at a time.
  metrics_->queue_depth.Increment();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++queued_;
  }
  std::unique_lock<std::mutex> model_lock(model_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --queued_;
  }
  metrics_->queue_depth.Decrement();
  // The model is this request's until the commit: the watchdog watches it advance chunk by
  // chunk (a request that holds it without advancing is a wedged node).
  watchdog_->Beat();
  computing_ = true;
  struct Computing {
    PrefillService* self;
    ~Computing() {
      if (self != nullptr) self->computing_ = false;
    }
  } computing{this};
  if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  absl::StatusOr<model::PrefillResult> result = ComputePrefill(tokens, options, state);
  if (!result.ok()) return ToGrpcStatus(result.status());
  const int64_t vocab = model_.config().vocab_size;
  const std::span<const float> last_row(result->logits.data() + result->logits.size() - vocab,
                                        static_cast<size_t>(vocab));
  const auto& sampling = generate.sampling();
  const model::SampledToken first =
      model::SampleToken(last_row,
                         {.temperature = sampling.temperature(),
                          .top_k = static_cast<int32_t>(sampling.top_k()),
                          .top_p = sampling.top_p() > 0 ? sampling.top_p() : 1.0f,
                          .seed = sampling.seed()},
                         request->completed_tokens());
  const double prefill_ms = MillisSince(start);
  if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");

  // Commit the header with its checksums; the decode node reads the exposed regions meanwhile.
  const auto transfer_start = Clock::now();
  v1::DecodeNode::Stub& decode = DecodeStub(request->decode_address());
  v1::CommitRequest commit;
  *commit.mutable_source() = (*exposure)->Source(request->transport());
  v1::StateHeader& h = *commit.mutable_header();
  h.set_model_fingerprint(model_.fingerprint());
  h.set_request_id(generate.request_id());
  h.set_reservation_id(reservation.reservation_id());
  h.set_prompt_len(static_cast<uint32_t>(tokens.size()));
  h.set_s_valid(request->s_valid());
  h.set_mode(request->mode());
  h.set_keep(request->keep());
  h.set_first_token(first.token);
  h.set_first_logprob(first.logprob);
  h.set_replayed_rows(static_cast<uint32_t>(result->consumer_rows));
  transfer::SealHeader(state, h);
  computing_ = false;
  computing.self = nullptr;  // the next request may set it from now on
  model_lock.unlock();
  auto client = grpc::ClientContext::FromServerContext(*context);
  // The propagated deadline of the router's call still applies: the earlier of the two wins.
  const auto commit_deadline =
      std::chrono::system_clock::now() + std::chrono::milliseconds(options_.commit_timeout_ms);
  client->set_deadline(commit_deadline);
  v1::CommitResponse committed;
  exposures_.Add(*exposure);
  const grpc::Status commit_status = decode.Commit(client.get(), commit, &committed);
  // The decode node has read the regions (or given up): stop exposing them. The UCX
  // registration ends with the last reference, once the write-back payloads are copied.
  exposures_.Remove((*exposure)->id());
  if (!commit_status.ok()) {
    // The decode node may not have noticed yet that this commit ended: its buffer is not
    // handed to another request until it must have (transfer/exposure.h, HoldBack).
    (*exposure)->HoldBack();
    // The decode node failed or refused, not this node: the router must not take this node
    // for lost when the decode node is (DESIGN section 6, faults).
    context->AddTrailingMetadata(kFailedNodeKey, "decode");
    const auto now = std::chrono::system_clock::now();
    if (commit_status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
        now >= commit_deadline && context->deadline() > now) {
      // --commit-timeout-ms ran out before the router's deadline: the decode node did not
      // answer (dead, wedged or cut off), and the request may go to another one. A
      // DEADLINE_EXCEEDED the decode node answered itself (its reservation expired during the
      // transfer) arrives before then and goes back as it is: that node is alive.
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("decode node did not answer the commit within ",
                                       options_.commit_timeout_ms, " ms"));
    }
    return commit_status;
  }
  const char* transport = request->transport() == v1::TRANSPORT_GRPC ? "grpc" : "ucx";
  metrics_->transfer_bytes.Add({{"transport", transport}})
      .Increment(static_cast<double>(transfer::StagingBytes(sizes)));
  metrics_->transfer_seconds.Add({{"transport", transport}}, metrics::TokenLatencyBuckets())
      .Observe(MillisSince(transfer_start) / 1000);

  if (kvstore_ != nullptr) {
    // The prompt's full blocks that this prefill computed (the hit's blocks are stored
    // already), written back after the first token is on its way.
    std::vector<v1::BlockWrite> writes;
    for (const kvstore::WriteBackStep& step :
         kvstore::WriteBackSteps(cached / layout.block_size, static_cast<int64_t>(keys.size()))) {
      v1::BlockWrite& write = writes.emplace_back();
      write.set_key(kvstore::KeyBytes(keys[step.block]));
      if (step.parent >= 0) write.set_parent(kvstore::KeyBytes(keys[step.parent]));
      if (step.region == kvstore::Region::kBlockKv) {
        write.set_region(v1::STORE_REGION_BLOCK_KV);
        write.set_payload(transfer::BlockKvPayload(state, step.block));
      } else {
        write.set_region(v1::STORE_REGION_PRODUCER_SWA);
        write.set_payload(transfer::ProducerSwaPayload(layout, producer_rows, L, step.block));
      }
    }
    metrics_->written_blocks.Increment(static_cast<double>(writes.size() / 2));
    QueueWriteBack(std::move(writes));
  }
  reply->set_first_token(first.token);
  reply->set_first_logprob(first.logprob);
  reply->mutable_usage()->set_cached_tokens(static_cast<uint32_t>(cached));
  reply->mutable_usage()->set_prompt_tokens(static_cast<uint32_t>(tokens.size()));
  reply->mutable_usage()->set_replayed_rows(static_cast<uint32_t>(result->consumer_rows));
  reply->set_prefill_ms(prefill_ms);
  reply->set_transfer_ms(MillisSince(transfer_start));
  return grpc::Status::OK;
}

}  // namespace baton::prefill_node
