// The RocksDB prefix store: chain keys, durable values in two column families, writes checked
// against the chain and the model's layout, corrupt values (bad checksum, NaN/Inf, old format)
// as counted misses, leaf-first eviction within a budget (SWA rows before block KV).
#include "baton/kvstore/prefix_store.h"

#include <rocksdb/db.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "baton/common/checksum.h"
#include "baton/common/wire_bounds.h"
#include "baton/kvstore/chain.h"
#include "baton/kvstore/hit_policy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_dir.h"

namespace baton::kvstore {
namespace {

std::vector<int32_t> Tokens(int64_t n, int32_t offset = 0) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(i * 7 + offset);
  return t;
}

// Known answers, computed apart from this code (Python's hashlib) from DESIGN section 5's
// definition: k_-1 = SHA-256(fingerprint || [len(tenant) as uint32 LE || tenant] || salt),
// k_b = SHA-256(k_b-1 || block b's tokens as int32 LE). Stores written by one build must be
// read by the next: these keys may never change.
TEST(ChainKeysTest, KeysMatchTheKnownAnswerVectors) {
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 40; ++i) tokens.push_back(i * 4099);
  const auto tenant = ChainKeys("baton-fp", "acme", "salt", tokens, 16);
  ASSERT_EQ(tenant.size(), 2u);  // the trailing 8 tokens make no block
  EXPECT_EQ(HexDigest(tenant[0]),
            "b93bd8823e3640477d677b6bcaa2f40a196857e9fecee93a1c3e37a09c050a81");
  EXPECT_EQ(HexDigest(tenant[1]),
            "2c6beaaaf4a76360b9793b4404b8942b645534b64b6e1dd74970326c5d172aef");
  const auto no_tenant = ChainKeys("baton-fp", "", "salt", tokens, 16);
  ASSERT_EQ(no_tenant.size(), 2u);
  EXPECT_EQ(HexDigest(no_tenant[0]),
            "dbd440bbc4a68594e64c129dbdf1c8841f1b4ae36f6502c4b9ba7380fec15c84");
  EXPECT_EQ(HexDigest(no_tenant[1]),
            "f5ebcf287a0d0b83aad37e7cd3dbd337efe5fc1b2847ff581549c849c1592d26");
}

TEST(ChainKeysTest, KeysNameWholePrefixesAndSaltsIsolate) {
  const auto a = ChainKeys("fp", "", "", Tokens(40), 16);
  ASSERT_EQ(a.size(), 2u);  // the partial third block has no key
  const auto longer = ChainKeys("fp", "", "", Tokens(64), 16);
  EXPECT_EQ(longer[0], a[0]);
  EXPECT_EQ(longer[1], a[1]);
  auto changed = Tokens(40);
  changed[3] += 1;  // a change in block 0 changes every later key
  const auto c = ChainKeys("fp", "", "", changed, 16);
  EXPECT_NE(c[0], a[0]);
  EXPECT_NE(c[1], a[1]);
  EXPECT_NE(ChainKeys("fp", "", "tenant-b", Tokens(40), 16)[0], a[0]);
  EXPECT_NE(ChainKeys("other-model", "", "", Tokens(40), 16)[0], a[0]);
}

TEST(ChainKeysTest, TenantsNeverShareKeysWhateverTheSalt) {
  const auto tokens = Tokens(32);
  const auto a = ChainKeys("fp", "tenant-a", "", tokens, 16);
  EXPECT_NE(ChainKeys("fp", "tenant-b", "", tokens, 16)[0], a[0]);
  EXPECT_NE(ChainKeys("fp", "", "", tokens, 16)[0], a[0]);
  // A salt cannot spell another tenant: neither by moving bytes between tenant and salt nor
  // by a keyless client sending the tenant as its salt.
  EXPECT_NE(ChainKeys("fp", "tenant-", "a", tokens, 16)[0], a[0]);
  EXPECT_NE(ChainKeys("fp", "", "tenant-a", tokens, 16)[0], a[0]);
  EXPECT_EQ(ChainKeys("fp", "tenant-a", "", tokens, 16), a);
}

// Why the router refuses a cache_salt with a NUL byte: a keyless router's root hashes the salt
// right after the fingerprint, where a keyed tenant's hashes its name's length (uint32 LE) and
// name, so such a salt would reach the tenant's keys on a store both share. Every tenant
// length the router accepts (at most kMaxTenantBytes) has a 0 byte in its prefix, so a salt
// without one never can, and the keys themselves never change.
TEST(ChainKeysTest, ASaltWithANulByteCouldSpellAKeyedRoot) {
  const auto tokens = Tokens(32);
  const std::string tenant = "tenant-a";
  const auto keyed = ChainKeys("fp", tenant, "s", tokens, 16);
  const std::string spelled =
      std::string(1, static_cast<char>(tenant.size())) + std::string(3, '\0') + tenant + "s";
  EXPECT_EQ(ChainKeys("fp", "", spelled, tokens, 16), keyed);
  EXPECT_NE(spelled.find('\0'), std::string::npos);
  static_assert(kMaxTenantBytes < (uint64_t{1} << 24), "a tenant's length prefix has a 0 byte");
}

class PrefixStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = baton::testing::ProcessTempDir() + "/store_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(path_);
  }
  // A store whose values are `payload` bytes in both regions.
  std::unique_ptr<PrefixStore> Open(uint64_t budget = 0, uint64_t payload = kPayload) {
    auto store = PrefixStore::Open({.path = path_,
                                    .model_fingerprint = "fp",
                                    .budget_bytes = budget,
                                    .block_kv_payload_bytes = payload,
                                    .producer_swa_payload_bytes = payload});
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  // Writes blocks [0, n) of a chain with payloads of `bytes` per region.
  void WriteChain(PrefixStore& store, const std::vector<Sha256Digest>& chain,
                  size_t bytes = kPayload, bool with_swa = true) {
    for (size_t b = 0; b < chain.size(); ++b) {
      const std::optional<Sha256Digest> parent =
          b > 0 ? std::optional<Sha256Digest>(chain[b - 1]) : std::nullopt;
      ASSERT_TRUE(
          store.Write(chain[b], parent, Region::kBlockKv, std::string(bytes, 'k' + b)).ok());
      if (with_swa) {
        ASSERT_TRUE(
            store.Write(chain[b], parent, Region::kProducerSwa, std::string(bytes, 's')).ok());
      }
    }
  }
  // Replaces the block-KV value of `key` behind the store's back (the store must be closed)
  // with what `edit` makes of it.
  void RewriteBlockKv(const Sha256Digest& key, const Sha256Digest& new_key,
                      const std::function<void(std::string&)>& edit) {
    rocksdb::DB* db = nullptr;
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    std::vector<rocksdb::ColumnFamilyDescriptor> descriptors = {
        {rocksdb::kDefaultColumnFamilyName, {}}, {"block_kv", {}}, {"producer_swa", {}}};
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), path_, descriptors, &handles, &db).ok());
    std::string value;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), handles[1], Slice(key), &value).ok());
    edit(value);
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), handles[1], Slice(new_key), value).ok());
    for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
    delete db;
  }
  static rocksdb::Slice Slice(const Sha256Digest& key) {
    return rocksdb::Slice(reinterpret_cast<const char*>(key.data()), key.size());
  }

  static constexpr uint64_t kPayload = 1000;
  std::string path_;
};

// `payload` with float `index` replaced by `value`.
std::string WithFloat(std::string payload, size_t index, float value) {
  std::memcpy(payload.data() + 4 * index, &value, 4);
  return payload;
}

TEST_F(PrefixStoreTest, ValuesRoundTripAndSurviveARestart) {
  const auto chain = ChainKeys("fp", "", "", Tokens(64), 16);
  {
    auto store = Open();
    WriteChain(*store, chain);
    const ChainLookup lookup = store->Lookup(chain);
    EXPECT_EQ(lookup.block_kv_blocks, 4);
    EXPECT_THAT(lookup.swa_present, ::testing::Each(true));
    EXPECT_EQ(store->counters().block_kv_values, 4u);
    EXPECT_EQ(store->counters().producer_swa_values, 4u);
  }
  auto reopened = Open();
  EXPECT_EQ(reopened->Lookup(chain).block_kv_blocks, 4);
  auto payload = reopened->Read(chain[2], Region::kBlockKv);
  ASSERT_TRUE(payload.ok());
  EXPECT_EQ(*payload, std::string(1000, 'k' + 2));
  EXPECT_EQ(reopened->counters().hits, 1u);
  EXPECT_EQ(
      reopened->Read(ChainKeys("fp", "", "x", Tokens(16), 16)[0], Region::kBlockKv).status().code(),
      absl::StatusCode::kNotFound);
  EXPECT_EQ(reopened->counters().misses, 1u);
}

// The bytes of the store's table files (what compression shrinks; the write-ahead log is not).
uint64_t TableBytes(const std::string& path) {
  uint64_t bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    if (entry.path().extension() == ".sst") bytes += entry.file_size();
  }
  return bytes;
}

// --compression: each one this RocksDB build has stores values that read back after a restart
// under any other (RocksDB reads each table file by its own compression), a compressing one
// shrinks compressible values on disk, and one the build lacks is refused by name.
TEST_F(PrefixStoreTest, EveryCompressionTheBuildHasReadsBackAndOneItLacksIsRefused) {
  const auto chain = ChainKeys("fp", "", "", Tokens(64), 16);
  std::vector<StoreCompression> supported;
  std::map<StoreCompression, uint64_t> table_bytes;
  for (StoreCompression compression : {StoreCompression::kNone, StoreCompression::kSnappy,
                                       StoreCompression::kLz4, StoreCompression::kZstd}) {
    std::filesystem::remove_all(path_);
    StoreOptions options{.path = path_,
                         .model_fingerprint = "fp",
                         .block_kv_payload_bytes = kPayload,
                         .producer_swa_payload_bytes = kPayload,
                         .compression = compression};
    auto store = PrefixStore::Open(options);
    if (!store.ok()) {
      EXPECT_THAT(
          std::string(store.status().message()),
          ::testing::HasSubstr(absl::StrCat("--compression: this RocksDB build has no ",
                                            StoreCompressionName(compression), "; it has: none")));
      EXPECT_NE(compression, StoreCompression::kNone);
      continue;
    }
    supported.push_back(compression);
    WriteChain(**store, chain);
    store->reset();
    // Reopened: the write-ahead log is flushed into a table file under this compression.
    ASSERT_TRUE(PrefixStore::Open(options).ok());
    table_bytes[compression] = TableBytes(path_);
    for (StoreCompression other : supported) {
      options.compression = other;
      auto reopened = PrefixStore::Open(options);
      ASSERT_TRUE(reopened.ok()) << reopened.status();
      auto payload = (*reopened)->Read(chain[3], Region::kBlockKv);
      ASSERT_TRUE(payload.ok()) << StoreCompressionName(compression) << " read under "
                                << StoreCompressionName(other);
      EXPECT_EQ(*payload, std::string(kPayload, 'k' + 3));
    }
  }
  ASSERT_FALSE(supported.empty());
  if (table_bytes.count(StoreCompression::kZstd) > 0) {
    // Eight values of 1,000 repeated bytes: zstd keeps a small part of what none writes.
    EXPECT_LT(2 * table_bytes[StoreCompression::kZstd], table_bytes[StoreCompression::kNone]);
  }
}

TEST_F(PrefixStoreTest, OnlyTheTwoStoredRegionsHaveColumnFamilies) {
  { Open(); }
  std::vector<std::string> families;
  ASSERT_TRUE(rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), path_, &families).ok());
  EXPECT_THAT(families, ::testing::UnorderedElementsAre("default", "block_kv", "producer_swa"));
}

TEST_F(PrefixStoreTest, CorruptValueIsACountedMissNotACrash) {
  const auto chain = ChainKeys("fp", "", "", Tokens(32), 16);
  { WriteChain(*Open(), chain); }
  // Flip one payload byte of block 1's block KV.
  RewriteBlockKv(chain[1], chain[1], [](std::string& value) { value.back() ^= 0x5a; });
  auto store = Open();  // the scan at open finds it and drops it
  EXPECT_EQ(store->counters().corrupt_values, 1u);
  EXPECT_EQ(store->Lookup(chain).block_kv_blocks, 1);
  EXPECT_FALSE(store->Read(chain[1], Region::kBlockKv).ok());
  EXPECT_TRUE(store->Read(chain[0], Region::kBlockKv).ok());
}

TEST_F(PrefixStoreTest, WritesThatBreakTheChainOrTheLayoutAreRefusedAndStoreNothing) {
  const auto chain = ChainKeys("fp", "", "", Tokens(32), 16);
  const std::string good(kPayload, 'k');
  auto store = Open();
  struct Case {
    std::optional<Sha256Digest> parent;
    std::string payload;
    absl::StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {chain[1], good, absl::StatusCode::kInvalidArgument, "parent: equals the key"},
      {std::nullopt, std::string(kPayload - 4, 'k'), absl::StatusCode::kInvalidArgument,
       "payload: 996 bytes; a block_kv value of this model is exactly 1000 bytes"},
      {std::nullopt, std::string(kPayload + 4, 'k'), absl::StatusCode::kInvalidArgument,
       "payload: 1004 bytes"},
      {std::nullopt, WithFloat(good, 7, std::numeric_limits<float>::quiet_NaN()),
       absl::StatusCode::kInvalidArgument, "payload: float 7 is NaN or Inf"},
      {std::nullopt, WithFloat(good, 0, -std::numeric_limits<float>::infinity()),
       absl::StatusCode::kInvalidArgument, "payload: float 0 is NaN or Inf"},
  };
  for (const Case& c : cases) {
    const absl::Status status = store->Write(chain[1], c.parent, Region::kBlockKv, c.payload);
    EXPECT_EQ(status.code(), c.code) << c.message;
    EXPECT_THAT(status.message(), ::testing::HasSubstr(c.message));
  }
  const StoreCounters counters = store->counters();
  EXPECT_EQ(counters.stored_bytes, 0u);
  EXPECT_EQ(counters.block_kv_values, 0u);
  EXPECT_EQ(counters.bytes_written, 0u);
  // The same value as a chain root, then its child, are stored.
  EXPECT_TRUE(store->Write(chain[0], std::nullopt, Region::kBlockKv, good).ok());
  EXPECT_TRUE(store->Write(chain[1], chain[0], Region::kBlockKv, good).ok());
  EXPECT_EQ(store->Lookup(chain).block_kv_blocks, 2);
}

TEST_F(PrefixStoreTest, SelfParentWritesCannotPinValuesPastTheBudget) {
  // A value that were its own parent would never be a leaf, so never evicted: twenty such
  // 12 KB writes used to leave 241,780 bytes under a 30,000-byte budget.
  const uint64_t payload = 12 * 1024;
  auto store = Open(/*budget=*/30000, payload);
  const auto keys = ChainKeys("fp", "", "", Tokens(20 * 16), 16);
  for (const Sha256Digest& key : keys) {
    EXPECT_EQ(store->Write(key, key, Region::kBlockKv, std::string(payload, 'k')).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(store->Write(key, std::nullopt, Region::kBlockKv, std::string(payload, 'k')).ok());
  }
  EXPECT_LE(store->counters().stored_bytes, 30000u);
  EXPECT_GT(store->counters().evictions, 0u);
}

TEST_F(PrefixStoreTest, NonFiniteValueReadsAsACountedMiss) {
  const auto chain = ChainKeys("fp", "", "", Tokens(32), 16);
  { WriteChain(*Open(), chain); }
  // Block 1: NaN in the payload under a checksum recomputed as the store computes it, so that
  // only the finiteness check can catch it.
  RewriteBlockKv(chain[1], chain[1], [&](std::string& value) {
    const float nan = std::nanf("");
    std::memcpy(value.data() + kValueHeaderBytes + 12, &nan, 4);
    const std::string_view v(value);
    const uint64_t checksum =
        ChecksumParts({std::string_view(reinterpret_cast<const char*>(chain[1].data()), 32),
                       v.substr(0, kValueChecksumOffset), v.substr(kValueChecksumOffset + 8)});
    std::memcpy(value.data() + kValueChecksumOffset, &checksum, 8);
  });
  // Block 0: a value of the first format (version 1, checksum of the payload alone) whose
  // payload became Inf; that old checksum is valid for the payload as it is now.
  RewriteBlockKv(chain[0], chain[0], [](std::string& value) {
    const uint32_t version = 1;
    std::memcpy(value.data() + 4, &version, 4);
    const float inf = std::numeric_limits<float>::infinity();
    std::memcpy(value.data() + kValueHeaderBytes, &inf, 4);
    const uint64_t checksum =
        Checksum(value.data() + kValueHeaderBytes, value.size() - kValueHeaderBytes);
    std::memcpy(value.data() + kValueChecksumOffset, &checksum, 8);
  });
  auto store = Open();
  EXPECT_EQ(store->Read(chain[1], Region::kBlockKv).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Read(chain[0], Region::kBlockKv).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->counters().corrupt_values, 2u);
  EXPECT_EQ(store->counters().misses, 2u);
  EXPECT_TRUE(store->Read(chain[1], Region::kProducerSwa).ok());  // the other region is intact
}

TEST_F(PrefixStoreTest, ChecksumCoversTheKey) {
  const auto chain = ChainKeys("fp", "", "", Tokens(32), 16);
  { WriteChain(*Open(), {chain[0]}); }
  // The whole, valid value of block 0 copied under block 1's key.
  RewriteBlockKv(chain[0], chain[1], [](std::string&) {});
  auto store = Open();
  EXPECT_EQ(store->counters().corrupt_values, 1u);
  EXPECT_EQ(store->Read(chain[1], Region::kBlockKv).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store->Read(chain[0], Region::kBlockKv).ok());
}

TEST_F(PrefixStoreTest, BudgetEvictsLeavesFirstAndSwaBeforeBlockKv) {
  const auto old_chain = ChainKeys("fp", "", "", Tokens(64), 16);
  const auto new_chain = ChainKeys("fp", "", "", Tokens(64, 1), 16);
  // Values are 1,000 payload bytes plus an 89-byte header; the budget holds 13 of 16.
  auto store = Open(/*budget=*/13 * 1089 + 50);
  WriteChain(*store, old_chain);
  WriteChain(*store, new_chain);
  const StoreCounters c = store->counters();
  EXPECT_LE(c.stored_bytes, store->budget_bytes());
  EXPECT_EQ(c.evictions, 3u);
  // The newest chain is whole; the old one lost its leaf (SWA rows, then block KV), then the
  // SWA rows of the block that became the leaf.
  EXPECT_EQ(store->Lookup(new_chain).block_kv_blocks, 4);
  const ChainLookup old = store->Lookup(old_chain);
  EXPECT_EQ(old.block_kv_blocks, 3);
  EXPECT_EQ(old.swa_present, std::vector<bool>({true, true, false}));
}

// A fleet node holds the blocks it owns, whose parents are usually on other nodes: a write
// whose parent is not held here is kept, and its link counts once the parent arrives (the
// parent is then no leaf, so it outlives its child).
TEST_F(PrefixStoreTest, AWriteWhoseParentIsElsewhereIsKeptAndLinkedWhenTheParentArrives) {
  const auto chain = ChainKeys("fp", "", "", Tokens(48), 16);  // 3 blocks
  auto store = Open(/*budget=*/2 * 1089 + 50);
  ASSERT_TRUE(store->Write(chain[2], chain[1], Region::kBlockKv, std::string(kPayload, 'c')).ok());
  EXPECT_TRUE(store->Read(chain[2], Region::kBlockKv).ok());
  EXPECT_EQ(store->Lookup(chain).block_kv_blocks, 0);  // nothing reads past a missing block
  ASSERT_TRUE(store->Write(chain[1], chain[0], Region::kBlockKv, std::string(kPayload, 'b')).ok());
  // Block 1 is block 2's parent, so not a leaf: a third value evicts block 2, the leaf, though
  // block 1 was written after it.
  ASSERT_TRUE(
      store->Write(chain[0], std::nullopt, Region::kBlockKv, std::string(kPayload, 'a')).ok());
  EXPECT_EQ(store->counters().evictions, 1u);
  EXPECT_EQ(store->Lookup(chain).block_kv_blocks, 2);
  EXPECT_FALSE(store->Read(chain[2], Region::kBlockKv).ok());
}

// Probe answers per key and per region, and touches what it finds from the chain's end back,
// so that where every held block is a leaf (their children on other nodes) the budget takes a
// chain from its end, never its first block while later ones stay.
TEST_F(PrefixStoreTest, ProbeIsPerKeyAndKeepsAChainsFirstBlocksLongest) {
  const auto chain = ChainKeys("fp", "", "", Tokens(48), 16);  // 3 blocks
  const auto other = ChainKeys("fp", "", "", Tokens(16, 5), 16);
  const auto third = ChainKeys("fp", "", "", Tokens(16, 9), 16);
  auto store = Open(/*budget=*/3 * 1089 + 50);
  // Blocks 0 and 2 here, both leaves (block 1 lives elsewhere); block 0 first, so the older.
  ASSERT_TRUE(
      store->Write(chain[0], std::nullopt, Region::kBlockKv, std::string(kPayload, 'a')).ok());
  ASSERT_TRUE(store->Write(chain[2], chain[1], Region::kBlockKv, std::string(kPayload, 'c')).ok());
  ASSERT_TRUE(
      store->Write(chain[2], chain[1], Region::kProducerSwa, std::string(kPayload, 's')).ok());
  const std::vector<PrefixStore::Presence> held = store->Probe(chain);
  ASSERT_EQ(held.size(), 3u);
  EXPECT_TRUE(held[0].block_kv);
  EXPECT_FALSE(held[0].producer_swa);
  EXPECT_FALSE(held[1].block_kv || held[1].producer_swa);
  EXPECT_TRUE(held[2].block_kv && held[2].producer_swa);
  // The probe used block 2, then block 0: block 0 is now the more recent leaf, and a value
  // past the budget takes block 2's values (SWA rows first), not block 0.
  ASSERT_TRUE(
      store->Write(other[0], std::nullopt, Region::kBlockKv, std::string(kPayload, 'o')).ok());
  EXPECT_EQ(store->counters().evictions, 1u);
  ASSERT_TRUE(
      store->Write(third[0], std::nullopt, Region::kBlockKv, std::string(kPayload, 't')).ok());
  EXPECT_EQ(store->counters().evictions, 2u);
  const std::vector<PrefixStore::Presence> after = store->Probe(chain);
  EXPECT_TRUE(after[0].block_kv);
  EXPECT_FALSE(after[2].block_kv || after[2].producer_swa);
}

// Two models' values side by side (a blue/green rollout): a read gets only its own model's
// values; another model's value is a miss that stays (not corrupt); both share one budget,
// evicted by recency; and both survive a reopen by a store whose own model is a third.
TEST_F(PrefixStoreTest, SeveralModelsShareTheStoreAndItsBudget) {
  const Sha256Digest blue = ChainKeys("blue", "", "", Tokens(16), 16)[0];
  const Sha256Digest green = ChainKeys("green", "", "", Tokens(16), 16)[0];
  const Sha256Digest green_2 = ChainKeys("green", "", "", Tokens(16, 3), 16)[0];
  const std::string payload(kPayload, 'p');
  {
    auto store = Open(/*budget=*/3 * 1089 + 50);  // its own model: "fp"
    ASSERT_TRUE(store->Write(blue, std::nullopt, Region::kBlockKv, payload, "blue").ok());
    ASSERT_TRUE(store->Write(green, std::nullopt, Region::kBlockKv, payload, "green").ok());
    EXPECT_TRUE(store->Read(blue, Region::kBlockKv, "blue").ok());  // blue is now the newer
    EXPECT_EQ(store->Read(blue, Region::kBlockKv, "green").status().code(),
              absl::StatusCode::kNotFound);
    EXPECT_EQ(store->Read(blue, Region::kBlockKv).status().code(), absl::StatusCode::kNotFound);
    EXPECT_TRUE(store->Read(blue, Region::kBlockKv, "blue").ok());  // still there
    EXPECT_EQ(store->counters().corrupt_values, 0u);
    // A key is one model's: another model's write of it is refused, its own is taken again.
    EXPECT_EQ(store->Write(blue, std::nullopt, Region::kBlockKv, payload, "green").code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(store->Write(blue, std::nullopt, Region::kBlockKv, payload, "blue").ok());
    // A third value and one more: the budget takes the least recently used, green's.
    ASSERT_TRUE(store->Write(green_2, std::nullopt, Region::kBlockKv, payload, "green").ok());
    ASSERT_TRUE(store->Write(blue, std::nullopt, Region::kProducerSwa, payload, "blue").ok());
    EXPECT_EQ(store->counters().evictions, 1u);
    EXPECT_FALSE(store->Read(green, Region::kBlockKv, "green").ok());
    EXPECT_TRUE(store->Read(green_2, Region::kBlockKv, "green").ok());
  }
  auto reopened = Open();
  EXPECT_TRUE(reopened->Read(blue, Region::kBlockKv, "blue").ok());
  EXPECT_TRUE(reopened->Read(blue, Region::kProducerSwa, "blue").ok());
  EXPECT_TRUE(reopened->Read(green_2, Region::kBlockKv, "green").ok());
  EXPECT_EQ(reopened->counters().corrupt_values, 0u);
  EXPECT_TRUE(reopened->Verify().ok());
}

TEST_F(PrefixStoreTest, EvictedSwaRowsOfTheLastNeededBlockBackOffExactlyOneBlock) {
  const auto chain = ChainKeys("fp", "", "", Tokens(80), 16);  // 5 blocks
  const HitPolicyInput input{.prompt_len = 110,
                             .keep = 22,
                             .truncation_on = true,
                             .ring_capacity = 22,
                             .window = 16,
                             .block_size = 16};
  {
    auto store = Open();
    WriteChain(*store, chain);
    EXPECT_EQ(HitBlocks(input, store->Lookup(chain)), 5);  // cap floor(88 / 16) = 5
  }
  // A budget one value short: the leaf (block 4) loses its SWA rows and keeps its block KV.
  auto store = Open(/*budget=*/9 * 1089 + 50);
  const ChainLookup lookup = store->Lookup(chain);
  EXPECT_EQ(lookup.block_kv_blocks, 5);
  EXPECT_FALSE(lookup.swa_present[4]);
  EXPECT_EQ(HitBlocks(input, lookup), 4);
}

TEST(HitPolicyTest, CapAndQualification) {
  // B = 16, W = 16, C = 22, K = 30.
  auto hit = [](int64_t L, int64_t present, std::vector<bool> swa, HitCap cap) {
    ChainLookup lookup{present, std::move(swa)};
    return HitBlocks({.prompt_len = L,
                      .keep = 30,
                      .truncation_on = true,
                      .ring_capacity = 22,
                      .window = 16,
                      .block_size = 16,
                      .cap = cap},
                     lookup);
  };
  const std::vector<bool> all(10, true);
  EXPECT_EQ(hit(100, 10, all, HitCap::kRing), (100 - 22) / 16);  // 4
  EXPECT_EQ(hit(100, 10, all, HitCap::kKeep), (100 - 30) / 16);  // 4
  EXPECT_EQ(hit(102, 10, all, HitCap::kRing), 5);
  EXPECT_EQ(hit(102, 10, all, HitCap::kKeep), 4);
  EXPECT_EQ(hit(100, 2, all, HitCap::kRing), 2);  // fewer blocks present than the cap
  EXPECT_EQ(hit(21, 10, all, HitCap::kRing), 0);  // L < C
  // SWA rows of block 3 missing: h = 4 needs blocks [(64 - 15) / 16, 4) = [3, 4): back off.
  std::vector<bool> hole = all;
  hole[3] = false;
  EXPECT_EQ(hit(100, 10, hole, HitCap::kRing), 3);
  // No hit without truncation.
  EXPECT_EQ(HitBlocks({.prompt_len = 100,
                       .keep = 0,
                       .truncation_on = false,
                       .ring_capacity = 22,
                       .window = 16,
                       .block_size = 16},
                      {10, all}),
            0);
  // Uncapped: floor((L - 1) / B), the last prompt token always computed; SWA still qualifies.
  EXPECT_EQ(hit(100, 10, all, HitCap::kNone), 99 / 16);  // 6
  EXPECT_EQ(hit(97, 10, all, HitCap::kNone), 6);
  EXPECT_EQ(hit(96, 10, all, HitCap::kNone), 5);
  // h = 6 needs the SWA rows of block 5 only, so the hole at 3 does not matter; one at 5 does.
  EXPECT_EQ(hit(100, 10, hole, HitCap::kNone), 6);
  std::vector<bool> hole5 = all;
  hole5[5] = false;
  EXPECT_EQ(hit(100, 10, hole5, HitCap::kNone), 5);
}

TEST(HitPolicyTest, CapNamesParseAndOnlyRingAndKeepAreChoices) {
  EXPECT_EQ(*ParseHitCap("ring", "--hit-cap"), HitCap::kRing);
  EXPECT_EQ(*ParseHitCap("keep", "--hit-cap"), HitCap::kKeep);
  for (HitCap cap : {HitCap::kRing, HitCap::kKeep}) {
    EXPECT_EQ(*ParseHitCap(HitCapName(cap), "f"), cap);
  }
  const absl::StatusOr<HitCap> none = ParseHitCap("none", "--hit-cap");
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()),
              ::testing::HasSubstr("--hit-cap: 'none' is unknown; allowed: ring, keep"));
}

// The prefill node's reads and write-back, which `batonctl simulate` replays through the same
// functions: block KV of [0, h), producer SWA from the first block the window reaches.
TEST(HitPolicyTest, ReadsAndWriteBackOfAHit) {
  // h = 4 blocks of B = 16, W = 16: the rows after H = 64 attend back to 49, block 3.
  HitReads reads = ReadsForHit(4, 16, 16);
  EXPECT_EQ(reads.block_kv_end, 4);
  EXPECT_EQ(reads.producer_swa_begin, 3);
  EXPECT_EQ(reads.producer_swa_end, 4);
  // W = 40 reaches back to 25: blocks [1, 4). A window wider than the hit reads all of it.
  EXPECT_EQ(ReadsForHit(4, 40, 16).producer_swa_begin, 1);
  EXPECT_EQ(ReadsForHit(4, 128, 16).producer_swa_begin, 0);
  // No hit, no reads.
  reads = ReadsForHit(0, 16, 16);
  EXPECT_EQ(reads.block_kv_end, 0);
  EXPECT_EQ(reads.producer_swa_end, 0);

  const std::vector<WriteBackStep> steps = WriteBackSteps(2, 4);
  ASSERT_EQ(steps.size(), 4u);  // blocks 2 and 3, each block KV then producer SWA
  EXPECT_EQ(steps[0].block, 2);
  EXPECT_EQ(steps[0].parent, 1);
  EXPECT_EQ(steps[0].region, Region::kBlockKv);
  EXPECT_EQ(steps[1].block, 2);
  EXPECT_EQ(steps[1].region, Region::kProducerSwa);
  EXPECT_EQ(steps[3].block, 3);
  EXPECT_EQ(steps[3].parent, 2);
  const std::vector<WriteBackStep> cold = WriteBackSteps(0, 1);
  ASSERT_EQ(cold.size(), 2u);
  EXPECT_EQ(cold[0].parent, -1);  // the first block has no parent
  EXPECT_TRUE(WriteBackSteps(3, 3).empty());
}

}  // namespace
}  // namespace baton::kvstore
