// The router's registry of nodes (DESIGN section 6): which prefill, decode and kvstore nodes
// have registered, under which certificate identity, for which served model and weights, how
// loaded each is, and which of them are live (heard from within --node-ttl-ms, not draining).
//
// Promises:
// - A node registers only as the role its certificate names, and a node_id stays bound to the
//   identity that first registered it: another certificate cannot take it over, drain it or
//   send cache events in its name. A per-node certificate (spiffe://baton/<role>/<instance>)
//   registers only the node_id that equals its instance; a role-only one (spiffe://baton/<role>,
//   an older PKI shared by a role's pods) binds its node_ids to the role, with a warning.
// - A node_id not heard from for Options::forget_after_ms is forgotten (its entry, binding and
//   cache index), within a second more; node_ids are bounded in all and per identity, and a
//   new one past either bound is refused by name.
// - A node's address, identity, fingerprint and channel never change in place: a node that
//   comes back different is a new RegisteredNode, so a request holding the old one keeps a
//   consistent view without the lock.
// - Every node handed out by Pick or TakePrefillSlot is counted in flight until its NodeLease
//   is dropped.
//
// Threading: every method is safe to call from any thread; one mutex guards the registry, and
// no method calls out (no RPC, no callback) while holding it. `on_change` runs after the lock
// is released.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "baton/common/model_config.h"
#include "baton/kvstore/prefill_placement.h"
#include "baton/kvstore/ttft_model.h"
#include "baton/router/cache_index.h"
#include "baton/text/tokenizer.h"
#include "baton/v1/node.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"

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

// The served model `name` names (its index in `models`); "" and any name for a router of one
// unnamed model are the first. NOT_FOUND naming what is served.
absl::StatusOr<size_t> ResolveServedModel(const std::vector<ServedModel>& models,
                                          const std::string& name);

// A node as the registry knows it. The counters are changed only by the registry, under its
// lock; every other field is fixed once the node is registered.
struct RegisteredNode {
  // What its last heartbeat reported that a prefill choice reads, copied out of `info` so
  // that a choice over a thousand nodes reads each node's few cache lines and no message.
  struct Reported {
    kvstore::PrefillRates rates;  // as reported: 0 where the node has measured nothing
    kvstore::RateLogs rate_logs;  // kvstore::LogsOf(rates), taken once per heartbeat
    double prefill_work_ms = 0;   // LoadReport.prefill_work_ms
    int64_t queued_requests = 0;
    double replay_ms_per_gflop = 0;  // a decode node's DecodeRates.replay_ms_per_gflop
    uint32_t routers = 0;            // LoadReport.routers (at most kMaxReportedRouters)
    uint32_t samples = 0;            // PrefillRates.samples: prefills its rates measured
    // When (the registry's NowMs) the node last measured a prefill or reported work: how old
    // its rates are (kvstore::RateEvidence's idle time runs from here).
    double measured_at_ms = 0;
  };
  // Copies what `load` reports into `reported`, at `now_ms` on the registry's clock.
  void NoteLoad(const v1::LoadReport& load, double now_ms);

  // The fields a prefill choice reads come first, together.
  std::chrono::steady_clock::time_point last_seen;  // the epoch once marked down
  // Of `inflight`, the prefills not yet answered (prefill nodes): how many, their predicted
  // service, and the work of it still ahead as the node runs them (kvstore::OwnPrefills).
  kvstore::OwnPrefills prefills;
  // What of its last reported prefill_work_ms was this router's (kvstore::QueueAhead): the
  // work of its prefills ahead when the heartbeat arrived, and the predicted service of those
  // that ended since the heartbeat before (a report made while one of them ran can arrive after
  // its answer; counted as the node's own queue it would price phantom work there until the
  // next heartbeat).
  double pending_at_report_ms = 0;
  double ended_since_report_ms = 0;
  uint32_t model = 0;           // its index in the served models (prefill and decode nodes)
  bool draining = false;        // its last registration said so: it gets no new request
  bool producers_only = false;  // info.held_layers() is HELD_LAYERS_PRODUCERS, fixed with it
  size_t id_hash = 0;           // ChainHolders::IdHash of its node_id, fixed with it
  // info.model_fingerprint(), fixed with it, and one object for every node of that fingerprint
  // (NodeRegistry interns it): a placement asks which of its views a node's fingerprint is for
  // of a thousand nodes, and equal pointers answer without reading the string.
  std::shared_ptr<const std::string> fingerprint;
  Reported reported;  // from info.load()

  std::chrono::steady_clock::time_point last_heard;  // its last registration (for forgetting)
  int64_t inflight = 0;  // requests this router sent there and has not finished
  std::shared_ptr<grpc::Channel> channel;
  std::string identity;  // the certificate identity it registered with ("" without TLS)
  // What its node_id is bound to: the identity, and for a role-only certificate (one that
  // every pod of the role carries) also the peer's IP, so that one pod cannot speak for another
  // from elsewhere (NodeRegistry::BindingOf).
  std::string binding;
  std::string pairing_key;  // NodeRegistry::PairingKey(info), fixed with it
  v1::RegisterRequest info;

  const std::string& id() const { return info.node_id(); }
};

class NodeRegistry;

// A node in use by one request: counted in the node's `inflight` until dropped.
class NodeLease {
 public:
  NodeLease() = default;
  NodeLease(NodeRegistry* registry, std::shared_ptr<RegisteredNode> node)
      : registry_(registry), node_(std::move(node)) {}
  NodeLease(NodeLease&& other) noexcept { *this = std::move(other); }
  NodeLease& operator=(NodeLease&& other) noexcept;
  NodeLease(const NodeLease&) = delete;
  NodeLease& operator=(const NodeLease&) = delete;
  ~NodeLease() { Reset(); }

  void Reset();
  explicit operator bool() const { return node_ != nullptr; }
  const RegisteredNode* operator->() const { return node_.get(); }
  const RegisteredNode& operator*() const { return *node_; }
  const std::shared_ptr<RegisteredNode>& node() const { return node_; }

 private:
  NodeRegistry* registry_ = nullptr;
  std::shared_ptr<RegisteredNode> node_;
};

class NodeRegistry {
 public:
  struct Options {
    uint32_t heartbeat_ms = 500;   // what registering nodes are told
    uint32_t node_ttl_ms = 6500;   // a node not heard from for this long is not used
    bool require_kvstore = false;  // Serving() waits for a kvstore to have registered once
    // The router's split: a prefill node must hold the layers it runs there (all, or the
    // producers only under replay-on-decode), a decode node every layer.
    v1::Split split = v1::SPLIT_PREFILL_ALL;
    // A node not heard from for this long is forgotten (--node-forget-after-ms; at least
    // node_ttl_ms): pods that went away leave nothing behind.
    uint32_t forget_after_ms = 30000;
    // At most this many node_ids (--max-node-ids), and per certificate identity
    // (--max-node-ids-per-identity: what one role-only certificate may hold; a per-node one
    // holds its own node_id only). Not applied per identity without TLS, where there is none.
    size_t max_node_ids = 4096;
    size_t max_node_ids_per_identity = 256;
    // The clock, in milliseconds, by which a node's queue of this router's prefills counts
    // down (kvstore::OwnPrefills); unset: the steady clock. A test that replays a cluster
    // simulation gives the simulation's time.
    std::function<double()> now_ms;
  };
  // `models` outlives the registry.
  NodeRegistry(const std::vector<ServedModel>& models, const Options& options);

  // Registers or refreshes the caller's node (Registry/Register; `context` gives the
  // certificate). INVALID_ARGUMENT naming the field, PERMISSION_DENIED for the wrong role or
  // another identity's node_id, FAILED_PRECONDITION for a model this router does not serve or
  // layers that do not fit its split (naming the node's and the router's). A prefill node's
  // cache events go to cache_index(); `*cache_resync` (when given) is set when they did not
  // follow the last batch and the node must send a snapshot.
  absl::Status Register(const grpc::ServerContextBase& context, const v1::RegisterRequest& request,
                        bool* cache_resync = nullptr);
  // Register for a caller already authorized for the request's role, whose certificate
  // identity is `identity` ("" without TLS). PERMISSION_DENIED naming the node_id and
  // `identity` when the node_id is another identity's or not the certificate's instance;
  // RESOURCE_EXHAUSTED naming the node_id and the bound past a cap on node_ids.
  // `peer_host` is the caller's IP: a role-only certificate's node_id is bound to it too.
  absl::Status RegisterFrom(const std::string& identity, const v1::RegisterRequest& request,
                            bool* cache_resync = nullptr, const std::string& peer_host = "");
  // What a node_id registered by `identity` from `peer_host` is bound to: a per-node
  // certificate's identity alone (it names the node); a role-only one's with the peer's IP.
  static std::string BindingOf(const std::string& identity, const std::string& peer_host);
  // Forgets the nodes not heard from for forget_after_ms before `now` (Register does this at
  // most once a second); how many. Tests call it with a later `now`.
  size_t ForgetExpired(std::chrono::steady_clock::time_point now);
  // The node_ids the registry holds, live or not.
  size_t NodeIds() const;
  // Called, without the registry's lock, after a registration or a freed prefill slot: what
  // waits for a node (admission) looks again.
  void OnChange(std::function<void()> on_change) { on_change_ = std::move(on_change); }

  // The live node of `role` with the least load (routing.h SelectNode), not in `exclude`,
  // whose PairingKey is `pairs_with` (any when empty); empty when none.
  NodeLease Pick(v1::NodeRole role, const std::vector<std::string>& exclude,
                 const std::string& pairs_with = "");

  // What admission asks: the live prefill nodes of served model `model` (of `fingerprint`
  // when not empty, not in `exclude`) whose weights a live decode node not in `lost_decode`
  // also serves, how many there are, and those of them where this router holds fewer
  // prefills than its share of `slots` (kvstore::RouterSlotShare over the routers the node
  // reports); which one a request takes is kvstore::PlacePrefill's choice. A candidate's
  // pending_ms is the work ahead there (kvstore::QueueAhead: what is left of this router's
  // prefills, kvstore::OwnPrefills, and the others' from the node's report).
  struct PrefillCandidate {
    std::shared_ptr<RegisteredNode> node;
    // Taken under the registry's lock when the choice was made (they change in place).
    int64_t prefilling = 0;
    double pending_ms = 0;
    int64_t reported_queued = 0;  // the node's last heartbeat's queued_requests
    // The rates that price it (kvstore::CredibleRates): its measured ones as far as its
    // evidence goes, the live prefill nodes' pooled ones for the rest and for each it lacks (the
    // cost model's defaults when none has measured it); replay_ms_per_gflop is left 0 here.
    kvstore::PrefillRates rates;
    // A node holding the producers only (replay-on-decode): its requests' replay runs on the
    // decode node, at the mean rate the live decode nodes reported (0: none has, or replay
    // runs here).
    double replay_ms_per_gflop = 0;
  };
  struct PrefillChoice {
    int64_t live = 0;
    // Every live one with a free slot, by node_id (empty: every live one is full).
    std::vector<PrefillCandidate> open;
  };
  PrefillChoice ChoosePrefill(size_t model, const std::string& fingerprint,
                              const std::vector<std::string>& exclude,
                              const std::vector<std::string>& lost_decode, int64_t slots) const;
  // Takes a prefill slot on `node` (from ChoosePrefill) for one request whose prefill is
  // predicted to take `predicted_ms` there (added to the node's queue until PrefillDone).
  NodeLease TakePrefillSlot(const std::shared_ptr<RegisteredNode>& node, double predicted_ms = 0);
  // The slot TakePrefillSlot took is free again.
  void PrefillDone(RegisteredNode& node, double predicted_ms = 0);
  // Which blocks each prefill node's local cache holds (its cache events).
  const CacheIndex& cache_index() const { return cache_index_; }
  // `node`, a prefill node with a block cache, is about to keep `steps` of `chain` (what this
  // router just sent it or it just answered): the cache index holds them at once, each until
  // the node's cache events confirm it or three heartbeats pass without (CacheIndex::Expect).
  // A node that reports no block cache keeps nothing: no-op.
  void ExpectCached(const RegisteredNode& node, std::span<const Sha256Digest> chain,
                    std::span<const kvstore::WriteBackStep> steps);
  // Per served model, the largest weight bytes a live prefill and a live decode node report.
  struct WeightBytes {
    uint64_t prefill = 0, decode = 0;
  };
  std::vector<WeightBytes> ResidentWeightBytes() const;
  // The decode slots the live decode nodes of `model` report in all.
  int64_t DecodeSlots(size_t model) const;

  // Takes `node_id` for down until it registers again.
  void MarkDown(const std::string& node_id);
  // A live decode node of served model `model`, not draining and not in `exclude`, exists.
  bool AnyDecode(size_t model, const std::vector<std::string>& exclude) const;
  // A prefill and a decode node that pair (PairingKey) are live (and a kvstore has
  // registered, with require_kvstore).
  bool Serving() const;
  // Per served model, the fingerprints that a live prefill and a live decode node both serve.
  std::vector<std::set<std::string>> ServedFingerprints() const;
  // The live store nodes that are not draining, by node_id: the prefix store's live set
  // (DESIGN section 5), the one set every placement of a request is computed over.
  std::vector<std::shared_ptr<RegisteredNode>> LiveStores() const;
  // The live prefill and decode nodes, draining or not, by node_id (`batonctl rates`).
  std::vector<std::shared_ptr<RegisteredNode>> LiveServingNodes() const;
  // Live nodes by role label ("prefill", "decode", "kvstore"), for baton_nodes.
  std::map<std::string, double> LiveByRole() const;
  // Live nodes by role, build and StateBlock format, for baton_router_nodes_by_version and
  // baton_router_version_skew (a rollout between formats shows as two formats at once).
  struct VersionCount {
    std::string role, build;
    uint32_t state_format = 0;
    double nodes = 0;
  };
  std::vector<VersionCount> LiveByVersion() const;
  // Live prefill and decode nodes by served model, weights fingerprint and role, for
  // baton_router_nodes_by_model (model skew: a model whose prefill and decode nodes share no
  // fingerprint serves nothing).
  struct ModelCount {
    std::string model, fingerprint, role;
    double nodes = 0;
  };
  std::vector<ModelCount> LiveByModel() const;

  static const char* RoleLabel(v1::NodeRole role);
  // What a prefill and a decode node pair on (DESIGN section 6): the same weights and the
  // same StateBlock format version, so that a decode node can take what a prefill node sends.
  static std::string PairingKey(const v1::RegisterRequest& node);

 private:
  friend class NodeLease;
  void Finished(RegisteredNode& node);
  bool Live(const RegisteredNode& node, std::chrono::steady_clock::time_point now) const;
  double NowMs() const;  // Options::now_ms, or the steady clock's
  // The served model a registering prefill or decode node serves, or why it is refused;
  // `renamed` when a router of one model takes a node of another name.
  absl::StatusOr<size_t> ModelOf(const v1::RegisterRequest& request, bool* renamed) const;
  void NoteRefused(const v1::RegisterRequest& request, const absl::Status& refused);
  // The checks that need no lock: fields, cache events, layers, model (its index), and the
  // certificate's instance against the node_id.
  absl::StatusOr<size_t> CheckRequest(const std::string& identity,
                                      const v1::RegisterRequest& request);
  // May `identity` (bound as `binding`) register `node_id` now: bound to it, new within the
  // caps, or taking over a node_id whose node has expired. Under mutex_.
  absl::Status CheckBindingLocked(const std::string& identity, const std::string& binding,
                                  const std::string& node_id,
                                  std::chrono::steady_clock::time_point now) const;
  // Adds or refreshes the node. Under mutex_.
  void UpdateLocked(const std::string& identity, const std::string& binding, size_t model,
                    const v1::RegisterRequest& request, std::chrono::steady_clock::time_point now);
  // Takes the expired nodes out of nodes_ (under mutex_); their ids.
  std::vector<std::string> ForgetLocked(std::chrono::steady_clock::time_point now);
  // Counts and logs them, and gives their memory back; without the lock.
  void Forgot(const std::vector<std::string>& node_ids);

  const std::vector<ServedModel>& models_;
  std::vector<std::string> config_digests_;  // ConfigDigest of each served model
  Options options_;
  std::function<void()> on_change_;
  prometheus::Family<prometheus::Counter>& registrations_;
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<RegisteredNode>> nodes_;
  // Changes whenever a node joins, is replaced (a registration that changed it) or goes. The
  // decode nodes as of a version, so that a prefill choice over a thousand prefill nodes walks
  // only the decode nodes to find their partners.
  uint64_t roster_version_ = 0;
  // The prefill, decode and store nodes as of roster_version_, each with its fixed fields that a
  // choice compares (weights fingerprint, pairing key) as small numbers (Roster::Intern), so
  // that a choice walks one array and compares no string. Rebuilt under mutex_ by
  // ChoosePrefill when the version has moved.
  struct RosterEntry {
    std::shared_ptr<RegisteredNode> node;
    uint32_t pairing = 0;
    uint32_t fingerprint = 0;
  };
  struct Roster {
    uint64_t version = ~uint64_t{0};
    std::vector<RosterEntry> prefill, decode, store;  // each by node_id
    std::map<std::string, uint32_t> interned;  // pairing keys and fingerprints
    uint32_t Intern(const std::string& text);
  };
  const Roster& RosterLocked() const;
  mutable Roster roster_;
  // The nodes' fingerprints as RegisteredNode::fingerprint holds them, one object each while a
  // node holds it. Under mutex_.
  std::shared_ptr<const std::string> InternFingerprintLocked(const std::string& fingerprint);
  std::map<std::string, std::weak_ptr<const std::string>> fingerprints_;
  std::map<std::string, size_t> node_ids_by_identity_;  // of nodes_, per identity
  std::chrono::steady_clock::time_point last_forget_;   // the last ForgetLocked
  std::set<std::string> role_only_noted_;               // role-only identities already warned of
  prometheus::Gauge& node_ids_;
  prometheus::Counter& forgotten_;
  std::set<std::string> refused_nodes_;  // refused (or renamed) registrations already logged
  mutable bool kvstore_seen_ = false;    // a kvstore has registered since start
  CacheIndex cache_index_;
};

}  // namespace baton::router
