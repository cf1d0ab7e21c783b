#include "baton/router/router_service.h"

#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "baton/common/ced_rules.h"
#include "baton/common/log.h"
#include "baton/common/metrics.h"
#include "baton/common/rpc.h"
#include "baton/common/security.h"
#include "baton/common/wire_bounds.h"
#include "baton/common/wire_names.h"
#include "generate_call.h"
#include "router_metrics.h"

namespace baton::router {
namespace {

using Clock = std::chrono::steady_clock;

std::string NewRequestId() {
  static std::mutex mutex;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(mutex);
  return absl::StrFormat("req-%016x", rng());
}

std::vector<ServedModel> ModelsOf(const ModelConfig& config, const RouterOptions& options) {
  std::vector<ServedModel> models = {{options.model_name, config, options.tokenizer}};
  models.insert(models.end(), options.more_models.begin(), options.more_models.end());
  return models;
}

// Blocks in the longest chain a store takes in one call: its model's positions over the block
// size, the least of the models served (a store refuses more keys than that).
size_t MaxChainBlocks(const std::vector<ServedModel>& models) {
  size_t blocks = SIZE_MAX;
  for (const ServedModel& model : models) {
    blocks = std::min<size_t>(blocks, static_cast<size_t>(model.config.max_position_embeddings /
                                                          model.config.kv_block_size));
  }
  return std::max<size_t>(blocks, 1);
}

}  // namespace

uint32_t ForgetAfterMs(const RouterOptions& options) {
  if (options.node_forget_after_ms != 0) return options.node_forget_after_ms;
  const uint64_t four_expiries = uint64_t{4} * options.node_ttl_ms;
  return static_cast<uint32_t>(std::max<uint64_t>(30000, four_expiries));
}

RouterService::RouterService(const ModelConfig& config, const RouterOptions& options)
    : models_(ModelsOf(config, options)),
      options_(options),
      metrics_(std::make_unique<RouterMetrics>()),
      idle_watch_(std::make_unique<StreamWatch>(options.stream_idle_timeout, "router")),
      registry_(models_, {.heartbeat_ms = options.heartbeat_ms,
                          .node_ttl_ms = options.node_ttl_ms,
                          .require_kvstore = options.require_kvstore,
                          .split = options.split,
                          .forget_after_ms = ForgetAfterMs(options),
                          .max_node_ids = options.max_node_ids,
                          .max_node_ids_per_identity = options.max_node_ids_per_identity}),
      admission_(registry_, models_,
                 {.max_queued = options.max_queued,
                  .max_queued_per_tenant = options.max_queued_per_tenant,
                  .max_streams_per_tenant = options.max_streams_per_tenant,
                  .prefill_slots = options.prefill_slots,
                  .node_ttl_ms = options.node_ttl_ms,
                  .api_keys = options.api_keys != nullptr,
                  .tenant_weight = options.api_keys != nullptr
                                       ? std::function<int64_t(const std::string&)>(
                                             [keys = options.api_keys](const std::string& tenant) {
                                               return keys->WeightOf(tenant);
                                             })
                                       : nullptr}),
      stubs_(options.stubs != nullptr ? options.stubs : GrpcNodeStubs()),
      store_breaker_(std::make_unique<kvstore::StoreBreaker>()),
      store_probes_(std::make_unique<kvstore::ProbeBatcher>(
          kvstore::ProbeBatcher::Options{.max_keys_per_call = MaxChainBlocks(models_)})) {
  registry_.OnChange([this] { admission_.Notify(); });
  // Live nodes by role, the queue and the tenants' streams, read at scrape time.
  nodes_collector_ = metrics::AddCollector([this] { return NodeFamilies(); });
}

std::vector<prometheus::MetricFamily> RouterService::NodeFamilies() const {
  std::vector<std::pair<std::map<std::string, std::string>, double>> live, streams;
  const std::map<std::string, double> by_role = registry_.LiveByRole();
  for (const auto& [role, n] : by_role) live.push_back({{{"role", role}}, n});
  // Builds and StateBlock formats of the live nodes: a format change mid-rollout shows as
  // two formats at once, whose nodes do not pair with each other's.
  std::vector<std::pair<std::map<std::string, std::string>, double>> versions;
  std::set<uint32_t> formats;
  for (const NodeRegistry::VersionCount& v : registry_.LiveByVersion()) {
    versions.push_back({{{"role", v.role},
                         {"version", v.build.empty() ? "unknown" : v.build},
                         {"state_format", std::to_string(v.state_format)}},
                        v.nodes});
    if (v.role != "kvstore") formats.insert(v.state_format);
  }
  // The weights each model's live nodes serve: prefill and decode nodes pair only on the
  // same fingerprint, so a model whose two pools share none serves nothing (model skew).
  std::vector<std::pair<std::map<std::string, std::string>, double>> by_model;
  for (const NodeRegistry::ModelCount& m : registry_.LiveByModel()) {
    by_model.push_back(
        {{{"model", m.model}, {"fingerprint", m.fingerprint}, {"role", m.role}}, m.nodes});
  }
  // One series per tenant of the API keys file (its names are the bound on the labels).
  for (const auto& [tenant, n] : admission_.StreamsByTenant()) {
    streams.push_back(
        {{{"tenant", metrics::TenantLabel(tenant, options_.metrics_tenant_names)}}, n});
  }
  const double stores = by_role.at("kvstore");
  return std::vector<prometheus::MetricFamily>{
      metrics::GaugeFamily("baton_kvstore_nodes",
                           "Live prefix-store nodes (the fleet's live set, DESIGN section 5)",
                           {{{}, stores}}),
      metrics::GaugeFamily("baton_kvstore_replication",
                           "Owners of each stored value (--kvstore-replication); fewer live "
                           "store nodes than this lose hits with every node lost",
                           {{{}, static_cast<double>(options_.kvstore_replication)}}),
      metrics::GaugeFamily("baton_router_store_breaker_open",
                           "Store nodes skipped now after repeated failed or slow probes",
                           {{{}, static_cast<double>(store_breaker_->open())}}),
      metrics::CounterFamily("baton_router_store_breaker_trips_total",
                             "Times a store node's breaker opened",
                             {{{}, static_cast<double>(store_breaker_->trips())}}),
      metrics::CounterFamily("baton_router_store_probe_calls_total",
                             "Probe calls sent to store nodes (each carries the lookups "
                             "queued for its node while the one before was out)",
                             {{{}, static_cast<double>(store_probes_->calls())}}),
      metrics::CounterFamily("baton_router_store_probe_lookups_total",
                             "Lookups' parts carried by those calls: over the calls, the "
                             "lookups one store call serves",
                             {{{}, static_cast<double>(store_probes_->lookups())}}),
      metrics::GaugeFamily("baton_router_cache_expected_blocks",
                           "Blocks (per region) this router indexed on prefill nodes from its "
                           "own placements that the nodes' cache events have not confirmed yet",
                           {{{}, static_cast<double>(registry_.cache_index().expected())}}),
      metrics::CounterFamily(
          "baton_router_cache_expected_dropped_total",
          "Expected blocks dropped unconfirmed three heartbeats on: the node "
          "did not keep what this router priced it with",
          {{{}, static_cast<double>(registry_.cache_index().expected_dropped())}}),
      metrics::GaugeFamily("baton_router_tenant_streams",
                           "Admitted requests not yet finished (prefilling or streaming), by "
                           "tenant",
                           streams),
      metrics::GaugeFamily("baton_nodes", "Registered nodes heard from recently, by role", live),
      metrics::GaugeFamily("baton_router_nodes_by_version",
                           "Live nodes by role, build version and StateBlock format version",
                           versions),
      metrics::GaugeFamily("baton_router_nodes_by_model",
                           "Live prefill and decode nodes by served model, weights "
                           "fingerprint and role",
                           by_model),
      metrics::GaugeFamily("baton_router_version_skew",
                           "1 while live prefill and decode nodes report more than one "
                           "StateBlock format (nodes of different formats do not pair)",
                           {{{}, formats.size() > 1 ? 1.0 : 0.0}}),
      metrics::GaugeFamily("baton_router_queue_depth",
                           "Requests waiting in the admission queue for a prefill slot",
                           {{{}, admission_.Queued()}})};
}

RouterService::~RouterService() {
  StopHealth();
}

void RouterService::StopHealth() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stopping_.notify_all();
  if (health_thread_.joinable()) health_thread_.join();
}

grpc::Status RouterService::Register(grpc::ServerContext* context,
                                     const v1::RegisterRequest* request,
                                     v1::RegisterResponse* reply) {
  bool resync = false;
  if (absl::Status s = registry_.Register(*context, *request, &resync); !s.ok()) {
    return ToGrpcStatus(s);
  }
  reply->set_heartbeat_ms(options_.heartbeat_ms);
  reply->set_cache_resync(resync);
  return grpc::Status::OK;
}

std::shared_ptr<grpc::AuthMetadataProcessor> RouterService::ApiKeyCheck() {
  if (options_.api_keys == nullptr) return nullptr;
  return security::ApiKeyCheck(
      options_.api_keys, [this](absl::string_view method, const absl::Status& refusal) {
        // baton_requests_total counts Generate calls, as Serve does.
        if (method == "/baton.v1.Generation/Generate") {
          metrics_->requests
              .Add({{"outcome", metrics::OutcomeLabel(grpc::StatusCode::UNAUTHENTICATED)}})
              .Increment();
        }
        log::Warn("request refused",
                  {{"method", std::string(method)}, {"error", std::string(refusal.message())}});
      });
}

absl::StatusOr<std::string> RouterService::Tenant(const grpc::ServerContext& context) const {
  if (options_.api_keys == nullptr) return "";
  return options_.api_keys->Authenticate(context);
}

grpc::Status RouterService::ListModels(grpc::ServerContext* context,
                                       const v1::ListModelsRequest* /*request*/,
                                       v1::ListModelsResponse* reply) {
  if (absl::StatusOr<std::string> tenant = Tenant(*context); !tenant.ok()) {
    return ToGrpcStatus(tenant.status());
  }
  const std::vector<std::set<std::string>> served = registry_.ServedFingerprints();
  const std::vector<NodeRegistry::WeightBytes> bytes = registry_.ResidentWeightBytes();
  for (size_t i = 0; i < models_.size(); ++i) {
    v1::ServedModel* model = reply->add_models();
    model->set_name(models_[i].name);
    model->set_max_model_len(options_.max_model_len);
    for (const std::string& fingerprint : served[i]) model->add_fingerprints(fingerprint);
    model->set_split(std::string(SplitName(options_.split)));
    model->set_prefill_weight_bytes(bytes[i].prefill);
    model->set_decode_weight_bytes(bytes[i].decode);
  }
  return grpc::Status::OK;
}

grpc::Status RouterService::ListStores(grpc::ServerContext* context,
                                       const v1::ListStoresRequest* /*request*/,
                                       v1::ListStoresResponse* reply) {
  if (absl::StatusOr<std::string> tenant = Tenant(*context); !tenant.ok()) {
    return ToGrpcStatus(tenant.status());
  }
  const std::vector<std::shared_ptr<RegisteredNode>> stores = registry_.LiveStores();
  reply->set_replication(static_cast<uint32_t>(options_.kvstore_replication));
  std::vector<v1::StoreStatus> status(stores.size());
  std::vector<std::thread> asks;
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(2);
  for (size_t i = 0; i < stores.size(); ++i) {
    asks.emplace_back([&, i] {
      grpc::ClientContext call;
      call.set_deadline(deadline);
      const grpc::Status s =
          stubs_->KvStore(*stores[i])
              ->Stats(&call, v1::KvStoreStatsRequest(), status[i].mutable_stats());
      status[i].set_answered(s.ok());
      if (!s.ok()) status[i].set_error(s.error_message());
    });
  }
  for (std::thread& t : asks) t.join();
  for (size_t i = 0; i < stores.size(); ++i) {
    status[i].set_node_id(stores[i]->id());
    status[i].set_model_fingerprint(stores[i]->info.model_fingerprint());
    status[i].set_skipped(store_breaker_->IsOpen(stores[i]->id()));
    *reply->add_stores() = std::move(status[i]);
  }
  return grpc::Status::OK;
}

grpc::Status RouterService::ListRates(grpc::ServerContext* context,
                                      const v1::ListRatesRequest* /*request*/,
                                      v1::ListRatesResponse* reply) {
  if (absl::StatusOr<std::string> tenant = Tenant(*context); !tenant.ok()) {
    return ToGrpcStatus(tenant.status());
  }
  // What the nodes' last registrations said: no call goes out.
  for (const std::shared_ptr<RegisteredNode>& node : registry_.LiveServingNodes()) {
    v1::NodeRates& entry = *reply->add_nodes();
    entry.set_node_id(node->id());
    entry.set_model(node->model < models_.size() ? models_[node->model].name : "");
    if (node->info.role() == v1::NODE_ROLE_PREFILL) {
      entry.set_role("prefill");
      entry.set_producers_only(node->info.held_layers() == v1::HELD_LAYERS_PRODUCERS);
      *entry.mutable_prefill() = node->info.load().rates();
    } else {
      entry.set_role("decode");
      *entry.mutable_decode() = node->info.load().decode_rates();
      *entry.mutable_fidelity() = node->info.load().fidelity();
    }
  }
  return grpc::Status::OK;
}

bool RouterService::Serving() const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (draining_) return false;
  }
  return registry_.Serving();
}

void RouterService::Drain(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  draining_ = true;
  if (health_) {
    health_("", false);
    health_("baton.v1.Generation", false);
  }
  log::Info("router draining", {{"open_calls", open_calls_}});
  calls_ended_.wait_until(lock, deadline, [this] { return open_calls_ == 0; });
  if (open_calls_ > 0) {
    log::Warn("drain timeout: open calls are cut", {{"open_calls", open_calls_}});
  }
}

void RouterService::WatchHealth(HealthSetter health) {
  health_ = health;
  health_thread_ = std::thread([this, health = std::move(health)] {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      lock.unlock();
      const bool serving = Serving();
      health("", serving);
      health("baton.v1.Generation", serving);
      lock.lock();
      // Node liveness is a matter of time (TTLs), so it is looked at again every 100 ms.
      stopping_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; });
    }
  });
}

absl::StatusOr<size_t> RouterService::ResolveModel(const std::string& name) const {
  return ResolveServedModel(models_, name);
}

absl::StatusOr<RouterService::Effective> RouterService::Validate(
    const v1::GenerateRequest& request) const {
  return ValidateRequest(request, models_, options_);
}

namespace {

// The truncation a checked request is served with: the router's default, the request's own
// (checked against the model), or untruncated when it asks for prompt logprobs.
absl::StatusOr<RouterService::Effective> EffectiveTruncation(const v1::GenerateRequest& r,
                                                             const ModelConfig& config,
                                                             const RouterOptions& options) {
  auto invalid = [](std::string message) { return absl::InvalidArgumentError(message); };
  RouterService::Effective effective{
      options.default_mode,
      static_cast<uint32_t>(EffectiveKeep(options.default_keep, config.ring_capacity()))};
  if (r.has_truncation()) {
    const v1::TruncationMode mode = r.truncation().mode();
    if (!IsTruncationMode(mode)) return invalid("truncation.mode: must be OFF, MASK or COMPACT");
    if (absl::Status keep = CheckKeep(mode != v1::TRUNCATION_MODE_OFF, r.truncation().keep(),
                                      config.ring_capacity(), "truncation.keep");
        !keep.ok()) {
      return keep;
    }
    if (mode != v1::TRUNCATION_MODE_OFF && r.prompt_logprobs()) {
      return invalid(absl::StrCat("prompt_logprobs: unavailable with truncation on (",
                                  v1::TruncationMode_Name(mode),
                                  "); ask for truncation.mode OFF or drop prompt_logprobs"));
    }
    effective = {mode, mode == v1::TRUNCATION_MODE_OFF ? 0u
                                                       : static_cast<uint32_t>(std::min<int64_t>(
                                                             r.truncation().keep(), UINT32_MAX))};
  } else if (r.prompt_logprobs()) {
    effective = {v1::TRUNCATION_MODE_OFF, 0};  // DESIGN section 3: served untruncated
  }
  if (effective.mode == v1::TRUNCATION_MODE_OFF) effective.keep = 0;
  return effective;
}

}  // namespace

absl::StatusOr<RouterService::Effective> ValidateRequest(const v1::GenerateRequest& r,
                                                         const std::vector<ServedModel>& models,
                                                         const RouterOptions& options) {
  auto invalid = [](std::string message) { return absl::InvalidArgumentError(message); };
  absl::StatusOr<size_t> model = ResolveServedModel(models, r.model());
  if (!model.ok()) return model.status();
  const ModelConfig& config = models[*model].config;
  const text::Tokenizer* tokenizer = models[*model].tokenizer.get();
  if (r.prompt_token_ids().empty()) {
    if (!r.prompt_text().empty()) {
      return invalid(
          "prompt_text: no tokenizer is configured on this router (the model directory has no "
          "tokenizer.model); send prompt_token_ids");
    }
    return invalid("prompt_token_ids: the prompt is empty; send at least one token id");
  }
  if (!r.prompt_text().empty()) {
    return invalid("prompt_text: send prompt_token_ids or prompt_text, not both");
  }
  if (r.sampling().stop_size() > 0 && tokenizer == nullptr) {
    return invalid(
        "sampling.stop: stop strings need a tokenizer and this router's model has none; use "
        "sampling.stop_token_ids");
  }
  if (absl::Status st = CheckRequestId("request_id", r.request_id()); !st.ok()) return st;
  if (absl::Status st = CheckBytes("cache_salt", r.cache_salt(), kMaxCacheSaltBytes); !st.ok()) {
    return st;
  }
  // A keyed tenant's chain root hashes its name's length (uint32 LE, whose last byte is 0 for
  // any name this router accepts) between the fingerprint and the salt; a keyless root hashes
  // the salt right after the fingerprint (kvstore/chain.h). A salt without NUL bytes can
  // therefore never spell a keyed tenant's root, on a store that keyless and keyed routers
  // share, and the keys stay as they are (stores written by earlier builds keep their hits).
  if (r.cache_salt().find('\0') != std::string::npos) {
    return invalid("cache_salt: must not contain a NUL byte");
  }
  if (r.fidelity_tokens() > kMaxFidelityTokens) {
    return invalid(absl::StrCat("fidelity_tokens: ", r.fidelity_tokens(), " must lie in [0, ",
                                kMaxFidelityTokens, "]"));
  }
  const auto& s = r.sampling();
  if (s.max_tokens() == 0 || s.max_tokens() > options.max_tokens_limit) {
    return invalid(absl::StrCat("sampling.max_tokens: ", s.max_tokens(), " must lie in [1, ",
                                options.max_tokens_limit, "]"));
  }
  // The model's own limit, whatever --max-model-len says; before the token loop, so that an
  // oversized prompt costs nothing more.
  if (absl::Status st = CheckSequenceLength("prompt_token_ids", r.prompt_token_ids_size(),
                                            s.max_tokens(), config);
      !st.ok()) {
    return st;
  }
  for (int i = 0; i < r.prompt_token_ids_size(); ++i) {
    const int32_t t = r.prompt_token_ids(i);
    if (t < 0 || t >= config.vocab_size) {
      return invalid(absl::StrCat("prompt_token_ids[", i, "]: ", t,
                                  " is outside the vocabulary [0, ", config.vocab_size, ")"));
    }
  }
  const uint64_t total = static_cast<uint64_t>(r.prompt_token_ids_size()) + s.max_tokens();
  if (total > options.max_model_len) {
    return invalid(
        absl::StrCat("prompt_token_ids + sampling.max_tokens: ", r.prompt_token_ids_size(), " + ",
                     s.max_tokens(), " exceeds the context limit ", options.max_model_len));
  }
  if (absl::Status st = CheckSampling("sampling", s, config); !st.ok()) return st;
  return EffectiveTruncation(r, config, options);
}

grpc::Status RouterService::Generate(grpc::ServerContext* context,
                                     const v1::GenerateRequest* request,
                                     grpc::ServerWriter<v1::GenerateResponse>* writer) {
  return Serve(context, *request, writer);
}

grpc::Status RouterService::Serve(grpc::ServerContext* context, const v1::GenerateRequest& request,
                                  ResponseWriter* writer) {
  RequestTrace trace;
  trace.start = Clock::now();
  // The client's trace when it sent a well-formed traceparent, else a new one; the client
  // learns its trace from the response's initial metadata.
  trace.span = trace::StartSpan(trace::FromCall(*context), options_.trace_sample_ratio);
  context->AddInitialMetadata(trace::kTraceparent, trace.span.context.Header());
  auto outcome = [&](grpc::StatusCode code) {
    metrics_->requests.Add({{"outcome", metrics::OutcomeLabel(code)}}).Increment();
  };
  absl::StatusOr<std::string> tenant = Tenant(*context);
  if (!tenant.ok()) {
    outcome(grpc::StatusCode::UNAUTHENTICATED);
    log::Warn(trace.span.Ids(), "request refused",
              {{"peer", context->peer()}, {"error", std::string(tenant.status().message())}});
    return ToGrpcStatus(tenant.status());
  }
  trace.hold.tenant = *std::move(tenant);
  trace.id = request.request_id().empty() ? NewRequestId() : request.request_id();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (draining_) {
      outcome(grpc::StatusCode::UNAVAILABLE);
      return ToGrpcStatus(absl::UnavailableError(
          "the router is draining (shutting down): retry on another router"));
    }
    ++open_calls_;
  }
  metrics_->running.Increment();
  const RouterParts parts{options_,  models_,      registry_,       admission_,    *stubs_,
                          *metrics_, *idle_watch_, *store_breaker_, *store_probes_};
  const grpc::Status status =
      ToGrpcStatus(GenerateCall(parts, context, request, writer, trace).Run());
  admission_.ReleaseStream(trace.hold);
  metrics_->running.Decrement();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--open_calls_ == 0) calls_ended_.notify_all();
  }
  outcome(status.error_code());
  metrics_->e2e.Observe(std::chrono::duration<double>(Clock::now() - trace.start).count());
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - trace.start).count();
  if (status.ok()) {
    log::Info(trace.span.Ids(), "request finished",
              {{"request_id", trace.id},
               {"prompt_tokens", trace.prompt_tokens},
               {"tokens", trace.tokens},
               {"prefill_node", trace.prefill_node},
               {"decode_node", trace.decode_node},
               {"ms", ms},
               {"stage_ms", trace.stage_ms}});
  } else {
    log::Warn(trace.span.Ids(), "request failed",
              {{"request_id", trace.id},
               {"code", metrics::OutcomeLabel(status.error_code())},
               {"error", status.error_message()},
               {"tokens", trace.tokens},
               {"ms", ms},
               {"stage_ms", trace.stage_ms}});
  }
  return status;
}

}  // namespace baton::router
