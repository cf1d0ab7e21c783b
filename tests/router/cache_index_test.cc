// The router's cache index (router/cache_index.h) against a plain model of what each node
// holds: after any sequence of stores, removals, snapshots, gaps and forgotten nodes, a node's
// Lookup and the one-walk LookupHolders for the whole cluster both give what the model gives,
// including after the index has swept out retired slots and handed their numbers to new nodes.
#include "baton/router/cache_index.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "baton/kvstore/block_cache.h"
#include "baton/kvstore/chain.h"
#include "gtest/gtest.h"

namespace baton::router {
namespace {

Sha256Digest Key(uint64_t i) {
  Sha256Digest key{};
  uint64_t x = i * 0x9e3779b97f4a7c15ULL + 1;
  for (size_t b = 0; b < key.size(); ++b) {
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ULL;
    key[b] = static_cast<uint8_t>(x >> 56);
  }
  return key;
}

// What the index should know: per node and region, the keys held.
using Model = std::map<std::string, std::set<Sha256Digest>[2]>;

kvstore::ChainLookup ModelLookup(const Model& model, const std::string& node,
                                 std::span<const Sha256Digest> chain) {
  kvstore::ChainLookup lookup;
  auto it = model.find(node);
  if (it == model.end()) return lookup;
  for (const Sha256Digest& key : chain) {
    if (!it->second[0].contains(key)) break;
    ++lookup.block_kv_blocks;
    lookup.swa_present.push_back(it->second[1].contains(key));
  }
  return lookup;
}

v1::StoreRegion Group(int region) {
  return region == 0 ? v1::STORE_REGION_BLOCK_KV : v1::STORE_REGION_PRODUCER_SWA;
}

class CacheIndexTest : public ::testing::Test {
 protected:
  // Sends one batch from `node`: `stored` and `removed` key numbers in `region`, as the next in
  // its sequence (or a snapshot, which first clears what the node held).
  bool Send(const std::string& node, int region, const std::vector<uint64_t>& stored,
            const std::vector<uint64_t>& removed, bool snapshot = false) {
    v1::CacheEventBatch batch;
    batch.set_sequence(++sequence_[node]);
    batch.set_snapshot(snapshot);
    if (snapshot) {
      batch.add_events()->mutable_all_blocks_cleared();
      for (auto& held : model_[node]) held.clear();
    }
    if (!stored.empty()) {
      v1::BlockStored& event = *batch.add_events()->mutable_block_stored();
      event.set_cache_group(Group(region));
      for (uint64_t k : stored) {
        event.add_block_hashes(kvstore::KeyBytes(Key(k)));
        model_[node][region].insert(Key(k));
      }
    }
    if (!removed.empty()) {
      v1::BlockRemoved& event = *batch.add_events()->mutable_block_removed();
      event.set_cache_group(Group(region));
      for (uint64_t k : removed) {
        event.add_block_hashes(kvstore::KeyBytes(Key(k)));
        model_[node][region].erase(Key(k));
      }
    }
    EXPECT_TRUE(CheckCacheEvents(batch).ok());
    return index_.Apply(node, batch, now_ms_);
  }
  // A batch out of sequence: the index forgets the node's blocks and asks for a snapshot.
  void Gap(const std::string& node) {
    v1::CacheEventBatch batch;
    sequence_[node] += 2;
    batch.set_sequence(sequence_[node]);
    EXPECT_FALSE(index_.Apply(node, batch));
    sequence_[node] = 0;  // the next is a snapshot
    model_.erase(node);
  }
  void Forget(const std::string& node) {
    index_.Forget(node);
    model_.erase(node);
    sequence_.erase(node);
  }
  // Every chain in `chains` gives the model's answer on every node, one node at a time and all
  // at once.
  void ExpectAgrees(const std::vector<std::vector<Sha256Digest>>& chains,
                    const std::vector<std::string>& nodes) {
    for (const auto& chain : chains) {
      const CacheIndex::Holders holders = index_.LookupHolders(chain);
      for (const std::string& node : nodes) {
        const kvstore::ChainLookup want = ModelLookup(model_, node, chain);
        const kvstore::ChainLookup one = index_.Lookup(node, chain);
        EXPECT_EQ(one.block_kv_blocks, want.block_kv_blocks) << node;
        EXPECT_EQ(one.swa_present, want.swa_present) << node;
        auto held = holders.find(node);
        if (want.block_kv_blocks == 0) {
          EXPECT_EQ(held, holders.end()) << node << " holds none of the chain";
          continue;
        }
        ASSERT_NE(held, holders.end()) << node;
        EXPECT_EQ(held->second.block_kv_blocks, want.block_kv_blocks) << node;
        EXPECT_EQ(held->second.swa_present, want.swa_present) << node;
      }
      for (const auto& [node, lookup] : holders) {
        EXPECT_GT(ModelLookup(model_, node, chain).block_kv_blocks, 0) << node;
      }
    }
  }
  CacheIndex index_;
  double now_ms_ = 0;  // the clock Send's batches are applied at
  Model model_;
  std::map<std::string, uint64_t> sequence_;
};

// Random churn over 12 nodes and 48 keys (chains are runs of consecutive key numbers, so nodes
// share prefixes of different lengths), checked against the model after every step.
TEST_F(CacheIndexTest, EveryLookupAgreesWithWhatTheNodesHoldThroughChurn) {
  std::mt19937_64 random(11);
  std::vector<std::string> nodes;
  for (int n = 0; n < 12; ++n) nodes.push_back("prefill-" + std::to_string(n));
  std::vector<std::vector<Sha256Digest>> chains;
  for (uint64_t start : {0, 8, 16, 24}) {
    std::vector<Sha256Digest> chain;
    for (uint64_t k = start; k < start + 24; ++k) chain.push_back(Key(k % 48));
    chains.push_back(chain);
  }
  for (const std::string& node : nodes) Send(node, 0, {}, {}, /*snapshot=*/true);
  for (int step = 0; step < 600; ++step) {
    const std::string& node = nodes[random() % nodes.size()];
    const uint64_t action = random() % 20;
    if (action == 0) {
      Gap(node);
      Send(node, 0, {}, {}, /*snapshot=*/true);
    } else if (action == 1) {
      Forget(node);
    } else {
      if (!sequence_.contains(node)) Send(node, 0, {}, {}, /*snapshot=*/true);
      // A run of keys stored from a random start, a few removed: prefixes of varying length.
      const uint64_t start = random() % 48, length = 1 + random() % 16;
      std::vector<uint64_t> stored, removed;
      for (uint64_t k = start; k < start + length; ++k) stored.push_back(k % 48);
      for (int r = 0; r < 2; ++r) removed.push_back(random() % 48);
      ASSERT_TRUE(Send(node, static_cast<int>(random() % 3 == 0), stored, removed,
                       /*snapshot=*/action == 2));
    }
    ExpectAgrees(chains, nodes);
    for (const std::string& n : nodes) {
      const auto it = model_.find(n);
      const size_t want = it == model_.end() ? 0 : it->second[0].size() + it->second[1].size();
      ASSERT_EQ(index_.blocks(n), want) << n << " at step " << step;
    }
  }
}

// A node that held many blocks and is cleared leaves its entries behind under a retired slot;
// once they outnumber the live ones they are swept out and the slot goes to another node,
// which then holds none of them.
TEST_F(CacheIndexTest, ARetiredSlotIsSweptBeforeAnotherNodeTakesIt) {
  // In batches of the most hashes a batch may carry.
  ASSERT_TRUE(Send("big", 0, {}, {}, /*snapshot=*/true));
  for (uint64_t from = 0; from < 70'000; from += kvstore::kMaxCacheEventHashes) {
    std::vector<uint64_t> some;
    for (uint64_t k = from; k < std::min<uint64_t>(70'000, from + kvstore::kMaxCacheEventHashes);
         ++k) {
      some.push_back(k);
    }
    ASSERT_TRUE(Send("big", 0, some, {}));
  }
  ASSERT_TRUE(Send("small", 0, {1}, {}, /*snapshot=*/true));
  EXPECT_EQ(index_.blocks("big"), 70'000u);
  std::vector<Sha256Digest> chain;
  for (uint64_t k = 0; k < 4; ++k) chain.push_back(Key(k));
  EXPECT_EQ(index_.LookupHolders(chain).at("big").block_kv_blocks, 4);
  // Cleared by a snapshot with one key: 70,000 retired entries against 2 live ones.
  ASSERT_TRUE(Send("big", 0, {3}, {}, /*snapshot=*/true));
  Forget("small");
  // New nodes take the freed slots; none of them holds the old entries.
  for (int n = 0; n < 4; ++n) Send("new-" + std::to_string(n), 0, {9}, {}, /*snapshot=*/true);
  ExpectAgrees({chain, {Key(1)}, {Key(3)}, {Key(9)}},
               {"big", "small", "new-0", "new-1", "new-2", "new-3"});
  EXPECT_EQ(index_.blocks("big"), 1u);
  EXPECT_EQ(index_.nodes(), 5u);
}

// The version changes with what the index holds, and not with a heartbeat that carries no
// event, so a request's one walk of its chain holds across those.
TEST_F(CacheIndexTest, TheVersionChangesWithWhatIsHeld) {
  ASSERT_TRUE(Send("p", 0, {1, 2}, {}, /*snapshot=*/true));
  uint64_t version = index_.version();
  ASSERT_TRUE(Send("p", 0, {}, {}));
  EXPECT_EQ(index_.version(), version);
  std::vector<Sha256Digest> chain = {Key(1), Key(2), Key(3)};
  ChainHolders holders;
  EXPECT_EQ(holders.On(index_, chain, "p").block_kv_blocks, 2);
  ASSERT_TRUE(Send("p", 0, {3}, {}));
  EXPECT_NE(index_.version(), version);
  EXPECT_EQ(holders.On(index_, chain, "p").block_kv_blocks, 3);
  version = index_.version();
  Forget("p");
  EXPECT_NE(index_.version(), version);
  EXPECT_EQ(holders.On(index_, chain, "p").block_kv_blocks, 0);
}

// A node that holds nothing of the chain is answered from its id's hash: its id (a line of its
// registration elsewhere in memory) is read only for a node the chain's walk found.
TEST_F(CacheIndexTest, ChainHoldersReadANodesIdOnlyWhenItsHashIsAHolders) {
  ASSERT_TRUE(Send("p", 0, {1, 2}, {}, /*snapshot=*/true));
  ASSERT_TRUE(Send("q", 0, {7}, {}, /*snapshot=*/true));
  const std::vector<Sha256Digest> chain = {Key(1), Key(2), Key(3)};
  ChainHolders holders;
  int reads = 0;
  auto on = [&](const std::string& id) {
    return holders.On(index_, chain, ChainHolders::IdHash(id), [&]() -> const std::string& {
      ++reads;
      return id;
    });
  };
  EXPECT_EQ(on("q").block_kv_blocks, 0);
  EXPECT_EQ(on("absent").block_kv_blocks, 0);
  EXPECT_EQ(reads, 0);
  EXPECT_EQ(on("p").block_kv_blocks, 2);
  EXPECT_EQ(reads, 1);
}

// What the router placed on a node is indexed at once (Expect), and stays only as the node
// confirms it: an expected block the node reports stored is kept past its deadline, one it
// reports removed goes at once, one expected again has its time restarted, and the rest go at
// the node's first batch after their deadline. A block the node's events already gave needs no
// confirming, and a gap forgets what was expected with the rest.
TEST_F(CacheIndexTest, ExpectedBlocksStayUntilTheNodeConfirmsThemOrTheirTimePasses) {
  std::vector<Sha256Digest> chain;
  for (uint64_t k = 0; k < 6; ++k) chain.push_back(Key(k));
  auto blocks = [&] { return index_.Lookup("p", chain); };
  ASSERT_TRUE(Send("p", 0, {}, {}, /*snapshot=*/true));
  // Blocks 0..3, both regions, until 100 ms.
  index_.Expect("p", chain, kvstore::WriteBackSteps(0, 4), 100);
  EXPECT_EQ(blocks().block_kv_blocks, 4);
  EXPECT_EQ(blocks().swa_present, std::vector<bool>(4, true));
  EXPECT_EQ(index_.expected("p"), 8u);
  EXPECT_EQ(index_.LookupHolders(chain).at("p").block_kv_blocks, 4);
  EXPECT_EQ(index_.Lookup("q", chain).block_kv_blocks, 0) << "another node holds nothing";

  now_ms_ = 50;
  ASSERT_TRUE(Send("p", 0, {0, 1}, {}));  // confirmed: block KV of 0 and 1
  ASSERT_TRUE(Send("p", 1, {}, {3}));     // 3's SWA rows are gone
  EXPECT_EQ(index_.expected("p"), 5u);    // block KV of 2, 3; SWA of 0, 1, 2
  EXPECT_EQ(blocks().swa_present, (std::vector<bool>{true, true, true, false}));
  index_.Expect("p", chain, std::vector<kvstore::WriteBackStep>{{.block = 2}}, 300);

  now_ms_ = 150;
  ASSERT_TRUE(Send("p", 0, {}, {}));
  EXPECT_EQ(blocks().block_kv_blocks, 3) << "block 2 was expected again, until 300";
  EXPECT_EQ(blocks().swa_present, std::vector<bool>(3, false));
  EXPECT_EQ(index_.expected("p"), 1u);

  now_ms_ = 350;
  ASSERT_TRUE(Send("p", 0, {}, {}));
  EXPECT_EQ(blocks().block_kv_blocks, 2) << "what the node confirmed stays";
  EXPECT_EQ(index_.expected("p"), 0u);
  EXPECT_EQ(index_.expected(), 0u);
  EXPECT_EQ(index_.expected_dropped(), 5u) << "3's block KV; 0, 1, 2's SWA rows; 2's block KV";
  EXPECT_EQ(index_.LookupHolders(chain).at("p").block_kv_blocks, 2);

  // Known from the node's own events: expecting it again changes nothing when the time passes.
  index_.Expect("p", chain, kvstore::WriteBackSteps(0, 2), 360);
  EXPECT_EQ(index_.expected("p"), 2u) << "only the SWA rows of 0 and 1 are news";
  now_ms_ = 1000;
  ASSERT_TRUE(Send("p", 0, {}, {}));
  EXPECT_EQ(blocks().block_kv_blocks, 2);
  EXPECT_EQ(index_.expected("p"), 0u);

  // Steps past the chain are ignored; a gap forgets the expected blocks with the rest.
  index_.Expect("p", chain, kvstore::WriteBackSteps(2, 9), 5000);
  EXPECT_EQ(blocks().block_kv_blocks, 6);
  EXPECT_EQ(index_.expected("p"), 8u);
  EXPECT_EQ(index_.expected(), 8u);
  Gap("p");
  EXPECT_EQ(index_.expected(), 0u);
  EXPECT_EQ(blocks().block_kv_blocks, 0);
  EXPECT_EQ(index_.expected("p"), 0u);
}

}  // namespace
}  // namespace baton::router
