#include "baton/kvstore/prefix_store.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>

#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "baton/common/checksum.h"

namespace baton::kvstore {
namespace {

constexpr char kMagic[4] = {'B', 'T', 'K', 'V'};
// 2: the checksum covers the key and the whole value (1 covered the payload only, so a value
// copied under another key, or given another parent, still passed).
constexpr uint32_t kFormatVersion = 2;
constexpr size_t kHeaderBytes = kValueHeaderBytes;
static_assert(kHeaderBytes == 89, "the value header layout of Encode and Decode");
static_assert(kValueChecksumOffset == 73, "the value header layout of Encode and Decode");
const char* const kFamilies[] = {"block_kv", "producer_swa"};

rocksdb::Slice KeySlice(const Sha256Digest& key) {
  return rocksdb::Slice(reinterpret_cast<const char*>(key.data()), key.size());
}

absl::Status FromRocks(const rocksdb::Status& status, const char* what) {
  if (status.ok()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("prefix store ", what, ": ", status.ToString()));
}

template <typename T>
void Append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// The checksum field of the value stored under `key` (see kValueHeaderBytes).
uint64_t ValueChecksum(const Sha256Digest& key, std::string_view value) {
  return ChecksumParts({std::string_view(reinterpret_cast<const char*>(key.data()), key.size()),
                        value.substr(0, kValueChecksumOffset),
                        value.substr(kValueChecksumOffset + 8)});
}

// Index of the first float32 of `payload` that is NaN or Inf, or nullopt when all are
// finite. Block KV and SWA rows are model activations: a non-finite one is corrupt and would
// poison every request that loads it.
std::optional<size_t> FirstNonFinite(std::string_view payload) {
  for (size_t i = 0; i + 4 <= payload.size(); i += 4) {
    uint32_t bits;
    std::memcpy(&bits, payload.data() + i, 4);
    if ((bits & 0x7f800000u) == 0x7f800000u) return i / 4;
  }
  return std::nullopt;
}

const char* RegionName(Region region) {
  return region == Region::kBlockKv ? "block_kv" : "producer_swa";
}

}  // namespace

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
  std::unique_ptr<PrefixStore> store(new PrefixStore(options));
  store->fingerprint_digest_ =
      Sha256Of(options.model_fingerprint.data(), options.model_fingerprint.size());
  rocksdb::Options db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
      {kFamilies[0], rocksdb::ColumnFamilyOptions()},
      {kFamilies[1], rocksdb::ColumnFamilyOptions()}};
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

PrefixStore::PrefixStore(const StoreOptions& options) : options_(options) {}

PrefixStore::~PrefixStore() {
  if (db_ == nullptr) return;
  for (rocksdb::ColumnFamilyHandle* handle : handles_) db_->DestroyColumnFamilyHandle(handle);
  db_.reset();
}

uint64_t PrefixStore::PayloadBytes(Region region) const {
  return region == Region::kBlockKv ? options_.block_kv_payload_bytes
                                    : options_.producer_swa_payload_bytes;
}

std::string PrefixStore::Encode(const Sha256Digest& key, const std::optional<Sha256Digest>& parent,
                                const std::string& payload) const {
  std::string value;
  value.reserve(kHeaderBytes + payload.size());
  value.append(kMagic, 4);
  Append(value, kFormatVersion);
  value.append(reinterpret_cast<const char*>(fingerprint_digest_.data()), 32);
  value.push_back(parent.has_value() ? 1 : 0);
  const Sha256Digest none{};
  const Sha256Digest& p = parent.has_value() ? *parent : none;
  value.append(reinterpret_cast<const char*>(p.data()), 32);
  Append(value, uint64_t{0});  // the checksum, filled in below once the value is whole
  Append(value, static_cast<uint64_t>(payload.size()));
  value.append(payload);
  const uint64_t checksum = ValueChecksum(key, value);
  std::memcpy(value.data() + kValueChecksumOffset, &checksum, 8);
  return value;
}

bool PrefixStore::Decode(const Sha256Digest& key, Region region, const std::string& value,
                         std::string* payload, std::optional<Sha256Digest>* parent) const {
  if (value.size() < kHeaderBytes || std::memcmp(value.data(), kMagic, 4) != 0) return false;
  uint32_t version;
  std::memcpy(&version, value.data() + 4, 4);
  if (version != kFormatVersion) return false;
  if (std::memcmp(value.data() + 8, fingerprint_digest_.data(), 32) != 0) return false;
  const bool has_parent = value[40] != 0;
  Sha256Digest p;
  std::memcpy(p.data(), value.data() + 41, 32);
  if (has_parent && p == key) return false;  // would never be evicted (see Write)
  uint64_t checksum, length;
  std::memcpy(&checksum, value.data() + kValueChecksumOffset, 8);
  std::memcpy(&length, value.data() + 81, 8);
  if (length != value.size() - kHeaderBytes || length != PayloadBytes(region)) return false;
  if (ValueChecksum(key, value) != checksum) return false;
  const std::string_view stored(value.data() + kHeaderBytes, length);
  if (FirstNonFinite(stored).has_value()) return false;
  if (payload != nullptr) payload->assign(stored);
  *parent = has_parent ? std::optional<Sha256Digest>(p) : std::nullopt;
  return true;
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
      if (it->key().size() != 32 ||
          !Decode(key, static_cast<Region>(region), it->value().ToString(), nullptr, &parent)) {
        corrupt.push_back(it->key().ToString());
        continue;
      }
      index_.Add(key, parent, static_cast<Region>(region), it->value().size());
    }
    if (!it->status().ok()) return FromRocks(it->status(), "scan");
    for (const std::string& key : corrupt) {
      db_->Delete(rocksdb::WriteOptions(), handles_[region + 1], key);
      ++counters_.corrupt_values;
    }
  }
  EvictToBudget();
  return absl::OkStatus();
}

void PrefixStore::EvictToBudget() {
  if (options_.budget_bytes == 0) return;
  counters_.evictions += index_.EvictToBudget(
      options_.budget_bytes, [this](const Sha256Digest& key, Region region, uint64_t) {
        db_->Delete(rocksdb::WriteOptions(), handles_[static_cast<int>(region) + 1], KeySlice(key));
      });
}

ChainLookup PrefixStore::Lookup(const std::vector<Sha256Digest>& chain) {
  std::lock_guard<std::mutex> lock(mutex_);
  return index_.Lookup(chain);
}

absl::StatusOr<std::string> PrefixStore::Read(const Sha256Digest& key, Region region) {
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
  if (!Decode(key, region, value, &payload, &parent)) {
    ++counters_.corrupt_values;
    ++counters_.misses;
    db_->Delete(rocksdb::WriteOptions(), handles_[static_cast<int>(region) + 1], KeySlice(key));
    index_.Remove(key, region);
    return absl::NotFoundError("stored value failed its checks; dropped");
  }
  ++counters_.hits;
  counters_.bytes_read += payload.size();
  index_.Touch(key);
  return payload;
}

absl::Status PrefixStore::Write(const Sha256Digest& key, const std::optional<Sha256Digest>& parent,
                                Region region, const std::string& payload) {
  if (parent == key) {
    return absl::InvalidArgumentError(
        "parent: equals the key; a block's parent is the previous block of its chain");
  }
  if (payload.size() != PayloadBytes(region)) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload: ", payload.size(), " bytes; a ", RegionName(region),
                     " value of this model is exactly ", PayloadBytes(region), " bytes"));
  }
  if (const std::optional<size_t> bad = FirstNonFinite(payload)) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload: float ", *bad, " is NaN or Inf; stored rows must be finite"));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (parent.has_value() && !index_.Contains(*parent, Region::kBlockKv) &&
      !index_.Contains(*parent, Region::kProducerSwa)) {
    return absl::FailedPreconditionError(
        "parent: not in the store; write the chain from its root (empty parent) on");
  }
  if (index_.Contains(key, region)) {
    index_.Touch(key);  // already stored (blocks are immutable for a given key)
    return absl::OkStatus();
  }
  const std::string value = Encode(key, parent, payload);
  if (absl::Status s =
          FromRocks(db_->Put(rocksdb::WriteOptions(), handles_[static_cast<int>(region) + 1],
                             KeySlice(key), value),
                    "write");
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
