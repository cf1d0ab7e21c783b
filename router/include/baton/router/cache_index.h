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
//
// Threading: every method is safe from any thread (one mutex; no call out while holding it).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <unordered_set>

#include "absl/status/status.h"
#include "baton/common/hash.h"
#include "baton/kvstore/prefix_index.h"
#include "baton/v1/node.pb.h"

namespace baton::router {

inline constexpr size_t kMaxIndexedBlocks = size_t{1} << 20;

// A batch's fields within their bounds (event and hash counts, 32-byte keys, tenant and salt
// lengths, a known cache group), naming the first field that is not.
absl::Status CheckCacheEvents(const v1::CacheEventBatch& batch);

class CacheIndex {
 public:
  // Applies a checked batch from `node_id`; false when it did not follow the last one (see the
  // file comment): the node must send a snapshot.
  bool Apply(const std::string& node_id, const v1::CacheEventBatch& batch);
  // The leading blocks of `chain` whose block KV `node_id` holds, and their SWA rows.
  kvstore::ChainLookup Lookup(const std::string& node_id,
                              std::span<const Sha256Digest> chain) const;
  // Drops what is known of `node_id` (a node the registry forgot).
  void Forget(const std::string& node_id);
  // Blocks (both regions) known for `node_id`.
  size_t blocks(const std::string& node_id) const;
  // Nodes with an entry.
  size_t nodes() const;
  uint64_t resyncs() const;

 private:
  struct DigestHash {
    size_t operator()(const Sha256Digest& key) const;
  };
  struct NodeBlocks {
    uint64_t sequence = 0;  // of the last batch applied; 0: none since the last gap
    std::unordered_set<Sha256Digest, DigestHash> held[2];  // by kvstore::Region
  };
  mutable std::mutex mutex_;
  std::map<std::string, NodeBlocks> nodes_;
  uint64_t resyncs_ = 0;
};

}  // namespace baton::router
