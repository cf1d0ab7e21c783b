// The prefix store's eviction index on its own: presence and lookup, byte accounting, and the
// eviction order (least recently used leaf first, its producer SWA value before its block KV,
// a parent becoming a leaf once its last child is gone).
#include "baton/kvstore/prefix_index.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::kvstore {
namespace {

// Stands in for chain keys: block `b` of chain `chain`.
Sha256Digest Key(int chain, int b) {
  const std::string text = std::to_string(chain) + "/" + std::to_string(b);
  return Sha256Of(text.data(), text.size());
}

std::optional<Sha256Digest> Parent(int chain, int b) {
  return b > 0 ? std::optional<Sha256Digest>(Key(chain, b - 1)) : std::nullopt;
}

// Adds blocks [0, n) of `chain`, each with block KV of `kv_bytes` and SWA of `swa_bytes`.
void AddChain(PrefixIndex& index, int chain, int n, uint64_t kv_bytes = 100,
              uint64_t swa_bytes = 10) {
  for (int b = 0; b < n; ++b) {
    index.Add(Key(chain, b), Parent(chain, b), Region::kBlockKv, kv_bytes);
    index.Add(Key(chain, b), Parent(chain, b), Region::kProducerSwa, swa_bytes);
  }
}

using Evicted = std::vector<std::pair<Sha256Digest, Region>>;

Evicted EvictTo(PrefixIndex& index, uint64_t budget) {
  Evicted evicted;
  const uint64_t n = index.EvictToBudget(
      budget,
      [&](const Sha256Digest& key, Region region, uint64_t) { evicted.emplace_back(key, region); });
  EXPECT_EQ(n, evicted.size());
  return evicted;
}

std::vector<Sha256Digest> Chain(int chain, int n) {
  std::vector<Sha256Digest> keys;
  for (int b = 0; b < n; ++b) keys.push_back(Key(chain, b));
  return keys;
}

TEST(PrefixIndexTest, LookupCountsLeadingBlockKvAndReportsSwa) {
  PrefixIndex index;
  AddChain(index, 0, 3);
  index.Remove(Key(0, 1), Region::kProducerSwa);
  ChainLookup lookup = index.Lookup(Chain(0, 5));
  EXPECT_EQ(lookup.block_kv_blocks, 3);
  EXPECT_EQ(lookup.swa_present, std::vector<bool>({true, false, true}));
  index.Remove(Key(0, 1), Region::kBlockKv);  // a hole: block 2 is no longer reachable
  lookup = index.Lookup(Chain(0, 5));
  EXPECT_EQ(lookup.block_kv_blocks, 1);
  EXPECT_TRUE(index.Contains(Key(0, 2), Region::kBlockKv));
  EXPECT_FALSE(index.Contains(Key(0, 1), Region::kBlockKv));
}

TEST(PrefixIndexTest, AccountsBytesAndValues) {
  PrefixIndex index;
  AddChain(index, 0, 2, 100, 10);
  EXPECT_EQ(index.stored_bytes(), 220u);
  EXPECT_EQ(index.values(Region::kBlockKv), 2u);
  EXPECT_EQ(index.values(Region::kProducerSwa), 2u);
  EXPECT_EQ(index.nodes(), 2u);
  index.Add(Key(0, 1), Parent(0, 1), Region::kBlockKv, 150);  // a present value: new size
  EXPECT_EQ(index.stored_bytes(), 270u);
  EXPECT_EQ(index.values(Region::kBlockKv), 2u);
  index.Remove(Key(0, 1), Region::kBlockKv);
  index.Remove(Key(0, 1), Region::kBlockKv);  // absent: no-op
  index.Remove(Key(0, 1), Region::kProducerSwa);
  EXPECT_EQ(index.stored_bytes(), 110u);
  EXPECT_EQ(index.nodes(), 1u);
}

TEST(PrefixIndexTest, LeastRecentlyUsedLeafLosesSwaFirstThenBlockKv) {
  PrefixIndex index;
  AddChain(index, 0, 2);  // 220 bytes
  AddChain(index, 1, 2);  // 220 bytes, newer
  // Over a 400-byte budget by 40: chain 0's leaf (block 1) loses SWA (10), then KV (100).
  EXPECT_EQ(EvictTo(index, 400),
            Evicted({{Key(0, 1), Region::kProducerSwa}, {Key(0, 1), Region::kBlockKv}}));
  EXPECT_EQ(index.stored_bytes(), 330u);
  // Block 0 of chain 0 became a leaf, with its own (oldest) recency: it goes next.
  EXPECT_EQ(EvictTo(index, 300),
            Evicted({{Key(0, 0), Region::kProducerSwa}, {Key(0, 0), Region::kBlockKv}}));
  EXPECT_EQ(index.Lookup(Chain(1, 2)).block_kv_blocks, 2);
}

TEST(PrefixIndexTest, LookupAndTouchRenewRecency) {
  PrefixIndex index;
  AddChain(index, 0, 1);
  AddChain(index, 1, 1);
  AddChain(index, 2, 1);
  index.Lookup(Chain(0, 1));  // chain 0 is now the newest
  index.Touch(Key(1, 0));     // then chain 1
  EXPECT_EQ(EvictTo(index, 330 - 10), Evicted({{Key(2, 0), Region::kProducerSwa}}));
  EXPECT_EQ(EvictTo(index, 0), Evicted({{Key(2, 0), Region::kBlockKv},
                                        {Key(0, 0), Region::kProducerSwa},
                                        {Key(0, 0), Region::kBlockKv},
                                        {Key(1, 0), Region::kProducerSwa},
                                        {Key(1, 0), Region::kBlockKv}}));
  EXPECT_EQ(index.nodes(), 0u);
  EXPECT_EQ(index.stored_bytes(), 0u);
}

TEST(PrefixIndexTest, InteriorBlocksWaitForTheirLeaves) {
  PrefixIndex index;
  AddChain(index, 0, 3);
  index.Touch(Key(0, 0));  // the newest use is on an interior block: it still is not a leaf
  AddChain(index, 1, 1);
  EXPECT_EQ(EvictTo(index, 440 - 1), Evicted({{Key(0, 2), Region::kProducerSwa}}));
}

TEST(PrefixIndexTest, ChildAddedBeforeItsParentCountsOnceTheParentComes) {
  // As the scan at open meets them: block 1 first, then block 0.
  PrefixIndex index;
  index.Add(Key(0, 1), Parent(0, 1), Region::kBlockKv, 100);
  index.Add(Key(0, 0), Parent(0, 0), Region::kBlockKv, 100);
  // Block 0 is newer but has a child, so block 1 goes first.
  EXPECT_EQ(EvictTo(index, 100), Evicted({{Key(0, 1), Region::kBlockKv}}));
  EXPECT_EQ(EvictTo(index, 0), Evicted({{Key(0, 0), Region::kBlockKv}}));
}

TEST(PrefixIndexTest, ParentDroppedOutOfOrderIsInteriorAgainWhenRewritten) {
  PrefixIndex index;
  AddChain(index, 0, 2);
  // Block 0 dropped as if corrupt while block 1 stays, then written again by a later prefill.
  index.Remove(Key(0, 0), Region::kBlockKv);
  index.Remove(Key(0, 0), Region::kProducerSwa);
  EXPECT_EQ(index.nodes(), 1u);
  AddChain(index, 0, 1);
  // Block 0 is the newest but still the parent of block 1: block 1 goes first.
  EXPECT_EQ(EvictTo(index, 110),
            Evicted({{Key(0, 1), Region::kProducerSwa}, {Key(0, 1), Region::kBlockKv}}));
}

}  // namespace
}  // namespace baton::kvstore
