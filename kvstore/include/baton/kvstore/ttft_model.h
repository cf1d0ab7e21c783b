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

// A node's time for a kind of work as a line, fixed_ms + per_unit_ms x units, fitted by least
// squares over its recent samples (each sample's weight falls by `keep` with every later one:
// 0.95 weighs about the last 20). The squares are of each sample's error relative to its time:
// what slows a prefill on shared cores slows it by a factor, so a large prefill's time swings
// by hundreds of ms where a small one's swings by a few, and plain least squares let those
// swings set the fixed time. Replaying one policy-bench run's 100 prefills (2 prefill nodes on
// 2 cores) through both: plain least squares ended at 23 ms fixed where a prefill of a few
// tokens took 13-20, and predicted each next prefill at 0.47-2.30x its time (p10-p90); relative
// errors ended at 16 ms and predicted 0.68-1.30x. A ratio of time to work alone would price a small
// prefill at a large one's rate: a prompt of a few tokens still streams every weight once (a few ms
// on the small preset, at 0.2 GFLOP), so a run of them raised a node's reported ms per GFLOP
// fourfold and its large prompts were priced at that. Once the samples weigh kMinSamples, one
// more than kClip times the line's prediction is taken at that bound (a prefill slowed by
// whatever shared its cores moves the line no more than that). While the samples' work does not
// spread enough to tell a slope from a constant (its weighted variance under kMinSpread of its mean
// squared), while the samples weigh less than kMinSamples (a line through a node's first few
// prefills, slowed by one-time costs, priced it at seconds a request and kept it from the traffic
// that would have corrected it), or the fit would give a negative fixed time or a slope that is not
// positive, the line is the ratio of the sums through zero.
class WorkTimeFit {
 public:
  static constexpr double kClip = 2.0;
  static constexpr double kMinSpread = 0.05;
  static constexpr double kMinSamples = 8;
  explicit WorkTimeFit(double keep = 0.95) : keep_(keep) {}
  // One sample; ignored unless both are finite and > 0.
  void Add(double units, double ms);
  double per_unit_ms() const { return per_unit_ms_; }  // 0 before any sample
  double fixed_ms() const { return fixed_ms_; }
  double Predict(double units) const { return fixed_ms_ + per_unit_ms_ * units; }

 private:
  double keep_;
  double weight_ = 0, units_ = 0, ms_ = 0;  // decayed sums: the samples, their work and time
  // The same of the line's terms, each sample weighed by 1 / ms^2 (its relative error).
  double w_ = 0, w_units_ = 0, w_units2_ = 0, w_ms_ = 0, w_units_ms_ = 0;
  double per_unit_ms_ = 0, fixed_ms_ = 0;
};

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
