#include "baton/kvstore/fleet.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "baton/common/wire_bounds.h"
#include "baton/kvstore/placement.h"

namespace baton::kvstore {

absl::Status CheckStoreFleet(const v1::StoreFleet& fleet, absl::string_view field) {
  const uint64_t nodes = static_cast<uint64_t>(fleet.nodes_size());
  if (nodes > kMaxStoreNodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".nodes: ", nodes, " store nodes; a fleet has at most ", kMaxStoreNodes));
  }
  const uint64_t r = fleet.replication();
  if (nodes == 0 ? r != 0 : (r < 1 || r > nodes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".replication: ", r, "; must be ", nodes == 0 ? "0 with no nodes" : "1 to the ",
        nodes == 0 ? "" : absl::StrCat(nodes, " nodes")));
  }
  std::set<std::string_view> seen;
  for (int i = 0; i < fleet.nodes_size(); ++i) {
    const v1::StoreNode& node = fleet.nodes(i);
    const std::string at = absl::StrCat(field, ".nodes[", i, "]");
    if (node.node_id().empty() || node.address().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": node_id and address are required"));
    }
    for (const absl::Status& s :
         {CheckBytes(absl::StrCat(at, ".node_id"), node.node_id(), kMaxNodeIdBytes),
          CheckBytes(absl::StrCat(at, ".address"), node.address(), kMaxAddressBytes)}) {
      if (!s.ok()) return s;
    }
    if (!seen.insert(node.node_id()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".node_id: '", node.node_id(), "' is named twice"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> FleetIds(const v1::StoreFleet& fleet) {
  std::vector<std::string> ids;
  ids.reserve(fleet.nodes_size());
  for (const v1::StoreNode& node : fleet.nodes()) ids.push_back(node.node_id());
  return ids;
}

std::vector<std::vector<size_t>> KeysByOwner(std::span<const Sha256Digest> keys,
                                             std::span<const std::string> node_ids,
                                             int replication) {
  std::vector<std::vector<size_t>> owned(node_ids.size());
  for (size_t k = 0; k < keys.size(); ++k) {
    for (size_t owner : Owners(keys[k], node_ids, replication)) owned[owner].push_back(k);
  }
  return owned;
}

ChainLookup MergeProbes(size_t chain_length, std::span<const OwnerProbe> probes) {
  std::vector<bool> block_kv(chain_length, false), swa(chain_length, false);
  for (const OwnerProbe& probe : probes) {
    const v1::ProbeResponse* r = probe.response;
    if (r == nullptr || static_cast<size_t>(r->block_kv_size()) != probe.keys.size() ||
        static_cast<size_t>(r->producer_swa_size()) != probe.keys.size()) {
      continue;
    }
    for (size_t i = 0; i < probe.keys.size(); ++i) {
      const size_t k = probe.keys[i];
      if (k >= chain_length) continue;
      if (r->block_kv(static_cast<int>(i))) block_kv[k] = true;
      if (r->producer_swa(static_cast<int>(i))) swa[k] = true;
    }
  }
  ChainLookup lookup;
  while (static_cast<size_t>(lookup.block_kv_blocks) < chain_length &&
         block_kv[lookup.block_kv_blocks]) {
    lookup.swa_present.push_back(swa[lookup.block_kv_blocks]);
    ++lookup.block_kv_blocks;
  }
  return lookup;
}

std::vector<size_t> ReadOrder(const Sha256Digest& key, std::span<const std::string> node_ids,
                              int replication, uint64_t turn) {
  std::vector<size_t> owners = Owners(key, node_ids, replication);
  if (!owners.empty()) {
    std::rotate(owners.begin(), owners.begin() + static_cast<std::ptrdiff_t>(turn % owners.size()),
                owners.end());
  }
  return owners;
}

bool StoreBreaker::Allow(const std::string& node_id, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || it->second.failures < options_.failures_to_open) return true;
  State& state = it->second;
  if (now < state.open_until || state.trial) return false;
  state.trial = true;  // half-open: this call decides
  return true;
}

void StoreBreaker::Record(const std::string& node_id, bool ok, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ok) {
    nodes_.erase(node_id);
    return;
  }
  if (nodes_.size() >= kMaxStoreNodes * 4 && !nodes_.contains(node_id)) {
    // Forget the nodes that are not open: a fleet's churn never grows this without bound.
    std::erase_if(nodes_, [&](const auto& entry) {
      return entry.second.failures < options_.failures_to_open;
    });
    if (nodes_.size() >= kMaxStoreNodes * 4) return;
  }
  State& state = nodes_[node_id];
  state.trial = false;
  if (++state.failures >= options_.failures_to_open) {
    if (now >= state.open_until) ++trips_;  // it opens (again)
    state.open_until = now + options_.open_for;
  }
}

void StoreBreaker::Cancel(const std::string& node_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = nodes_.find(node_id);
  if (it != nodes_.end()) it->second.trial = false;
}

bool StoreBreaker::IsOpen(const std::string& node_id, Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = nodes_.find(node_id);
  return it != nodes_.end() && it->second.failures >= options_.failures_to_open &&
         now < it->second.open_until;
}

size_t StoreBreaker::open(Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<size_t>(std::count_if(nodes_.begin(), nodes_.end(), [&](const auto& entry) {
    return entry.second.failures >= options_.failures_to_open && now < entry.second.open_until;
  }));
}

uint64_t StoreBreaker::trips() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return trips_;
}

}  // namespace baton::kvstore
