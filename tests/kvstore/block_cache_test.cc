// A prefill node's local block cache on its own: a value comes back exactly as put and only
// while it passes the store's checks, the budget holds with the store's eviction order, and
// the cache events (modelled on vLLM's KV events) tell exactly what it holds and drops, in
// numbered batches with snapshots where a router could have missed something.
#include "baton/kvstore/block_cache.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>

#include "baton/kvstore/chain.h"
#include "gtest/gtest.h"

namespace baton::kvstore {
namespace {

constexpr uint64_t kKvBytes = 64, kSwaBytes = 16;
constexpr int64_t kBlock = 4;

Sha256Digest Key(int chain, int b) {
  const std::string text = std::to_string(chain) + "/" + std::to_string(b);
  return Sha256Of(text.data(), text.size());
}

std::optional<Sha256Digest> Parent(int chain, int b) {
  return b > 0 ? std::optional<Sha256Digest>(Key(chain, b - 1)) : std::nullopt;
}

// `bytes` of float32 values, each `value`.
std::string Payload(uint64_t bytes, float value) {
  std::string payload(bytes, '\0');
  for (uint64_t i = 0; i + 4 <= bytes; i += 4) std::memcpy(payload.data() + i, &value, 4);
  return payload;
}

BlockCache MakeCache(uint64_t budget, size_t max_hashes = kMaxCacheEventHashes) {
  return BlockCache(ValueCodec("fingerprint", kKvBytes, kSwaBytes), kBlock, budget, max_hashes);
}

void PutChain(BlockCache& cache, int chain, int n, const std::string& tenant = "t",
              const std::string& salt = "") {
  for (int b = 0; b < n; ++b) {
    cache.Put(Key(chain, b), Parent(chain, b), Region::kBlockKv,
              Payload(kKvBytes, static_cast<float>(chain * 100 + b)), tenant, salt);
    cache.Put(Key(chain, b), Parent(chain, b), Region::kProducerSwa,
              Payload(kSwaBytes, static_cast<float>(-b)), tenant, salt);
  }
}

// What a batch says the cache holds, applied to `held` (as a router's index would).
void Apply(const v1::CacheEventBatch& batch, std::set<std::pair<std::string, int>>& held) {
  for (const v1::CacheEvent& event : batch.events()) {
    if (event.has_all_blocks_cleared()) held.clear();
    if (event.has_block_stored()) {
      for (const std::string& h : event.block_stored().block_hashes()) {
        held.insert({h, event.block_stored().cache_group()});
      }
    }
    if (event.has_block_removed()) {
      for (const std::string& h : event.block_removed().block_hashes()) {
        held.erase({h, event.block_removed().cache_group()});
      }
    }
  }
}

TEST(BlockCacheTest, GivesBackWhatWasPutAndNothingElse) {
  BlockCache cache = MakeCache(1 << 20);
  PutChain(cache, 1, 3);
  EXPECT_EQ(cache.Get(Key(1, 2), Region::kBlockKv), Payload(kKvBytes, 102));
  EXPECT_EQ(cache.Get(Key(1, 1), Region::kProducerSwa), Payload(kSwaBytes, -1));
  EXPECT_FALSE(cache.Get(Key(1, 3), Region::kBlockKv).has_value());
  EXPECT_FALSE(cache.Get(Key(2, 0), Region::kBlockKv).has_value());
  // A payload of another size than its region's is not held.
  cache.Put(Key(3, 0), std::nullopt, Region::kBlockKv, Payload(kKvBytes - 4, 1), "t", "");
  EXPECT_FALSE(cache.Contains(Key(3, 0), Region::kBlockKv));
  const BlockCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.hits, 2u);
  EXPECT_EQ(stats.misses, 2u);
  EXPECT_EQ(stats.blocks, 6u);
  EXPECT_EQ(stats.bytes, 3 * (StoredValueBytes(kKvBytes) + StoredValueBytes(kSwaBytes)));
}

TEST(BlockCacheTest, AValueThatFailsTheStoresChecksIsDroppedNotServed) {
  BlockCache cache = MakeCache(1 << 20);
  (void)cache.TakeEvents();  // the first batch (a snapshot) is out of the way
  // A NaN is what a bad kernel writes; the store refuses it, and so does the cache.
  cache.Put(Key(1, 0), std::nullopt, Region::kBlockKv,
            Payload(kKvBytes, std::numeric_limits<float>::quiet_NaN()), "t", "");
  EXPECT_FALSE(cache.Get(Key(1, 0), Region::kBlockKv).has_value());
  EXPECT_FALSE(cache.Contains(Key(1, 0), Region::kBlockKv));
  EXPECT_EQ(cache.stats().corrupt, 1u);
  // The router hears it was stored and then removed: it holds nothing of it.
  std::set<std::pair<std::string, int>> held;
  Apply(cache.TakeEvents(), held);
  EXPECT_TRUE(held.empty());
}

TEST(BlockCacheTest, BudgetHoldsByEvictingTheLeastRecentlyUsedLeafSwaFirst) {
  const uint64_t block = StoredValueBytes(kKvBytes) + StoredValueBytes(kSwaBytes);
  BlockCache cache = MakeCache(4 * block);
  PutChain(cache, 1, 2);
  PutChain(cache, 2, 2);
  EXPECT_EQ(cache.stats().evictions, 0u);
  ASSERT_TRUE(cache.Get(Key(1, 1), Region::kBlockKv).has_value());  // chain 1 is used again
  PutChain(cache, 3, 1);
  // Chain 2's leaf was the least recently used: its SWA goes first, then its block KV.
  EXPECT_FALSE(cache.Contains(Key(2, 1), Region::kProducerSwa));
  EXPECT_FALSE(cache.Contains(Key(2, 1), Region::kBlockKv));
  EXPECT_TRUE(cache.Contains(Key(2, 0), Region::kBlockKv));
  EXPECT_TRUE(cache.Contains(Key(1, 1), Region::kProducerSwa));
  EXPECT_TRUE(cache.Contains(Key(3, 0), Region::kBlockKv));
  EXPECT_LE(cache.stats().bytes, 4 * block);
  EXPECT_EQ(cache.stats().evictions, 2u);
}

TEST(BlockCacheTest, EventsTellExactlyWhatIsHeldInNumberedBatches) {
  const uint64_t block = StoredValueBytes(kKvBytes) + StoredValueBytes(kSwaBytes);
  BlockCache cache = MakeCache(4 * block);
  PutChain(cache, 1, 2);
  std::set<std::pair<std::string, int>> held;
  // The first batch is a snapshot: it clears, then says what is there.
  const v1::CacheEventBatch first = cache.TakeEvents();
  EXPECT_EQ(first.sequence(), 1u);
  EXPECT_TRUE(first.snapshot());
  ASSERT_GT(first.events_size(), 0);
  EXPECT_TRUE(first.events(0).has_all_blocks_cleared());
  Apply(first, held);
  EXPECT_EQ(held.size(), 4u);

  // A chain of three blocks, in order: one BlockStored per region run, with its parent, the
  // tokens it covers, the tenant and the salt.
  PutChain(cache, 2, 3, "tenant-a", "salt-b");
  const v1::CacheEventBatch second = cache.TakeEvents();
  EXPECT_EQ(second.sequence(), 2u);
  EXPECT_FALSE(second.snapshot());
  int runs = 0;
  for (const v1::CacheEvent& event : second.events()) {
    if (!event.has_block_stored()) continue;
    const v1::BlockStored& stored = event.block_stored();
    EXPECT_EQ(stored.tenant(), "tenant-a");
    EXPECT_EQ(stored.cache_salt(), "salt-b");
    EXPECT_EQ(stored.medium(), "cpu");
    EXPECT_EQ(stored.token_count(), kBlock * stored.block_hashes_size());
    if (stored.block_hashes(0) == KeyBytes(Key(2, 1))) {
      EXPECT_EQ(stored.parent_block_hash(), KeyBytes(Key(2, 0)));
    }
    ++runs;
  }
  // Put alternates regions block by block, so runs do not merge across regions here.
  EXPECT_EQ(runs, 6);
  Apply(second, held);
  // The budget is four blocks and five were put: chain 1's leaf went (two values), each told
  // as removed.
  std::set<std::pair<std::string, int>> truth;
  for (int chain : {1, 2}) {
    for (int b = 0; b < 3; ++b) {
      for (Region r : {Region::kBlockKv, Region::kProducerSwa}) {
        if (cache.Contains(Key(chain, b), r)) {
          truth.insert({KeyBytes(Key(chain, b)), r == Region::kBlockKv
                                                     ? v1::STORE_REGION_BLOCK_KV
                                                     : v1::STORE_REGION_PRODUCER_SWA});
        }
      }
    }
  }
  EXPECT_EQ(held, truth);
  EXPECT_EQ(truth.size(), 8u);
  EXPECT_FALSE(cache.Contains(Key(1, 1), Region::kBlockKv));

  // A router that missed a batch asks for a snapshot: the next batch gives the whole truth.
  cache.Resync();
  const v1::CacheEventBatch third = cache.TakeEvents();
  EXPECT_EQ(third.sequence(), 3u);
  EXPECT_TRUE(third.snapshot());
  std::set<std::pair<std::string, int>> fresh = {{"stale", 1}};
  Apply(third, fresh);
  EXPECT_EQ(fresh, truth);
}

TEST(BlockCacheTest, PendingEventsPastTheirBoundBecomeASnapshot) {
  BlockCache cache = MakeCache(1 << 20, /*max_hashes=*/5);
  (void)cache.TakeEvents();
  PutChain(cache, 1, 3);  // six values: past five hashes
  const v1::CacheEventBatch batch = cache.TakeEvents();
  EXPECT_TRUE(batch.snapshot());
  int hashes = 0;
  for (const v1::CacheEvent& event : batch.events()) {
    hashes += event.block_stored().block_hashes_size();
  }
  // A snapshot is bounded too: the router then knows fewer blocks, never wrong ones.
  EXPECT_LE(hashes, 5);
  std::set<std::pair<std::string, int>> held;
  Apply(batch, held);
  for (const auto& [hash, group] : held) {
    Sha256Digest key;
    std::memcpy(key.data(), hash.data(), key.size());
    EXPECT_TRUE(cache.Contains(
        key, group == v1::STORE_REGION_BLOCK_KV ? Region::kBlockKv : Region::kProducerSwa));
  }
}

}  // namespace
}  // namespace baton::kvstore
