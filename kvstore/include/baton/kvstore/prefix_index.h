// The prefix store's eviction index (DESIGN section 5), without any storage: which values
// (block, region) are held and their sizes, the chain links between blocks, and the recency
// order of chain leaves. PrefixStore keeps one beside its RocksDB database; `batonctl simulate`
// runs one on its own to replay a trace through the same presence, LRU and budget rules.
//
// A node is a chain key holding at least one value. Its children are the nodes that name it as
// their parent, counted whatever order they arrived in (a child written before its parent, as
// a scan at open meets them, counts once the parent arrives). A leaf is a node without
// children. Eviction takes the least recently used leaf: its producer SWA value goes first
// (a hit needs SWA rows only near its end, so a chain stays useful longer), then its block
// KV; a node left without values leaves the index, which may make its parent a leaf, with the
// parent's own (older) recency.
//
// Recency: a node is used when it is added, touched, or found by Lookup; adding the second
// region's value to an existing node does not count as a use.
//
// Not thread-safe: the owner serialises calls (PrefixStore holds its mutex).
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "baton/common/hash.h"

namespace baton::kvstore {

// The two stored regions of a block (DESIGN section 4); consumer SWA never enters the store.
enum class Region { kBlockKv = 0, kProducerSwa = 1 };

struct ChainLookup {
  int64_t block_kv_blocks = 0;    // leading blocks with block KV present
  std::vector<bool> swa_present;  // for each of those blocks
};

class PrefixIndex {
 public:
  // Called once per evicted value, after the index has dropped it.
  using EvictFn = std::function<void(const Sha256Digest& key, Region region, uint64_t bytes)>;

  // Leading blocks of `chain` whose block KV is present, and which of them have producer SWA
  // rows; touches each of those blocks in chain order.
  ChainLookup Lookup(std::span<const Sha256Digest> chain);

  bool Contains(const Sha256Digest& key, Region region) const;

  // What Lookup would find, without touching anything (ranking a node must not change its LRU).
  ChainLookup Peek(std::span<const Sha256Digest> chain) const;

  // Records a value of `bytes` (> 0) for (key, region); a present value just takes the new
  // size. `parent` is the previous block's key (nullopt for block 0). A new node counts as
  // used now. Does not evict: call EvictToBudget after.
  void Add(const Sha256Digest& key, const std::optional<Sha256Digest>& parent, Region region,
           uint64_t bytes);

  // Drops the value (no-op when absent); a node left without values leaves the index.
  void Remove(const Sha256Digest& key, Region region);

  // Marks the node as used now (no-op when absent).
  void Touch(const Sha256Digest& key);

  // Touches the node when it holds `region`'s value and returns true; false (and no change)
  // when it does not: Contains then Touch, with one probe.
  bool TouchIfPresent(const Sha256Digest& key, Region region);

  // Evicts values in the order of the file comment until stored_bytes() <= budget_bytes or
  // nothing is left; calls `on_evict` (may be empty) for each. Returns the values evicted.
  uint64_t EvictToBudget(uint64_t budget_bytes, const EvictFn& on_evict);

  uint64_t stored_bytes() const { return stored_bytes_; }
  uint64_t values(Region region) const { return values_[static_cast<int>(region)]; }
  size_t nodes() const { return nodes_.size(); }

 private:
  struct Node {
    std::optional<Sha256Digest> parent;
    int64_t children = 0;
    uint64_t last_used = 0;
    uint64_t bytes[2] = {0, 0};  // value size per region, 0 when absent
  };
  // Chain keys are SHA-256 digests, uniform already: their first bytes are a good hash.
  struct DigestHash {
    size_t operator()(const Sha256Digest& key) const {
      size_t h;
      std::memcpy(&h, key.data(), sizeof(h));
      return h;
    }
  };
  // Equality word by word, inline: a probe's compare is on every lookup's path (memcmp is a
  // call per probe).
  struct DigestEq {
    bool operator()(const Sha256Digest& a, const Sha256Digest& b) const {
      uint64_t x[4], y[4];
      std::memcpy(x, a.data(), sizeof(x));
      std::memcpy(y, b.data(), sizeof(y));
      return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0;
    }
  };

  // The leaves by recency, as (last_used, key) entries: an entry is current while its node is
  // still a leaf with that last_used; others are stale and skipped where they surface, so a use
  // costs one append (no tree node to allocate, nothing to erase). Each node's last_used is
  // unique (the clock ticks at every use), so the least current entry is the least recently
  // used leaf. A use is the newest, so its entry goes at the back of `used_`, which stays in
  // order; a parent left without children becomes a leaf at its own older recency, so its
  // entry goes into the heap `orphaned_`. The oldest leaf is the least of the two fronts.
  using LeafEntry = std::pair<uint64_t, Sha256Digest>;
  struct Later {
    bool operator()(const LeafEntry& a, const LeafEntry& b) const { return a.first > b.first; }
  };
  void Use(Node& node, const Sha256Digest& key);
  void Orphaned(const Node& node, const Sha256Digest& key);
  bool Current(const LeafEntry& entry) const;
  // Drops the stale entries once they outnumber the nodes (linear, so amortised over the uses).
  void Compact();
  // The least recently used leaf's entry after dropping stale fronts; null when none is left.
  const LeafEntry* OldestLeaf();
  // Open addressing: a lookup probes one flat array instead of a bucket's list (the simulator
  // walks chains of hundreds of keys through indexes of millions).
  absl::flat_hash_map<Sha256Digest, Node, DigestHash, DigestEq> nodes_;
  // For keys not in the index: how many nodes name them as parent (counted in when they come).
  absl::flat_hash_map<Sha256Digest, int64_t, DigestHash, DigestEq> waiting_children_;
  std::deque<LeafEntry> used_;       // ascending last_used
  std::vector<LeafEntry> orphaned_;  // a heap under Later
  uint64_t clock_ = 0;
  uint64_t stored_bytes_ = 0;
  uint64_t values_[2] = {0, 0};
};

}  // namespace baton::kvstore
