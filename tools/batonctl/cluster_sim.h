// The cluster half of `batonctl simulate`: a trace's requests arriving at their times at a
// router with N prefill nodes, each node with its local block cache beside one shared store,
// routed by one of the router's policies and priced by the router's own cost model
// (kvstore/ttft_model.h), so that an SRE can size --block-cache-bytes and the number of
// prefill nodes before deploying.
//
// What it models, as serving does: admission holds a request until a node has a free slot
// (`slots` prefills in flight a node, one computing at a time, in order); the policy ranks
// the nodes with a free slot (least-loaded: fewest in flight; longest-prefix: most blocks in
// the node's local cache; predicted-ttft: the least predicted TTFT, queue = the predicted
// service of the node's prefills in flight); the hit is DESIGN section 5's policy over both
// tiers; a prefill takes the cost model's service time; blocks read from the store are kept in
// the node's cache when the prefill starts, and the blocks it computes go to its cache and the
// store when it ends (PrefixIndex with each budget: LRU over chain leaves). Each request's
// TTFT is its prefill's end less its arrival.
//
// What it leaves out: the decode side, and contention between nodes sharing cores (the
// measured rates fold in what a real run had of it).
//
// Pure; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "baton/common/hash.h"
#include "baton/kvstore/hit_policy.h"
#include "baton/kvstore/ttft_model.h"

namespace baton::tools {

using RoutePolicy = kvstore::RoutingPolicy;
// Comma-separated policy names; the error names --policy and the allowed names.
absl::StatusOr<std::vector<RoutePolicy>> ParseRoutePolicies(absl::string_view text);
// "name=value,..." over the PrefillRates fields (compute_ms_per_gflop, local_ms_per_mib,
// store_ms_per_mib, fixed_ms); fields not named keep their defaults
// (kvstore::DefaultPrefillRates). Each value must be finite and >= 0.
absl::StatusOr<kvstore::PrefillRates> ParseRates(absl::string_view text);

struct ClusterRequest {
  double arrival_ms = 0;
  int64_t prompt_len = 0;
  std::vector<Sha256Digest> chain;  // keys of the prompt's full blocks
};

struct ClusterOptions {
  RoutePolicy policy = RoutePolicy::kPredictedTtft;
  int64_t prefill_nodes = 2;
  int64_t slots = 2;               // prefills in flight per node (the router's --prefill-slots)
  uint64_t block_cache_bytes = 0;  // per node; 0: no local tier
  std::optional<uint64_t> store_budget;  // nullopt: unlimited
  kvstore::HitPolicyInput hit;           // prompt_len is set per request
  kvstore::BlockBytes payload;           // per block and region
  ModelConfig config;                    // the model's shapes (the work of each prefill)
  kvstore::PrefillRates rates = kvstore::DefaultPrefillRates();
};

struct ClusterResult {
  std::vector<double> ttft_ms;  // per request, in trace order
  int64_t prompt_tokens = 0;
  int64_t local_hit_tokens = 0;  // hit tokens whose block KV came from a node's cache
  int64_t store_hit_tokens = 0;
  double makespan_ms = 0;  // first arrival to last prefill's end
  std::vector<int64_t> requests_per_node;
};

ClusterResult SimulateCluster(const std::vector<ClusterRequest>& requests,
                              const ClusterOptions& options);

}  // namespace baton::tools
