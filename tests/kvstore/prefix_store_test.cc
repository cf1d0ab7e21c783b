// The RocksDB prefix store: chain keys, durable values in two column families, corrupt values
// as counted misses, leaf-first eviction within a budget (SWA rows before block KV).
#include "baton/kvstore/prefix_store.h"

#include <rocksdb/db.h>

#include <filesystem>

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

class PrefixStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = baton::testing::ProcessTempDir() + "/store_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(path_);
  }
  std::unique_ptr<PrefixStore> Open(uint64_t budget = 0) {
    auto store =
        PrefixStore::Open({.path = path_, .model_fingerprint = "fp", .budget_bytes = budget});
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  // Writes blocks [0, n) of a chain with payloads of `bytes` per region.
  void WriteChain(PrefixStore& store, const std::vector<Sha256Digest>& chain, size_t bytes,
                  bool with_swa = true) {
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
  std::string path_;
};

TEST_F(PrefixStoreTest, ValuesRoundTripAndSurviveARestart) {
  const auto chain = ChainKeys("fp", "", "", Tokens(64), 16);
  {
    auto store = Open();
    WriteChain(*store, chain, 1000);
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

TEST_F(PrefixStoreTest, OnlyTheTwoStoredRegionsHaveColumnFamilies) {
  { Open(); }
  std::vector<std::string> families;
  ASSERT_TRUE(rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), path_, &families).ok());
  EXPECT_THAT(families, ::testing::UnorderedElementsAre("default", "block_kv", "producer_swa"));
}

TEST_F(PrefixStoreTest, CorruptValueIsACountedMissNotACrash) {
  const auto chain = ChainKeys("fp", "", "", Tokens(32), 16);
  { WriteChain(*Open(), chain, 500); }
  {
    // Flip one payload byte of block 1's block KV behind the store's back.
    rocksdb::DB* db = nullptr;
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    std::vector<rocksdb::ColumnFamilyDescriptor> descriptors = {
        {rocksdb::kDefaultColumnFamilyName, {}}, {"block_kv", {}}, {"producer_swa", {}}};
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), path_, descriptors, &handles, &db).ok());
    const rocksdb::Slice key(reinterpret_cast<const char*>(chain[1].data()), 32);
    std::string value;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), handles[1], key, &value).ok());
    value.back() ^= 0x5a;
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), handles[1], key, value).ok());
    for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
    delete db;
  }
  auto store = Open();  // the scan at open finds it and drops it
  EXPECT_EQ(store->counters().corrupt_values, 1u);
  EXPECT_EQ(store->Lookup(chain).block_kv_blocks, 1);
  EXPECT_FALSE(store->Read(chain[1], Region::kBlockKv).ok());
  EXPECT_TRUE(store->Read(chain[0], Region::kBlockKv).ok());
}

TEST_F(PrefixStoreTest, BudgetEvictsLeavesFirstAndSwaBeforeBlockKv) {
  const auto old_chain = ChainKeys("fp", "", "", Tokens(64), 16);
  const auto new_chain = ChainKeys("fp", "", "", Tokens(64, 1), 16);
  // Values are 1,000 payload bytes plus an 89-byte header; the budget holds 13 of 16.
  auto store = Open(/*budget=*/13 * 1089 + 50);
  WriteChain(*store, old_chain, 1000);
  WriteChain(*store, new_chain, 1000);
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
    WriteChain(*store, chain, 1000);
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
}

}  // namespace
}  // namespace baton::kvstore
