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
// Decode, with decode_nodes > 0 (decode_sim.h): a request also needs a decode slot
// (`decode_slots` a node, the least loaded node's, fewest requests then lowest index, as the
// router's Pick) before its prefill starts, as the router reserves one at admission; from its
// prefill's end it joins its decode node's next step. Each step is the decode node's own plan
// (decode_node::PlanStep under `decode_step`) over its requests, taking the fitted time of its
// rows (DecodeRates: fixed + per_row x rows, as the node's step-cost fit) and giving every
// request in it `tokens_per_step` tokens (speculation's measured tokens per step, 1 without
// it); a request leaves after its output tokens (the first comes from the prefill), freeing
// its slot. Each token's gap is its ITL sample, the way `batonctl replay` measures it (a step's
// tokens share its gap).
//
// Replay-on-decode (DecodeRates::replay_ms_per_gflop > 0): the router prices a request's replay
// at the decode node's measured rate, and the prefill node's slot is free from the prefill's
// end. With the decode node's replay piece costs (DecodeRates::replays_in_steps) the replay
// runs in the decode node's steps, pieces of rows planned as the node plans them beside its
// streams (within --replay-rows-per-step and --replay-step-budget), each adding its fitted
// cost to the step, so the streams' gaps stretch while a replay is in flight and the first
// token is the end of the step that finishes the replay; without them, the replay is a delay
// at the measured rate after the prefill, beside the steps.
//
// What it leaves out: contention between nodes sharing cores (the measured rates fold in what
// a real run had of it).
//
// Pure; safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "baton/common/hash.h"
#include "baton/decode_node/decode_step.h"
#include "baton/kvstore/hit_policy.h"
#include "baton/kvstore/prefill_placement.h"
#include "baton/kvstore/ttft_model.h"
#include "baton/v1/generation.pb.h"
#include "latency_histogram.h"
#include "trace.h"

namespace baton::tools {

// "unlimited" or 0 (none: nullopt), or a byte count with an optional unit: K, M, G, T and
// KiB..TiB are powers of 1024, KB..TB powers of 1000. The error names `flag`.
absl::StatusOr<std::optional<uint64_t>> ParseBudget(absl::string_view item, absl::string_view flag);
// A comma-separated list of ParseBudget's sizes.
absl::StatusOr<std::vector<std::optional<uint64_t>>> ParseBudgets(absl::string_view text,
                                                                  absl::string_view flag);
// Nearest-rank percentile q in [0, 100] (0 when empty), as `batonctl replay` reports them.
double NearestRank(std::vector<double> values, double q);

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
  int64_t output_len = 1;           // completion tokens (decode_nodes > 0)
  std::vector<Sha256Digest> chain;  // keys of the prompt's full blocks (unless `from` is set)
  // Or the trace line the chain is made from (TraceChainKeys with `tokens`) when the request
  // is placed, and dropped at its prefill's end: a long trace then holds only its requests in
  // flight's keys. It must outlive the simulation.
  const TraceRequest* from = nullptr;
  TokenOptions tokens;
};

// The keys of the full blocks of TraceTokens(request, tokens), made without the tokens: block
// b's key hashes the key before it with the (hash id, first offset, end offset) of each piece
// of a trace block that its tokens come from. A trace block's tokens are a pure function of its
// hash id and the offset (HashIdTokens), so two prompts' keys agree exactly where ChainKeys
// over their tokens would, up to collisions of 128-bit hashes; but the keys are not
// ChainKeys', so they name the same blocks only within a simulation.
std::vector<Sha256Digest> TraceChainKeys(const TraceRequest& request, const TokenOptions& tokens,
                                         int64_t block_size);

// A decode step's time by its rows, as a decode node fits it (baton_decode_step_cost_ms), and
// the tokens a request gains per step; with replay-on-decode, the decode node's replay rate.
struct DecodeRates {
  double step_fixed_ms = 20;
  double step_per_row_ms = 1;
  double tokens_per_step = 1;
  // > 0: the cluster replays on decode (DESIGN section 6), at this measured rate
  // (baton_decode_replay_ms_per_gflop): a request's replay is priced at it, as the router
  // prices it, and runs on its decode node after the prefill, not in the prefill node's slot.
  double replay_ms_per_gflop = 0;
  // With replay-on-decode, what a replay piece adds to a step at a prompt of 1,024 positions
  // (baton_decode_replay_piece_cost_ms: in proportion to the prompt's length). Either > 0: the
  // decode node replays in its steps, as the node plans them (decode_node::PlanStep) beside its
  // streams, and a request's first token is its replay's last step's end; both 0: the replay
  // is a delay at replay_ms_per_gflop, beside the steps.
  double replay_piece_fixed_ms = 0;
  double replay_piece_row_ms = 0;
  // The node's steps' time over what these fits price them at (baton_decode_step_stretch:
  // what shared cores and the steps' spread add); each simulated step takes this times its
  // priced time. 0: 1, the fits as they are.
  double step_stretch = 0;
  // The spread of those steps (baton_decode_step_stretch_quantile: quantiles 0.1, 0.5, 0.9
  // and 0.99 of each step's time over its price). Given (all > 0), each simulated step takes
  // a factor drawn from them (StretchAt, seeded: a simulation stays a pure function of its
  // input), scaled so that their mean is step_stretch when that is given (the node's time
  // over its price in all: the spread shapes the steps, the stretch keeps the node's
  // throughput).
  std::array<double, 4> step_stretch_quantiles{};
  double stretch() const { return step_stretch > 0 ? step_stretch : 1; }
  bool stretch_spread() const { return step_stretch_quantiles[0] > 0; }
  bool replays_in_steps() const {
    return replay_ms_per_gflop > 0 && (replay_piece_fixed_ms > 0 || replay_piece_row_ms > 0);
  }
};
// The step factor at probability u in [0, 1) of the quantiles (0.1, 0.5, 0.9, 0.99): linear
// between them, the 0.1 quantile below 0.1 and the 0.99 one above 0.99.
double StretchAt(const std::array<double, 4>& quantiles, double u);
// The mean of StretchAt over u in [0, 1).
double StretchMean(const std::array<double, 4>& quantiles);

// "name=value,..." over the DecodeRates fields; each finite, step times and the replay rates
// >= 0 and tokens_per_step >= 1; the step_stretch quantiles all or none, in order. Names
// --decode-rates in its errors.
absl::StatusOr<DecodeRates> ParseDecodeRates(absl::string_view text);

// The means of what a cluster's nodes measured, as the router's registry holds them
// (Generation/ListRates): each rate over the nodes of `model` ("" : every model) that have
// measured it, as `batonctl simulate --rates` and `--decode-rates` take them (a rate none has
// measured is left out, so the simulator's default stands). A prefill node's rates weigh the
// prefills it measured them over (PrefillRates.samples; one when it reports none).
struct MeasuredRates {
  std::string rates;         // for --rates
  std::string decode_rates;  // for --decode-rates
  int64_t prefill_nodes = 0;
  int64_t decode_nodes = 0;
  bool replay_on_decode = false;  // a prefill node holds the producers only
};
MeasuredRates MeanRates(const v1::ListRatesResponse& reply, absl::string_view model);
// `--rates FILE`: a --rates value without '=' names a file that holds what `batonctl rates
// --addr ROUTER` printed (a JSON object whose "rates" and "decode_rates" are the two flags'
// strings). `rates` becomes the file's "rates", and `decode_rates`, unless --decode-rates gave
// it, the file's "decode_rates". A value with '=' is left as it is. Errors name --rates and the
// file: unreadable, over 64 MiB, not JSON, or without a string "rates".
absl::Status ResolveRatesFile(std::string& rates, std::string& decode_rates);

// How a prefill node computes the prefills it holds at once: one at a time on all its cores in
// the order they came, as baton-prefill does (common/fifo_turns.h), or all of them at once, each
// at an equal share of the node (the node's cores split between them: processor sharing), the
// alternative a what-if can price against it.
enum class PrefillSharing { kArrivalOrder, kShared };
// "arrival-order" or "shared"; the error names --prefill-sharing and the allowed names.
absl::StatusOr<PrefillSharing> ParsePrefillSharing(absl::string_view name);

struct ClusterOptions {
  RoutePolicy policy = RoutePolicy::kPredictedTtft;
  int64_t prefill_nodes = 2;
  int64_t slots = 2;               // prefills in flight per node (the router's --prefill-slots)
  PrefillSharing sharing = PrefillSharing::kArrivalOrder;
  uint64_t block_cache_bytes = 0;  // per node; 0: no local tier
  std::optional<uint64_t> store_budget;  // nullopt: unlimited
  kvstore::HitPolicyInput hit;           // prompt_len is set per request
  kvstore::BlockBytes payload;           // per block and region
  ModelConfig config;                    // the model's shapes (the work of each prefill)
  kvstore::PrefillRates rates = kvstore::DefaultPrefillRates();
  bool record_steps = false;     // ClusterResult::steps
  bool record_requests = false;  // ClusterResult::placed
  // With stop_over_count > 0: the simulation stops once that many requests are known to miss
  // stop_over_ttft_ms (their prefill's end, and a replay delayed after it, less their arrival:
  // no less than their TTFT will be), as soon as a TTFT percentile is sure to exceed it. The
  // capacity search stops a point there that cannot meet its target.
  double stop_over_ttft_ms = 0;
  int64_t stop_over_count = 0;
  // Every open node's view goes to the placement, as the router gives it (tests); otherwise
  // only those that can be its choice or runner-up (cluster_sim.cc, OpenNodes), which choose
  // the same.
  bool exhaustive_placement = false;
  // The prefix store as a fleet (DESIGN section 5): its nodes, named as `baton up` names them
  // (kvstore, kvstore-1, ...), and each value's owners (kvstore/placement.h).
  int64_t store_nodes = 1;
  int64_t store_replication = 1;
  int64_t decode_nodes = 0;  // 0: decode is not modelled
  int64_t decode_slots = 64;
  DecodeRates decode;
  // What one decode step may do, as the decode node's flags set it (--max-batch,
  // --replay-rows-per-step, --replay-step-budget and their defaults).
  decode_node::StepPolicy decode_step{.max_batch = 64, .replay_rows = 8, .replay_step_budget = 1.0};
  // ClusterResult::itl_ms: every token gap one by one, in the order the steps end (tests). A
  // simulation of a million requests leaves it off: its percentiles come from
  // ClusterResult::itl, in constant memory.
  bool itl_samples = true;
  // A decode node plans the steps its plan holds for at once (decode_sim.h: a cruise), one event
  // for them all; false: every step alone (tests: both give the same steps).
  bool decode_cruises = true;
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
  int64_t runner_up = -1;      // kPlaced: the placement's runner-up node (-1: none)
  double time_ms = 0;          // when it was placed, or answered
};

// How one request was placed and priced (ClusterOptions::record_requests), as `batonctl replay`
// reports each request, to set the two side by side.
struct PlacedRequest {
  int64_t node = -1;  // -1: never placed (a stopped simulation)
  int64_t cached_tokens = 0;
  int64_t local_cached_tokens = 0;
  double admitted_ms = 0;  // placed less arrived: the wait for a free slot
  double queue_ms = 0;     // the work ahead of it on its node, as the placement priced it
  double service_ms = 0;   // its predicted service there (load, compute, replay, fixed)
};

struct ClusterResult {
  // Per request, in trace order; when `stopped`, only those placed before the stop, in the
  // order they were placed.
  std::vector<double> ttft_ms;
  bool stopped = false;  // ClusterOptions::stop_over_count was reached
  int64_t prompt_tokens = 0;
  int64_t local_hit_tokens = 0;  // hit tokens whose block KV came from a node's cache
  int64_t store_hit_tokens = 0;
  double makespan_ms = 0;  // first arrival to last prefill's end
  std::vector<int64_t> requests_per_node;
  std::vector<ClusterStep> steps;  // with ClusterOptions::record_steps
  std::vector<PlacedRequest> placed;  // per request in trace order, with record_requests
  std::vector<std::string> store_ids;
  std::vector<StoreNodeOps> store_ops;  // per store node, as store_ids
  // With decode: every token gap after the first token (ITL samples: all of them in `itl`, and
  // one by one in `itl_ms` with ClusterOptions::itl_samples); per request in trace order, its
  // mean gap (TPOT; -1 for a request of one token) and its last token's time less its
  // arrival; and each decode node's busy time.
  LatencyHistogram itl;
  std::vector<double> itl_ms;
  std::vector<double> tpot_ms;
  std::vector<double> e2e_ms;
  std::vector<double> decode_busy_ms;
  std::vector<int64_t> requests_per_decode_node;
};

ClusterResult SimulateCluster(const std::vector<ClusterRequest>& requests,
                              const ClusterOptions& options);

// A trace's requests as the simulation takes them: arrivals from the first one times
// `time_scale`, prompts of TraceTokens' length with their chains of `block_size` blocks
// (TraceChainKeys), and the trace's output lengths capped by `max_output_tokens` (0: no cap),
// at least one token. The chains are made here when all of them take at most
// kChainKeysUpFront keys (a search simulates the same requests many times); past that, each
// is made from its line as the simulation needs it (ClusterRequest::from: `trace` must then
// outlive the simulations).
inline constexpr int64_t kChainKeysUpFront = int64_t{1} << 22;  // 128 MiB of keys
std::vector<ClusterRequest> ClusterRequestsFromTrace(const std::vector<TraceRequest>& trace,
                                                     const TokenOptions& tokens, int64_t block_size,
                                                     double time_scale, int64_t max_output_tokens);

}  // namespace baton::tools
