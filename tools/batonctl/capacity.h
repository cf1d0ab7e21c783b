// `batonctl capacity`: the cheapest cluster (fewest prefill plus decode nodes) whose simulated
// TTFT and ITL p99 on a trace meet the SLOs, found by running the cluster simulation
// (cluster_sim.h, the router's own placement) at the node counts it tries.
//
// The search assumes that more nodes of a role never make a request slower. It first finds the
// fewest decode nodes that meet both SLOs with the most prefill nodes allowed (so prefill is no
// constraint), then the fewest prefill nodes that meet both with those decode nodes, each by
// doubling from one node and then bisecting; then, while it finds fewer, the fewest decode nodes
// beside those prefill nodes (fewer prefill nodes pace the requests into decode) and the fewest
// prefill nodes beside those, each stepping down from the point that meets; and finally tries one
// decode node more with its own
// fewest prefill nodes, in case more decode slots let fewer prefill nodes meet the TTFT target (a
// request's decode slot is reserved before its prefill starts): that search knows the count
// just below the first answer meets, so it steps down from there (1, 2, 4, ... below) and then
// bisects. Every point it ran is kept, in order: the frontier it explored. A point stops as soon
// as its TTFT p99 is sure to miss the target, so the points below the answer cost a part of a
// simulation each.
//
// With T threads (CapacityGoal::threads) each round of a bisection runs T points at once,
// evenly inside the range, and each round stepping down T steps: a bisection takes about
// log_(T+1) rounds where one thread takes log_2. The doublings up from one node go one at a
// time (one run beside the first that meets would be a whole simulation above the answer).
// Under the assumption above the answer is the one a thread alone finds.
//
// Pure; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "cluster_sim.h"

namespace baton::tools {

struct CapacityGoal {
  double ttft_p99_ms = 0;
  double itl_p99_ms = 0;   // 0: no ITL target (decode nodes still needed for the slots)
  int64_t max_nodes = 64;  // per role
  // Points simulated at once in a bisection, each on its own thread (0: one per core the
  // machine has).
  int64_t threads = 1;
};

struct CapacityPoint {
  int64_t prefill_nodes = 0, decode_nodes = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0, itl_p50_ms = 0, itl_p99_ms = 0;
  double requests_per_s = 0;
  bool meets = false;
  // It stopped once its TTFT p99 was sure to miss (ClusterOptions::stop_over_count): its
  // percentiles are over the requests placed by then.
  bool stopped = false;
  double seconds = 0;  // the simulation's wall time
  // 1: run on the whole trace. K > 1: run on one prefix group in K at 1/K of the counts above
  // (PlanCapacitySampled), which are the whole cluster's it stands for.
  int64_t sample_one_in = 1;
};

struct CapacityPlan {
  std::optional<CapacityPoint> best;  // none: not even max_nodes of each meets the SLOs
  std::vector<CapacityPoint> explored;
};

// `base` gives everything but the node counts (its decode_nodes is taken as at least one).
CapacityPlan PlanCapacity(const std::vector<ClusterRequest>& requests, const ClusterOptions& base,
                          const CapacityGoal& goal);

// The same search on `sample`, one prefix group of `requests` in `one_in` (SamplePrefixGroups),
// at up to max_nodes / one_in nodes a role: the sample carries 1/one_in of the load with its
// prefixes whole, so n nodes serve it about as n x one_in serve the whole. Its answer, times
// one_in, is then run on the whole trace; while that misses, the role whose target it missed
// gains one_in nodes (prefill for TTFT, decode for ITL; decode once prefill is at max_nodes), up
// to max_nodes each. A sample that no count meets has the whole trace run at max_nodes of each,
// the answer if it meets. So the answer is always a point of the whole trace that meets both
// targets, found by small simulations and one or a few whole ones: a million requests' plan
// takes about the time of one or two whole simulations. It is not the fewest: its counts are
// multiples of one_in, and 1/one_in of the nodes is a smaller pool, whose queues absorb the same
// bursts worse, so the sample asks for more nodes than the whole needs. The sample's points are
// listed with their counts and rate times one_in (CapacityPoint::sample_one_in), then the whole
// trace's.
CapacityPlan PlanCapacitySampled(const std::vector<ClusterRequest>& requests,
                                 const std::vector<ClusterRequest>& sample, int64_t one_in,
                                 const ClusterOptions& base, const CapacityGoal& goal);

}  // namespace baton::tools
