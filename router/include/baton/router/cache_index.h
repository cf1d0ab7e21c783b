// The router's view of each prefill node's local block cache (kvstore/block_cache.h), built
// from the cache events the nodes send with their registrations: which chain keys a node
// holds, per region, so that routing can price a hit from that node's own memory.
//
// Promises:
// - Batches apply in order: a batch that does not follow the last one applied (a gap, or a
//   node's first batch that is no snapshot) is not applied, the node's blocks are forgotten
//   and Apply says to ask for a resync; the node's next batch is then a snapshot.
// - What a node's entry holds is bounded (kMaxIndexedBlocks per region); past it the router
//   simply knows fewer of the node's blocks.
// - What the router itself placed on a node is known at once (Expect): the blocks a prefill
//   keeps are indexed when the router sends it, or when its answer comes back, not a heartbeat
//   later. An expected block that the node's own events have not confirmed within its time is
//   dropped at the node's next batch; one the node reports removed, or forgets in a snapshot,
//   goes at once.
//
// Threading: every method is safe from any thread (one mutex; no call out while holding it).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "baton/common/hash.h"
#include "baton/kvstore/hit_policy.h"
#include "baton/kvstore/prefix_index.h"
#include "baton/v1/node.pb.h"

namespace baton::router {

inline constexpr size_t kMaxIndexedBlocks = size_t{1} << 20;

// A batch's fields within their bounds (event and hash counts, 32-byte keys, tenant and salt
// lengths, a known cache group), naming the first field that is not.
absl::Status CheckCacheEvents(const v1::CacheEventBatch& batch);

// Held keys live in one table per region, from chain key to the nodes that hold it, so that a
// request's placement walks its chain once for the whole cluster (LookupHolders) instead of
// probing every node's own table: at a thousand nodes that is one probe per key instead of one
// per node. A node whose blocks are forgotten (a gap, a snapshot, Forget) takes a fresh slot;
// its old slot's entries are skipped, dropped when their key is next touched, and swept out
// when they outnumber the live ones.
class CacheIndex {
 public:
  // Applies a checked batch from `node_id`; false when it did not follow the last one (see the
  // file comment): the node must send a snapshot.
  // `now_ms` is the clock Expect's deadlines are on: expectations of `node_id` past theirs and
  // not confirmed by a BlockStored are dropped.
  bool Apply(const std::string& node_id, const v1::CacheEventBatch& batch, double now_ms = 0);
  // `node_id` is about to hold `steps` of `chain` (kvstore::CacheKeptReads of a hit it was
  // sent, kvstore::WriteBackSteps of a prefill it answered): each block it is not known to
  // hold is indexed now, until its BlockStored confirms it or `deadline_ms` passes (Apply).
  // Steps outside the chain are ignored.
  void Expect(const std::string& node_id, std::span<const Sha256Digest> chain,
              std::span<const kvstore::WriteBackStep> steps, double deadline_ms);
  // Expected blocks of `node_id` not yet confirmed (both regions).
  size_t expected(const std::string& node_id) const;
  // The same over every node, and the expected blocks dropped unconfirmed so far (each a hit
  // the router priced that the node did not keep).
  size_t expected() const;
  uint64_t expected_dropped() const;
  // The leading blocks of `chain` whose block KV `node_id` holds, and their SWA rows.
  kvstore::ChainLookup Lookup(const std::string& node_id,
                              std::span<const Sha256Digest> chain) const;
  // Lookup for every node that holds at least the chain's first block, by node_id (a node that
  // is not there holds none of it).
  using Holders = absl::flat_hash_map<std::string, kvstore::ChainLookup>;
  Holders LookupHolders(std::span<const Sha256Digest> chain) const;
  // Changes whenever what the index holds may have changed: a LookupHolders answer is current
  // while this stays the same.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  // Drops what is known of `node_id` (a node the registry forgot).
  void Forget(const std::string& node_id);
  // Blocks (both regions) known for `node_id`.
  size_t blocks(const std::string& node_id) const;
  // Nodes with an entry.
  size_t nodes() const;
  uint64_t resyncs() const;

 private:
  // The nodes holding a key: each entry a node's slot << 2 with a bit per region it holds
  // (1: block KV, 2: producer SWA), so one table serves both regions.
  using Slots = absl::InlinedVector<uint32_t, 4>;
  // A block the router expects a node to hold before the node said so, by region.
  struct Unconfirmed {
    double deadline_ms[2] = {0, 0};
    uint8_t regions = 0;  // bit 1 << region: expected, not yet confirmed
  };
  struct NodeBlocks {
    uint64_t sequence = 0;  // of the last batch applied; 0: none since the last gap
    uint32_t slot = 0;
    size_t held[2] = {0, 0};  // entries, by kvstore::Region
    absl::flat_hash_map<Sha256Digest, Unconfirmed> unconfirmed;
    // Each expected key once, with the deadline it was queued at, in queueing order. A key
    // expected again meanwhile is requeued at its later deadline when this one passes (so it
    // may lapse up to one TTL past its own, never before); one settled meanwhile is skipped.
    std::deque<std::pair<double, Sha256Digest>> due;
  };
  // Drops `node`'s expectations whose deadline is before `now_ms` and that no event confirmed.
  void ExpireExpected(NodeBlocks& node, double now_ms);
  // `region` of `key` is confirmed (stored) or gone (removed): no longer an expectation.
  void Settle(NodeBlocks& node, int region, const Sha256Digest& key);
  NodeBlocks& Node(const std::string& node_id);
  // Forgets what `node` holds: its slot is retired and a fresh one taken.
  void Clear(NodeBlocks& node);
  void Insert(int region, const Sha256Digest& key, NodeBlocks& node);
  void Erase(int region, const Sha256Digest& key, NodeBlocks& node);
  // Drops retired slots' entries from one key's list.
  void Prune(Slots& slots);
  // Sweeps every retired slot's entries once they outnumber the live ones; their slots are
  // then free for reuse.
  void MaybeSweep();
  uint32_t NewSlot(const std::string* node_id);

  mutable std::mutex mutex_;
  std::map<std::string, NodeBlocks> nodes_;
  // absl's seeded hash over all 32 bytes: the keys come from the nodes, and a node that sent
  // keys alike in a few bytes must not make every probe of the table walk a long run.
  absl::flat_hash_map<Sha256Digest, Slots> holders_;
  std::vector<const std::string*> slot_node_;  // a live slot's node_id; null: retired or free
  std::vector<uint32_t> retired_;              // slots whose entries may remain in holders_
  std::vector<uint32_t> free_;                 // slots with no entry anywhere
  size_t live_entries_ = 0;
  size_t retired_entries_ = 0;  // at most: some are pruned as their keys are touched
  std::atomic<uint64_t> version_{0};
  uint64_t resyncs_ = 0;
  size_t expected_ = 0;  // unconfirmed (block, region) pairs, every node's
  uint64_t expected_dropped_ = 0;
};

// One request's chain in every node's cache: LookupHolders, walked again only when the index
// has changed since the last walk. Not thread-safe (one per request).
class ChainHolders {
 public:
  kvstore::ChainLookup On(const CacheIndex& index, std::span<const Sha256Digest> chain,
                          const std::string& node_id) {
    return On(index, chain, IdHash(node_id), [&]() -> const std::string& { return node_id; });
  }
  // The same with the node's IdHash given and its id read only through `node_id`: a node
  // that holds nothing of the chain (nearly all of a thousand) is answered from the hash
  // alone, without reading its id (a line of its registration elsewhere in memory).
  kvstore::ChainLookup On(const CacheIndex& index, std::span<const Sha256Digest> chain,
                          size_t id_hash, absl::FunctionRef<const std::string&()> node_id);
  static size_t IdHash(const std::string& node_id) { return std::hash<std::string>{}(node_id); }

 private:
  CacheIndex::Holders held_;
  std::vector<size_t> held_hashes_;  // IdHash of held_'s node_ids, sorted
  std::optional<uint64_t> version_;
};

}  // namespace baton::router
