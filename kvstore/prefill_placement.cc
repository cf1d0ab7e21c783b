#include "baton/kvstore/prefill_placement.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

namespace baton::kvstore {

Placement PlacePrefill(std::span<const PrefillNodeView> open, const PlacementRequest& request) {
  Placement placement;
  if (open.empty()) return placement;
  // Load order: fewest prefills in flight, then the least reported queue, then as given.
  // Scratch kept from call to call on this thread (a router places on its serving threads).
  thread_local std::vector<size_t> order;
  thread_local std::vector<NodePlan> plans;
  order.resize(open.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (open[a].prefilling != open[b].prefilling) return open[a].prefilling < open[b].prefilling;
    return open[a].reported_queued < open[b].reported_queued;
  });
  auto plan_on = [&](const PrefillNodeView& node) {
    NodePlan plan;
    plan.hit = PlanTieredHit(request.hit, node.tiers, request.payload);
    if (request.config != nullptr) {
      plan.cost = PredictPrefill(node.rates, node.queue_ms, request.hit, plan.hit, *request.config);
    }
    plan.rank = request.policy == RoutingPolicy::kLongestPrefix
                    ? -static_cast<double>(plan.hit.local_blocks)
                : request.policy == RoutingPolicy::kPredictedTtft ? plan.cost.total_ms()
                                                                  : 0;
    return plan;
  };
  plans.clear();
  for (size_t i : order) plans.push_back(plan_on(open[i]));
  // The first of least rank, then the first of least rank among the others.
  size_t first = 0;
  for (size_t k = 1; k < plans.size(); ++k) {
    if (plans[k].rank < plans[first].rank) first = k;
  }
  size_t second = plans.size();
  for (size_t k = 0; k < plans.size(); ++k) {
    if (k != first && (second == plans.size() || plans[k].rank < plans[second].rank)) second = k;
  }
  placement.chosen = static_cast<int64_t>(order[first]);
  placement.plan = plans[first];
  placement.least_loaded = first == 0;
  if (second < plans.size()) {
    placement.runner_up = static_cast<int64_t>(order[second]);
    placement.runner_up_plan = plans[second];
  }
  return placement;
}

int64_t RouterSlotShare(int64_t slots, int64_t routers) {
  return std::max<int64_t>(1, slots / std::max<int64_t>(1, routers));
}

double QueueAhead(double own_ms, double reported_ms, double own_at_report_ms) {
  return own_ms + std::max(0.0, reported_ms - own_at_report_ms);
}

double RateEvidence(uint32_t samples, double idle_ms) {
  const double whole = samples == 0 ? 1.0 : std::min(1.0, samples / kFullEvidenceSamples);
  // A node with work is not idle (no exp2 for it: this runs for every node on every choice);
  // neither is a time that is not a number (a clock read out of order is no age either).
  return !(idle_ms > 0) ? whole : whole * std::exp2(-idle_ms / kEvidenceHalfLifeMs);
}

namespace {

// The four rates a node measures, in RateLogs' order.
std::array<double*, 4> Measured(PrefillRates& r) {
  return {&r.compute_ms_per_gflop, &r.local_ms_per_mib, &r.store_ms_per_mib, &r.fixed_ms};
}
bool IsMeasured(double rate) {
  return rate > 0 && std::isfinite(rate);
}

}  // namespace

RateLogs LogsOf(const PrefillRates& rates) {
  PrefillRates r = rates;
  const std::array<double*, 4> values = Measured(r);
  RateLogs logs;
  for (size_t i = 0; i < values.size(); ++i) {
    logs[i] = IsMeasured(*values[i]) ? std::log(*values[i]) : std::nan("");
  }
  return logs;
}

void PooledRates::Add(const PrefillRates& rates, const RateLogs& logs, double evidence) {
  PrefillRates r = rates;
  const std::array<double*, 4> values = Measured(r);
  // A node whose evidence has all aged away still counts a little: the pool is then the plain
  // mean of what the nodes measured, not the prior.
  const double weight = std::max(evidence, 1e-6);
  for (size_t i = 0; i < values.size(); ++i) {
    if (!IsMeasured(*values[i])) continue;
    log_sum_[i] += weight * logs[i];
    weight_[i] += weight;
    low_[i] = std::min(low_[i], *values[i]);
    high_[i] = std::max(high_[i], *values[i]);
  }
}

PrefillRates PooledRates::Pooled(const PrefillRates& fallback) const {
  PrefillRates pooled = fallback;
  const std::array<double*, 4> values = Measured(pooled);
  for (size_t i = 0; i < values.size(); ++i) {
    // Nodes that all measured one value pool to exactly it (exp of its log may differ in the
    // last bit, and nodes priced a bit apart would break their ties by it).
    if (weight_[i] > 0)
      *values[i] = low_[i] == high_[i] ? low_[i] : std::exp(log_sum_[i] / weight_[i]);
  }
  return pooled;
}

PrefillRates CredibleRates(const PrefillRates& own, const RateLogs& own_logs, double evidence,
                           const PrefillRates& pooled, const RateLogs& pooled_logs) {
  PrefillRates credible = own;
  PrefillRates pool = pooled;
  const std::array<double*, 4> values = Measured(credible);
  const std::array<double*, 4> pool_values = Measured(pool);
  const double e = std::clamp(evidence, 0.0, 1.0);
  for (size_t i = 0; i < values.size(); ++i) {
    if (!IsMeasured(*values[i])) {
      *values[i] = *pool_values[i];
    } else if (e < 1 && IsMeasured(*pool_values[i]) && *values[i] != *pool_values[i]) {
      *values[i] = std::exp(e * own_logs[i] + (1 - e) * pooled_logs[i]);
    }
  }
  return credible;
}

void OwnPrefills::Took(double predicted_ms, double now_ms) {
  ++count;
  pending_ms += predicted_ms;
  busy_until_ms = std::max(busy_until_ms, now_ms) + predicted_ms;
}

void OwnPrefills::Ended(double predicted_ms, double now_ms) {
  --count;
  pending_ms = count <= 0 ? 0 : std::max(0.0, pending_ms - predicted_ms);
  count = std::max<int64_t>(0, count);
  busy_until_ms = now_ms + pending_ms;
}

double OwnPrefills::Ahead(double now_ms) const {
  return std::max(0.0, busy_until_ms - now_ms);
}

std::vector<WriteBackStep> CacheKeptReads(int64_t hit_blocks, int64_t window, int64_t block_size) {
  const HitReads reads = ReadsForHit(hit_blocks, window, block_size);
  std::vector<WriteBackStep> steps;
  for (int64_t b = 0; b < reads.block_kv_end; ++b) {
    steps.push_back({.block = b, .parent = b - 1, .region = Region::kBlockKv});
  }
  for (int64_t b = reads.producer_swa_begin; b < reads.producer_swa_end; ++b) {
    steps.push_back({.block = b, .parent = b - 1, .region = Region::kProducerSwa});
  }
  return steps;
}

}  // namespace baton::kvstore
