#include "baton/router/cache_index.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "baton/common/wire_bounds.h"
#include "baton/kvstore/block_cache.h"

namespace baton::router {
namespace {

int RegionIndex(v1::StoreRegion region) {
  return region == v1::STORE_REGION_PRODUCER_SWA ? 1 : 0;
}

Sha256Digest Digest(const std::string& bytes) {
  Sha256Digest key;
  std::memcpy(key.data(), bytes.data(), key.size());
  return key;
}

absl::Status CheckHashes(const google::protobuf::RepeatedPtrField<std::string>& hashes,
                         const std::string& field) {
  for (int i = 0; i < hashes.size(); ++i) {
    if (hashes[i].size() != Sha256Digest{}.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: ", hashes[i].size(), " bytes; a chain key is 32"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckGroup(v1::StoreRegion group, const std::string& field) {
  if (group == v1::STORE_REGION_BLOCK_KV || group == v1::STORE_REGION_PRODUCER_SWA) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": must be STORE_REGION_BLOCK_KV or STORE_REGION_PRODUCER_SWA"));
}

}  // namespace

absl::Status CheckCacheEvents(const v1::CacheEventBatch& batch) {
  // A node sends at most kMaxCacheEventHashes block hashes a batch, and one AllBlocksCleared.
  if (static_cast<size_t>(batch.events_size()) > kvstore::kMaxCacheEventHashes + 1) {
    return absl::InvalidArgumentError(absl::StrCat("cache_events.events: ", batch.events_size(),
                                                   " events; at most ",
                                                   kvstore::kMaxCacheEventHashes + 1));
  }
  size_t hashes = 0;
  for (int i = 0; i < batch.events_size(); ++i) {
    const v1::CacheEvent& event = batch.events(i);
    const std::string field = absl::StrCat("cache_events.events[", i, "]");
    absl::Status s;
    if (event.has_block_stored()) {
      const v1::BlockStored& stored = event.block_stored();
      hashes += static_cast<size_t>(stored.block_hashes_size());
      for (absl::Status check :
           {CheckHashes(stored.block_hashes(), field + ".block_stored.block_hashes"),
            CheckGroup(stored.cache_group(), field + ".block_stored.cache_group"),
            CheckBytes(field + ".block_stored.tenant", stored.tenant(), kMaxTenantBytes),
            CheckBytes(field + ".block_stored.cache_salt", stored.cache_salt(), kMaxCacheSaltBytes),
            CheckBytes(field + ".block_stored.medium", stored.medium(), 16)}) {
        if (!check.ok()) return check;
      }
      if (!stored.parent_block_hash().empty() &&
          stored.parent_block_hash().size() != Sha256Digest{}.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".block_stored.parent_block_hash: 32 bytes, or empty"));
      }
    } else if (event.has_block_removed()) {
      const v1::BlockRemoved& removed = event.block_removed();
      hashes += static_cast<size_t>(removed.block_hashes_size());
      for (absl::Status check :
           {CheckHashes(removed.block_hashes(), field + ".block_removed.block_hashes"),
            CheckGroup(removed.cache_group(), field + ".block_removed.cache_group")}) {
        if (!check.ok()) return check;
      }
    } else if (!event.has_all_blocks_cleared()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": one of block_stored, block_removed, all_blocks_cleared"));
    }
  }
  if (hashes > kvstore::kMaxCacheEventHashes) {
    return absl::InvalidArgumentError(absl::StrCat("cache_events: ", hashes,
                                                   " block hashes; at most ",
                                                   kvstore::kMaxCacheEventHashes, " a batch"));
  }
  return absl::OkStatus();
}

uint32_t CacheIndex::NewSlot(const std::string* node_id) {
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    slot = static_cast<uint32_t>(slot_node_.size());
    slot_node_.push_back(nullptr);
  }
  slot_node_[slot] = node_id;
  return slot;
}

CacheIndex::NodeBlocks& CacheIndex::Node(const std::string& node_id) {
  auto [it, added] = nodes_.try_emplace(node_id);
  if (added) it->second.slot = NewSlot(&it->first);
  return it->second;
}

void CacheIndex::Clear(NodeBlocks& node) {
  for (const auto& [key, expected] : node.unconfirmed) expected_ -= std::popcount(expected.regions);
  node.unconfirmed.clear();
  node.due.clear();
  const size_t held = node.held[0] + node.held[1];
  if (held == 0) return;  // nothing of the slot is anywhere: it stays
  const std::string* node_id = slot_node_[node.slot];
  slot_node_[node.slot] = nullptr;
  retired_.push_back(node.slot);
  live_entries_ -= held;
  retired_entries_ += held;
  node.held[0] = node.held[1] = 0;
  node.slot = NewSlot(node_id);
  MaybeSweep();
}

void CacheIndex::Prune(Slots& slots) {
  size_t pruned = 0;
  slots.erase(std::remove_if(slots.begin(), slots.end(),
                             [&](uint32_t entry) {
                               if (slot_node_[entry >> 2] != nullptr) return false;
                               pruned += std::popcount(entry & 3u);
                               return true;
                             }),
              slots.end());
  retired_entries_ -= std::min(retired_entries_, pruned);
}

void CacheIndex::MaybeSweep() {
  // Amortized: a sweep visits every key once, after at least as many entries were retired
  // (and a few: a small table is not swept at every retirement).
  if (retired_entries_ < std::max<size_t>(live_entries_, 1024)) return;
  for (auto it = holders_.begin(); it != holders_.end();) {
    Prune(it->second);
    if (it->second.empty()) {
      holders_.erase(it++);
    } else {
      ++it;
    }
  }
  retired_entries_ = 0;
  free_.insert(free_.end(), retired_.begin(), retired_.end());
  retired_.clear();
  // The table keeps its capacity as it empties: give back what its keys no longer need (the
  // nodes that held them are gone, as after a flood of invented node_ids is forgotten).
  if (holders_.size() < holders_.capacity() / 4) holders_.rehash(0);
}

void CacheIndex::Insert(int region, const Sha256Digest& key, NodeBlocks& node) {
  if (node.held[region] >= kMaxIndexedBlocks) return;
  const uint32_t bit = 1u << region;
  Slots& slots = holders_[key];
  Prune(slots);
  auto entry =
      std::find_if(slots.begin(), slots.end(), [&](uint32_t e) { return (e >> 2) == node.slot; });
  if (entry == slots.end()) {
    slots.push_back(node.slot << 2 | bit);
  } else if ((*entry & bit) == 0) {
    *entry |= bit;
  } else {
    return;
  }
  ++node.held[region];
  ++live_entries_;
}

void CacheIndex::Erase(int region, const Sha256Digest& key, NodeBlocks& node) {
  auto it = holders_.find(key);
  if (it == holders_.end()) return;
  const uint32_t bit = 1u << region;
  Slots& slots = it->second;
  Prune(slots);
  auto entry =
      std::find_if(slots.begin(), slots.end(), [&](uint32_t e) { return (e >> 2) == node.slot; });
  if (entry != slots.end() && (*entry & bit) != 0) {
    *entry &= ~bit;
    if ((*entry & 3u) == 0) slots.erase(entry);
    --node.held[region];
    --live_entries_;
  }
  if (slots.empty()) holders_.erase(it);
}

void CacheIndex::Settle(NodeBlocks& node, int region, const Sha256Digest& key) {
  auto it = node.unconfirmed.find(key);
  if (it == node.unconfirmed.end() || (it->second.regions & (1u << region)) == 0) return;
  --expected_;
  it->second.regions &= static_cast<uint8_t>(~(1u << region));
  if (it->second.regions == 0) node.unconfirmed.erase(it);
}

void CacheIndex::ExpireExpected(NodeBlocks& node, double now_ms) {
  bool dropped = false;
  // Expected again since queued: requeued once at its later deadline (below), so the queue
  // holds at most one entry per expected key and the deadlines already passed.
  std::vector<std::pair<double, Sha256Digest>> later;
  while (!node.due.empty() && node.due.front().first < now_ms) {
    const Sha256Digest key = node.due.front().second;
    node.due.pop_front();
    auto it = node.unconfirmed.find(key);
    if (it == node.unconfirmed.end()) continue;
    double next = 0;
    for (int region = 0; region < 2; ++region) {
      const uint8_t bit = static_cast<uint8_t>(1u << region);
      if ((it->second.regions & bit) == 0) continue;
      if (it->second.deadline_ms[region] >= now_ms) {
        next = std::max(next, it->second.deadline_ms[region]);
        continue;
      }
      it->second.regions &= static_cast<uint8_t>(~bit);
      --expected_;
      ++expected_dropped_;
      Erase(region, key, node);
      dropped = true;
    }
    if (it->second.regions == 0) {
      node.unconfirmed.erase(it);
    } else if (next > 0) {
      later.emplace_back(next, key);
    }
  }
  for (auto& entry : later) node.due.push_back(std::move(entry));
  if (dropped) version_.fetch_add(1, std::memory_order_release);
}

void CacheIndex::Expect(const std::string& node_id, std::span<const Sha256Digest> chain,
                        std::span<const kvstore::WriteBackStep> steps, double deadline_ms) {
  if (steps.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  NodeBlocks& node = Node(node_id);
  bool added = false;
  for (const kvstore::WriteBackStep& step : steps) {
    if (step.block < 0 || step.block >= static_cast<int64_t>(chain.size())) continue;
    const Sha256Digest& key = chain[static_cast<size_t>(step.block)];
    const int region = static_cast<int>(step.region);
    const uint8_t bit = static_cast<uint8_t>(1u << region);
    auto pending = node.unconfirmed.find(key);
    if (pending != node.unconfirmed.end() && (pending->second.regions & bit) != 0) {
      // Expected again: its time restarts (ExpireExpected requeues it when the first passes).
      pending->second.deadline_ms[region] = deadline_ms;
      continue;
    }
    const size_t before = node.held[region];
    Insert(region, key, node);
    // Known already (the node's events said so) or past the node's bound: nothing to confirm.
    if (node.held[region] == before) continue;
    Unconfirmed& expected = node.unconfirmed[key];
    // A key's first expectation queues it; its other region's rides on that entry.
    if (expected.regions == 0) node.due.emplace_back(deadline_ms, key);
    expected.regions |= bit;
    expected.deadline_ms[region] = deadline_ms;
    ++expected_;
    added = true;
  }
  if (added) version_.fetch_add(1, std::memory_order_release);
}

size_t CacheIndex::expected(const std::string& node_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return 0;
  size_t n = 0;
  for (const auto& [key, expected] : it->second.unconfirmed) n += std::popcount(expected.regions);
  return n;
}

size_t CacheIndex::expected() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return expected_;
}

uint64_t CacheIndex::expected_dropped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return expected_dropped_;
}

bool CacheIndex::Apply(const std::string& node_id, const v1::CacheEventBatch& batch,
                       double now_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  NodeBlocks& node = Node(node_id);
  if (batch.events_size() > 0 || batch.snapshot() || batch.sequence() != node.sequence + 1) {
    version_.fetch_add(1, std::memory_order_release);
  }
  if (!batch.snapshot() && (node.sequence == 0 || batch.sequence() != node.sequence + 1)) {
    // A gap: what the node holds is unknown until its snapshot.
    Clear(node);
    node.sequence = 0;
    ++resyncs_;
    return false;
  }
  node.sequence = batch.sequence();
  for (const v1::CacheEvent& event : batch.events()) {
    if (event.has_all_blocks_cleared()) {
      Clear(node);
    } else if (event.has_block_stored()) {
      const int region = RegionIndex(event.block_stored().cache_group());
      for (const std::string& hash : event.block_stored().block_hashes()) {
        const Sha256Digest key = Digest(hash);
        Insert(region, key, node);
        Settle(node, region, key);
      }
    } else if (event.has_block_removed()) {
      const int region = RegionIndex(event.block_removed().cache_group());
      for (const std::string& hash : event.block_removed().block_hashes()) {
        const Sha256Digest key = Digest(hash);
        Erase(region, key, node);
        Settle(node, region, key);
      }
    }
  }
  // After the batch: what it confirmed stays.
  ExpireExpected(node, now_ms);
  return true;
}

kvstore::ChainLookup CacheIndex::Lookup(const std::string& node_id,
                                        std::span<const Sha256Digest> chain) const {
  kvstore::ChainLookup lookup;
  std::lock_guard<std::mutex> lock(mutex_);
  auto node = nodes_.find(node_id);
  if (node == nodes_.end()) return lookup;
  const uint32_t slot = node->second.slot;
  // The regions `slot` holds of `key`, as its entry's bits.
  auto holds = [&](const Sha256Digest& key) {
    auto it = holders_.find(key);
    if (it == holders_.end()) return 0u;
    for (uint32_t entry : it->second) {
      if ((entry >> 2) == slot) return entry & 3u;
    }
    return 0u;
  };
  for (const Sha256Digest& key : chain) {
    const uint32_t held = holds(key);
    if ((held & 1u) == 0) break;
    ++lookup.block_kv_blocks;
    lookup.swa_present.push_back((held & 2u) != 0);
  }
  return lookup;
}

CacheIndex::Holders CacheIndex::LookupHolders(std::span<const Sha256Digest> chain) const {
  Holders holders;
  if (chain.empty()) return holders;
  std::lock_guard<std::mutex> lock(mutex_);
  // The slots still matching, each with its lookup so far; a slot drops out at its first key
  // without block KV. Marks are per key, so each key costs its holders plus the slots left.
  struct Walk {
    uint32_t slot;
    kvstore::ChainLookup lookup;
  };
  std::vector<Walk> walks;
  auto first = holders_.find(chain[0]);
  if (first == holders_.end()) return holders;
  for (uint32_t entry : first->second) {
    if ((entry & 1u) != 0 && slot_node_[entry >> 2] != nullptr) walks.push_back({entry >> 2, {}});
  }
  std::vector<uint32_t> mark(slot_node_.size(), 0);  // a slot's region bits for the key
  auto finish = [&](Walk& walk) {
    holders.emplace(*slot_node_[walk.slot], std::move(walk.lookup));
  };
  for (const Sha256Digest& key : chain) {
    if (walks.empty()) break;
    auto it = holders_.find(key);
    if (it != holders_.end()) {
      for (uint32_t entry : it->second) mark[entry >> 2] = entry & 3u;
    }
    size_t kept = 0;
    for (Walk& walk : walks) {
      if ((mark[walk.slot] & 1u) == 0) {
        finish(walk);
        continue;
      }
      ++walk.lookup.block_kv_blocks;
      walk.lookup.swa_present.push_back((mark[walk.slot] & 2u) != 0);
      if (&walks[kept] != &walk) walks[kept] = std::move(walk);
      ++kept;
    }
    walks.resize(kept);
    if (it != holders_.end()) {
      for (uint32_t entry : it->second) mark[entry >> 2] = 0;
    }
  }
  for (Walk& walk : walks) finish(walk);
  return holders;
}

size_t CacheIndex::blocks(const std::string& node_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = nodes_.find(node_id);
  return it == nodes_.end() ? 0 : it->second.held[0] + it->second.held[1];
}

void CacheIndex::Forget(const std::string& node_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return;
  version_.fetch_add(1, std::memory_order_release);
  Clear(it->second);
  // The node's slot held nothing after Clear: free it with the node.
  slot_node_[it->second.slot] = nullptr;
  free_.push_back(it->second.slot);
  nodes_.erase(it);
}

size_t CacheIndex::nodes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return nodes_.size();
}

uint64_t CacheIndex::resyncs() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return resyncs_;
}

kvstore::ChainLookup ChainHolders::On(const CacheIndex& index, std::span<const Sha256Digest> chain,
                                      size_t id_hash,
                                      absl::FunctionRef<const std::string&()> node_id) {
  // The version is read before the walk: a batch applied during it makes the next call walk
  // again.
  if (const uint64_t version = index.version(); version_ != version) {
    held_ = index.LookupHolders(chain);
    version_ = version;
    held_hashes_.clear();
    for (const auto& [id, lookup] : held_) held_hashes_.push_back(IdHash(id));
    std::sort(held_hashes_.begin(), held_hashes_.end());
  }
  if (!std::binary_search(held_hashes_.begin(), held_hashes_.end(), id_hash)) return {};
  auto it = held_.find(node_id());
  return it == held_.end() ? kvstore::ChainLookup{} : it->second;
}

}  // namespace baton::router
