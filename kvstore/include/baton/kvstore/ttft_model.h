// The price of serving a prompt on one prefill node, in time (the router's predicted-TTFT
// policy, and `batonctl simulate`, which runs the same code over a trace):
//
//   TTFT = queue wait + load of the hit (per tier) + computed rows + replayed consumer rows
//          + the node's fixed cost per request (commit, transfer, sampling)
//
// A CED hit of H tokens still costs the rows after it (producers and block KV over [H, L))
// and the consumers' replay over [max(s_keep, H), L): C to C + B - 1 rows after a hit capped
// at L - C, K without one (DESIGN section 5). Rows are priced by their work, not their count:
// a replayed row attends to every block-KV position before it, so after a long prefix it
// costs several computed rows (EstimatePrefillWork counts the FLOPs as model::EstimateWork
// does). Each term is priced at the node's measured rates (moving averages the node reports),
// or at DefaultPrefillRates before it has measured.
//
// Pure functions; safe from any thread.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "baton/common/model_config.h"
#include "baton/kvstore/hit_policy.h"
#include "baton/kvstore/prefix_index.h"
#include "baton/v1/node.pb.h"

namespace baton::kvstore {

// How a router chooses among the prefill nodes with a free slot (baton-router
// --prefill-policy, `batonctl simulate --policy`): the least loaded, the one whose local cache
// holds the longest prefix, or the one of least predicted TTFT (PredictPrefill).
enum class RoutingPolicy { kLeastLoaded, kLongestPrefix, kPredictedTtft };
inline constexpr RoutingPolicy kRoutingPolicies[] = {
    RoutingPolicy::kLeastLoaded, RoutingPolicy::kLongestPrefix, RoutingPolicy::kPredictedTtft};
// "least-loaded", "longest-prefix", "predicted-ttft".
const char* RoutingPolicyName(RoutingPolicy policy);
// One policy name; the error names `field` and the allowed names.
absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(absl::string_view text, absl::string_view field);

// Rates in milliseconds; what a node has not measured (0) takes the default's.
struct PrefillRates {
  double compute_ms_per_gflop = 0;
  double local_ms_per_mib = 0;
  double store_ms_per_mib = 0;
  double fixed_ms = 0;
  // Where the replay runs on another node (replay-on-decode: the decode nodes' measured
  // DecodeRates.replay_ms_per_gflop), its rate; 0: the replay runs here, at compute_ms_per_gflop.
  double replay_ms_per_gflop = 0;
  bool replays_elsewhere() const { return replay_ms_per_gflop > 0; }
};
// Priors for a node that has measured nothing yet (the small preset on 2 cores, roughly): they
// only order nodes until real rates arrive.
PrefillRates DefaultPrefillRates();
// `reported`, each rate that is not positive (or not finite) taken from the defaults.
PrefillRates RatesOrDefaults(const v1::PrefillRates& reported);
v1::PrefillRates ToProto(const PrefillRates& rates, uint32_t samples);

// The blocks a node holds in its local tier and the shared store holds, as each's lookup
// (leading block-KV blocks and their SWA rows).
struct TierLookups {
  ChainLookup local;
  ChainLookup store;
};

// A hit over both tiers (each block from either, the local tier first) and what it reads
// from each.
struct TieredHit {
  int64_t hit_blocks = 0;    // h, by the hit policy (HitBlocks) over both tiers at once
  int64_t local_blocks = 0;  // of the h blocks' block KV, from the local tier
  uint64_t local_bytes = 0;  // payload bytes read from the local tier
  uint64_t store_bytes = 0;  // and from the store
};
// The payload bytes of one block per region: a block-KV page (G groups x (K, V) x B rows x
// kv_dim floats) and the stored producer SWA rows (P layers x (K, V) x B rows x kv_dim).
struct BlockBytes {
  uint64_t block_kv = 0;
  uint64_t swa = 0;
};
BlockBytes BlockPayloadBytes(const ModelConfig& config);
TieredHit PlanTieredHit(const HitPolicyInput& input, const TierLookups& tiers,
                        const BlockBytes& bytes);

// The FLOPs (in GFLOP) of computing rows [computed_begin, L) through the producers and the
// block-KV projections, and rows [replay_begin, L) through the consumer layers (their SWA and
// global attention included) and the last row's logits.
struct PrefillWork {
  double computed_gflop = 0;
  double replayed_gflop = 0;
};
PrefillWork EstimatePrefillWork(const ModelConfig& config, int64_t prompt_len,
                                int64_t computed_begin, int64_t replay_begin);

struct PrefillCost {
  int64_t computed_rows = 0;  // L - H
  int64_t replayed_rows = 0;  // L - max(s_keep, H)
  double queue_ms = 0;
  double load_ms = 0;
  double compute_ms = 0;
  double replay_ms = 0;
  double fixed_ms = 0;
  bool replay_elsewhere = false;  // replay_ms is the decode node's (rates.replays_elsewhere())
  double total_ms() const { return queue_ms + load_ms + compute_ms + replay_ms + fixed_ms; }
  double service_ms() const { return total_ms() - queue_ms; }
  // What the prefill node itself spends: its service, less a replay that runs elsewhere.
  double node_ms() const { return service_ms() - (replay_elsewhere ? replay_ms : 0); }
};
// The predicted TTFT of `input`'s prompt with `hit` on a node of `rates` whose queue holds
// `queue_ms` of work, for a model of `config` (its block size is input.block_size).
PrefillCost PredictPrefill(const PrefillRates& rates, double queue_ms, const HitPolicyInput& input,
                           const TieredHit& hit, const ModelConfig& config);

}  // namespace baton::kvstore
