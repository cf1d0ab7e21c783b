#include "cluster_sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <queue>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "baton/kvstore/fleet.h"
#include "baton/kvstore/placement.h"
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
  uint64_t read_turn = 0;  // which owner its next store read starts from
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
  // The store fleet's node names, as `baton up` gives them.
  for (int64_t n = 0; n < std::max<int64_t>(1, o.store_nodes); ++n) {
    result.store_ids.push_back(n == 0 ? std::string("kvstore") : absl::StrCat("kvstore-", n));
  }
  result.store_ops.assign(result.store_ids.size(), {});
  const int replication = static_cast<int>(
      std::clamp<int64_t>(o.store_replication, 1, static_cast<int64_t>(result.store_ids.size())));
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  for (size_t i = 0; i < requests.size(); ++i) events.push({requests[i].arrival_ms, 1, i});
  std::deque<size_t> waiting;  // admission's queue, first come first served
  double first_arrival = std::numeric_limits<double>::max(), last_end = 0;

  // `steps` of `chain` put in `index`: a value present is touched, a new one added.
  auto put = [&](kvstore::PrefixIndex& index, const std::vector<Sha256Digest>& chain,
                 const std::vector<kvstore::WriteBackStep>& steps, uint64_t budget) {
    for (const kvstore::WriteBackStep& step : steps) {
      const Sha256Digest& key = chain[step.block];
      if (index.Contains(key, step.region)) {
        index.Touch(key);
        continue;
      }
      const std::optional<Sha256Digest> parent =
          step.parent >= 0 ? std::optional<Sha256Digest>(chain[step.parent]) : std::nullopt;
      index.Add(key, parent, step.region, step.region == Region::kBlockKv ? kv_value : swa_value);
      index.EvictToBudget(budget, {});
    }
  };

  auto dispatch = [&](double now) {
    while (!waiting.empty()) {
      const size_t r = waiting.front();
      const ClusterRequest& request = requests[r];
      const kvstore::ChainLookup in_store = Peek(store, request.chain);
      // The nodes with a free slot, in index order, as the router's registry lists them.
      std::vector<size_t> open;
      std::vector<kvstore::PrefillNodeView> views;
      for (size_t n = 0; n < nodes.size(); ++n) {
        if (nodes[n].prefilling >= o.slots) continue;
        open.push_back(n);
        views.push_back(
            {.prefilling = nodes[n].prefilling,
             .reported_queued = std::max<int64_t>(0, nodes[n].prefilling - 1),
             .queue_ms = nodes[n].pending_ms,
             .rates = o.rates,
             .tiers = {.local = Peek(nodes[n].cache, request.chain), .store = in_store}});
      }
      if (open.empty()) return;
      kvstore::PlacementRequest place{
          .policy = o.policy, .hit = o.hit, .payload = o.payload, .config = &o.config};
      place.hit.prompt_len = request.prompt_len;
      const kvstore::Placement placement = kvstore::PlacePrefill(views, place);
      const size_t chosen = open[static_cast<size_t>(placement.chosen)];
      const kvstore::TieredHit& chosen_hit = placement.plan.hit;
      waiting.pop_front();
      Node& node = nodes[chosen];
      // The hit's reads: the store's blocks are used (touched) and kept in the node's cache.
      const int64_t h = chosen_hit.hit_blocks;
      const std::vector<Sha256Digest> hit_chain(request.chain.begin(), request.chain.begin() + h);
      node.cache.Lookup(hit_chain);
      store.Lookup(hit_chain);
      // The router's lookup: one probe per owner of some of the prompt's keys.
      const std::vector<std::vector<size_t>> owned =
          kvstore::KeysByOwner(request.chain, result.store_ids, replication);
      for (size_t s = 0; s < owned.size(); ++s) {
        if (owned[s].empty()) continue;
        ++result.store_ops[s].lookups;
        result.store_ops[s].probe_keys += static_cast<int64_t>(owned[s].size());
      }
      // The values the hit reads that the node's cache lacks come from one owner each.
      const std::vector<kvstore::WriteBackStep> kept = kvstore::CacheKeptReads(h, o.hit.window, B);
      const uint64_t turn = node.read_turn++;
      for (const kvstore::WriteBackStep& step : kept) {
        if (o.block_cache_bytes > 0 &&
            node.cache.Contains(request.chain[step.block], step.region)) {
          continue;
        }
        const size_t owner =
            kvstore::ReadOrder(request.chain[step.block], result.store_ids, replication, turn)[0];
        ++result.store_ops[owner].reads;
        result.store_ops[owner].read_bytes +=
            step.region == Region::kBlockKv ? o.payload.block_kv : o.payload.swa;
      }
      if (o.block_cache_bytes > 0) put(node.cache, request.chain, kept, o.block_cache_bytes);
      result.local_hit_tokens += chosen_hit.local_blocks * B;
      result.store_hit_tokens += (h - chosen_hit.local_blocks) * B;
      const double service = placement.plan.cost.service_ms();
      const double end = std::max(now, node.busy_until) + service;
      node.busy_until = end;
      node.pending_ms += service;
      ++node.prefilling;
      node_of[r] = chosen;
      service_of[r] = service;
      hit_of[r] = h;
      ++result.requests_per_node[chosen];
      result.ttft_ms[r] = end - request.arrival_ms;
      if (o.record_steps) {
        result.steps.push_back({.kind = ClusterStep::kPlaced,
                                .request = r,
                                .node = static_cast<int64_t>(chosen),
                                .hit_blocks = h,
                                .store = in_store});
      }
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
      const std::vector<kvstore::WriteBackStep> computed = kvstore::WriteBackSteps(
          hit_of[event.request], static_cast<int64_t>(request.chain.size()));
      if (o.block_cache_bytes > 0) put(node.cache, request.chain, computed, o.block_cache_bytes);
      put(store, request.chain, computed, o.store_budget.value_or(unlimited));
      for (const kvstore::WriteBackStep& step : computed) {
        for (size_t owner :
             kvstore::Owners(request.chain[step.block], result.store_ids, replication)) {
          ++result.store_ops[owner].writes;
          result.store_ops[owner].write_bytes +=
              step.region == Region::kBlockKv ? o.payload.block_kv : o.payload.swa;
        }
      }
      last_end = std::max(last_end, event.time);
      if (o.record_steps) {
        result.steps.push_back({.kind = ClusterStep::kEnded,
                                .request = event.request,
                                .node = static_cast<int64_t>(node_of[event.request]),
                                .hit_blocks = hit_of[event.request]});
      }
    }
    dispatch(event.time);
  }
  result.makespan_ms = last_end - first_arrival;
  return result;
}

}  // namespace baton::tools
