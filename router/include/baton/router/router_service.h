// baton-router: the client-facing Generation service and the node registry (DESIGN
// section 6). For each request it validates the input, applies the configured default
// truncation (compact with K = C unless configured otherwise) where the request does not
// override it, reserves state on the least-loaded decode node, has the least-loaded prefill
// node compute the prompt and move its StateBlock there, relays the first token, then relays
// the decode node's stream.
//
// Faults: a prefill node that fails before committing is retried on another one (the
// reservation is released); a decode node lost mid-stream is replaced by re-prefilling the
// prompt plus the tokens streamed so far on another decode node, with the original s_keep
// (keep K + g) and the sampling step continued, so the client sees every token once.
// Deadlines and client cancellation reach the nodes through propagated client contexts.
//
// The parts, each in its own file: the node registry (node_registry.h), admission
// (admission.h), the stubs to the nodes (node_stubs.h), the routing rules and the retry policy
// (routing.h), and one request's pipeline of stages (generate_call.h). This class is the gRPC
// boundary: the one place where a request's absl::Status becomes its grpc::Status.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "baton/common/api_keys.h"
#include "baton/common/model_config.h"
#include "baton/common/rpc.h"
#include "baton/common/stream_watch.h"
#include "baton/kvstore/fleet.h"
#include "baton/kvstore/hit_policy.h"
#include "baton/kvstore/probe_batcher.h"
#include "baton/kvstore/ttft_model.h"
#include "baton/router/admission.h"
#include "baton/router/node_registry.h"
#include "baton/router/node_stubs.h"
#include "baton/text/tokenizer.h"
#include "baton/v1/generation.grpc.pb.h"
#include "baton/v1/node.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace baton::router {

using PrefillPolicy = kvstore::RoutingPolicy;

struct RouterOptions {
  v1::TruncationMode default_mode = v1::TRUNCATION_MODE_COMPACT;
  int64_t default_keep = 0;  // 0: the ring capacity C
  uint32_t max_tokens_limit = 4096;
  // prompt + max_tokens; the router's is --max-model-len as ResolveMaxModelLen made it.
  uint32_t max_model_len = 32768;
  v1::Transport transport = v1::TRANSPORT_UCX;
  uint32_t reservation_timeout_ms = 30000;
  // How often nodes register again (what they are told), and how long a node not heard from
  // is still used: at least three heartbeats plus a resolver timeout (MinNodeExpiryMs in
  // router_main.h), so that a slow DNS answer on a node's side never drops it.
  uint32_t heartbeat_ms = 500;
  uint32_t node_ttl_ms = 6500;
  // A node not heard from for this long is forgotten, and the bounds on node_ids in all and
  // per certificate identity (NodeRegistry::Options). A forget time of 0 is four node
  // expiries and at least 30 s (ForgetAfterMs), so that no --node-expiry-ms the chart allows
  // (up to 600 s) makes the default refuse to start.
  uint32_t node_forget_after_ms = 0;
  uint32_t max_node_ids = 4096;
  uint32_t max_node_ids_per_identity = 256;
  kvstore::HitCap hit_cap = kvstore::HitCap::kRing;
  // Which prefill node takes a request (--prefill-policy): the least loaded, the one whose
  // local block cache holds the longest prefix, or the one of least predicted time to first
  // token (kvstore/ttft_model.h), each among the nodes with a free slot.
  PrefillPolicy prefill_policy = PrefillPolicy::kPredictedTtft;
  // How requests are cut between nodes (DESIGN section 6); the registry accepts only prefill
  // nodes that hold the layers it needs (all, or the producers only under replay-on-decode).
  v1::Split split = v1::SPLIT_PREFILL_ALL;
  uint32_t lookup_timeout_ms = 200;  // a slower prefix store means a cold request
  // Owners of each stored value among the live store nodes (--kvstore-replication; DESIGN
  // section 5): the lookup asks them all, and the prefill node reads from any and writes to
  // all. More than the live nodes means every node.
  int kvstore_replication = 1;
  // The sampled share of the traces the router starts (common/trace.h); a client's traceparent
  // keeps its own flag.
  double trace_sample_ratio = 1.0;
  // Shadow verification (docs/fidelity.md): the share of the requests served with truncation
  // whose first `fidelity_tokens` completion tokens their decode node also computes untruncated
  // on spare capacity (--fidelity-sample-rate, --fidelity-tokens). A request's own
  // GenerateRequest.fidelity_tokens asks for it whatever the rate.
  double fidelity_sample_rate = 0;
  uint32_t fidelity_tokens = 32;
  bool require_kvstore = false;      // first SERVING also waits for a kvstore to register
  // Admission: requests wait in one queue of at most `max_queued` (first come, first served
  // within a tenant, fair across tenants: fair_queue.h) until a prefill node has a free slot
  // (`prefill_slots` prefills in flight per node: one computing, the next ready); the decode
  // reservation is taken only then, so none expires in a queue. Past the bound: RESOURCE_EXHAUSTED
  // at once, with a retry hint (common/rpc.h kRetryAfterKey).
  int64_t max_queued = 1024;
  // Tenants' shares (admission.h, tenant_share.h): with API keys, each active tenant may hold
  // its weighted fair part of the queue and of the decode slots the model's live decode nodes
  // report (requests past the queue, prefilling or streaming), never under one; past its share
  // of the queue it gets RESOURCE_EXHAUSTED while others are still queued, and past its share
  // of the decode slots it waits while other tenants' requests go first. These ceilings bound
  // any one tenant's share besides (0: none; without keys, every request is the one tenant "").
  int64_t max_queued_per_tenant = 0;
  int64_t max_streams_per_tenant = 0;
  int64_t prefill_slots = 2;
  // The model's tokenizer (text/tokenizer.h); null: requests and responses are token ids only.
  // With one, prompt_text is encoded here, every response message carries its text, and
  // sampling.stop takes stop strings.
  std::shared_ptr<const text::Tokenizer> tokenizer;
  // The name the constructor's model is served under; "" serves it under any name a node
  // registers, for a router of one model. More models served beside it (router --model
  // given more than once), each with its own nodes.
  std::string model_name;
  std::vector<ServedModel> more_models;
  // Client API keys (key -> tenant); null: the client API takes no key and the tenant is empty.
  std::shared_ptr<const ApiKeys> api_keys;
  // /metrics' tenant labels are the tenants' names (--metrics-tenant-names); by default a
  // digest of each (metrics::TenantLabel), since the page is open to whoever reaches it.
  bool metrics_tenant_names = false;
  // A client that takes no message for this long has its stream cancelled, and the decode
  // slot behind it freed (common/stream_watch.h); 0 disables.
  std::chrono::milliseconds stream_idle_timeout{60000};
  // The prefill call's deadline: the client's, and at most this.
  uint32_t prefill_timeout_ms = 600000;
  // The stubs the router calls its nodes through; null: gRPC stubs over each node's channel.
  // Tests put fakes here.
  std::shared_ptr<NodeStubs> stubs;
};

// Where a Generate call's messages go (a gRPC ServerWriter, or a test's fake).
using ResponseWriter = grpc::ServerWriterInterface<v1::GenerateResponse>;

struct RouterMetrics;

// The forget time the registry uses: options.node_forget_after_ms, or when that is 0, four
// node expiries and at least 30 s.
uint32_t ForgetAfterMs(const RouterOptions& options);

class RouterService final : public v1::Generation::Service, public v1::Registry::Service {
 public:
  RouterService(const ModelConfig& config, const RouterOptions& options);
  ~RouterService() override;

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  // Generate with any writer: what Generate runs, and what in-process tests call.
  grpc::Status Serve(grpc::ServerContext* context, const v1::GenerateRequest& request,
                     ResponseWriter* writer);
  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* reply) override;
  // The models served, each with the weights that can serve it now (API key as Generate).
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* reply) override;
  // The live store nodes, each with its KvStore/Stats (asked in parallel, within 2 s; a node
  // that does not answer is listed with its error). API key as Generate.
  grpc::Status ListStores(grpc::ServerContext* context, const v1::ListStoresRequest* request,
                          v1::ListStoresResponse* reply) override;
  grpc::Status ListRates(grpc::ServerContext* context, const v1::ListRatesRequest* request,
                         v1::ListRatesResponse* reply) override;

  // Sets grpc.health.v1 for "" and "baton.v1.Generation" (through `health`, on every server of
  // the process) as nodes come and go, until StopHealth (which must come before the servers are
  // destroyed).
  void WatchHealth(HealthSetter health);
  void StopHealth();
  // A prefill and a decode node are live (and a kvstore has registered, with
  // --require-kvstore): what grpc.health.v1 and the HTTP front's /health report.
  bool Serving() const;
  // The client server's check of API keys (security.h ApiKeyCheck: before any message of a call
  // is read), whose refusals count and log as refused requests; null without API keys.
  std::shared_ptr<grpc::AuthMetadataProcessor> ApiKeyCheck();
  // The models served, the constructor's first (GET /v1/models).
  const std::vector<ServedModel>& Models() const { return models_; }
  // The registry of nodes, with its view of the prefill nodes' block caches.
  const NodeRegistry& registry() const { return registry_; }
  // Graceful drain (ServeUntilShutdown's `drain`): from now on Serving() is false and a new
  // Generate call is refused with UNAVAILABLE (a client retries on another router); returns
  // once every open call has ended, or at `deadline`.
  void Drain(std::chrono::steady_clock::time_point deadline);

  // A request's effective truncation.
  struct Effective {
    v1::TruncationMode mode;
    uint32_t keep;
  };
  // Checks a client's request (every field bounded, each refusal INVALID_ARGUMENT naming the
  // field; NOT_FOUND for a model not served) and gives its effective truncation: the request's
  // override or the defaults.
  absl::StatusOr<Effective> Validate(const v1::GenerateRequest& request) const;
  // The served model a request names (its index in Models()); NOT_FOUND naming what is served.
  absl::StatusOr<size_t> ResolveModel(const std::string& name) const;

 private:
  // The tenant of the caller's API key, from the call's metadata (security.h ApiKeyCheck says
  // why not from the auth context); "" without API keys.
  absl::StatusOr<std::string> Tenant(const grpc::ServerContext& context) const;

  std::vector<ServedModel> models_;  // [0]: the constructor's
  RouterOptions options_;
  std::unique_ptr<RouterMetrics> metrics_;
  std::unique_ptr<StreamWatch> idle_watch_;
  NodeRegistry registry_;
  Admission admission_;
  std::shared_ptr<NodeStubs> stubs_;
  // Store nodes whose probes keep failing or timing out are skipped for a while.
  std::unique_ptr<kvstore::StoreBreaker> store_breaker_;
  // The lookups' probes, coalesced per store node (kvstore/probe_batcher.h).
  std::unique_ptr<kvstore::ProbeBatcher> store_probes_;
  mutable std::mutex mutex_;  // what follows
  bool stop_ = false;
  bool draining_ = false;   // Drain was called
  HealthSetter health_;     // WatchHealth's (Drain turns readiness off through it)
  int64_t open_calls_ = 0;  // Generate calls in progress
  std::condition_variable calls_ended_;
  std::condition_variable stopping_;
  std::thread health_thread_;
  std::shared_ptr<prometheus::Collectable> nodes_collector_;  // baton_nodes{role} and more
  // What nodes_collector_ reports at scrape time: live nodes by role, version and model, the
  // store fleet's state, the tenants' streams and the queue.
  std::vector<prometheus::MetricFamily> NodeFamilies() const;
};

// RouterService::Validate for the models `models` under `options`.
absl::StatusOr<RouterService::Effective> ValidateRequest(const v1::GenerateRequest& request,
                                                         const std::vector<ServedModel>& models,
                                                         const RouterOptions& options);

}  // namespace baton::router
