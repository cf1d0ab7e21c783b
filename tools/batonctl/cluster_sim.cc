#include "cluster_sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <queue>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "baton/kvstore/prefix_index.h"
#include "baton/kvstore/stored_value.h"

namespace baton::tools {
namespace {

using kvstore::Region;

// What a tier holds of `chain`, without touching it (ranking a node must not change its LRU).
kvstore::ChainLookup Peek(const kvstore::PrefixIndex& index,
                          const std::vector<Sha256Digest>& chain) {
  kvstore::ChainLookup lookup;
  for (const Sha256Digest& key : chain) {
    if (!index.Contains(key, Region::kBlockKv)) break;
    ++lookup.block_kv_blocks;
    lookup.swa_present.push_back(index.Contains(key, Region::kProducerSwa));
  }
  return lookup;
}

struct Node {
  kvstore::PrefixIndex cache;
  int64_t prefilling = 0;
  double pending_ms = 0;  // predicted service of the prefills in flight
  double busy_until = 0;  // one computes at a time
};

struct Event {
  double time = 0;
  int kind = 0;  // 0: a prefill ends, 1: a request arrives (ends first at equal times)
  size_t request = 0;
  bool operator>(const Event& other) const {
    return time != other.time ? time > other.time : kind > other.kind;
  }
};

}  // namespace

absl::StatusOr<std::vector<RoutePolicy>> ParseRoutePolicies(absl::string_view text) {
  std::vector<RoutePolicy> policies;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    absl::StatusOr<RoutePolicy> policy = kvstore::ParseRoutingPolicy(item, "--policy");
    if (!policy.ok()) return policy.status();
    policies.push_back(*policy);
  }
  return policies;
}

absl::StatusOr<kvstore::PrefillRates> ParseRates(absl::string_view text) {
  kvstore::PrefillRates rates = kvstore::DefaultPrefillRates();
  if (text.empty()) return rates;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
    double value = 0;
    if (!absl::SimpleAtod(kv.second, &value) || !std::isfinite(value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rates: '", item, "' needs a finite value >= 0 (name=milliseconds)"));
    }
    double* field = kv.first == "compute_ms_per_gflop" ? &rates.compute_ms_per_gflop
                    : kv.first == "local_ms_per_mib"   ? &rates.local_ms_per_mib
                    : kv.first == "store_ms_per_mib"   ? &rates.store_ms_per_mib
                    : kv.first == "fixed_ms"           ? &rates.fixed_ms
                                                       : nullptr;
    if (field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rates: '", kv.first,
          "' is unknown; allowed: compute_ms_per_gflop, local_ms_per_mib, store_ms_per_mib, "
          "fixed_ms"));
    }
    *field = value;
  }
  return rates;
}

ClusterResult SimulateCluster(const std::vector<ClusterRequest>& requests,
                              const ClusterOptions& o) {
  ClusterResult result;
  result.ttft_ms.assign(requests.size(), 0);
  result.requests_per_node.assign(static_cast<size_t>(o.prefill_nodes), 0);
  if (requests.empty() || o.prefill_nodes <= 0) return result;
  const int64_t B = o.hit.block_size;
  const uint64_t kv_value = kvstore::StoredValueBytes(o.payload.block_kv);
  const uint64_t swa_value = kvstore::StoredValueBytes(o.payload.swa);
  const uint64_t unlimited = std::numeric_limits<uint64_t>::max();
  kvstore::PrefixIndex store;
  std::vector<Node> nodes(static_cast<size_t>(o.prefill_nodes));
  std::vector<size_t> node_of(requests.size());
  std::vector<double> service_of(requests.size());
  std::vector<int64_t> hit_of(requests.size());
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  for (size_t i = 0; i < requests.size(); ++i) events.push({requests[i].arrival_ms, 1, i});
  std::deque<size_t> waiting;  // admission's queue, first come first served
  double first_arrival = std::numeric_limits<double>::max(), last_end = 0;

  // The blocks [from, to) of `chain` written to `index` (block KV then SWA per block).
  auto write = [&](kvstore::PrefixIndex& index, const std::vector<Sha256Digest>& chain,
                   int64_t from, int64_t to, uint64_t budget) {
    for (int64_t b = from; b < to; ++b) {
      const std::optional<Sha256Digest> parent =
          b > 0 ? std::optional<Sha256Digest>(chain[b - 1]) : std::nullopt;
      for (const auto& [region, bytes] :
           {std::pair{Region::kBlockKv, kv_value}, std::pair{Region::kProducerSwa, swa_value}}) {
        if (index.Contains(chain[b], region)) {
          index.Touch(chain[b]);
        } else {
          index.Add(chain[b], parent, region, bytes);
          index.EvictToBudget(budget, {});
        }
      }
    }
  };

  auto dispatch = [&](double now) {
    while (!waiting.empty()) {
      const size_t r = waiting.front();
      const ClusterRequest& request = requests[r];
      kvstore::HitPolicyInput hit = o.hit;
      hit.prompt_len = request.prompt_len;
      const kvstore::ChainLookup in_store = Peek(store, request.chain);
      // The nodes with a free slot, least loaded first (then by index), as ChoosePrefill ranks.
      std::vector<size_t> open;
      for (size_t n = 0; n < nodes.size(); ++n) {
        if (nodes[n].prefilling < o.slots) open.push_back(n);
      }
      if (open.empty()) return;
      std::stable_sort(open.begin(), open.end(), [&](size_t a, size_t b) {
        return nodes[a].prefilling < nodes[b].prefilling;
      });
      size_t chosen = open[0];
      double best = 0;
      kvstore::TieredHit chosen_hit;
      kvstore::PrefillCost chosen_cost;
      for (size_t k = 0; k < open.size(); ++k) {
        const size_t n = open[k];
        const kvstore::TieredHit tiered = kvstore::PlanTieredHit(
            hit, {.local = Peek(nodes[n].cache, request.chain), .store = in_store}, o.payload);
        const kvstore::PrefillCost cost =
            kvstore::PredictPrefill(o.rates, nodes[n].pending_ms, hit, tiered, o.config);
        const double rank = o.policy == RoutePolicy::kLongestPrefix
                                ? -static_cast<double>(tiered.local_blocks)
                            : o.policy == RoutePolicy::kPredictedTtft ? cost.total_ms()
                                                                      : 0;
        if (k == 0 || rank < best) {
          best = rank;
          chosen = n;
          chosen_hit = tiered;
          chosen_cost = cost;
        }
      }
      waiting.pop_front();
      Node& node = nodes[chosen];
      // The hit's reads: the store's blocks are used (touched) and kept in the node's cache.
      const int64_t h = chosen_hit.hit_blocks;
      const std::vector<Sha256Digest> hit_chain(request.chain.begin(), request.chain.begin() + h);
      node.cache.Lookup(hit_chain);
      store.Lookup(hit_chain);
      if (o.block_cache_bytes > 0) write(node.cache, request.chain, 0, h, o.block_cache_bytes);
      result.local_hit_tokens += chosen_hit.local_blocks * B;
      result.store_hit_tokens += (h - chosen_hit.local_blocks) * B;
      const double service = chosen_cost.service_ms();
      const double end = std::max(now, node.busy_until) + service;
      node.busy_until = end;
      node.pending_ms += service;
      ++node.prefilling;
      node_of[r] = chosen;
      service_of[r] = service;
      hit_of[r] = h;
      ++result.requests_per_node[chosen];
      result.ttft_ms[r] = end - request.arrival_ms;
      events.push({end, 0, r});
    }
  };

  while (!events.empty()) {
    const Event event = events.top();
    events.pop();
    const ClusterRequest& request = requests[event.request];
    if (event.kind == 1) {
      first_arrival = std::min(first_arrival, event.time);
      result.prompt_tokens += request.prompt_len;
      waiting.push_back(event.request);
    } else {
      Node& node = nodes[node_of[event.request]];
      --node.prefilling;
      node.pending_ms =
          node.prefilling == 0 ? 0 : std::max(0.0, node.pending_ms - service_of[event.request]);
      const int64_t full = static_cast<int64_t>(request.chain.size());
      if (o.block_cache_bytes > 0) {
        write(node.cache, request.chain, hit_of[event.request], full, o.block_cache_bytes);
      }
      write(store, request.chain, hit_of[event.request], full, o.store_budget.value_or(unlimited));
      last_end = std::max(last_end, event.time);
    }
    dispatch(event.time);
  }
  result.makespan_ms = last_end - first_arrival;
  return result;
}

}  // namespace baton::tools
