#include "baton/kvstore/prefix_store.h"

#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>

#include <algorithm>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "baton/common/log.h"

namespace baton::kvstore {
namespace {

const char* const kFamilies[] = {"block_kv", "producer_swa"};

rocksdb::Slice KeySlice(const Sha256Digest& key) {
  return rocksdb::Slice(reinterpret_cast<const char*>(key.data()), key.size());
}

absl::Status FromRocks(const rocksdb::Status& status, const char* what) {
  if (status.ok()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("prefix store ", what, ": ", status.ToString()));
}

rocksdb::CompressionType RocksCompression(StoreCompression compression) {
  switch (compression) {
    case StoreCompression::kNone:
      return rocksdb::kNoCompression;
    case StoreCompression::kSnappy:
      return rocksdb::kSnappyCompression;
    case StoreCompression::kLz4:
      return rocksdb::kLZ4Compression;
    case StoreCompression::kZstd:
      return rocksdb::kZSTD;
  }
  return rocksdb::kNoCompression;
}

// The compression, checked against what this RocksDB build has.
absl::StatusOr<rocksdb::CompressionType> SupportedCompression(StoreCompression compression) {
  const rocksdb::CompressionType wanted = RocksCompression(compression);
  const std::vector<rocksdb::CompressionType> supported = rocksdb::GetSupportedCompressions();
  if (wanted == rocksdb::kNoCompression ||
      std::find(supported.begin(), supported.end(), wanted) != supported.end()) {
    return wanted;
  }
  std::vector<std::string> names = {"none"};
  for (StoreCompression c :
       {StoreCompression::kSnappy, StoreCompression::kLz4, StoreCompression::kZstd}) {
    if (std::find(supported.begin(), supported.end(), RocksCompression(c)) != supported.end()) {
      names.emplace_back(StoreCompressionName(c));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("--compression: this RocksDB build has no ",
                                                 StoreCompressionName(compression),
                                                 "; it has: ", absl::StrJoin(names, ", ")));
}

const char* RegionName(Region region) {
  return region == Region::kBlockKv ? "block_kv" : "producer_swa";
}

}  // namespace

absl::string_view StoreCompressionName(StoreCompression compression) {
  switch (compression) {
    case StoreCompression::kNone:
      return "none";
    case StoreCompression::kSnappy:
      return "snappy";
    case StoreCompression::kLz4:
      return "lz4";
    case StoreCompression::kZstd:
      return "zstd";
  }
  return "none";
}

absl::StatusOr<std::unique_ptr<PrefixStore>> PrefixStore::Open(const StoreOptions& options) {
  if (options.path.empty()) return absl::InvalidArgumentError("path: the store needs a folder");
  for (auto [field, bytes] :
       {std::pair<const char*, uint64_t>{"block_kv_payload_bytes", options.block_kv_payload_bytes},
        {"producer_swa_payload_bytes", options.producer_swa_payload_bytes}}) {
    if (bytes == 0 || bytes % 4 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", bytes, "; it must be a positive multiple of 4 (float32 rows of a block)"));
    }
  }
  absl::StatusOr<rocksdb::CompressionType> compression = SupportedCompression(options.compression);
  if (!compression.ok()) return compression.status();
  std::unique_ptr<PrefixStore> store(new PrefixStore(options));
  rocksdb::Options db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  rocksdb::ColumnFamilyOptions family;
  family.compression = *compression;
  std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, family}, {kFamilies[0], family}, {kFamilies[1], family}};
  rocksdb::DB* db = nullptr;
  if (absl::Status s = FromRocks(
          rocksdb::DB::Open(db_options, options.path, families, &store->handles_, &db), "open");
      !s.ok()) {
    return s;
  }
  store->db_.reset(db);
  if (absl::Status s = store->Rebuild(); !s.ok()) return s;
  return store;
}

PrefixStore::PrefixStore(const StoreOptions& options)
    : options_(options),
      codec_(options.model_fingerprint, options.block_kv_payload_bytes,
             options.producer_swa_payload_bytes) {}

PrefixStore::~PrefixStore() {
  if (db_ == nullptr) return;
  for (rocksdb::ColumnFamilyHandle* handle : handles_) db_->DestroyColumnFamilyHandle(handle);
  db_.reset();
}

absl::Status PrefixStore::Rebuild() {
  std::lock_guard<std::mutex> lock(mutex_);
  // A scan meets children before their parents; the index links them whatever the order.
  for (int region = 0; region < 2; ++region) {
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(rocksdb::ReadOptions(), handles_[region + 1]));
    std::vector<std::string> corrupt;
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      std::optional<Sha256Digest> parent;
      Sha256Digest key{};
      if (it->key().size() == 32) std::memcpy(key.data(), it->key().data(), 32);
      // Any model's value: each read checks its reader's model (see the header comment).
      if (it->key().size() != 32 ||
          !codec_.Decode(key, static_cast<Region>(region), it->value().ToString(), nullptr, &parent,
                         /*any_model=*/true)) {
        corrupt.push_back(it->key().ToString());
        continue;
      }
      index_.Add(key, parent, static_cast<Region>(region), it->value().size());
    }
    if (!it->status().ok()) return FromRocks(it->status(), "scan");
    for (const std::string& key : corrupt) {
      Delete(region, key);
      ++counters_.corrupt_values;
    }
  }
  EvictToBudget();
  return absl::OkStatus();
}

void PrefixStore::Delete(int region, const rocksdb::Slice& key) {
  rocksdb::WriteOptions write;
  write.sync = options_.sync_writes;
  const rocksdb::Status status = db_->Delete(write, handles_[region + 1], key);
  if (!status.ok()) {
    ++counters_.failed_deletes;
    log::Error("prefix-store delete failed; the value stays on disk until the next open",
               {{"error", status.ToString()}});
  }
}

void PrefixStore::EvictToBudget() {
  if (options_.budget_bytes == 0) return;
  counters_.evictions += index_.EvictToBudget(
      options_.budget_bytes, [this](const Sha256Digest& key, Region region, uint64_t) {
        Delete(static_cast<int>(region), KeySlice(key));
      });
}

absl::Status PrefixStore::Verify() const {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t values = 0, bytes = 0;
  for (int region = 0; region < 2; ++region) {
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(rocksdb::ReadOptions(), handles_[region + 1]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      Sha256Digest key{};
      if (it->key().size() != 32) {
        return absl::DataLossError(absl::StrCat("a key of ", it->key().size(), " bytes in ",
                                                kFamilies[region]));
      }
      std::memcpy(key.data(), it->key().data(), 32);
      std::optional<Sha256Digest> parent;
      if (!codec_.Decode(key, static_cast<Region>(region), it->value().ToString(), nullptr, &parent,
                         /*any_model=*/true)) {
        return absl::DataLossError(
            absl::StrCat("a value in ", kFamilies[region], " fails its checks"));
      }
      if (!index_.Contains(key, static_cast<Region>(region))) {
        return absl::DataLossError(
            absl::StrCat("a value in ", kFamilies[region], " is not in the index"));
      }
      ++values;
      bytes += it->value().size();
    }
    if (!it->status().ok()) return FromRocks(it->status(), "scan");
  }
  const uint64_t indexed =
      index_.values(Region::kBlockKv) + index_.values(Region::kProducerSwa);
  if (values != indexed || bytes != index_.stored_bytes()) {
    return absl::DataLossError(absl::StrCat("RocksDB holds ", values, " values of ", bytes,
                                            " bytes; the index ", indexed, " of ",
                                            index_.stored_bytes()));
  }
  return absl::OkStatus();
}

Sha256Digest PrefixStore::ModelFor(std::string_view model_fingerprint) const {
  return model_fingerprint.empty() ? codec_.model_digest()
                                   : ValueCodec::ModelDigest(model_fingerprint);
}

ChainLookup PrefixStore::Lookup(const std::vector<Sha256Digest>& chain) {
  std::lock_guard<std::mutex> lock(mutex_);
  return index_.Lookup(chain);
}

std::vector<PrefixStore::Presence> PrefixStore::Probe(std::span<const Sha256Digest> keys) {
  std::vector<Presence> held(keys.size());
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = keys.size(); i-- > 0;) {
    held[i] = {index_.Contains(keys[i], Region::kBlockKv),
               index_.Contains(keys[i], Region::kProducerSwa)};
    if (held[i].block_kv || held[i].producer_swa) index_.Touch(keys[i]);
  }
  return held;
}

absl::StatusOr<std::string> PrefixStore::Read(const Sha256Digest& key, Region region,
                                              std::string_view model_fingerprint) {
  std::string value;
  const rocksdb::Status status = db_->Get(
      rocksdb::ReadOptions(), handles_[static_cast<int>(region) + 1], KeySlice(key), &value);
  std::lock_guard<std::mutex> lock(mutex_);
  if (status.IsNotFound()) {
    ++counters_.misses;
    return absl::NotFoundError("block not in the prefix store");
  }
  if (!status.ok()) {
    ++counters_.misses;
    return FromRocks(status, "read");
  }
  std::string payload;
  std::optional<Sha256Digest> parent;
  if (!codec_.Decode(key, region, value, &payload, &parent, /*any_model=*/true)) {
    ++counters_.corrupt_values;
    ++counters_.misses;
    Delete(static_cast<int>(region), KeySlice(key));
    index_.Remove(key, region);
    return absl::NotFoundError("stored value failed its checks; dropped");
  }
  if (ValueCodec::ModelOf(value) != ModelFor(model_fingerprint)) {
    ++counters_.misses;  // another model's value: not this reader's, and not corrupt
    return absl::NotFoundError("stored value is another model's");
  }
  ++counters_.hits;
  counters_.bytes_read += payload.size();
  index_.Touch(key);
  return payload;
}

absl::Status PrefixStore::Write(const Sha256Digest& key, const std::optional<Sha256Digest>& parent,
                                Region region, const std::string& payload,
                                std::string_view model_fingerprint) {
  if (parent == key) {
    return absl::InvalidArgumentError(
        "parent: equals the key; a block's parent is the previous block of its chain");
  }
  if (payload.size() != codec_.payload_bytes(region)) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload: ", payload.size(), " bytes; a ", RegionName(region),
                     " value of this model is exactly ", codec_.payload_bytes(region), " bytes"));
  }
  if (const std::optional<size_t> bad = FirstNonFinite(payload)) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload: float ", *bad, " is NaN or Inf; stored rows must be finite"));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const Sha256Digest model = ModelFor(model_fingerprint);
  if (index_.Contains(key, region)) {
    // Already stored: blocks are immutable for a given key, and a key is one model's (the
    // chain keys carry the fingerprint), so a write naming another model is refused.
    std::string held;
    if (db_->Get(rocksdb::ReadOptions(), handles_[static_cast<int>(region) + 1], KeySlice(key),
                 &held)
            .ok() &&
        ValueCodec::ModelOf(held) != model) {
      return absl::FailedPreconditionError(
          "model_fingerprint: the key holds another model's value; a chain key is one model's");
    }
    index_.Touch(key);
    return absl::OkStatus();
  }
  const std::string value = codec_.Encode(key, parent, payload, model);
  rocksdb::WriteOptions write;
  write.sync = options_.sync_writes;
  if (absl::Status s = FromRocks(
          db_->Put(write, handles_[static_cast<int>(region) + 1], KeySlice(key), value), "write");
      !s.ok()) {
    return s;
  }
  counters_.bytes_written += payload.size();
  index_.Add(key, parent, region, value.size());
  EvictToBudget();
  return absl::OkStatus();
}

StoreCounters PrefixStore::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  StoreCounters counters = counters_;
  counters.stored_bytes = index_.stored_bytes();
  counters.block_kv_values = index_.values(Region::kBlockKv);
  counters.producer_swa_values = index_.values(Region::kProducerSwa);
  return counters;
}

}  // namespace baton::kvstore
