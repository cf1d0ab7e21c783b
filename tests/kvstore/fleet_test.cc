// What the router's lookup and a prefill node's reads share over a store fleet: the checks on
// a StoreFleet from the wire, keys grouped by owner, probes merged into a chain's lookup, the
// readers' rotation over a key's owners, and the per-node breaker.
#include "baton/kvstore/fleet.h"

#include <set>

#include "baton/kvstore/placement.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::kvstore {
namespace {

using ::testing::HasSubstr;

std::vector<Sha256Digest> Keys(int n) {
  std::vector<Sha256Digest> keys;
  for (int i = 0; i < n; ++i) keys.push_back(Sha256Of(&i, sizeof(i)));
  return keys;
}

v1::StoreFleet Fleet(int nodes, uint32_t replication) {
  v1::StoreFleet fleet;
  for (int i = 0; i < nodes; ++i) {
    v1::StoreNode& node = *fleet.add_nodes();
    node.set_node_id(i == 0 ? "kvstore" : "kvstore-" + std::to_string(i));
    node.set_address("127.0.0.1:" + std::to_string(7000 + i));
  }
  fleet.set_replication(replication);
  return fleet;
}

TEST(FleetTest, BadFleetsAreRefusedByField) {
  EXPECT_TRUE(CheckStoreFleet(Fleet(0, 0)).ok());
  EXPECT_TRUE(CheckStoreFleet(Fleet(3, 2)).ok());
  struct Case {
    v1::StoreFleet fleet;
    const char* message;
  };
  std::vector<Case> cases = {{Fleet(3, 0), "stores.replication: 0; must be 1 to the 3 nodes"},
                             {Fleet(3, 4), "stores.replication: 4"},
                             {Fleet(0, 1), "stores.replication: 1; must be 0 with no nodes"},
                             {Fleet(kMaxStoreNodes + 1, 1), "stores.nodes: 257 store nodes"}};
  v1::StoreFleet twice = Fleet(3, 1);
  twice.mutable_nodes(2)->set_node_id("kvstore-1");
  cases.push_back({twice, "stores.nodes[2].node_id: 'kvstore-1' is named twice"});
  v1::StoreFleet no_address = Fleet(2, 1);
  no_address.mutable_nodes(1)->clear_address();
  cases.push_back({no_address, "stores.nodes[1]: node_id and address are required"});
  v1::StoreFleet long_id = Fleet(2, 1);
  long_id.mutable_nodes(0)->set_node_id(std::string(300, 'k'));
  cases.push_back({long_id, "stores.nodes[0].node_id"});
  v1::StoreFleet long_address = Fleet(2, 1);
  long_address.mutable_nodes(1)->set_address(std::string(600, '1'));
  cases.push_back({long_address, "stores.nodes[1].address"});
  for (const Case& c : cases) {
    const absl::Status s = CheckStoreFleet(c.fleet);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
  }
}

TEST(FleetTest, EachKeyIsAskedOfExactlyItsOwners) {
  const std::vector<std::string> ids = {"kvstore", "kvstore-1", "kvstore-2"};
  const std::vector<Sha256Digest> keys = Keys(300);
  const auto owned = KeysByOwner(keys, ids, 2);
  ASSERT_EQ(owned.size(), 3u);
  std::vector<std::set<size_t>> askers(keys.size());
  for (size_t n = 0; n < owned.size(); ++n) {
    EXPECT_TRUE(std::is_sorted(owned[n].begin(), owned[n].end()));  // chain order
    EXPECT_GT(owned[n].size(), 100u);  // 200 of 300 expected: every node has its share
    for (size_t k : owned[n]) askers[k].insert(n);
  }
  for (size_t k = 0; k < keys.size(); ++k) {
    const std::vector<size_t> owners = Owners(keys[k], ids, 2);
    EXPECT_EQ(askers[k], std::set<size_t>(owners.begin(), owners.end()));
  }
}

TEST(FleetTest, AChainIsHeldUpToItsFirstBlockNoOwnerHolds) {
  const std::vector<size_t> a_keys = {0, 1, 3}, b_keys = {1, 2, 3};
  v1::ProbeResponse a, b, short_answer;
  for (bool held : {true, false, true}) a.add_block_kv(held), a.add_producer_swa(false);
  for (bool held : {true, true, true}) b.add_block_kv(held), b.add_producer_swa(held);
  short_answer.add_block_kv(true);  // one answer for three keys: not used
  const std::vector<size_t> c_keys = {4, 5, 6};
  const OwnerProbe probes[] = {
      {a_keys, &a}, {b_keys, &b}, {c_keys, &short_answer}, {c_keys, nullptr}};
  const ChainLookup lookup = MergeProbes(7, probes);
  // Block 1 comes from b (a lacks it), block 2 from b alone; block 4 is held by no usable
  // answer, so the hit ends there.
  EXPECT_EQ(lookup.block_kv_blocks, 4);
  EXPECT_EQ(lookup.swa_present, std::vector<bool>({false, true, true, true}));
  // A failed owner is a miss for its keys, never a failure: block 0 only from a.
  const OwnerProbe a_only[] = {{a_keys, &a}, {b_keys, nullptr}};
  EXPECT_EQ(MergeProbes(7, a_only).block_kv_blocks, 1);
}

TEST(FleetTest, ReadsOfAKeyTurnOverItsOwners) {
  const std::vector<std::string> ids = {"kvstore", "kvstore-1", "kvstore-2", "kvstore-3"};
  for (const Sha256Digest& key : Keys(50)) {
    const std::vector<size_t> owners = Owners(key, ids, 2);
    std::set<size_t> first;
    for (uint64_t turn = 0; turn < 4; ++turn) {
      const std::vector<size_t> order = ReadOrder(key, ids, 2, turn);
      EXPECT_EQ(std::set<size_t>(order.begin(), order.end()),
                std::set<size_t>(owners.begin(), owners.end()));
      first.insert(order.front());
    }
    EXPECT_EQ(first.size(), 2u);  // both owners serve first in turn
  }
}

TEST(FleetTest, TheBreakerOpensAfterFailuresInARowAndLetsOneTrialThrough) {
  StoreBreaker breaker({.failures_to_open = 3, .open_for = std::chrono::milliseconds(1000)});
  const auto t0 = StoreBreaker::Clock::now();
  EXPECT_TRUE(breaker.Allow("a", t0));
  breaker.Record("a", false, t0);
  breaker.Record("a", false, t0);
  breaker.Record("a", true, t0);  // a success starts the count again
  breaker.Record("a", false, t0);
  breaker.Record("a", false, t0);
  EXPECT_TRUE(breaker.Allow("a", t0));
  EXPECT_EQ(breaker.open(t0), 0u);
  breaker.Record("a", false, t0);
  EXPECT_FALSE(breaker.Allow("a", t0));
  EXPECT_TRUE(breaker.IsOpen("a", t0));
  EXPECT_TRUE(breaker.Allow("b", t0));  // per node
  EXPECT_FALSE(breaker.IsOpen("b", t0));
  EXPECT_EQ(breaker.open(t0), 1u);
  EXPECT_EQ(breaker.trips(), 1u);
  // Past open_for one call goes through; others wait for its result.
  const auto t1 = t0 + std::chrono::milliseconds(1001);
  EXPECT_TRUE(breaker.Allow("a", t1));
  EXPECT_FALSE(breaker.Allow("a", t1));
  breaker.Cancel("a");  // the trial's call was not made: the next caller is the trial
  EXPECT_TRUE(breaker.Allow("a", t1));
  breaker.Record("a", false, t1);  // the trial failed: open again
  EXPECT_FALSE(breaker.Allow("a", t1));
  EXPECT_EQ(breaker.trips(), 2u);
  const auto t2 = t1 + std::chrono::milliseconds(1001);
  EXPECT_TRUE(breaker.Allow("a", t2));
  breaker.Record("a", true, t2);  // the trial succeeded: closed
  EXPECT_TRUE(breaker.Allow("a", t2));
  EXPECT_TRUE(breaker.Allow("a", t2));
  EXPECT_EQ(breaker.open(t2), 0u);
}

}  // namespace
}  // namespace baton::kvstore
