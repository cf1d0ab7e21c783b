// The router's admission (DESIGN section 6): requests wait in one queue per served model, of at
// most `max_queued` (first come, first served within a tenant, fair across tenants:
// fair_queue.h) until a prefill node has a free slot (`prefill_slots` prefills in flight per
// node: one computing, the next ready). The decode reservation is taken only after admission,
// so none expires in a queue.
//
// Promises:
// - Past the queue's bound, or past a tenant's share of it, a request is refused at once with
//   RESOURCE_EXHAUSTED and a retry hint; it never waits unbounded. A request that finds the
//   queue full while its tenant holds less than its share takes the place of the newest
//   request of the tenant furthest over its share, which is refused the same way.
// - A tenant holds at most its share of the decode slots (StreamHold) from its first admission
//   until ReleaseStream; a tenant at its share waits, and its turn passes to the others.
// - Both shares are tenant_share.h's: with API keys, each active tenant's weighted fair part of
//   the queue and of the live decode slots, never under one, with a reserve for newcomers, so
//   no number of flooding tenants shuts another out.
// - A retry after a lost node does not queue behind new requests.
// - A prefill slot taken is given back exactly once (PrefillSlot).
//
// Threading: every method is safe from any thread. Admission's mutex is taken before the
// registry's (never the other way), and the registry's changes reach waiting requests through
// Notify(). A waiting request sleeps until it is woken as the head of its queue's turn order
// (or as a retry) after something it depends on changed; otherwise it only looks at its own
// call's cancellation and deadline now and then, so waiting costs O(1) per request.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/kvstore/prefill_placement.h"
#include "baton/router/fair_queue.h"
#include "baton/router/node_registry.h"
#include "grpcpp/grpcpp.h"

namespace baton::router {

// A request's place in its tenant's share of the decode slots, from its first admission.
struct StreamHold {
  std::string tenant;  // from the client's API key; "" without keys
  size_t model = 0;    // the served model's index
  bool held = false;   // admitted: counted in its tenant's share
};

class Admission;

// A prefill slot taken by Admit, given back when the prefill node answers (Done) or when the
// attempt ends first.
class PrefillSlot {
 public:
  PrefillSlot() = default;
  PrefillSlot(Admission* admission, std::shared_ptr<RegisteredNode> node, double predicted_ms = 0)
      : admission_(admission), node_(std::move(node)), predicted_ms_(predicted_ms) {}
  PrefillSlot(PrefillSlot&& other) noexcept { *this = std::move(other); }
  PrefillSlot& operator=(PrefillSlot&& other) noexcept;
  PrefillSlot(const PrefillSlot&) = delete;
  PrefillSlot& operator=(const PrefillSlot&) = delete;
  ~PrefillSlot() { Done(); }
  void Done();

 private:
  Admission* admission_ = nullptr;
  std::shared_ptr<RegisteredNode> node_;
  double predicted_ms_ = 0;  // counted in the node's prefills until Done
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

class Admission {
 public:
  struct Options {
    int64_t max_queued = 1024;
    // Ceilings on one tenant's share (0: none) beside its fair share (tenant_share.h).
    int64_t max_queued_per_tenant = 0;
    int64_t max_streams_per_tenant = 0;
    int64_t prefill_slots = 2;
    uint32_t node_ttl_ms = 6500;
    bool api_keys = false;  // requests carry tenants (without, one tenant holds every pool)
    // A tenant's weight (ApiKeys::WeightOf, which follows the key file); null: every weight 1.
    std::function<int64_t(const std::string&)> tenant_weight;
  };
  // `registry` and `models` outlive the admission.
  Admission(NodeRegistry& registry, const std::vector<ServedModel>& models, const Options& options);

  // What one admission asks for.
  struct Ask {
    bool retry = false;                    // a retry after a lost node: no queueing
    std::string fingerprint;               // weights the request is tied to; "" any
    std::vector<std::string> exclude;      // prefill nodes this request gave up on
    std::vector<std::string> lost_decode;  // decode nodes this request gave up on
    // What the placement of the request among the nodes with a free slot takes
    // (kvstore::PlacePrefill): the policy, the hit policy's input and the model.
    kvstore::PlacementRequest placement;
    // The request's chain in a candidate's local cache and in the store; null: empty tiers.
    std::function<kvstore::TierLookups(const RegisteredNode&)> tiers;
  };
  struct Admitted {
    NodeLease node;
    PrefillSlot slot;
    NodeRegistry::PrefillCandidate chosen;
    // The next best node with a free slot, when there was one (for the request's debug log).
    std::optional<NodeRegistry::PrefillCandidate> runner_up;
    kvstore::Placement placement;  // the hit and predicted cost on each of the two
  };
  // Waits for a prefill node of `hold.model` with a free slot and takes the slot; `hold`
  // enters its tenant's share on first admission. UNAVAILABLE when no prefill node has been
  // live for a node TTL, RESOURCE_EXHAUSTED (with `*retry_after_ms` set) past the queue's
  // bounds, CANCELLED or DEADLINE_EXCEEDED with the client's call.
  absl::StatusOr<Admitted> Admit(const grpc::ServerContextBase& context, const Ask& ask,
                                 StreamHold& hold, int64_t* retry_after_ms);
  // The request's place in its tenant's share is free again.
  void ReleaseStream(StreamHold& hold);
  // Something a waiting request depends on changed (a node registered, a slot was freed).
  void Notify();

  // For the metrics: requests queued, and admitted requests by tenant.
  double Queued() const;
  std::map<std::string, double> StreamsByTenant() const;

 private:
  friend class PrefillSlot;
  // One waiting request: woken (`woken` set, then `wake` notified) when it may have its turn,
  // or when another tenant's request took its place in the queue (`refused`).
  struct Waiter {
    std::condition_variable wake;
    bool woken = false;
    absl::Status refused;
    int64_t retry_after_ms = 0;
  };
  // A waiting request's entry among the waiters, taken out (and its ticket out of the queue,
  // not admitted) when it leaves. mutex_ held throughout.
  class Waiting;
  void SlotDone(RegisteredNode& node, std::chrono::steady_clock::duration took,
                double predicted_ms);
  // The rest of this file's methods: mutex_ held.
  int64_t Weight(const std::string& tenant) const;
  // The tenants active for `model`: holding decode streams or waiting in its queue.
  std::set<std::string> ActiveTenants(size_t model) const;
  // Of `tenants`, those that may not take a decode stream of `model` now (tenant_share.h).
  std::set<std::string> StreamsFull(size_t model, const std::set<std::string>& tenants) const;
  // The refusal of a request that cannot queue, or OK when it may (after taking the place of
  // the newest request of the tenant furthest over its share, when the queue is full).
  absl::Status MakeQueueRoom(size_t model, const std::string& tenant, int64_t live,
                             int64_t* retry_after_ms);
  // Wakes the request whose turn it is in `model`'s queue, and every retry waiting.
  void WakeTurn(size_t model);
  // Sleeps until woken, until `recheck`, or until the call is cancelled or past its deadline.
  absl::Status Sleep(const grpc::ServerContextBase& context, std::unique_lock<std::mutex>& lock,
                     Waiter& waiter, std::chrono::steady_clock::time_point recheck);
  // Takes the policy's first node of `choice` (which has one with a free slot).
  Admitted TakeSlot(const NodeRegistry::PrefillChoice& choice, const Ask& ask);

  NodeRegistry& registry_;
  const std::vector<ServedModel>& models_;
  Options options_;
  mutable std::mutex mutex_;
  std::vector<FairQueue> queues_;  // the requests waiting for admission, per model
  // Per model, the waiters of the queued requests by ticket, and the retries' (not queued).
  std::vector<std::map<uint64_t, Waiter*>> waiters_;
  std::vector<std::set<Waiter*>> retries_;
  // Per model, admitted requests not yet finished, by tenant (no zeros).
  std::vector<std::map<std::string, int64_t>> streams_;
  double prefill_ms_average_ = 100;  // moving average of a prefill's time, for retry hints
};

}  // namespace baton::router
