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
    const ClusterResult r = SimulateCluster(requests, options);
    CapacityPoint point{
        .prefill_nodes = prefill,
        .decode_nodes = decode,
        .ttft_p50_ms = NearestRank(r.ttft_ms, 50),
        .ttft_p99_ms = NearestRank(r.ttft_ms, 99),
        .itl_p50_ms = NearestRank(r.itl_ms, 50),
        .itl_p99_ms = NearestRank(r.itl_ms, 99),
        .requests_per_s =
            r.makespan_ms > 0 ? static_cast<double>(requests.size()) / (r.makespan_ms / 1000) : 0};
    point.meets = point.ttft_p99_ms <= goal.ttft_p99_ms &&
                  (goal.itl_p99_ms <= 0 || point.itl_p99_ms <= goal.itl_p99_ms);
    seen.emplace(key, point);
    plan.explored.push_back(point);
    return point;
  };
  // The fewest in [1, max] for which `meets(n)` holds, given that it holds at max.
  auto fewest = [&](auto meets) {
    int64_t low = 1, high = goal.max_nodes;
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
  const int64_t max = std::max<int64_t>(1, goal.max_nodes);
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
