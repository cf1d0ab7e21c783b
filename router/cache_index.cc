#include "baton/router/cache_index.h"

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

size_t CacheIndex::DigestHash::operator()(const Sha256Digest& key) const {
  size_t h;
  std::memcpy(&h, key.data(), sizeof(h));
  return h;
}

bool CacheIndex::Apply(const std::string& node_id, const v1::CacheEventBatch& batch) {
  std::lock_guard<std::mutex> lock(mutex_);
  NodeBlocks& node = nodes_[node_id];
  if (!batch.snapshot() && (node.sequence == 0 || batch.sequence() != node.sequence + 1)) {
    // A gap: what the node holds is unknown until its snapshot.
    for (auto& held : node.held) held.clear();
    node.sequence = 0;
    ++resyncs_;
    return false;
  }
  node.sequence = batch.sequence();
  for (const v1::CacheEvent& event : batch.events()) {
    if (event.has_all_blocks_cleared()) {
      for (auto& held : node.held) held.clear();
    } else if (event.has_block_stored()) {
      auto& held = node.held[RegionIndex(event.block_stored().cache_group())];
      for (const std::string& hash : event.block_stored().block_hashes()) {
        if (held.size() < kMaxIndexedBlocks) held.insert(Digest(hash));
      }
    } else if (event.has_block_removed()) {
      auto& held = node.held[RegionIndex(event.block_removed().cache_group())];
      for (const std::string& hash : event.block_removed().block_hashes()) {
        held.erase(Digest(hash));
      }
    }
  }
  return true;
}

kvstore::ChainLookup CacheIndex::Lookup(const std::string& node_id,
                                        std::span<const Sha256Digest> chain) const {
  kvstore::ChainLookup lookup;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return lookup;
  for (const Sha256Digest& key : chain) {
    if (!it->second.held[0].contains(key)) break;
    ++lookup.block_kv_blocks;
    lookup.swa_present.push_back(it->second.held[1].contains(key));
  }
  return lookup;
}

size_t CacheIndex::blocks(const std::string& node_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = nodes_.find(node_id);
  return it == nodes_.end() ? 0 : it->second.held[0].size() + it->second.held[1].size();
}

void CacheIndex::Forget(const std::string& node_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  nodes_.erase(node_id);
}

size_t CacheIndex::nodes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return nodes_.size();
}

uint64_t CacheIndex::resyncs() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return resyncs_;
}

}  // namespace baton::router
