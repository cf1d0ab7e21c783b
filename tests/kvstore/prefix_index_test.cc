// The prefix store's eviction index on its own: presence and lookup, byte accounting, and the
// eviction order (least recently used leaf first, its producer SWA value before its block KV,
// a parent becoming a leaf once its last child is gone).
#include "baton/kvstore/prefix_index.h"

#include <map>
#include <optional>
#include <random>
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
  const ChainLookup peek = index.Peek(Chain(0, 5));
  EXPECT_EQ(peek.block_kv_blocks, lookup.block_kv_blocks);
  EXPECT_EQ(peek.swa_present, lookup.swa_present);
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

// The index's rules written the slow way, over a forest whose key k names a fixed parent: a
// node's children are the present nodes naming it, and eviction scans for the least recently
// used leaf. What the index must match, whatever structure keeps its order.
class SlowIndex {
 public:
  explicit SlowIndex(std::vector<int> parent) : parent_(std::move(parent)) {}
  void Add(int k, Region region, uint64_t bytes) {
    auto [it, added] = nodes_.try_emplace(k);
    if (added) it->second.last_used = ++clock_;
    it->second.bytes[static_cast<int>(region)] = bytes;
  }
  void Remove(int k, Region region) {
    auto it = nodes_.find(k);
    if (it == nodes_.end()) return;
    it->second.bytes[static_cast<int>(region)] = 0;
    if (it->second.bytes[0] == 0 && it->second.bytes[1] == 0) nodes_.erase(it);
  }
  void Touch(int k) {
    if (auto it = nodes_.find(k); it != nodes_.end()) it->second.last_used = ++clock_;
  }
  // Touches what it finds unless `peek`.
  int64_t Lookup(const std::vector<int>& path, bool peek = false) {
    int64_t found = 0;
    for (int k : path) {
      auto it = nodes_.find(k);
      if (it == nodes_.end() || it->second.bytes[0] == 0) break;
      if (!peek) it->second.last_used = ++clock_;
      ++found;
    }
    return found;
  }
  std::vector<std::pair<int, Region>> EvictTo(uint64_t budget) {
    std::vector<std::pair<int, Region>> evicted;
    while (stored() > budget) {
      std::optional<int> oldest;
      for (const auto& [k, node] : nodes_) {
        bool leaf = true;
        for (const auto& [c, child] : nodes_) leaf = leaf && parent_[c] != k;
        if (leaf && (!oldest || node.last_used < nodes_.at(*oldest).last_used)) oldest = k;
      }
      if (!oldest) break;
      const Region region =
          nodes_.at(*oldest).bytes[1] != 0 ? Region::kProducerSwa : Region::kBlockKv;
      Remove(*oldest, region);
      evicted.emplace_back(*oldest, region);
    }
    return evicted;
  }
  uint64_t stored() const {
    uint64_t sum = 0;
    for (const auto& [k, node] : nodes_) sum += node.bytes[0] + node.bytes[1];
    return sum;
  }
  bool Contains(int k, Region region) const {
    auto it = nodes_.find(k);
    return it != nodes_.end() && it->second.bytes[static_cast<int>(region)] != 0;
  }
  size_t nodes() const { return nodes_.size(); }

 private:
  struct Node {
    uint64_t last_used = 0;
    uint64_t bytes[2] = {0, 0};
  };
  std::vector<int> parent_;  // -1: a root
  std::map<int, Node> nodes_;
  uint64_t clock_ = 0;
};

// Random adds (children before parents too), removals, touches, lookups and evictions over a
// forest of 48 keys: the index evicts what the slow rules evict, in their order, and agrees on
// presence, bytes and nodes after every step.
TEST(PrefixIndexTest, EvictsAsTheSlowRulesDoOverRandomOperations) {
  constexpr int kKeys = 48;
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    std::mt19937 random(seed);
    std::vector<int> parent(kKeys, -1);
    for (int k = 1; k < kKeys; ++k) {
      if (random() % 5 != 0) parent[k] = static_cast<int>(random() % static_cast<uint32_t>(k));
    }
    auto key = [](int k) { return Key(7, k); };
    auto path = [&](int k) {
      std::vector<int> up;
      for (int at = k; at >= 0; at = parent[at]) up.insert(up.begin(), at);
      return up;
    };
    PrefixIndex index;
    SlowIndex slow(parent);
    int evictions = 0;
    for (int step = 0; step < 1500; ++step) {
      const int k = static_cast<int>(random() % kKeys);
      const Region region = random() % 3 == 0 ? Region::kProducerSwa : Region::kBlockKv;
      switch (random() % 6) {
        case 0:
        case 1: {
          const uint64_t bytes = 1 + random() % 100;
          index.Add(key(k), parent[k] < 0 ? std::nullopt : std::optional(key(parent[k])), region,
                    bytes);
          slow.Add(k, region, bytes);
          break;
        }
        case 2:
          index.Remove(key(k), region);
          slow.Remove(k, region);
          break;
        case 3:
          if (random() % 2 == 0) {
            index.Touch(key(k));
            slow.Touch(k);
          } else {
            const bool present = slow.Contains(k, region);
            if (present) slow.Touch(k);
            ASSERT_EQ(index.TouchIfPresent(key(k), region), present) << step;
          }
          break;
        case 4: {
          std::vector<Sha256Digest> chain;
          for (int at : path(k)) chain.push_back(key(at));
          ASSERT_EQ(index.Peek(chain).block_kv_blocks, slow.Lookup(path(k), /*peek=*/true));
          ASSERT_EQ(index.Lookup(chain).block_kv_blocks, slow.Lookup(path(k))) << step;
          break;
        }
        default: {
          const uint64_t budget = slow.stored() * (random() % 4) / 4;
          Evicted expected;
          for (const auto& [at, r] : slow.EvictTo(budget)) expected.emplace_back(key(at), r);
          evictions += static_cast<int>(expected.size());
          ASSERT_EQ(EvictTo(index, budget), expected) << "seed " << seed << " step " << step;
        }
      }
      ASSERT_EQ(index.stored_bytes(), slow.stored()) << step;
      ASSERT_EQ(index.nodes(), slow.nodes()) << step;
      for (int at = 0; at < kKeys; ++at) {
        for (Region r : {Region::kBlockKv, Region::kProducerSwa}) {
          ASSERT_EQ(index.Contains(key(at), r), slow.Contains(at, r)) << step;
        }
      }
    }
    EXPECT_GT(evictions, 100);  // the property was exercised, not skipped
  }
}

}  // namespace
}  // namespace baton::kvstore
