#include "capacity.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

namespace baton::tools {

CapacityPlan PlanCapacity(const std::vector<ClusterRequest>& requests, const ClusterOptions& base,
                          const CapacityGoal& goal) {
  CapacityPlan plan;
  std::map<std::pair<int64_t, int64_t>, CapacityPoint> seen;
  auto run = [&](int64_t prefill, int64_t decode) {
    const auto key = std::make_pair(prefill, decode);
    if (auto it = seen.find(key); it != seen.end()) return it->second;
    ClusterOptions options = base;
    options.prefill_nodes = prefill;
    options.decode_nodes = decode;
    options.record_steps = false;
    options.itl_samples = false;
    // A point stops once its TTFT p99 is sure to miss the target: when more requests miss it
    // than the p99's nearest rank leaves above it (NearestRank's rank, counted alike).
    const double n = static_cast<double>(requests.size());
    options.stop_over_ttft_ms = goal.ttft_p99_ms;
    options.stop_over_count =
        static_cast<int64_t>(n - std::max(1.0, std::ceil(99.0 / 100 * n)) + 1);
    const ClusterResult r = SimulateCluster(requests, options);
    CapacityPoint point{
        .prefill_nodes = prefill,
        .decode_nodes = decode,
        .ttft_p50_ms = NearestRank(r.ttft_ms, 50),
        .ttft_p99_ms = NearestRank(r.ttft_ms, 99),
        .itl_p50_ms = r.itl.Percentile(50),
        .itl_p99_ms = r.itl.Percentile(99),
        .requests_per_s =
            r.makespan_ms > 0 ? static_cast<double>(requests.size()) / (r.makespan_ms / 1000) : 0};
    point.stopped = r.stopped;
    point.meets = !r.stopped && point.ttft_p99_ms <= goal.ttft_p99_ms &&
                  (goal.itl_p99_ms <= 0 || point.itl_p99_ms <= goal.itl_p99_ms);
    seen.emplace(key, point);
    plan.explored.push_back(point);
    return point;
  };
  const int64_t max = std::max<int64_t>(1, goal.max_nodes);
  // The fewest in [1, max] for which `meets(n)` holds, given that it holds at max: doubling
  // from 1 until it holds, then bisecting the last step. The points below the answer miss, and
  // a miss stops early, so a small answer costs few full simulations.
  auto fewest = [&](auto meets) {
    int64_t low = 0, high = 1;  // meets(low) fails (0: none tried), meets(high) is asked
    while (high < max && !meets(high)) {
      low = high;
      high = std::min(max, 2 * high);
    }
    ++low;
    while (low < high) {
      const int64_t mid = low + (high - low) / 2;
      if (meets(mid)) {
        high = mid;
      } else {
        low = mid + 1;
      }
    }
    return high;
  };
  if (!run(max, max).meets) return plan;
  const int64_t decode = fewest([&](int64_t d) { return run(max, d).meets; });
  const int64_t prefill = fewest([&](int64_t p) { return run(p, decode).meets; });
  CapacityPoint best = run(prefill, decode);
  // One decode node more may let fewer prefill nodes meet the TTFT target.
  if (decode < max && prefill > 1 && run(prefill - 1, decode + 1).meets) {
    const int64_t fewer = fewest([&](int64_t p) { return run(p, decode + 1).meets; });
    if (fewer + decode + 1 < best.prefill_nodes + best.decode_nodes) best = run(fewer, decode + 1);
  }
  plan.best = best;
  return plan;
}

}  // namespace baton::tools
