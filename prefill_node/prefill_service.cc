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
#include "baton/kvstore/fleet.h"
#include "baton/kvstore/hit_policy.h"
#include "baton/transfer/state_block.h"
#include "prefill_call.h"
#include "prefill_metrics.h"
#include "store_fleet.h"

namespace baton::prefill_node {
namespace {

uint64_t PayloadBytes(const std::vector<v1::BlockWrite>& writes) {
  uint64_t bytes = 0;
  for (const v1::BlockWrite& w : writes) bytes += w.payload().size();
  return bytes;
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
        CheckSampling("request.sampling", generate.sampling(), config),
        kvstore::CheckStoreFleet(request.stores(), "stores")}) {
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

PrefillService::PrefillService(model::Engine& model, const PrefillOptions& options)
    : model_(model), options_(options), metrics_(std::make_unique<Metrics>()) {
  watchdog_ = std::make_unique<Watchdog>("prefill", std::chrono::milliseconds(options.watchdog_ms),
                                         [this] { return computing_.load(); });
  if (options.block_cache_bytes > 0) {
    const model::StateLayout layout = model.state_layout();
    cache_ = std::make_unique<kvstore::BlockCache>(
        kvstore::ValueCodec(model.fingerprint(), sizeof(float) * layout.page_floats(),
                            sizeof(float) * layout.stored_swa_block_floats()),
        layout.block_size, options.block_cache_bytes);
  }
  // Any request may name store nodes (the router's fleet), so the writer always runs.
  stores_ = std::make_unique<StoreFleetClient>(options.kvstore_address);
  writer_ = std::thread([this] { WriteBackLoop(); });
  copier_ = std::thread([this] { CopyLoop(); });
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
  staging_collector_ = metrics::AddCollector([this] { return ScrapeFamilies(); });
}

std::vector<prometheus::MetricFamily> PrefillService::ScrapeFamilies() const {
  auto gauge = [](const char* name, const char* help, double value) {
    return metrics::GaugeFamily(name, help, {{{}, value}});
  };
  std::vector<prometheus::MetricFamily> families;
  if (cache_ != nullptr) {
    const kvstore::BlockCache::Stats stats = cache_->stats();
    families.push_back(gauge("baton_block_cache_bytes",
                             "Bytes the local block cache holds (values with their headers)",
                             static_cast<double>(stats.bytes)));
    families.push_back(gauge("baton_block_cache_budget_bytes",
                             "The local block cache's budget (--block-cache-bytes)",
                             static_cast<double>(stats.budget)));
    families.push_back(metrics::CounterFamily(
        "baton_block_cache_lookups_total",
        "Block reads from the local block cache, by result (hit, miss, corrupt: dropped)",
        {{{{"result", "hit"}}, static_cast<double>(stats.hits)},
         {{{"result", "miss"}}, static_cast<double>(stats.misses - stats.corrupt)},
         {{{"result", "corrupt"}}, static_cast<double>(stats.corrupt)}}));
    families.push_back(metrics::CounterFamily("baton_block_cache_evictions_total",
                                              "Values the local block cache evicted",
                                              {{{}, static_cast<double>(stats.evictions)}}));
  }
  const v1::LoadReport load = Load();
  const v1::PrefillRates& rates = load.rates();
  families.push_back(metrics::GaugeFamily(
      "baton_prefill_rate_ms",
      "The node's measured rates (moving averages) that the router prices requests with: "
      "ms per GFLOP computed, per MiB loaded from each tier, and per request",
      {{{{"rate", "compute_per_gflop"}}, rates.compute_ms_per_gflop()},
       {{{"rate", "local_per_mib"}}, rates.local_ms_per_mib()},
       {{{"rate", "store_per_mib"}}, rates.store_ms_per_mib()},
       {{{"rate", "fixed"}}, rates.fixed_ms()}}));
  for (prometheus::MetricFamily& family : std::vector<prometheus::MetricFamily>{
           gauge("baton_prefill_store_breaker_open",
                 "Store nodes this node skips now after repeated failed or slow calls",
                 static_cast<double>(stores_->breaker().open())),
           metrics::CounterFamily("baton_prefill_store_breaker_trips_total",
                                  "Times a store node's breaker opened on this node",
                                  {{{}, static_cast<double>(stores_->breaker().trips())}}),
           gauge("baton_prefill_exposures",
                 "Computed states exposed for their decode node's read (commits in flight)",
                 static_cast<double>(exposures_.size())),
           gauge("baton_prefill_running",
                 "Prefills the model is computing now (one at a time: 0 or 1)",
                 computing_.load() ? 1.0 : 0.0),
           gauge("baton_prefill_requests_active",
                 "Prefill requests this node holds now (queued, computing or committing)",
                 static_cast<double>(load.active_requests())),
           gauge("baton_prefill_requests_active_peak",
                 "The most prefill requests this node has held at once since it started "
                 "(at most the routers' --prefill-slots when every router shares it)",
                 static_cast<double>(ActivePeak())),
           gauge("baton_prefill_work_ms",
                 "The predicted work of the prefills this node holds that are not computed "
                 "yet, in ms (what it reports to the routers as prefill_work_ms)",
                 load.prefill_work_ms()),
           gauge("baton_prefill_staging_buffers",
                 "Idle staging buffers kept for their reader's next request",
                 static_cast<double>(staging_->held())),
           gauge("baton_prefill_weight_bytes",
                 "Model weight bytes resident on this node (the producers' alone under the "
                 "replay-on-decode split)",
                 static_cast<double>(model_.weight_bytes()))}) {
    families.push_back(std::move(family));
  }
  return families;
}

PrefillService::~PrefillService() {
  // The answered calls' copies first: they queue store writes, and hold exposed memory.
  {
    std::lock_guard<std::mutex> lock(copy_mutex_);
    stop_copier_ = true;
  }
  copy_ready_.notify_all();
  if (copier_.joinable()) copier_.join();
  stop_progress_ = true;
  if (ucx_thread_.joinable()) ucx_thread_.join();
  {
    std::lock_guard<std::mutex> lock(write_mutex_);
    stop_writer_ = true;
  }
  write_ready_.notify_all();
  if (writer_.joinable()) writer_.join();
}

PrefillService::PrefixLoad PrefillService::LoadPrefix(
    grpc::ServerContext& caller, const trace::Span& span, const StoreFleetRoute& route,
    const std::vector<Sha256Digest>& keys, int64_t hit_tokens, const std::string& tenant,
    const std::string& salt, model::SequenceState& state) {
  const model::StateLayout& layout = state.layout();
  const int64_t B = layout.block_size, C = layout.ring_capacity;
  const int64_t h = hit_tokens / B;
  PrefixLoad load;
  if ((route.empty() && cache_ == nullptr) || h == 0 || static_cast<int64_t>(keys.size()) < h) {
    return load;
  }
  const auto deadline = ReadDeadline(hit_tokens);
  const kvstore::HitReads reads = kvstore::ReadsForHit(h, model_.config().sliding_window, B);
  // Blocks [first, end) of `region`: the local cache's first, then one store read for the rest.
  auto read = [&](int64_t first, int64_t end, kvstore::Region region, uint64_t bytes,
                  const std::function<void(int64_t, const std::string&)>& use) {
    const auto local_start = Clock::now();
    std::vector<int64_t> missing;
    for (int64_t b = first; b < end; ++b) {
      std::optional<std::string> held =
          cache_ != nullptr ? cache_->Get(keys[b], region) : std::nullopt;
      if (!held.has_value()) {
        missing.push_back(b);
        continue;
      }
      use(b, *held);
      load.local_bytes += held->size();
      if (region == kvstore::Region::kBlockKv) ++load.local_blocks;
    }
    load.local_ms += MillisSince(local_start);
    if (missing.empty()) return true;
    if (route.empty()) return false;
    const auto store_start = Clock::now();
    const bool read = stores_->Read(
        route, caller, span, keys, missing, region, model_.fingerprint(), bytes, deadline,
        [&](int64_t b, const std::string& payload) {
          use(b, payload);
          load.store_bytes += payload.size();
          // The block is kept near the compute for the next prompt that shares it.
          if (cache_ != nullptr) {
            cache_->Put(keys[b], b > 0 ? std::optional<Sha256Digest>(keys[b - 1]) : std::nullopt,
                        region, payload, tenant, salt);
          }
        });
    load.store_ms += MillisSince(store_start);
    return read;
  };
  const uint64_t page_bytes = sizeof(float) * layout.page_floats();
  const bool kv = read(
      0, reads.block_kv_end, kvstore::Region::kBlockKv, page_bytes,
      [&](int64_t b, const std::string& payload) { transfer::LoadBlockKv(payload, b, state); });
  const uint64_t swa_bytes = sizeof(float) * layout.stored_swa_block_floats();
  const bool swa =
      kv && read(reads.producer_swa_begin, reads.producer_swa_end, kvstore::Region::kProducerSwa,
                 swa_bytes, [&](int64_t b, const std::string& payload) {
                   // The window needs only the rows the ring keeps: [H - C, H).
                   transfer::LoadProducerSwaRows(payload, b, hit_tokens - C, state);
                 });
  load.ok = kv && swa;
  return load;
}

void PrefillService::Observe(const Observed& o) {
  // Moving averages over about the last 20 prefills (a sample's weight halves over 14): one
  // prefill's times swing with whatever shares the node's cores, and over the last 5 (the
  // horizon before) the fixed cost alone varied 43 to 108 ms between runs of one workload, so
  // the router's prices and a capacity plan made from them (`batonctl rates`) followed the
  // last few requests rather than the node. Each is a ratio of decayed sums, so every sample
  // weighs as much as the next when it arrives (the first no more than the others).
  constexpr double kKeep = 0.95;
  // A tier's rate per MiB is weighted by the bytes: a small read (whose fixed costs dominate)
  // moves it as little as it weighs.
  auto weigh = [](RateSums& sums, double ms, double units) {
    sums.ms = kKeep * sums.ms + ms;
    sums.units = kKeep * sums.units + units;
    return sums.ms / sums.units;
  };
  const kvstore::PrefillWork work =
      kvstore::EstimatePrefillWork(model_.config(), o.prompt_len, o.prompt_len - o.computed_rows,
                                   o.prompt_len - o.replayed_rows);
  const double gflop = work.computed_gflop + (o.replayed_rows > 0 ? work.replayed_gflop : 0);
  constexpr double kMiB = 1024.0 * 1024.0;
  std::lock_guard<std::mutex> lock(rates_mutex_);
  // The compute time is a line in the work (kvstore::WorkTimeFit): its slope is the rate per
  // GFLOP, and its constant (the weights streamed once per prefill, whatever its rows) joins
  // the fixed cost per request.
  compute_fit_.Add(gflop, o.compute_ms);
  if (compute_fit_.per_unit_ms() > 0) rates_.compute_ms_per_gflop = compute_fit_.per_unit_ms();
  // Small reads say little of a tier's rate (a fixed cost dominates): 1 MiB at least.
  if (o.load.local_bytes >= kMiB) {
    rates_.local_ms_per_mib =
        weigh(local_sums_, o.load.local_ms, static_cast<double>(o.load.local_bytes) / kMiB);
  }
  if (o.load.store_bytes >= kMiB) {
    rates_.store_ms_per_mib =
        weigh(store_sums_, o.load.store_ms, static_cast<double>(o.load.store_bytes) / kMiB);
  }
  // The fixed cost is the decayed mean of the samples (each weighs as much as the next when
  // it arrives): a node's first prefill, which pays its one-time costs (the first touch of its
  // staging memory, its first connection to a decode node: 140 ms of commit where later ones
  // take 5), no longer sets the rate that the next 20 only slowly move.
  rates_.fixed_ms = weigh(fixed_sums_, std::max(0.0, o.fixed_ms), 1) + compute_fit_.fixed_ms();
  ++rate_samples_;
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

double PrefillService::PredictedWorkMs(int64_t prompt_len, int64_t s_valid, int64_t keep,
                                       bool truncation_on) const {
  kvstore::PrefillRates measured;
  {
    std::lock_guard<std::mutex> lock(rates_mutex_);
    measured = rates_;
  }
  const ModelConfig& config = model_.config();
  const kvstore::HitPolicyInput input{.prompt_len = prompt_len,
                                      .keep = keep,
                                      .truncation_on = truncation_on,
                                      .block_size = config.kv_block_size};
  const kvstore::PrefillCost cost =
      kvstore::PredictPrefill(kvstore::RatesOrDefaults(kvstore::ToProto(measured, 0)), 0, input,
                              {.hit_blocks = s_valid / config.kv_block_size}, config);
  const bool replays_here = options_.split != model::Split::kReplayOnDecode;
  return cost.compute_ms + (replays_here ? cost.replay_ms : 0) + cost.fixed_ms;
}

std::chrono::system_clock::time_point PrefillService::ReadDeadline(int64_t hit_tokens) const {
  kvstore::PrefillRates rates;
  {
    std::lock_guard<std::mutex> lock(rates_mutex_);
    rates = rates_;
  }
  const double ms_per_gflop = rates.compute_ms_per_gflop > 0
                                  ? rates.compute_ms_per_gflop
                                  : kvstore::DefaultPrefillRates().compute_ms_per_gflop;
  const double compute_ms =
      kvstore::EstimatePrefillWork(model_.config(), hit_tokens, 0, hit_tokens).computed_gflop *
      ms_per_gflop;
  const double ms = std::max(compute_ms, static_cast<double>(options_.store_read_min_ms));
  return std::chrono::system_clock::now() +
         std::chrono::microseconds(static_cast<int64_t>(std::min(ms, 600000.0) * 1000));
}

void PrefillService::QueueWriteBack(std::vector<v1::BlockWrite> writes, const trace::Span& span,
                                    StoreFleetRoute route) {
  if (writes.empty() || route.empty()) return;
  const uint64_t bytes = PayloadBytes(writes);
  {
    std::lock_guard<std::mutex> lock(write_mutex_);
    // The store is behind: skip rather than grow.
    if (bytes >
        options_.write_back_bytes - std::min(options_.write_back_bytes, write_queue_bytes_)) {
      return;
    }
    write_queue_bytes_ += bytes;
    write_queue_.push_back({std::move(writes), span, std::move(route)});
  }
  write_ready_.notify_one();
}

void PrefillService::AfterAnswer(std::unique_ptr<PrefillCall> call) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++writing_back_;
  }
  call->Answered();
  {
    std::lock_guard<std::mutex> lock(copy_mutex_);
    copy_queue_.push_back(std::move(call));
  }
  copy_ready_.notify_one();
}

void PrefillService::CopyLoop() {
  std::unique_lock<std::mutex> lock(copy_mutex_);
  while (true) {
    copy_ready_.wait(lock, [this] { return stop_copier_ || !copy_queue_.empty(); });
    if (copy_queue_.empty()) return;
    std::unique_ptr<PrefillCall> call = std::move(copy_queue_.front());
    copy_queue_.pop_front();
    lock.unlock();
    if (options_.before_write_back) options_.before_write_back();
    call->WriteBackAfterAnswer();
    call.reset();  // its staging memory is free
    {
      std::lock_guard<std::mutex> node_lock(mutex_);
      if (--writing_back_ == 0) idle_.notify_all();
    }
    lock.lock();
  }
}

void PrefillService::WriteBackLoop() {
  std::unique_lock<std::mutex> lock(write_mutex_);
  while (true) {
    write_ready_.wait(lock, [this] { return stop_writer_ || !write_queue_.empty(); });
    if (write_queue_.empty()) return;
    QueuedWrites queued = std::move(write_queue_.front());
    write_queue_.pop_front();
    lock.unlock();
    const std::vector<v1::BlockWrite>& writes = queued.writes;
    for (const std::string& node : stores_->Write(queued.route, writes, queued.span)) {
      log::Warn(queued.span.Ids(), "prefix-store write failed", {{"store", node}});
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
  v1::LoadReport load;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    load.set_active_requests(static_cast<uint32_t>(active_));
    load.set_queued_requests(static_cast<uint32_t>(queued_));
    // The one computing has run part of its predicted work already.
    const double ran =
        computing_work_ms_ > 0
            ? std::min(computing_work_ms_,
                       std::chrono::duration<double, std::milli>(Clock::now() - computing_since_)
                           .count())
            : 0;
    load.set_prefill_work_ms(std::max(0.0, held_work_ms_ - ran));
  }
  {
    std::lock_guard<std::mutex> lock(rates_mutex_);
    *load.mutable_rates() = kvstore::ToProto(rates_, rate_samples_);
  }
  if (cache_ != nullptr) {
    const kvstore::BlockCache::Stats stats = cache_->stats();
    load.set_block_cache_bytes(stats.bytes);
    load.set_block_cache_budget_bytes(stats.budget);
  }
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
  return exposures_.Stream(security::PeerIdentity(*context), *request, allowed);
}

grpc::Status PrefillService::Prefill(grpc::ServerContext* context,
                                     const v1::PrefillRequest* request,
                                     v1::PrefillResponse* reply) {
  return ToGrpcStatus(Serve(*context, *request, *reply));
}

absl::Status PrefillService::Serve(grpc::ServerContext& context, const v1::PrefillRequest& request,
                                   v1::PrefillResponse& reply) {
  if (absl::Status s =
          security::Authorize(context, {security::Role::kRouter}, "PrefillNode/Prefill");
      !s.ok()) {
    return s;
  }
  const auto start = Clock::now();
  const trace::Span span = trace::StartServerSpan(context);
  std::map<std::string, double> stage_ms;
  // The call has let go of all it held (prefill_call.h) before it is counted and logged, but
  // for what its write-back copies out after the answer (AfterAnswer).
  auto call = std::make_unique<PrefillCall>(*this, context, request, reply, span, stage_ms);
  const absl::Status status = call->Run();
  if (status.ok() && call->write_back_pending()) AfterAnswer(std::move(call));
  call.reset();
  const std::string outcome = metrics::OutcomeLabel(static_cast<int>(status.code()));
  metrics_->requests.Add({{"outcome", outcome}}).Increment();
  metrics_->seconds.Observe(MillisSince(start) / 1000);
  const std::string& id = request.request().request_id();
  if (status.ok()) {
    metrics_->tokens.Increment(request.request().prompt_token_ids_size());
    // The work the node's rates are measured over (Observe), so that a log shows what each
    // prefill cost against what it computed.
    const int64_t prompt_len = request.request().prompt_token_ids_size();
    const bool replayed_here = options_.split != model::Split::kReplayOnDecode;
    const kvstore::PrefillWork work = kvstore::EstimatePrefillWork(
        model_.config(), prompt_len, reply.usage().cached_tokens(),
        prompt_len - (replayed_here ? reply.usage().replayed_rows() : 0));
    log::Info(span.Ids(), "prefill done",
              {{"request_id", id},
               {"prompt_tokens", request.request().prompt_token_ids_size()},
               {"cached_tokens", reply.usage().cached_tokens()},
               {"replayed_rows", reply.usage().replayed_rows()},
               {"local_cached_tokens", reply.usage().local_cached_tokens()},
               {"load_ms", reply.load_ms()},
               {"prefill_ms", reply.prefill_ms()},
               {"transfer_ms", reply.transfer_ms()},
               {"computed_gflop", work.computed_gflop},
               {"replayed_gflop", work.replayed_gflop},
               {"ms", MillisSince(start)},
               {"stage_ms", stage_ms}});
  } else {
    log::Warn(span.Ids(), "prefill failed",
              {{"request_id", id},
               {"code", outcome},
               {"error", std::string(status.message())},
               {"stage_ms", stage_ms}});
  }
  return status;
}

void PrefillService::Drain(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  draining_ = true;
  log::Info("prefill node draining", {{"requests", active_}});
  idle_.wait_until(lock, deadline, [this] { return active_ == 0 && writing_back_ == 0; });
  if (active_ > 0) log::Warn("drain timeout: prefills are cut", {{"requests", active_}});
}

}  // namespace baton::prefill_node
