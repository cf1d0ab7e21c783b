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
#include "baton/kvstore/hit_policy.h"
#include "baton/router/fair_queue.h"
#include "baton/text/tokenizer.h"
#include "baton/v1/generation.grpc.pb.h"
#include "baton/v1/node.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/collectable.h"

namespace baton::router {

// One model the router serves: the name clients ask for (GenerateRequest.model, the OpenAI
// "model" field), the config its requests are checked against, and its tokenizer. Nodes
// register under the name with the config's digest (ConfigDigest); nodes of one name may carry
// different weights (a rollout), and the router pairs prefill and decode nodes of the same
// weights' fingerprint.
struct ServedModel {
  std::string name;
  ModelConfig config;
  std::shared_ptr<const text::Tokenizer> tokenizer;  // null: token ids only
};

struct RouterOptions {
  v1::TruncationMode default_mode = v1::TRUNCATION_MODE_COMPACT;
  int64_t default_keep = 0;  // 0: the ring capacity C
  uint32_t max_tokens_limit = 4096;
  uint32_t max_model_len = 32768;  // prompt + max_tokens
  v1::Transport transport = v1::TRANSPORT_UCX;
  uint32_t reservation_timeout_ms = 30000;
  uint32_t heartbeat_ms = 500;
  uint32_t node_ttl_ms = 2000;  // a node not heard from for this long is not used
  kvstore::HitCap hit_cap = kvstore::HitCap::kRing;
  uint32_t lookup_timeout_ms = 200;  // a slower prefix store means a cold request
  bool require_kvstore = false;      // first SERVING also waits for a kvstore to register
  // Admission: requests wait in one queue of at most `max_queued` (first come, first served
  // within a tenant, fair across tenants: fair_queue.h) until a prefill node has a free slot
  // (`prefill_slots` prefills in flight per node: one computing, the next ready); the decode
  // reservation is taken only then, so none expires in a queue. Past the bound: RESOURCE_EXHAUSTED
  // at once, with a retry hint (common/rpc.h kRetryAfterKey).
  int64_t max_queued = 1024;
  // A tenant's share of that queue: a tenant with this many waiting gets RESOURCE_EXHAUSTED
  // while others are still queued (0: half of max_queued with API keys, all of it without,
  // where every request is the one tenant "").
  int64_t max_queued_per_tenant = 0;
  // A tenant's share of the decode slots: at most this many of its requests are past the queue
  // (prefilling or streaming) at once; more wait their turn, which passes to other tenants
  // (0: half of the slots the model's live decode nodes report with API keys, no bound
  // without).
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
  // A client that takes no message for this long has its stream cancelled, and the decode
  // slot behind it freed (common/stream_watch.h); 0 disables.
  std::chrono::milliseconds stream_idle_timeout{60000};
  // The prefill call's deadline: the client's, and at most this.
  uint32_t prefill_timeout_ms = 600000;
};

// prompt_text may hold at most this many bytes per token of --max-model-len: room for any
// real text, and a bound on what one request can make the tokenizer read.
inline constexpr uint32_t kPromptTextBytesPerToken = 64;

class RouterService final : public v1::Generation::Service, public v1::Registry::Service {
 public:
  RouterService(const ModelConfig& config, const RouterOptions& options);
  ~RouterService() override;

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* reply) override;
  // The models served, each with the weights that can serve it now (API key as Generate).
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* reply) override;

  // Sets grpc.health.v1 for "" and "baton.v1.Generation" (through `health`, on every server of
  // the process) as nodes come and go, until StopHealth (which must come before the servers are
  // destroyed).
  void WatchHealth(HealthSetter health);
  void StopHealth();
  // A prefill and a decode node are live (and a kvstore has registered, with
  // --require-kvstore): what grpc.health.v1 and the HTTP front's /health report.
  bool Serving() const;
  // The models served, the constructor's first (GET /v1/models).
  const std::vector<ServedModel>& Models() const { return models_; }
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
  struct Node {
    v1::RegisterRequest info;
    std::chrono::steady_clock::time_point last_seen;
    int64_t inflight = 0;    // requests this router sent there and has not finished
    int64_t prefilling = 0;  // of those, prefills not yet answered (prefill nodes)
    std::shared_ptr<grpc::Channel> channel;
    std::string identity;   // the certificate identity it registered with ("" without TLS)
    bool draining = false;  // its last registration said so: it gets no new request
    size_t model = 0;       // its index in models_ (prefill and decode nodes)
  };
  // What one request did, for its metrics and log lines.
  struct Trace {
    std::string id;
    std::string tenant;  // from the client's API key; "" without keys
    std::chrono::steady_clock::time_point start;
    std::optional<std::chrono::steady_clock::time_point> last_token;
    int64_t tokens = 0;
    int64_t prompt_tokens = 0;  // once encoded (a text prompt's ids)
    std::string prefill_node;   // the nodes of the last attempt, for the log line
    std::string decode_node;
    size_t model = 0;            // the served model's index
    bool holds_stream = false;   // admitted: counted in its tenant's share of decode slots
  };
  struct Metrics;

  grpc::Status Serve(grpc::ServerContext* context, const v1::GenerateRequest* request,
                     grpc::ServerWriter<v1::GenerateResponse>* writer, Trace& trace);
  // Records `n` tokens handed to the client now: time to first token, then inter-token times.
  void Delivered(Trace& trace, int n);
  // Writes one message to the client, cancelling the call if it stays blocked past
  // --stream-idle-timeout; false when the client is gone.
  bool Send(grpc::ServerContext* context, grpc::ServerWriter<v1::GenerateResponse>* writer,
            const v1::GenerateResponse& response);
  // The prefix hit H (tokens) for a request, or 0 when the store is absent, slow or failing.
  uint32_t PrefixHit(const v1::GenerateRequest& request, const ModelConfig& config,
                     const Effective& effective, const std::string& fingerprint,
                     const std::string& tenant);
  // The live node of `role` with the least load, not in `exclude`, serving `fingerprint` (any
  // when empty); nullptr when none.
  std::shared_ptr<Node> Pick(v1::NodeRole role, const std::vector<std::string>& exclude,
                             const std::string& fingerprint = "");
  // Waits in the admission queue (see RouterOptions) for a prefill node, not in `exclude`,
  // with a free slot, and takes the slot; `tenant`'s turn comes by fair_queue.h. A retry after
  // a lost node does not queue behind new requests. UNAVAILABLE when no prefill node is live,
  // RESOURCE_EXHAUSTED (with `retry_after_ms` set) past the queue's bound, CANCELLED or
  // DEADLINE_EXCEEDED with the client's call.
  // Only prefill nodes of served model `model` are taken, of weights `fingerprint` when it is
  // not empty, and only those whose weights a live decode node also serves.
  // `lost_decode` are decode nodes this request gave up on. A request first admitted counts
  // in its tenant's share of the decode slots (StreamShare) until ReleaseStream; a tenant
  // holding its share waits, and its turn passes to the others.
  absl::StatusOr<std::shared_ptr<Node>> AdmitPrefill(grpc::ServerContext* context,
                                                     const std::vector<std::string>& exclude,
                                                     Trace& trace, bool retry,
                                                     int64_t* retry_after_ms, size_t model,
                                                     const std::string& fingerprint,
                                                     const std::vector<std::string>& lost_decode);
  // How many requests of one tenant may be admitted at once for served model `model`
  // (RouterOptions::max_streams_per_tenant). mutex_ held.
  int64_t StreamShare(size_t model) const;
  // The request's place in its tenant's share is free again.
  void ReleaseStream(const Trace& trace);
  // Frees the slot AdmitPrefill took; `took` feeds the retry hint.
  void PrefillDone(Node& node, std::chrono::steady_clock::duration took);
  void MarkDown(const std::string& node_id);
  // A live decode node of served model `model`, not draining and not in `exclude`, exists.
  bool AnyDecode(size_t model, const std::vector<std::string>& exclude) const;

  std::vector<ServedModel> models_;          // [0]: the constructor's
  std::vector<std::string> config_digests_;  // ConfigDigest of each
  RouterOptions options_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Node>> nodes_;
  std::set<std::string> refused_nodes_;  // refused (or renamed) registrations already logged
  static constexpr size_t kMaxNoted = 4096;
  std::condition_variable admission_;  // a prefill slot was freed, or the queue moved
  std::vector<FairQueue> queues_;      // the requests waiting for admission, per model
  // Per model, admitted requests not yet finished, by tenant (no zeros).
  std::vector<std::map<std::string, int64_t>> streams_;
  double prefill_ms_average_ = 100;    // moving average of a prefill's time, for retry hints
  mutable bool kvstore_seen_ = false;  // a kvstore has registered since start
  bool stop_ = false;
  bool draining_ = false;   // Drain was called
  HealthSetter health_;     // WatchHealth's (Drain turns readiness off through it)
  int64_t open_calls_ = 0;  // Generate calls in progress
  std::condition_variable calls_ended_;
  std::thread health_thread_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<StreamWatch> idle_watch_;
  std::shared_ptr<prometheus::Collectable> nodes_collector_;  // baton_nodes{role}
};

}  // namespace baton::router
