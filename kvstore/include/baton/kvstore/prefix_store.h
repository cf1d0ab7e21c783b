// The prefix store (DESIGN section 5): one RocksDB database with two column families, one
// value per block per region: block KV ("block_kv") and producer SWA rows ("producer_swa").
// Consumer SWA never enters it.
//
// Every value carries a format version, the model fingerprint, its parent's key and an XXH3
// checksum of its key and every other byte of the value; a value that fails any check (also:
// a payload of the wrong size for its region, or one holding NaN or Inf as float32) is
// counted, deleted and reported as a miss.
//
// Several models' values lie side by side (a blue/green rollout shares the store): a write
// names its model's fingerprint and a read its reader's, and a value is served only to a
// reader of the model it was written for (another model's is a miss, and stays). Chain keys
// carry the fingerprint already, so the models never share a key. All models share one shape
// (StoreOptions' payload sizes: a rollout changes weights, not the config) and one budget,
// evicted across them by recency. StoreOptions::model_fingerprint is the model of a read or
// write that names none. Writes go through the write-ahead log, so the store
// survives restarts; the index used for eviction (PrefixIndex) is rebuilt from the values at
// Open.
//
// Writes are checked before anything is stored: a payload is exactly one block of its region
// for the model (StoreOptions), holds only finite floats, and names a parent that differs from
// its key (or no parent: a chain root). A value that were its own parent would be a node that
// is never a leaf, hence never evicted. The parent need not be held here: in a fleet each node
// holds the values it owns (kvstore/placement.h), and a block's parent is usually another
// node's; the link is recorded, and counts (for eviction) once the parent is held here too.
// Nothing reads past a missing block: a lookup's hit ends at the first block without its
// block KV (docs/architecture.md, "The store as a fleet").
//
// Budget: when the stored bytes (values with their headers) pass `budget_bytes`, the least
// recently used chain leaf loses its producer SWA rows first, then its block KV (which may
// make its parent a leaf); PrefixIndex keeps that order and RocksDB deletes what it evicts.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "baton/common/hash.h"
#include "baton/kvstore/prefix_index.h"
#include "baton/kvstore/stored_value.h"

namespace rocksdb {
class DB;
class ColumnFamilyHandle;
class Slice;
}  // namespace rocksdb

namespace baton::kvstore {

// How RocksDB compresses the stored values on disk, per block of its files (--compression; the
// budget counts payload bytes either way). Snappy is RocksDB's own default; float32 state
// compresses little, so none saves the CPU, and zstd the most disk.
enum class StoreCompression { kNone, kSnappy, kLz4, kZstd };
absl::string_view StoreCompressionName(StoreCompression compression);  // "none", "snappy", ...

struct StoreOptions {
  std::string path;
  std::string model_fingerprint;  // hex; the model of reads and writes that name none
  uint64_t budget_bytes = 0;      // 0: unlimited
  // Payload of one block, per region (model::StateLayout: page_floats() and
  // stored_swa_block_floats() floats); both required, multiples of 4 (float32).
  uint64_t block_kv_payload_bytes = 0;
  uint64_t producer_swa_payload_bytes = 0;
  // Every write and delete waits for its write-ahead-log record to reach the disk (fsync), so
  // an acknowledged write survives a crash of the machine, not only of the process.
  bool sync_writes = false;
  // One that this RocksDB build lacks is refused by Open, naming those it has.
  StoreCompression compression = StoreCompression::kSnappy;
};

struct StoreCounters {
  uint64_t hits = 0;  // values read successfully
  uint64_t misses = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t evictions = 0;  // values removed for the budget
  uint64_t corrupt_values = 0;
  uint64_t failed_deletes = 0;  // RocksDB deletes that failed (the value stays on disk)
  uint64_t stored_bytes = 0;  // bytes of every value held now
  uint64_t block_kv_values = 0;
  uint64_t producer_swa_values = 0;
};

class PrefixStore {
 public:
  static absl::StatusOr<std::unique_ptr<PrefixStore>> Open(const StoreOptions& options);
  ~PrefixStore();

  // Leading blocks of `chain` whose block KV is present; touches them for LRU.
  ChainLookup Lookup(const std::vector<Sha256Digest>& chain);
  // Which of `keys` (one chain's, in chain order) are held, per region. The held ones are
  // touched from the last to the first: of one chain's blocks on this node the earlier ones
  // are then the more recently used, so eviction takes a chain from its end even where its
  // blocks' children live on other nodes (and so every block here is a leaf).
  struct Presence {
    bool block_kv = false, producer_swa = false;
  };
  std::vector<Presence> Probe(std::span<const Sha256Digest> keys);
  // The payload, or NOT_FOUND (absent, another model's, or dropped after failing its checks).
  // `model_fingerprint`: the reader's model ("": StoreOptions::model_fingerprint).
  absl::StatusOr<std::string> Read(const Sha256Digest& key, Region region,
                                   std::string_view model_fingerprint = {});
  // `parent` is the previous block's key (nullopt for block 0); `model_fingerprint` the
  // value's model ("": StoreOptions::model_fingerprint). Evicts to stay in budget.
  // INVALID_ARGUMENT for a payload of the wrong size or with NaN/Inf, or a parent equal to the
  // key; FAILED_PRECONDITION for a key that holds another model's value. A refused write
  // stores nothing.
  absl::Status Write(const Sha256Digest& key, const std::optional<Sha256Digest>& parent,
                     Region region, const std::string& payload,
                     std::string_view model_fingerprint = {});
  StoreCounters counters() const;
  uint64_t budget_bytes() const { return options_.budget_bytes; }
  // Compares the in-memory index with what RocksDB holds (every value of either is in the
  // other, with its size) and checks each value's checksum: OK, or DATA_LOSS naming the first
  // difference. A full scan, for tests and the crash test's verification.
  absl::Status Verify() const;

 private:
  explicit PrefixStore(const StoreOptions& options);
  absl::Status Rebuild();
  // Evicts from the index and deletes from RocksDB until within budget; caller holds mutex_.
  void EvictToBudget();
  // The header digest of `model_fingerprint`'s values ("": StoreOptions::model_fingerprint).
  Sha256Digest ModelFor(std::string_view model_fingerprint) const;
  // Deletes a value from RocksDB; a failure is logged and counted. Caller holds mutex_.
  void Delete(int region, const rocksdb::Slice& key);

  StoreOptions options_;
  ValueCodec codec_;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;  // default, block_kv, producer_swa
  mutable std::mutex mutex_;
  PrefixIndex index_;       // guarded by mutex_
  StoreCounters counters_;  // all but the three the index keeps (stored bytes, value counts)
};

}  // namespace baton::kvstore
