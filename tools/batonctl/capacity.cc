#include "capacity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <thread>
#include <utility>

namespace baton::tools {
namespace {

using Shape = std::pair<int64_t, int64_t>;  // prefill nodes, decode nodes

// One point's simulation, stopped once its TTFT p99 is sure to miss the target: when more
// requests miss it than the p99's nearest rank leaves above it (NearestRank's rank, counted
// alike).
CapacityPoint RunPoint(const std::vector<ClusterRequest>& requests, const ClusterOptions& base,
                       const CapacityGoal& goal, Shape shape) {
  const auto start = std::chrono::steady_clock::now();
  ClusterOptions options = base;
  options.prefill_nodes = shape.first;
  options.decode_nodes = shape.second;
  options.record_steps = false;
  options.itl_samples = false;
  const double n = static_cast<double>(requests.size());
  options.stop_over_ttft_ms = goal.ttft_p99_ms;
  options.stop_over_count = static_cast<int64_t>(n - std::max(1.0, std::ceil(99.0 / 100 * n)) + 1);
  const ClusterResult r = SimulateCluster(requests, options);
  CapacityPoint point{
      .prefill_nodes = shape.first,
      .decode_nodes = shape.second,
      .ttft_p50_ms = NearestRank(r.ttft_ms, 50),
      .ttft_p99_ms = NearestRank(r.ttft_ms, 99),
      .itl_p50_ms = r.itl.Percentile(50),
      .itl_p99_ms = r.itl.Percentile(99),
      .requests_per_s =
          r.makespan_ms > 0 ? static_cast<double>(requests.size()) / (r.makespan_ms / 1000) : 0};
  point.stopped = r.stopped;
  point.meets = !r.stopped && point.ttft_p99_ms <= goal.ttft_p99_ms &&
                (goal.itl_p99_ms <= 0 || point.itl_p99_ms <= goal.itl_p99_ms);
  point.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return point;
}

// The fewest n in (low, high] for which meets(n) holds, given that it holds at high and fails
// at low (0: nothing below 1 is asked): `batch` asks meets of several counts at once and
// returns each answer. Each round asks `width` counts evenly inside the range, so the range
// shrinks by width + 1 a round.
template <typename Batch>
int64_t Bisect(int64_t low, int64_t high, int64_t width, const Batch& batch) {
  while (high - low > 1) {
    std::vector<int64_t> asked;
    const int64_t k = std::min(width, high - low - 1);
    for (int64_t i = 1; i <= k; ++i) {
      const int64_t n = low + (high - low) * i / (k + 1);
      if (n > low && n < high && (asked.empty() || n > asked.back())) asked.push_back(n);
    }
    const std::vector<bool> met = batch(asked);
    // The least count that met bounds the range from above; the greatest below it that
    // failed, from below.
    for (size_t i = 0; i < asked.size(); ++i) {
      if (met[i]) {
        high = asked[i];
        break;
      }
      low = asked[i];
    }
  }
  return high;
}

}  // namespace

CapacityPlan PlanCapacity(const std::vector<ClusterRequest>& requests, const ClusterOptions& base,
                          const CapacityGoal& goal) {
  CapacityPlan plan;
  std::map<Shape, CapacityPoint> seen;
  const int64_t threads =
      goal.threads > 0
          ? goal.threads
          : std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  // Runs the shapes not run yet, `threads` at once, and keeps them in the order asked.
  auto run_all = [&](const std::vector<Shape>& shapes) {
    std::vector<Shape> fresh;
    for (const Shape& s : shapes) {
      if (!seen.contains(s) && std::find(fresh.begin(), fresh.end(), s) == fresh.end()) {
        fresh.push_back(s);
      }
    }
    for (size_t first = 0; first < fresh.size(); first += static_cast<size_t>(threads)) {
      const size_t end = std::min(fresh.size(), first + static_cast<size_t>(threads));
      std::vector<CapacityPoint> points(end - first);
      std::vector<std::thread> running;
      for (size_t i = first + 1; i < end; ++i) {
        running.emplace_back(
            [&, i] { points[i - first] = RunPoint(requests, base, goal, fresh[i]); });
      }
      points[0] = RunPoint(requests, base, goal, fresh[first]);
      for (std::thread& t : running) t.join();
      for (size_t i = first; i < end; ++i) {
        seen.emplace(fresh[i], points[i - first]);
        plan.explored.push_back(points[i - first]);
      }
    }
    std::vector<CapacityPoint> out;
    for (const Shape& s : shapes) out.push_back(seen.at(s));
    return out;
  };
  auto run = [&](Shape s) { return run_all({s}).front(); };
  const int64_t max = std::max<int64_t>(1, goal.max_nodes);
  // meets(n) of several counts at once, for a search over one role's count.
  auto batch_of = [&](auto shape_of) {
    return [&, shape_of](const std::vector<int64_t>& counts) {
      std::vector<Shape> shapes;
      for (int64_t n : counts) shapes.push_back(shape_of(n));
      std::vector<bool> met;
      for (const CapacityPoint& p : run_all(shapes)) met.push_back(p.meets);
      return met;
    };
  };
  // The fewest in [1, max] that meets, given that max does: doubling from 1 until one meets,
  // then bisecting the last step (`threads` points a round). The points below the answer miss,
  // and a miss stops early, so a small answer costs few full simulations. The doublings go one
  // at a time: a doubling run beside the one that first meets would be a whole simulation
  // spent above the answer.
  auto fewest = [&](const auto& batch) {
    int64_t low = 0;  // meets fails at low (0: none tried)
    for (int64_t n = 1;; n = std::min(max, 2 * n)) {
      if (batch({n}).front()) return Bisect(low, n, threads, batch);
      low = n;
      if (n >= max) return max;  // not even max met: the caller checked it does
    }
  };

  // The fewest in [1, top] that meets, given that top does and the answer is near it:
  // stepping down 1, 2, 4, ... below top (`threads` steps a round) until one fails, then
  // bisecting the last step.
  auto fewest_below = [&](int64_t top, const auto& batch) {
    int64_t high = top, step = 1;  // meets at high
    while (high > 1) {
      std::vector<int64_t> asked;  // descending
      for (; static_cast<int64_t>(asked.size()) < threads; step *= 2) {
        const int64_t n = std::max<int64_t>(1, top - step);
        if (n < (asked.empty() ? high : asked.back())) asked.push_back(n);
        if (n == 1) break;
      }
      if (asked.empty()) break;
      const std::vector<bool> met = batch(asked);
      for (size_t i = 0; i < asked.size(); ++i) {
        if (!met[i]) return Bisect(asked[i], i == 0 ? high : asked[i - 1], threads, batch);
      }
      high = asked.back();
    }
    return high;
  };
  if (!run({max, max}).meets) return plan;
  int64_t decode = fewest(batch_of([&](int64_t d) { return Shape{max, d}; }));
  int64_t prefill = fewest(batch_of([&](int64_t p) { return Shape{p, decode}; }));
  // Those decode nodes were found beside every prefill node. Fewer prefill nodes pace the
  // requests into decode (smaller batches, shorter steps), so fewer decode nodes may meet the
  // ITL target beside them, and then the fewest prefill nodes beside those are searched again:
  // each search steps down from a point that meets, until the decode count holds. Every round
  // takes nodes away, so it ends.
  while (decode > 1) {
    const int64_t fewer_decode = fewest_below(decode, batch_of([&](int64_t d) {
                                                return Shape{prefill, d};
                                              }));
    if (fewer_decode >= decode) break;
    decode = fewer_decode;
    prefill = fewest_below(prefill, batch_of([&](int64_t p) { return Shape{p, decode}; }));
  }
  CapacityPoint best = run({prefill, decode});
  // One decode node more may let fewer prefill nodes meet the TTFT target.
  if (decode < max && prefill > 1 && run({prefill - 1, decode + 1}).meets) {
    const int64_t fewer = fewest_below(prefill - 1, batch_of([&](int64_t p) {
                                         return Shape{p, decode + 1};
                                       }));
    if (fewer + decode + 1 < best.prefill_nodes + best.decode_nodes)
      best = run({fewer, decode + 1});
  }
  plan.best = best;
  return plan;
}

CapacityPlan PlanCapacitySampled(const std::vector<ClusterRequest>& requests,
                                 const std::vector<ClusterRequest>& sample, int64_t one_in,
                                 const ClusterOptions& base, const CapacityGoal& goal) {
  if (one_in <= 1) return PlanCapacity(requests, base, goal);
  const int64_t max = std::max<int64_t>(1, goal.max_nodes);
  CapacityGoal scaled = goal;
  scaled.max_nodes = std::max<int64_t>(1, max / one_in);
  CapacityPlan plan = PlanCapacity(sample, base, scaled);
  for (CapacityPoint& p : plan.explored) {
    p.prefill_nodes *= one_in;
    p.decode_nodes *= one_in;
    p.requests_per_s *= static_cast<double>(one_in);
    p.sample_one_in = one_in;
  }
  // A sample that no count meets may still be met by the whole trace at max_nodes (its larger
  // pool absorbs bursts better): that point is then the answer, else there is none.
  Shape shape{max, max};
  if (plan.best) {
    shape = {std::min(max, plan.best->prefill_nodes * one_in),
             std::min(max, plan.best->decode_nodes * one_in)};
  }
  plan.best.reset();
  while (true) {
    const CapacityPoint point = RunPoint(requests, base, goal, shape);
    plan.explored.push_back(point);
    if (point.meets) {
      plan.best = point;
      break;
    }
    const bool ttft_missed = point.stopped || point.ttft_p99_ms > goal.ttft_p99_ms;
    const bool itl_missed =
        !point.stopped && goal.itl_p99_ms > 0 && point.itl_p99_ms > goal.itl_p99_ms;
    Shape next = shape;
    if (ttft_missed) {
      if (next.first < max) {
        next.first = std::min(max, next.first + one_in);
      } else {
        next.second = std::min(max, next.second + one_in);
      }
    }
    if (itl_missed) next.second = std::min(max, next.second + one_in);
    if (next == shape) break;  // at max_nodes of what missed: no answer
    shape = next;
  }
  return plan;
}

}  // namespace baton::tools
