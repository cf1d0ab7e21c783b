#include "baton/kvstore/block_cache.h"

#include <cstring>

#include "baton/kvstore/chain.h"

namespace baton::kvstore {
namespace {

constexpr char kMedium[] = "cpu";

v1::StoreRegion ProtoRegion(Region region) {
  return region == Region::kBlockKv ? v1::STORE_REGION_BLOCK_KV : v1::STORE_REGION_PRODUCER_SWA;
}

}  // namespace

size_t BlockCache::ValueKeyHash::operator()(const ValueKey& k) const {
  size_t h;
  std::memcpy(&h, k.key.data(), sizeof(h));  // a SHA-256 digest: uniform already
  return h ^ static_cast<size_t>(k.region);
}

BlockCache::BlockCache(ValueCodec codec, int64_t block_size, uint64_t budget_bytes,
                       size_t max_event_hashes)
    : codec_(std::move(codec)),
      block_size_(block_size),
      budget_(budget_bytes),
      max_event_hashes_(max_event_hashes) {
  stats_.budget = budget_bytes;
}

std::optional<std::string> BlockCache::Get(const Sha256Digest& key, Region region) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = values_.find({key, region});
  if (it == values_.end()) {
    ++stats_.misses;
    return std::nullopt;
  }
  std::string payload;
  std::optional<Sha256Digest> parent;
  if (!codec_.Decode(key, region, it->second.value, &payload, &parent) ||
      parent != it->second.parent) {
    // Memory went bad, or a bug wrote it: the value is dropped, never served.
    ++stats_.corrupt;
    ++stats_.misses;
    index_.Remove(key, region);
    Dropped(key, region);
    return std::nullopt;
  }
  index_.Touch(key);
  ++stats_.hits;
  return payload;
}

bool BlockCache::Contains(const Sha256Digest& key, Region region) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return values_.contains({key, region});
}

void BlockCache::Put(const Sha256Digest& key, const std::optional<Sha256Digest>& parent,
                     Region region, std::string_view payload, std::string_view tenant,
                     std::string_view salt) {
  if (payload.size() != codec_.payload_bytes(region)) return;
  const uint64_t bytes = StoredValueBytes(payload.size());
  if (bytes > budget_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (values_.contains({key, region})) {
    index_.Touch(key);
    return;
  }
  Entry& entry = values_[{key, region}];
  entry.value = codec_.Encode(key, parent, payload);
  entry.parent = parent;
  entry.tenant = tenant;
  entry.salt = salt;
  index_.Add(key, parent, region, bytes);
  Stored(key, entry, region);
  stats_.evictions += index_.EvictToBudget(
      budget_, [this](const Sha256Digest& k, Region r, uint64_t) { Dropped(k, r); });
}

void BlockCache::Dropped(const Sha256Digest& key, Region region) {
  values_.erase({key, region});
  Removed(key, region);
}

bool BlockCache::Overflowed() {
  if (pending_hashes_ <= max_event_hashes_) return false;
  // The router will not hear these one by one: it gets a snapshot instead.
  pending_.clear();
  pending_hashes_ = 0;
  snapshot_next_ = true;
  return true;
}

void BlockCache::Stored(const Sha256Digest& key, const Entry& entry, Region region) {
  if (snapshot_next_) return;  // the snapshot will carry it
  const std::string hash = KeyBytes(key);
  ++pending_hashes_;
  if (!pending_.empty() && pending_.back().has_block_stored()) {
    v1::BlockStored& last = *pending_.back().mutable_block_stored();
    // A block continuing the last event's chain joins it, as vLLM's BlockStored carries a run.
    if (last.cache_group() == ProtoRegion(region) && entry.parent.has_value() &&
        last.block_hashes(last.block_hashes_size() - 1) == KeyBytes(*entry.parent) &&
        last.tenant() == entry.tenant && last.cache_salt() == entry.salt) {
      last.add_block_hashes(hash);
      last.set_token_count(last.token_count() + static_cast<uint32_t>(block_size_));
      Overflowed();
      return;
    }
  }
  v1::BlockStored& stored = *pending_.emplace_back().mutable_block_stored();
  stored.add_block_hashes(hash);
  if (entry.parent.has_value()) stored.set_parent_block_hash(KeyBytes(*entry.parent));
  stored.set_token_count(static_cast<uint32_t>(block_size_));
  stored.set_cache_group(ProtoRegion(region));
  stored.set_tenant(entry.tenant);
  stored.set_cache_salt(entry.salt);
  stored.set_medium(kMedium);
  Overflowed();
}

void BlockCache::Removed(const Sha256Digest& key, Region region) {
  if (snapshot_next_) return;
  ++pending_hashes_;
  if (!pending_.empty() && pending_.back().has_block_removed() &&
      pending_.back().block_removed().cache_group() == ProtoRegion(region)) {
    pending_.back().mutable_block_removed()->add_block_hashes(KeyBytes(key));
  } else {
    v1::BlockRemoved& removed = *pending_.emplace_back().mutable_block_removed();
    removed.add_block_hashes(KeyBytes(key));
    removed.set_cache_group(ProtoRegion(region));
    removed.set_medium(kMedium);
  }
  Overflowed();
}

v1::CacheEventBatch BlockCache::TakeEvents() {
  std::lock_guard<std::mutex> lock(mutex_);
  v1::CacheEventBatch batch;
  batch.set_sequence(++sequence_);
  if (!snapshot_next_) {
    for (v1::CacheEvent& event : pending_) *batch.add_events() = std::move(event);
    pending_.clear();
    pending_hashes_ = 0;
    return batch;
  }
  snapshot_next_ = false;
  pending_.clear();
  pending_hashes_ = 0;
  batch.set_snapshot(true);
  batch.add_events()->mutable_all_blocks_cleared();
  size_t told = 0;
  for (const auto& [value_key, entry] : values_) {
    if (told++ == max_event_hashes_) break;  // a bound, not a ledger: the router knows less
    v1::BlockStored& stored = *batch.add_events()->mutable_block_stored();
    stored.add_block_hashes(KeyBytes(value_key.key));
    if (entry.parent.has_value()) stored.set_parent_block_hash(KeyBytes(*entry.parent));
    stored.set_token_count(static_cast<uint32_t>(block_size_));
    stored.set_cache_group(ProtoRegion(value_key.region));
    stored.set_tenant(entry.tenant);
    stored.set_cache_salt(entry.salt);
    stored.set_medium(kMedium);
  }
  return batch;
}

void BlockCache::Resync() {
  std::lock_guard<std::mutex> lock(mutex_);
  snapshot_next_ = true;
  pending_.clear();
  pending_hashes_ = 0;
}

BlockCache::Stats BlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats stats = stats_;
  stats.bytes = index_.stored_bytes();
  stats.blocks = values_.size();
  return stats;
}

}  // namespace baton::kvstore
