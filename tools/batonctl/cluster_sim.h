// The cluster half of `batonctl simulate`: a trace's requests arriving at their times at a
// router with N prefill nodes, each node with its local block cache beside one shared store,
// routed by one of the router's policies and priced by the router's own cost model
// (kvstore/ttft_model.h), so that an SRE can size --block-cache-bytes and the number of
// prefill nodes before deploying.
//
// What it models, as serving does: admission holds a request until a node has a free slot
// (`slots` prefills in flight a node, one computing at a time, in order); the node it goes to
// is the router's own choice, kvstore::PlacePrefill, over the same views the router has (each
// node's prefills in flight, its queue of waiting requests as a heartbeat reports it, the
// predicted service of its prefills in flight, its rates, its local cache's and the store's
// lookups of the prompt); the hit is DESIGN section 5's policy over both tiers; a prefill
// takes the cost model's service time; what the hit read is kept in the node's cache when the
// prefill starts (kvstore::CacheKeptReads, as the prefill node keeps it), and the blocks it
// computes go to its cache and the store when it ends (PrefixIndex with each budget: LRU over
// chain leaves). Each request's TTFT is its prefill's end less its arrival.
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
#include "baton/kvstore/prefill_placement.h"
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
  bool record_steps = false;  // ClusterResult::steps
  // The prefix store as a fleet (DESIGN section 5): its nodes, named as `baton up` names them
  // (kvstore, kvstore-1, ...), and each value's owners (kvstore/placement.h).
  int64_t store_nodes = 1;
  int64_t store_replication = 1;
};

// What one store node served over a simulation, as the fleet's rules send it: a lookup probes
// every owner of some of the prompt's keys once (KeysByOwner); a value the hit reads from the
// store comes from one of its owners, rotated per read as a prefill node rotates them
// (ReadOrder); a value written back goes to every owner.
struct StoreNodeOps {
  int64_t lookups = 0;     // probes
  int64_t probe_keys = 0;  // keys asked in them
  int64_t reads = 0;       // values read
  int64_t writes = 0;      // values written
  uint64_t read_bytes = 0;
  uint64_t write_bytes = 0;
};

// One step of a simulation, in the order it happened: a request placed on a node (with the
// store's lookup of its chain then, and the hit), or its prefill ending there.
struct ClusterStep {
  enum Kind { kPlaced, kEnded } kind = kPlaced;
  size_t request = 0;
  int64_t node = 0;
  int64_t hit_blocks = 0;
  kvstore::ChainLookup store;  // kPlaced
};

struct ClusterResult {
  std::vector<double> ttft_ms;  // per request, in trace order
  int64_t prompt_tokens = 0;
  int64_t local_hit_tokens = 0;  // hit tokens whose block KV came from a node's cache
  int64_t store_hit_tokens = 0;
  double makespan_ms = 0;  // first arrival to last prefill's end
  std::vector<int64_t> requests_per_node;
  std::vector<ClusterStep> steps;  // with ClusterOptions::record_steps
  std::vector<std::string> store_ids;
  std::vector<StoreNodeOps> store_ops;  // per store node, as store_ids
};

ClusterResult SimulateCluster(const std::vector<ClusterRequest>& requests,
                              const ClusterOptions& options);

}  // namespace baton::tools
