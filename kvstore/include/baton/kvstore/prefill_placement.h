// Where a prompt's prefill goes: the router's choice among the prefill nodes with a free slot
// (DESIGN section 6), as one pure function that the router's admission and `batonctl
// simulate` both call, so that a capacity plan is the router's own decision and not a copy.
//
//   open nodes, ordered least loaded first (prefills in flight, then the node's reported queue,
//   then the order given: the router's registry by node_id, the simulator's nodes by index)
//     -> per node: the hit over its local tier and the store (PlanTieredHit) and its predicted
//        cost (PredictPrefill, with the node's queue of work ahead)
//     -> the policy's rank (least-loaded: none; longest-prefix: most local blocks;
//        predicted-ttft: least predicted TTFT); the first of least rank is chosen, the next the
//        runner-up.
//
// And what a node's local block cache keeps of a prefill (CacheKeptReads, WriteBackSteps): the
// values the hit read, and the values it computed, as the prefill node puts them.
//
// Pure functions; safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "baton/common/model_config.h"
#include "baton/kvstore/hit_policy.h"
#include "baton/kvstore/ttft_model.h"

namespace baton::kvstore {

// One prefill node with a free slot, as a router sees it when it places a request.
struct PrefillNodeView {
  int64_t prefilling = 0;       // prefills this router has in flight there
  int64_t reported_queued = 0;  // requests the node reports waiting for its model
  double queue_ms = 0;          // predicted work ahead of a new prefill there
  PrefillRates rates;           // measured, each missing rate filled (RatesOrDefaults)
  TierLookups tiers;            // the request's chain in the node's local cache and the store
};

// What a placement needs of the request.
struct PlacementRequest {
  RoutingPolicy policy = RoutingPolicy::kPredictedTtft;
  HitPolicyInput hit;                   // the prompt's hit policy input
  BlockBytes payload;                   // per block and region
  const ModelConfig* config = nullptr;  // null: no cost is predicted (every cost 0)
};

// A request on one node: its hit, its predicted cost and its rank under the policy.
struct NodePlan {
  TieredHit hit;
  PrefillCost cost;
  double rank = 0;
};

struct Placement {
  int64_t chosen = -1;     // index into the views; -1: none was given
  int64_t runner_up = -1;  // the next best, -1 when there is no other
  NodePlan plan;           // on the chosen node
  NodePlan runner_up_plan;
  bool least_loaded = true;  // the chosen node is the first in load order
};

// The node `request` goes to among `open` (every one with a free slot).
Placement PlacePrefill(std::span<const PrefillNodeView> open, const PlacementRequest& request);

// Several routers place prefills on the same nodes (every node registers with every router),
// each seeing its own requests; two rules make them agree.
//
// A router's share of a prefill node's `slots` (--prefill-slots) when the node reports that
// `routers` routers take its registrations (0: not reported, taken as one): slots / routers,
// at least one. So the routers together send a node at most `slots` prefills at once whenever
// slots >= routers (with more routers than slots, each still holds one).
int64_t RouterSlotShare(int64_t slots, int64_t routers);
// The work ahead of a new prefill on a node: this router's prefills there now (`own_ms`, their
// predicted service), and what the node's last report held (`reported_ms`, its
// prefill_work_ms) beyond what this router had there at that report (`own_at_report_ms`): the
// other routers' prefills.
double QueueAhead(double own_ms, double reported_ms, double own_at_report_ms);

// How far a router trusts a prefill node's own measured rates against its peers': its
// evidence, from 0 (its peers' rates price it) to 1 (its own do). A node's rates are decayed
// means over about its last kFullEvidenceSamples prefills (prefill_service.cc), so that many
// make them whole, and 0 samples with rates is a node that does not count them (taken whole).
// And they age: what a node measured is trusted half as much for every kEvidenceHalfLifeMs it
// has had no prefill to measure (`idle_ms`). A node priced high on a few slow prefills (its
// first contacts with decode nodes, or prefills run while a busier peer shared its cores) would
// otherwise get no work to correct them with, and stay starved while its peers queue.
inline constexpr double kFullEvidenceSamples = 20;
inline constexpr double kEvidenceHalfLifeMs = 5000;
double RateEvidence(uint32_t samples, double idle_ms);

// The logs of the four rates a node measures (compute, local, store, fixed; NaN where not
// measured), which the pool and the blend below work in. A router takes a node's once per
// heartbeat (RegisteredNode::NoteLoad), not once per node on every choice: a choice over a
// thousand nodes would otherwise spend most of its time in log.
using RateLogs = std::array<double, 4>;
RateLogs LogsOf(const PrefillRates& rates);

// The peers' rates: each node's measured rates (0: not measured, left out) weighted by its
// evidence, as a geometric mean per rate (a rate is a factor: one peer ten times slower must
// not make the others look slow); a rate no node measured is `fallback`'s.
class PooledRates {
 public:
  // `logs` is LogsOf(rates).
  void Add(const PrefillRates& rates, const RateLogs& logs, double evidence);
  void Add(const PrefillRates& rates, double evidence) { Add(rates, LogsOf(rates), evidence); }
  PrefillRates Pooled(const PrefillRates& fallback) const;

 private:
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  double log_sum_[4] = {0, 0, 0, 0};
  double weight_[4] = {0, 0, 0, 0};
  double low_[4] = {kInf, kInf, kInf, kInf};  // the least and the most measured
  double high_[4] = {0, 0, 0, 0};
};

// The rates that price a node: each rate it measured blended with the pooled one by its
// evidence, geometrically (evidence 1: its own; 0: the pool's); one it has not measured is the
// pooled one. replay_ms_per_gflop is the node's own (the decode nodes' rate, not this node's).
// `own_logs` and `pooled_logs` are LogsOf(own) and LogsOf(pooled), taken once per heartbeat and
// once per choice.
PrefillRates CredibleRates(const PrefillRates& own, const RateLogs& own_logs, double evidence,
                           const PrefillRates& pooled, const RateLogs& pooled_logs);
inline PrefillRates CredibleRates(const PrefillRates& own, double evidence,
                                  const PrefillRates& pooled) {
  return CredibleRates(own, LogsOf(own), evidence, pooled, LogsOf(pooled));
}

// A router's own prefills in flight on one prefill node, and the work they leave ahead of a
// new one (`own_ms` above). The node computes its prefills one at a time in arrival order, so
// that work drains as they run: what is ahead at `now_ms` is what is predicted to be left of
// it then (a node about to answer its only prefill is nearly free), not every prefill's whole
// prediction until its answer. When one is answered, the others' whole predictions are ahead
// from then on (the next starts then). Times are milliseconds on one clock: the router's steady
// clock, or the cluster simulation's time; both call these, so they price a queue alike.
struct OwnPrefills {
  int64_t count = 0;         // in flight
  double pending_ms = 0;     // their predicted service in all
  double busy_until_ms = 0;  // when what is in flight is predicted to have been served

  // One more, predicted at `predicted_ms`, sent at `now_ms`.
  void Took(double predicted_ms, double now_ms);
  // One of them (predicted at `predicted_ms`) was answered at `now_ms`.
  void Ended(double predicted_ms, double now_ms);
  // The work still ahead at `now_ms`: 0 once the predictions have run out.
  double Ahead(double now_ms) const;
};

// The values a prefill node's local cache holds after a hit of h blocks read them (each put
// there when the store gave it, touched when the cache had it), in the order the node reads
// them: block KV of [0, h), then producer SWA of ReadsForHit's range. The write-back of the
// blocks it computed follows at the prefill's end (WriteBackSteps).
std::vector<WriteBackStep> CacheKeptReads(int64_t hit_blocks, int64_t window, int64_t block_size);

}  // namespace baton::kvstore
