#include "baton/router/router_service.h"

#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "baton/common/ced_rules.h"
#include "baton/common/log.h"
#include "baton/common/metrics.h"
#include "baton/common/rpc.h"
#include "baton/common/security.h"
#include "baton/common/wire_bounds.h"
#include "baton/kvstore/chain.h"
#include "baton/router/routing.h"
#include "baton/text/streaming_text.h"
#include "baton/v1/kvstore.grpc.pb.h"
#include "grpcpp/health_check_service_interface.h"

namespace baton::router {
namespace {

using Clock = std::chrono::steady_clock;

// The certificate role a node of `role` must present.
std::optional<security::Role> CertificateRole(v1::NodeRole role) {
  switch (role) {
    case v1::NODE_ROLE_PREFILL:
      return security::Role::kPrefill;
    case v1::NODE_ROLE_DECODE:
      return security::Role::kDecode;
    case v1::NODE_ROLE_KVSTORE:
      return security::Role::kKvstore;
    default:
      return std::nullopt;
  }
}

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

std::string NewRequestId() {
  static std::mutex mutex;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(mutex);
  return absl::StrFormat("req-%016x", rng());
}

// A client context that carries the caller's cancellation and deadline, capped at `cap`.
std::unique_ptr<grpc::ClientContext> Propagated(grpc::ServerContext* server,
                                                std::chrono::milliseconds cap) {
  auto client = grpc::ClientContext::FromServerContext(*server);
  const auto capped = std::chrono::system_clock::now() + cap;
  if (server->deadline() > capped) client->set_deadline(capped);
  return client;
}

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

const char* RoleLabel(v1::NodeRole role) {
  switch (role) {
    case v1::NODE_ROLE_PREFILL:
      return "prefill";
    case v1::NODE_ROLE_DECODE:
      return "decode";
    case v1::NODE_ROLE_KVSTORE:
      return "kvstore";
    default:
      return "unknown";
  }
}

}  // namespace

struct RouterService::Metrics {
  prometheus::Family<prometheus::Counter>& requests = metrics::Counter(
      "baton_requests_total", "Generate requests finished, by outcome (a gRPC status code name)");
  prometheus::Gauge& running =
      metrics::Gauge("baton_requests_running", "Generate requests in flight").Add({});
  prometheus::Counter& prompt_tokens =
      metrics::Counter("baton_prompt_tokens_total", "Prompt tokens of admitted requests").Add({});
  prometheus::Counter& generation_tokens =
      metrics::Counter("baton_generation_tokens_total", "Tokens streamed to clients").Add({});
  prometheus::Histogram& ttft =
      metrics::Histogram("baton_time_to_first_token_seconds",
                         "From a request's arrival to its first token leaving the router")
          .Add({}, metrics::LatencyBuckets());
  prometheus::Histogram& itl =
      metrics::Histogram("baton_inter_token_latency_seconds",
                         "Time between consecutive tokens of a request, at the router")
          .Add({}, metrics::TokenLatencyBuckets());
  prometheus::Histogram& e2e = metrics::Histogram("baton_e2e_request_latency_seconds",
                                                  "From a request's arrival to its last message")
                                   .Add({}, metrics::LatencyBuckets());
  prometheus::Counter& prefix_queries =
      metrics::Counter("baton_prefix_queries_total",
                       "Prefix-store lookups (requests whose truncation allows a hit)")
          .Add({});
  prometheus::Counter& prefix_hits =
      metrics::Counter("baton_prefix_hits_total", "Lookups that gave a hit (H > 0)").Add({});
  prometheus::Counter& cached_tokens =
      metrics::Counter("baton_prefix_cached_tokens_total",
                       "Prompt tokens served from the prefix store (H per request)")
          .Add({});
  prometheus::Counter& replayed_rows =
      metrics::Counter("baton_prefix_replayed_rows_total",
                       "Consumer rows the prefill nodes computed (replayed) per request")
          .Add({});
  prometheus::Family<prometheus::Counter>& retries = metrics::Counter(
      "baton_retries_total", "Attempts started again on another node, by the reason");
  prometheus::Counter& prefix_query_failures =
      metrics::Counter("baton_prefix_query_failures_total",
                       "Prefix-store lookups that failed or timed out (the request ran cold)")
          .Add({});
  // Joins repeated within minutes are the node-flapping alert's signal.
  prometheus::Family<prometheus::Counter>& node_registrations = metrics::Counter(
      "baton_node_registrations_total",
      "Nodes that joined, by role: new, back with another address or identity, or heard from "
      "again after they expired or were marked down");
};

RouterService::RouterService(const ModelConfig& config, const RouterOptions& options)
    : options_(options),
      metrics_(std::make_unique<Metrics>()),
      idle_watch_(std::make_unique<StreamWatch>(options.stream_idle_timeout, "router")) {
  models_.push_back({options.model_name, config, options.tokenizer});
  models_.insert(models_.end(), options.more_models.begin(), options.more_models.end());
  for (const ServedModel& model : models_) config_digests_.push_back(ConfigDigest(model.config));
  queues_.resize(models_.size());
  streams_.resize(models_.size());
  // Live nodes by role, read at scrape time from the registry.
  nodes_collector_ = metrics::AddCollector([this] {
    std::map<std::string, double> live = {{"prefill", 0}, {"decode", 0}, {"kvstore", 0}};
    double queued = 0;
    std::map<std::string, double> streams;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const FairQueue& queue : queues_) queued += static_cast<double>(queue.size());
      for (const auto& model : streams_) {
        for (const auto& [tenant, n] : model) streams[tenant] += static_cast<double>(n);
      }
      const auto now = Clock::now();
      for (const auto& [id, node] : nodes_) {
        if (now - node->last_seen <= std::chrono::milliseconds(options_.node_ttl_ms)) {
          live[RoleLabel(node->info.role())] += 1;
        }
      }
    }
    std::vector<std::pair<std::map<std::string, std::string>, double>> samples;
    for (const auto& [role, n] : live) samples.push_back({{{"role", role}}, n});
    // One series per tenant of the API keys file (its names are the bound on the labels).
    std::vector<std::pair<std::map<std::string, std::string>, double>> tenant_streams;
    for (const auto& [tenant, n] : streams) tenant_streams.push_back({{{"tenant", tenant}}, n});
    return std::vector<prometheus::MetricFamily>{
        metrics::GaugeFamily("baton_router_tenant_streams",
                             "Admitted requests not yet finished (prefilling or streaming), by "
                             "tenant",
                             tenant_streams),
        metrics::GaugeFamily("baton_nodes", "Registered nodes heard from recently, by role",
                             samples),
        metrics::GaugeFamily("baton_router_queue_depth",
                             "Requests waiting in the admission queue for a prefill slot",
                             {{{}, queued}})};
  });
}

RouterService::~RouterService() {
  StopHealth();
}

void RouterService::StopHealth() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  if (health_thread_.joinable()) health_thread_.join();
}

grpc::Status RouterService::Register(grpc::ServerContext* context,
                                     const v1::RegisterRequest* request,
                                     v1::RegisterResponse* reply) {
  const std::optional<security::Role> role = CertificateRole(request->role());
  if (!role) return Invalid("role: must be PREFILL, DECODE or KVSTORE");
  // A node registers only as the role its certificate names.
  if (absl::Status s = security::Authorize(*context, {*role}, "Registry/Register"); !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (request->node_id().empty() || request->address().empty()) {
    return Invalid("node_id and address: both are required");
  }
  for (absl::Status s :
       {CheckBytes("node_id", request->node_id(), kMaxNodeIdBytes),
        CheckBytes("address", request->address(), kMaxAddressBytes),
        CheckBytes("model_fingerprint", request->model_fingerprint(), kMaxFingerprintBytes),
        CheckBytes("model_name", request->model_name(), kMaxModelNameBytes),
        CheckBytes("config_digest", request->config_digest(), kMaxFingerprintBytes),
        CheckBytes("ucx_worker_address", request->ucx_worker_address(), kMaxUcxAddressBytes)}) {
    if (!s.ok()) return ToGrpcStatus(s);
  }
  if (!request->ucx_worker_address().empty() && request->role() != v1::NODE_ROLE_PREFILL) {
    return Invalid("ucx_worker_address: only a prefill node registers one");
  }
  // A prefill or decode node serves one of this router's models, with that model's config. A
  // router of one model takes a node of another name (nodes name their model after their own
  // directory by default) when the config is the same, and says so once.
  size_t model = 0;
  if (request->role() != v1::NODE_ROLE_KVSTORE) {
    absl::Status refused;
    bool renamed = false;
    if (!request->model_name().empty() && !(models_.size() == 1 && models_[0].name.empty())) {
      absl::StatusOr<size_t> found = ResolveModel(request->model_name());
      if (found.ok()) {
        model = *found;
      } else if (models_.size() == 1) {
        renamed = true;
      } else {
        refused = absl::FailedPreconditionError(absl::StrCat(
            "model_name: node ", request->node_id(), " serves '", request->model_name(),
            "', which this router does not; ", found.status().message()));
      }
    }
    if (refused.ok() && !request->config_digest().empty() &&
        request->config_digest() != config_digests_[model]) {
      refused = absl::FailedPreconditionError(absl::StrCat(
          "config_digest: node ", request->node_id(), "'s model config differs from the one ",
          "this router serves as '", models_[model].name,
          "' (another config needs a name of its own: --served-model-name)"));
    }
    if (!refused.ok() || renamed) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (refused_nodes_.size() >= kMaxNoted) refused_nodes_.clear();  // a bound, not a ledger
      if (refused_nodes_.insert(request->node_id()).second) {
        if (!refused.ok()) {
          log::Warn("node refused", {{"node", request->node_id()},
                                     {"error", std::string(refused.message())},
                                     {"message", std::string(refused.message())}});
        } else {
          const std::string message =
              absl::StrCat("node ", request->node_id(), " registers as '", request->model_name(),
                           "'; this router serves one model, '", models_[0].name,
                           "', of the same config, and takes it as that");
          log::Warn("node of another model name taken",
                    {{"node", request->node_id()}, {"message", message}});
        }
      }
      if (!refused.ok()) return ToGrpcStatus(refused);
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string identity = security::PeerIdentity(*context);
  // A node_id belongs to the identity that first registered it: another certificate (another
  // pod's, or another role's) cannot take it over and draw its requests.
  if (auto bound = nodes_.find(request->node_id());
      bound != nodes_.end() && bound->second->identity != identity) {
    log::Warn("node_id takeover refused", {{"node", request->node_id()},
                                           {"identity", identity.empty() ? "none" : identity}});
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("node_id: '", request->node_id(),
                                     "' is registered to another identity"));
  }
  auto& node = nodes_[request->node_id()];
  // Requests in flight read a node's address, id, fingerprint and identity without the lock, so
  // those never change in place: a node that comes back different is a new Node. A heartbeat
  // of the same node only refreshes its load (read under the lock).
  if (node == nullptr || node->info.address() != request->address() ||
      node->info.role() != request->role() ||
      node->info.model_fingerprint() != request->model_fingerprint() ||
      node->info.model_name() != request->model_name() ||
      node->info.ucx_worker_address() != request->ucx_worker_address() ||
      node->identity != identity) {
    node = std::make_shared<Node>();
    node->model = model;
    // The router sends prompts and state only to a server that proves the registered role.
    node->channel = security::InternalChannel(request->address(), *role);
    node->identity = identity;
    node->info = *request;
    node->draining = request->draining();
    log::Info("node registered",
              {{"node", request->node_id()},
               {"role", v1::NodeRole_Name(request->role())},
               {"address", request->address()},
               {"message", absl::StrCat("node ", request->node_id(), " registered")}});
  } else {
    *node->info.mutable_load() = request->load();
    if (request->draining() && !node->draining) {
      log::Info("node draining",
                {{"node", request->node_id()},
                 {"role", v1::NodeRole_Name(request->role())},
                 {"message", absl::StrCat("node ", request->node_id(),
                                          " is draining: no new requests go there")}});
    }
    node->draining = request->draining();
  }
  // A new Node's last_seen is the epoch, as is a marked-down one's.
  if (Clock::now() - node->last_seen > std::chrono::milliseconds(options_.node_ttl_ms)) {
    metrics_->node_registrations.Add({{"role", RoleLabel(request->role())}}).Increment();
  }
  node->last_seen = Clock::now();
  reply->set_heartbeat_ms(options_.heartbeat_ms);
  return grpc::Status::OK;
}

std::shared_ptr<RouterService::Node> RouterService::Pick(v1::NodeRole role,
                                                         const std::vector<std::string>& exclude,
                                                         const std::string& fingerprint) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::shared_ptr<Node>> candidates;
  std::vector<NodeLoad> loads;
  for (auto& [id, node] : nodes_) {
    candidates.push_back(node);
    loads.push_back({.id = id,
                     .role = node->info.role(),
                     .last_seen = node->last_seen,
                     .inflight = node->inflight,
                     .queued = node->info.load().queued_requests(),
                     .free_pages = node->info.load().free_pages(),
                     .draining = node->draining,
                     .fingerprint = node->info.model_fingerprint()});
  }
  const int64_t chosen = SelectNode(loads, role, exclude, Clock::now(),
                                    std::chrono::milliseconds(options_.node_ttl_ms), fingerprint);
  if (chosen < 0) return nullptr;
  ++candidates[chosen]->inflight;
  return candidates[chosen];
}

absl::StatusOr<std::shared_ptr<RouterService::Node>> RouterService::AdmitPrefill(
    grpc::ServerContext* context, const std::vector<std::string>& exclude, Trace& trace,
    bool retry, int64_t* retry_after_ms, size_t model, const std::string& fingerprint,
    const std::vector<std::string>& lost_decode) {
  const std::string& tenant = trace.tenant;
  std::unique_lock<std::mutex> lock(mutex_);
  std::map<std::string, int64_t>& streams = streams_[model];
  // Each model waits in its own queue: one without a free prefill slot holds up no other.
  FairQueue& queue = queues_[model];
  const auto entered = Clock::now();
  std::optional<uint64_t> ticket;
  auto leave = [&] {
    if (ticket.has_value()) {
      queue.Remove(*ticket, /*admitted=*/false);
      admission_.notify_all();
    }
  };
  while (true) {
    const auto now = Clock::now();
    const auto ttl = std::chrono::milliseconds(options_.node_ttl_ms);
    // The weights a live decode node serves: a prefill node is of use only with a partner.
    std::set<std::string> decodable;
    for (const auto& [id, node] : nodes_) {
      if (node->info.role() == v1::NODE_ROLE_DECODE && !node->draining && node->model == model &&
          now - node->last_seen <= ttl &&
          std::find(lost_decode.begin(), lost_decode.end(), id) == lost_decode.end()) {
        decodable.insert(node->info.model_fingerprint());
      }
    }
    std::shared_ptr<Node> best;
    int64_t live = 0;
    for (auto& [id, node] : nodes_) {
      if (node->info.role() != v1::NODE_ROLE_PREFILL || node->draining || node->model != model ||
          (!fingerprint.empty() && node->info.model_fingerprint() != fingerprint) ||
          !decodable.contains(node->info.model_fingerprint()) || now - node->last_seen > ttl ||
          std::find(exclude.begin(), exclude.end(), id) != exclude.end()) {
        continue;
      }
      ++live;
      if (node->prefilling >= options_.prefill_slots) continue;
      // Fewest prefills in flight, then the least reported queue.
      if (best == nullptr || node->prefilling < best->prefilling ||
          (node->prefilling == best->prefilling &&
           node->info.load().queued_requests() < best->info.load().queued_requests())) {
        best = node;
      }
    }
    // A node marked down after one failed call is back at its next heartbeat: wait that long
    // before telling the queue there is none.
    if (live == 0 && now - entered > std::chrono::milliseconds(options_.node_ttl_ms)) {
      leave();
      return absl::UnavailableError(
          models_[model].name.empty()
              ? std::string("no prefill node is available")
              : absl::StrCat("no prefill node is available for model '", models_[model].name,
                             "' (with a decode node of the same weights)"));
    }
    // A new request takes a slot only when it is its turn (fair_queue.h), and while its tenant
    // holds less than its share of the decode slots; the turn of a tenant at its share passes
    // to the next.
    const int64_t share = StreamShare(model);
    std::set<std::string> full;
    for (const auto& [t, n] : streams) {
      if (n >= share) full.insert(t);
    }
    const bool at_share = !trace.holds_stream && full.contains(tenant);
    const std::optional<uint64_t> head = queue.Head(full);
    const bool turn = !at_share && (retry || !head.has_value() || head == ticket);
    if (best != nullptr && turn) {
      if (ticket.has_value()) {
        queue.Remove(*ticket, /*admitted=*/true);
        admission_.notify_all();
      }
      if (!trace.holds_stream) {
        ++streams[tenant];
        trace.holds_stream = true;
        trace.model = model;
      }
      ++best->prefilling;
      ++best->inflight;
      return best;
    }
    if (!ticket.has_value() && !retry) {
      if (static_cast<int64_t>(queue.size()) >= options_.max_queued) {
        // Roughly when the queue ahead will have drained to where this request would start.
        *retry_after_ms = static_cast<int64_t>(
            prefill_ms_average_ * static_cast<double>(queue.size()) /
            static_cast<double>(std::max<int64_t>(1, live * options_.prefill_slots)));
        return absl::ResourceExhaustedError(absl::StrCat(
            "the router's admission queue is full (", options_.max_queued,
            " requests waiting for a prefill node); retry after ", *retry_after_ms, " ms"));
      }
      // A tenant's share: a flood from one tenant is refused while the others' requests wait.
      const int64_t share =
          options_.max_queued_per_tenant > 0 ? options_.max_queued_per_tenant
          : options_.api_keys != nullptr     ? std::max<int64_t>(1, options_.max_queued / 2)
                                             : options_.max_queued;
      if (queue.waiting(tenant) >= share) {
        *retry_after_ms = static_cast<int64_t>(
            prefill_ms_average_ * static_cast<double>(queue.waiting(tenant)) /
            static_cast<double>(std::max<int64_t>(1, live * options_.prefill_slots)));
        return absl::ResourceExhaustedError(absl::StrCat(
            "this tenant holds its share of the router's admission queue (", share, " of ",
            options_.max_queued, " requests waiting); retry after ", *retry_after_ms, " ms"));
      }
      ticket = queue.Push(tenant);
    }
    if (context->IsCancelled()) {
      leave();
      return absl::CancelledError("cancelled while waiting for a prefill node");
    }
    if (context->deadline() < std::chrono::system_clock::now()) {
      leave();
      return absl::DeadlineExceededError(
          "the request's deadline passed while it waited for a prefill node");
    }
    admission_.wait_for(lock, std::chrono::milliseconds(20));
  }
}

int64_t RouterService::StreamShare(size_t model) const {
  if (options_.max_streams_per_tenant > 0) return options_.max_streams_per_tenant;
  if (options_.api_keys == nullptr) return std::numeric_limits<int64_t>::max();
  int64_t slots = 0;
  const auto now = Clock::now();
  for (const auto& [id, node] : nodes_) {
    if (node->info.role() == v1::NODE_ROLE_DECODE && !node->draining && node->model == model &&
        now - node->last_seen <= std::chrono::milliseconds(options_.node_ttl_ms)) {
      slots += node->info.load().total_slots();
    }
  }
  // No decode node has said how many slots it has: the share is unknown, so unbounded.
  return slots == 0 ? std::numeric_limits<int64_t>::max() : std::max<int64_t>(1, slots / 2);
}

void RouterService::ReleaseStream(const Trace& trace) {
  if (!trace.holds_stream) return;
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, int64_t>& streams = streams_[trace.model];
  if (--streams[trace.tenant] <= 0) streams.erase(trace.tenant);
  admission_.notify_all();
}

void RouterService::PrefillDone(Node& node, Clock::duration took) {
  std::lock_guard<std::mutex> lock(mutex_);
  --node.prefilling;
  prefill_ms_average_ =
      0.8 * prefill_ms_average_ + 0.2 * std::chrono::duration<double, std::milli>(took).count();
  admission_.notify_all();
}

grpc::Status RouterService::ListModels(grpc::ServerContext* context,
                                       const v1::ListModelsRequest* /*request*/,
                                       v1::ListModelsResponse* reply) {
  if (options_.api_keys != nullptr) {
    if (absl::StatusOr<std::string> tenant = options_.api_keys->Authenticate(*context);
        !tenant.ok()) {
      return ToGrpcStatus(tenant.status());
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  // Per model, the fingerprints of live prefill and decode nodes; served: in both.
  std::vector<std::set<std::string>> prefill(models_.size()), decode(models_.size());
  for (const auto& [id, node] : nodes_) {
    if (node->draining || now - node->last_seen > std::chrono::milliseconds(options_.node_ttl_ms)) {
      continue;
    }
    if (node->info.role() == v1::NODE_ROLE_PREFILL) {
      prefill[node->model].insert(node->info.model_fingerprint());
    }
    if (node->info.role() == v1::NODE_ROLE_DECODE) {
      decode[node->model].insert(node->info.model_fingerprint());
    }
  }
  for (size_t i = 0; i < models_.size(); ++i) {
    v1::ServedModel* model = reply->add_models();
    model->set_name(models_[i].name);
    model->set_max_model_len(options_.max_model_len);
    for (const std::string& fingerprint : prefill[i]) {
      if (decode[i].contains(fingerprint)) model->add_fingerprints(fingerprint);
    }
  }
  return grpc::Status::OK;
}

bool RouterService::AnyDecode(size_t model, const std::vector<std::string>& exclude) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  for (const auto& [id, node] : nodes_) {
    if (node->info.role() == v1::NODE_ROLE_DECODE && !node->draining && node->model == model &&
        now - node->last_seen <= std::chrono::milliseconds(options_.node_ttl_ms) &&
        std::find(exclude.begin(), exclude.end(), id) == exclude.end()) {
      return true;
    }
  }
  return false;
}

void RouterService::MarkDown(const std::string& node_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = nodes_.find(node_id);
  if (it != nodes_.end()) it->second->last_seen = Clock::time_point{};
}

bool RouterService::Serving() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  if (draining_) return false;
  // Serving: a prefill and a decode node of the same weights are live.
  std::set<std::string> prefill, decode;
  bool kvstore = false;
  for (const auto& [id, node] : nodes_) {
    if (node->draining || now - node->last_seen > std::chrono::milliseconds(options_.node_ttl_ms)) {
      continue;
    }
    if (node->info.role() == v1::NODE_ROLE_PREFILL) prefill.insert(node->info.model_fingerprint());
    if (node->info.role() == v1::NODE_ROLE_DECODE) decode.insert(node->info.model_fingerprint());
    kvstore |= node->info.role() == v1::NODE_ROLE_KVSTORE;
  }
  bool paired = false;
  for (const std::string& fingerprint : prefill) paired |= decode.contains(fingerprint);
  // The store is needed to become ready, not to stay ready: a store lost later makes requests
  // cold, never the router unready (DESIGN section 6).
  if (kvstore) kvstore_seen_ = true;
  return paired && (kvstore_seen_ || !options_.require_kvstore);
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
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stop_) return;
      }
      const bool serving = Serving();
      health("", serving);
      health("baton.v1.Generation", serving);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
}

absl::StatusOr<size_t> RouterService::ResolveModel(const std::string& name) const {
  if (name.empty()) return 0;
  if (absl::Status s = CheckBytes("model", name, kMaxModelNameBytes); !s.ok()) return s;
  std::string served;
  for (size_t i = 0; i < models_.size(); ++i) {
    if (models_[i].name == name) return i;
    absl::StrAppend(&served, i == 0 ? "" : ", ", "'", models_[i].name, "'");
  }
  // A router of one unnamed model serves it under any name.
  if (models_.size() == 1 && models_[0].name.empty()) return 0;
  return absl::NotFoundError(
      absl::StrCat("model: '", name, "' is not served here; this router serves ", served));
}

absl::StatusOr<RouterService::Effective> RouterService::Validate(
    const v1::GenerateRequest& r) const {
  auto invalid = [](std::string message) { return absl::InvalidArgumentError(message); };
  absl::StatusOr<size_t> model = ResolveModel(r.model());
  if (!model.ok()) return model.status();
  const ModelConfig& config = models_[*model].config;
  const text::Tokenizer* tokenizer = models_[*model].tokenizer.get();
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
  const auto& s = r.sampling();
  if (s.max_tokens() == 0 || s.max_tokens() > options_.max_tokens_limit) {
    return invalid(absl::StrCat("sampling.max_tokens: ", s.max_tokens(), " must lie in [1, ",
                                options_.max_tokens_limit, "]"));
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
  if (total > options_.max_model_len) {
    return invalid(
        absl::StrCat("prompt_token_ids + sampling.max_tokens: ", r.prompt_token_ids_size(), " + ",
                     s.max_tokens(), " exceeds the context limit ", options_.max_model_len));
  }
  if (absl::Status st = CheckSampling("sampling", s, config); !st.ok()) return st;
  Effective effective{options_.default_mode, static_cast<uint32_t>(EffectiveKeep(
                                                 options_.default_keep, config.ring_capacity()))};
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

uint32_t RouterService::PrefixHit(const v1::GenerateRequest& request, const ModelConfig& config,
                                  const Effective& effective, const std::string& fingerprint,
                                  const std::string& tenant) {
  if (effective.mode == v1::TRUNCATION_MODE_OFF) return 0;  // DESIGN section 5, step 4
  std::shared_ptr<Node> store = Pick(v1::NODE_ROLE_KVSTORE, {});
  if (store == nullptr) return 0;
  struct Release {
    RouterService* self;
    std::shared_ptr<Node> node;
    ~Release() {
      std::lock_guard<std::mutex> lock(self->mutex_);
      --node->inflight;
    }
  } release{this, store};
  const std::vector<int32_t> tokens(request.prompt_token_ids().begin(),
                                    request.prompt_token_ids().end());
  const std::vector<Sha256Digest> chain =
      kvstore::ChainKeys(fingerprint, tenant, request.cache_salt(), tokens, config.kv_block_size);
  v1::LookupRequest lookup;
  for (const Sha256Digest& key : chain) lookup.add_keys(kvstore::KeyBytes(key));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(options_.lookup_timeout_ms));
  v1::LookupResponse found;
  auto stub = v1::KvStore::NewStub(store->channel);
  metrics_->prefix_queries.Increment();
  if (grpc::Status s = stub->Lookup(&context, lookup, &found); !s.ok()) {
    log::Warn("prefix lookup failed; running cold", {{"error", s.error_message()}});
    metrics_->prefix_query_failures.Increment();
    return 0;  // the store never fails a request
  }
  kvstore::ChainLookup chain_lookup;
  chain_lookup.block_kv_blocks = found.block_kv_blocks();
  chain_lookup.swa_present.assign(found.swa_present().begin(), found.swa_present().end());
  const int64_t h = kvstore::HitBlocks({.prompt_len = static_cast<int64_t>(tokens.size()),
                                        .keep = effective.keep,
                                        .truncation_on = true,
                                        .ring_capacity = config.ring_capacity(),
                                        .window = config.sliding_window,
                                        .block_size = config.kv_block_size,
                                        .cap = options_.hit_cap},
                                       chain_lookup);
  if (h > 0) {
    metrics_->prefix_hits.Increment();
    metrics_->cached_tokens.Increment(static_cast<double>(h * config.kv_block_size));
  }
  return static_cast<uint32_t>(h * config.kv_block_size);
}

void RouterService::Delivered(Trace& trace, int n) {
  if (n <= 0) return;
  const auto now = Clock::now();
  if (!trace.last_token.has_value()) {
    metrics_->ttft.Observe(Seconds(now - trace.start));
    for (int i = 1; i < n; ++i) metrics_->itl.Observe(0);
  } else {
    const double each = Seconds(now - *trace.last_token) / n;
    for (int i = 0; i < n; ++i) metrics_->itl.Observe(each);
  }
  trace.last_token = now;
  trace.tokens += n;
  metrics_->generation_tokens.Increment(n);
}

grpc::Status RouterService::Generate(grpc::ServerContext* context,
                                     const v1::GenerateRequest* request,
                                     grpc::ServerWriter<v1::GenerateResponse>* writer) {
  Trace trace;
  trace.start = Clock::now();
  if (options_.api_keys != nullptr) {
    absl::StatusOr<std::string> tenant = options_.api_keys->Authenticate(*context);
    if (!tenant.ok()) {
      metrics_->requests
          .Add({{"outcome", metrics::OutcomeLabel(grpc::StatusCode::UNAUTHENTICATED)}})
          .Increment();
      log::Warn("request refused",
                {{"peer", context->peer()}, {"error", std::string(tenant.status().message())}});
      return ToGrpcStatus(tenant.status());
    }
    trace.tenant = *std::move(tenant);
  }
  trace.id = request->request_id().empty() ? NewRequestId() : request->request_id();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (draining_) {
      metrics_->requests.Add({{"outcome", metrics::OutcomeLabel(grpc::StatusCode::UNAVAILABLE)}})
          .Increment();
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the router is draining (shutting down): retry on another router");
    }
    ++open_calls_;
  }
  metrics_->running.Increment();
  const grpc::Status status = Serve(context, request, writer, trace);
  ReleaseStream(trace);
  metrics_->running.Decrement();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--open_calls_ == 0) calls_ended_.notify_all();
  }
  metrics_->requests.Add({{"outcome", metrics::OutcomeLabel(status.error_code())}}).Increment();
  metrics_->e2e.Observe(Seconds(Clock::now() - trace.start));
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - trace.start).count();
  if (status.ok()) {
    log::Info("request finished", {{"request_id", trace.id},
                                   {"prompt_tokens", trace.prompt_tokens},
                                   {"tokens", trace.tokens},
                                   {"prefill_node", trace.prefill_node},
                                   {"decode_node", trace.decode_node},
                                   {"ms", ms}});
  } else {
    log::Warn("request failed", {{"request_id", trace.id},
                                 {"code", metrics::OutcomeLabel(status.error_code())},
                                 {"error", status.error_message()},
                                 {"tokens", trace.tokens},
                                 {"ms", ms}});
  }
  return status;
}

bool RouterService::Send(grpc::ServerContext* context,
                         grpc::ServerWriter<v1::GenerateResponse>* writer,
                         const v1::GenerateResponse& response) {
  StreamWatch::Writing writing(*idle_watch_, context);
  return writer->Write(response);
}

grpc::Status RouterService::Serve(grpc::ServerContext* context, const v1::GenerateRequest* request,
                                  grpc::ServerWriter<v1::GenerateResponse>* writer, Trace& trace) {
  const auto start = trace.start;
  // A text prompt becomes token ids here, so that everything past this point (validation,
  // prefix keys, the nodes) sees ids only.
  absl::StatusOr<size_t> model = ResolveModel(request->model());
  if (!model.ok()) return ToGrpcStatus(model.status());
  const ServedModel& served = models_[*model];
  const text::Tokenizer* tokenizer = served.tokenizer.get();
  v1::GenerateRequest encoded;
  if (tokenizer != nullptr && request->prompt_token_ids().empty() &&
      !request->prompt_text().empty()) {
    const uint64_t max_bytes = uint64_t{kPromptTextBytesPerToken} * options_.max_model_len;
    if (absl::Status s = CheckBytes("prompt_text", request->prompt_text(), max_bytes); !s.ok()) {
      return ToGrpcStatus(s);
    }
    encoded = *request;
    encoded.clear_prompt_text();
    for (int32_t id : tokenizer->Encode(request->prompt_text(), tokenizer->add_bos())) {
      encoded.add_prompt_token_ids(id);
    }
    if (encoded.prompt_token_ids().empty()) {
      return Invalid("prompt_text: the text encodes to no tokens; send some text");
    }
    request = &encoded;
  }
  absl::StatusOr<Effective> effective = Validate(*request);
  if (!effective.ok()) return ToGrpcStatus(effective.status());
  const std::string& id = trace.id;
  metrics_->prompt_tokens.Increment(request->prompt_token_ids_size());
  trace.prompt_tokens = request->prompt_token_ids_size();
  const auto& prompt = request->prompt_token_ids();
  std::vector<int32_t> generated;
  std::vector<std::string> lost_decode, lost_prefill;
  std::optional<uint32_t> s_valid;  // decided once; a re-prefill keeps it (DESIGN section 6)
  // The weights serving the request, fixed with s_valid: a re-prefill after tokens were
  // streamed continues on the same weights (a rollout may run two versions of one model side
  // by side).
  std::string fingerprint;
  v1::Usage usage;
  usage.set_prompt_tokens(static_cast<uint32_t>(prompt.size()));
  v1::Timings timings;
  const std::chrono::milliseconds reserve_cap(options_.reservation_timeout_ms);
  // The text of what is streamed, where there is a tokenizer: decoded a token at a time and
  // cut at the first stop string (its tokens end the generation there).
  std::optional<text::IncrementalDetokenizer> detokenizer;
  std::optional<text::StopStrings> stop_strings;
  if (tokenizer != nullptr) {
    detokenizer.emplace(
        *tokenizer, std::span<const int32_t>(prompt.data(), static_cast<size_t>(prompt.size())));
    stop_strings.emplace(std::vector<std::string>(request->sampling().stop().begin(),
                                                  request->sampling().stop().end()));
  }
  // Adds one token's text to `response`; true when it completed a stop string.
  auto add_text = [&](int32_t token, v1::GenerateResponse& response) {
    if (!detokenizer.has_value()) return false;
    text::StopStrings::Step step = stop_strings->Push(detokenizer->Next(token));
    response.mutable_text()->append(step.text);
    return step.stopped;
  };
  // The text held at the end of generation; true when it held a stop string after all.
  auto flush_text = [&](v1::GenerateResponse& response) {
    if (!detokenizer.has_value()) return false;
    text::StopStrings::Step step = stop_strings->Push(detokenizer->Flush());
    response.mutable_text()->append(step.text);
    if (!step.stopped) response.mutable_text()->append(stop_strings->Flush());
    return step.stopped;
  };
  // Ends the response as a stop string does: finish STOP, with the usage so far.
  auto finish_stopped = [&](v1::GenerateResponse& response) {
    usage.set_completion_tokens(static_cast<uint32_t>(generated.size()));
    response.set_finish_reason(v1::FINISH_REASON_STOP);
    *response.mutable_usage() = usage;
    *response.mutable_timings() = timings;
  };

  int transfer_retries = 0;
  for (int attempt = 0; attempt < 6; ++attempt) {
    const uint32_t g = static_cast<uint32_t>(generated.size());
    if (g == 0) {
      // Nothing streamed yet: a retry starts afresh, on any weights of the model (a rollout
      // may have drained the ones the last attempt chose).
      s_valid.reset();
      fingerprint.clear();
    }
    // A re-prefill covers prompt + the g tokens streamed so far, with keep K + g so that
    // s_keep stays where the undisturbed prefill put it (DESIGN section 6).
    v1::PrefillRequest prefill;
    *prefill.mutable_request() = *request;
    prefill.mutable_request()->clear_prompt_text();
    prefill.mutable_request()->set_request_id(id);  // the nodes log under the router's id
    for (int32_t t : generated) prefill.mutable_request()->add_prompt_token_ids(t);
    prefill.set_mode(effective->mode);
    prefill.set_keep(effective->mode == v1::TRUNCATION_MODE_OFF ? 0 : effective->keep + g);
    prefill.set_transport(options_.transport);
    prefill.set_completed_tokens(g);
    prefill.set_tenant(trace.tenant);
    const uint32_t prompt_len = static_cast<uint32_t>(prefill.request().prompt_token_ids_size());

    struct Inflight {
      RouterService* self;
      std::shared_ptr<Node> node;
      ~Inflight() {
        if (node == nullptr) return;
        std::lock_guard<std::mutex> lock(self->mutex_);
        --node->inflight;
      }
    };
    // Admission first: the prefill node, once one has a free slot (the reservation names the
    // identity that may fill it, and is taken only now, so it never expires in a queue).
    int64_t retry_after_ms = 0;
    absl::StatusOr<std::shared_ptr<Node>> admitted =
        AdmitPrefill(context, lost_prefill, trace, attempt > 0, &retry_after_ms, *model,
                     fingerprint, lost_decode);
    if (!admitted.ok()) {
      if (absl::IsResourceExhausted(admitted.status())) {
        context->AddTrailingMetadata(kRetryAfterKey, std::to_string(retry_after_ms));
      }
      return ToGrpcStatus(admitted.status());
    }
    std::shared_ptr<Node> prefill_node = *admitted;
    Inflight prefill_inflight{this, prefill_node};
    // The prefill slot goes back when the prefill node answers (or this attempt ends first).
    struct PrefillSlot {
      RouterService* self;
      Node* node;
      Clock::time_point start = Clock::now();
      void Done() {
        if (node != nullptr) self->PrefillDone(*node, Clock::now() - start);
        node = nullptr;
      }
      ~PrefillSlot() { Done(); }
    } prefill_slot{this, prefill_node.get()};
    std::shared_ptr<Node> decode =
        Pick(v1::NODE_ROLE_DECODE, lost_decode, prefill_node->info.model_fingerprint());
    if (decode == nullptr) {
      // The prefill node's weights lost their last decode node after admission (a drain in a
      // rollout): while the request is not tied to those weights, another prefill node may
      // still have a partner.
      if (fingerprint.empty() && AnyDecode(*model, lost_decode)) {
        lost_prefill.push_back(prefill_node->info.node_id());
        continue;
      }
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no decode node is available");
    }
    Inflight decode_inflight{this, decode};
    trace.prefill_node = prefill_node->info.node_id();
    trace.decode_node = decode->info.node_id();
    auto decode_stub = v1::DecodeNode::NewStub(decode->channel);
    v1::ReserveRequest reserve;
    reserve.set_request_id(absl::StrCat(id, "#", attempt));  // the decode node logs under it
    reserve.set_prefill_identity(prefill_node->identity);
    reserve.set_prefill_address(prefill_node->info.address());
    reserve.set_prefill_ucx_worker_address(prefill_node->info.ucx_worker_address());
    reserve.set_prompt_tokens(prompt_len);
    reserve.set_model_fingerprint(decode->info.model_fingerprint());
    *reserve.mutable_sampling() = request->sampling();
    reserve.set_logprobs(request->logprobs());
    reserve.set_timeout_ms(options_.reservation_timeout_ms);
    reserve.set_completed_tokens(g);
    auto reserve_context = Propagated(context, reserve_cap);
    grpc::Status status =
        decode_stub->Reserve(reserve_context.get(), reserve, prefill.mutable_reservation());
    if (!status.ok()) {
      if (NodeLost(status)) {
        MarkDown(decode->info.node_id());
        lost_decode.push_back(decode->info.node_id());
        continue;
      }
      return status;
    }
    prefill.set_decode_address(decode->info.address());
    prefill.set_decode_identity(decode->identity);
    if (!s_valid.has_value()) {
      s_valid = PrefixHit(*request, served.config, *effective, decode->info.model_fingerprint(),
                          trace.tenant);
      fingerprint = decode->info.model_fingerprint();
    }
    prefill.set_s_valid(s_valid.value_or(0));  // set just above
    const std::string reservation_id = prefill.reservation().reservation_id();
    auto release = [&] {
      grpc::ClientContext release_context;
      release_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
      v1::ReleaseRequest r;
      r.set_reservation_id(reservation_id);
      v1::ReleaseResponse ignored;
      (void)decode_stub->Release(&release_context, r, &ignored);
    };

    auto prefill_stub = v1::PrefillNode::NewStub(prefill_node->channel);
    auto prefill_context =
        Propagated(context, std::chrono::milliseconds(options_.prefill_timeout_ms));
    v1::PrefillResponse prefilled;
    status = prefill_stub->Prefill(prefill_context.get(), prefill, &prefilled);
    prefill_slot.Done();
    if (!status.ok()) {
      release();
      // A failure the prefill node attributes to the decode node (its commit could not reach
      // it) is the decode node's: retry on another decode node, keep the prefill node.
      const auto& trailers = prefill_context->GetServerTrailingMetadata();
      auto failed = trailers.find(kFailedNodeKey);
      const PrefillFailure failure = ClassifyPrefillFailure(
          status,
          failed != trailers.end() ? std::string(failed->second.data(), failed->second.size()) : "",
          transfer_retries);
      if (failure == PrefillFailure::kRetryTransfer) {
        // The decode node's read of the StateBlock failed (the peer or transport, not a
        // node): try the transfer again.
        ++transfer_retries;
        log::Warn("StateBlock transfer failed; retrying", {{"request_id", id},
                                                           {"node", decode->info.node_id()},
                                                           {"error", status.error_message()}});
        metrics_->retries.Add({{"reason", "transfer_failed"}}).Increment();
        continue;
      }
      if (failure == PrefillFailure::kDecodeLost) {
        log::Warn("decode node lost before its commit; retrying on another",
                  {{"request_id", id},
                   {"node", decode->info.node_id()},
                   {"error", status.error_message()}});
        metrics_->retries.Add({{"reason", "decode_lost"}}).Increment();
        MarkDown(decode->info.node_id());
        lost_decode.push_back(decode->info.node_id());
        continue;
      }
      if (failure == PrefillFailure::kPrefillLost) {
        log::Warn(
            "prefill node lost; retrying on another",
            {{"request_id", id},
             {"node", prefill_node->info.node_id()},
             {"error", status.error_message()},
             {"message", absl::StrCat("prefill node ", prefill_node->info.node_id(), " lost")}});
        metrics_->retries.Add({{"reason", "prefill_lost"}}).Increment();
        MarkDown(prefill_node->info.node_id());
        lost_prefill.push_back(prefill_node->info.node_id());
        continue;
      }
      return status;
    }
    generated.push_back(prefilled.first_token());
    if (g == 0) {
      metrics_->replayed_rows.Increment(prefilled.usage().replayed_rows());
      usage.set_replayed_rows(prefilled.usage().replayed_rows());
      usage.set_cached_tokens(prefilled.usage().cached_tokens());
      timings.set_ttft_ms(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      timings.set_prefill_ms(prefilled.prefill_ms());
      timings.set_transfer_ms(prefilled.transfer_ms());
    }
    v1::GenerateResponse first;
    first.set_request_id(id);
    first.add_token_ids(prefilled.first_token());
    if (request->logprobs()) first.add_logprobs(prefilled.first_logprob());
    if (g == 0) *first.mutable_prompt_logprobs() = prefilled.prompt_logprobs();
    if (add_text(prefilled.first_token(), first)) {
      // The first token completed a stop string: the request ends here, and the state the
      // decode node holds for it is freed.
      finish_stopped(first);
      release();
      const bool sent = Send(context, writer, first);
      if (sent) Delivered(trace, 1);
      return sent ? grpc::Status::OK
                  : grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    }
    if (!Send(context, writer, first)) {
      release();
      return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    }
    Delivered(trace, 1);

    auto stream_context = grpc::ClientContext::FromServerContext(*context);
    v1::StreamRequest stream_request;
    stream_request.set_reservation_id(reservation_id);
    auto stream = decode_stub->Stream(stream_context.get(), stream_request);
    v1::DecodeOutput output;
    while (stream->Read(&output)) {
      v1::GenerateResponse response;
      response.set_request_id(id);
      bool stopped = false;
      for (int i = 0; i < output.token_ids_size() && !stopped; ++i) {
        generated.push_back(output.token_ids(i));
        response.add_token_ids(output.token_ids(i));
        if (request->logprobs()) response.add_logprobs(output.logprobs(i));
        stopped = add_text(output.token_ids(i), response);
      }
      if (!stopped && output.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        stopped = flush_text(response);
        usage.set_completion_tokens(static_cast<uint32_t>(generated.size()));
        response.set_finish_reason(output.finish_reason());
        *response.mutable_usage() = usage;
        *response.mutable_timings() = timings;
      }
      if (stopped) {
        // A stop string ends the generation at the token that completed it; the decode node
        // sees the cancel and frees the request's slot and pages.
        finish_stopped(response);
        stream_context->TryCancel();
        const bool sent = Send(context, writer, response);
        if (sent) Delivered(trace, response.token_ids_size());
        return sent ? grpc::Status::OK
                    : grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      }
      if (!Send(context, writer, response)) {
        stream_context->TryCancel();
        return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      }
      Delivered(trace, output.token_ids_size());
    }
    status = stream->Finish();
    if (status.ok()) return grpc::Status::OK;
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    if (NodeLost(status)) {
      log::Warn("decode node lost; re-prefilling prompt + tokens so far on another",
                {{"request_id", id},
                 {"node", decode->info.node_id()},
                 {"tokens", generated.size()},
                 {"message", absl::StrCat("decode node ", decode->info.node_id(), " lost after ",
                                          generated.size(), " tokens")}});
      metrics_->retries.Add({{"reason", "decode_lost"}}).Increment();
      MarkDown(decode->info.node_id());
      lost_decode.push_back(decode->info.node_id());
      continue;
    }
    return status;
  }
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "nodes kept failing; gave up");
}

}  // namespace baton::router
