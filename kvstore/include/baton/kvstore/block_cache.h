// A prefill node's local tier of the prefix cache (DESIGN section 5): recently used blocks'
// stored regions (block KV and producer SWA rows) in a bounded DRAM cache beside the shared
// store, so that a hit on this node loads from memory rather than over gRPC from RocksDB.
//
// Promises:
// - A value is held exactly as the store holds it (kvstore/stored_value.h), keyed by the same
//   chain keys (model fingerprint, tenant and salt in the key), and it is served only when it
//   passes the store's checks (version, fingerprint, checksum, finite floats) on every read; a
//   value that fails is dropped, never served.
// - The bytes held stay within the budget: eviction takes the least recently used chain leaf,
//   producer SWA first, as the store's index does (kvstore/prefix_index.h).
// - Every value it comes to hold or drops is told as a cache event (modelled on vLLM's KV
//   events, proto/baton/v1/node.proto), in batches numbered from 1; the events between two
//   batches are bounded, and past the bound the next batch is a snapshot instead.
//
// Threading: every method is safe from any thread (one mutex).
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "baton/common/hash.h"
#include "baton/kvstore/prefix_index.h"
#include "baton/kvstore/stored_value.h"
#include "baton/v1/node.pb.h"

namespace baton::kvstore {

// Block hashes the events between two batches may name (and a snapshot at most); past it the
// pending events are dropped and the next batch is a snapshot.
inline constexpr size_t kMaxCacheEventHashes = 8192;

class BlockCache {
 public:
  // `codec` checks values as the store does; `block_size` is B (an event's token counts).
  BlockCache(ValueCodec codec, int64_t block_size, uint64_t budget_bytes,
             size_t max_event_hashes = kMaxCacheEventHashes);

  // The payload of (key, region) when held and its value passes every check (the block counts
  // as used); nullopt otherwise. A value that fails its checks is dropped and counted.
  std::optional<std::string> Get(const Sha256Digest& key, Region region);
  bool Contains(const Sha256Digest& key, Region region) const;

  // Holds `payload` (one block of `region`) under `key`, whose chain parent is `parent`, for
  // `tenant` and `salt` (for the events; the key already separates them), then evicts to the
  // budget. A held value is only marked used. A payload of the wrong size is not held.
  void Put(const Sha256Digest& key, const std::optional<Sha256Digest>& parent, Region region,
           std::string_view payload, std::string_view tenant, std::string_view salt);

  // The events since the last call as the next batch; a snapshot (AllBlocksCleared, then what
  // is held, at most max_event_hashes blocks) when it is the first batch, after Resync, or when
  // the pending events passed their bound.
  v1::CacheEventBatch TakeEvents();
  // A router missed a batch: the next batch is a snapshot.
  void Resync();

  struct Stats {
    uint64_t bytes = 0;   // stored bytes held (values with their headers)
    uint64_t budget = 0;  // the budget
    uint64_t hits = 0;    // Get calls served
    uint64_t misses = 0;  // Get calls not served (absent or failed)
    uint64_t corrupt = 0;
    uint64_t evictions = 0;
    uint64_t blocks = 0;  // values held
  };
  Stats stats() const;

 private:
  struct ValueKey {
    Sha256Digest key;
    Region region;
    bool operator==(const ValueKey&) const = default;
  };
  struct ValueKeyHash {
    size_t operator()(const ValueKey& k) const;
  };
  struct Entry {
    std::string value;  // as the store holds it (ValueCodec::Encode)
    std::optional<Sha256Digest> parent;
    std::string tenant, salt;
  };
  // Drops (key, region) from the map and tells it. mutex_ held.
  void Dropped(const Sha256Digest& key, Region region);
  // Appends to the pending events, coalescing with the last event where it continues it.
  void Stored(const Sha256Digest& key, const Entry& entry, Region region);
  void Removed(const Sha256Digest& key, Region region);
  bool Overflowed();

  const ValueCodec codec_;
  const int64_t block_size_;
  const uint64_t budget_;
  const size_t max_event_hashes_;
  mutable std::mutex mutex_;
  PrefixIndex index_;
  std::unordered_map<ValueKey, Entry, ValueKeyHash> values_;
  std::vector<v1::CacheEvent> pending_;
  size_t pending_hashes_ = 0;
  bool snapshot_next_ = true;  // the first batch is one
  uint64_t sequence_ = 0;
  Stats stats_;
};

}  // namespace baton::kvstore
