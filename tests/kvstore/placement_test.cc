// Rendezvous placement of stored values over store nodes: deterministic whatever the nodes'
// order, balanced, and moving only what a joining or leaving node must.
#include "baton/kvstore/placement.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace baton::kvstore {
namespace {

std::vector<Sha256Digest> Keys(int n) {
  std::vector<Sha256Digest> keys;
  for (int i = 0; i < n; ++i) keys.push_back(Sha256Of(&i, sizeof(i)));
  return keys;
}

std::vector<std::string> Ids(const std::vector<std::string>& ids,
                             const std::vector<size_t>& indexes) {
  std::vector<std::string> out;
  for (size_t i : indexes) out.push_back(ids[i]);
  return out;
}

TEST(PlacementTest, OwnersAreDistinctAndTheSameWhateverTheNodesOrder) {
  const std::vector<std::string> nodes = {"kvstore", "kvstore-1", "kvstore-2", "kvstore-3"};
  std::vector<std::string> reversed(nodes.rbegin(), nodes.rend());
  for (const Sha256Digest& key : Keys(500)) {
    const std::vector<std::string> owners = Ids(nodes, Owners(key, nodes, 3));
    EXPECT_EQ(owners.size(), 3u);
    EXPECT_EQ(std::set<std::string>(owners.begin(), owners.end()).size(), 3u);
    EXPECT_EQ(Ids(reversed, Owners(key, reversed, 3)), owners);
    // The first R of R + 1 owners are the R owners: a higher replication adds, never reorders.
    const std::vector<std::string> more = Ids(nodes, Owners(key, nodes, 4));
    EXPECT_TRUE(std::equal(owners.begin(), owners.end(), more.begin()));
  }
}

TEST(PlacementTest, ReplicationIsBoundedByTheFleet) {
  const Sha256Digest key = Keys(1)[0];
  const std::vector<std::string> two = {"a", "b"};
  EXPECT_EQ(Owners(key, two, 5).size(), 2u);
  EXPECT_EQ(Owners(key, two, 0).size(), 1u);
  EXPECT_TRUE(Owners(key, {}, 2).empty());
}

TEST(PlacementTest, EachNodeOwnsItsShare) {
  const std::vector<std::string> nodes = {"kvstore", "kvstore-1", "kvstore-2", "kvstore-3",
                                          "kvstore-4"};
  constexpr int kKeys = 30000;
  for (int replication : {1, 2}) {
    std::map<std::string, int> owned;
    for (const Sha256Digest& key : Keys(kKeys)) {
      for (const std::string& id : Ids(nodes, Owners(key, nodes, replication))) ++owned[id];
    }
    // Each node owns replication / 5 of the values; a binomial count's standard deviation is
    // below 90 here, so 10% (at least 600) off is more than six of them.
    const double share = kKeys * replication / 5.0;
    for (const std::string& id : nodes) {
      EXPECT_NEAR(owned[id], share, share / 10) << id << " at R = " << replication;
    }
  }
}

TEST(PlacementTest, AJoiningNodeTakesOnlyItsShareAndOnlyForItself) {
  std::vector<std::string> nodes = {"kvstore", "kvstore-1", "kvstore-2"};
  const std::vector<Sha256Digest> keys = Keys(20000);
  std::vector<std::vector<std::string>> before;
  for (const Sha256Digest& key : keys) before.push_back(Ids(nodes, Owners(key, nodes, 2)));
  nodes.push_back("kvstore-3");
  int changed = 0;
  for (size_t k = 0; k < keys.size(); ++k) {
    const std::vector<std::string> after = Ids(nodes, Owners(keys[k], nodes, 2));
    if (after == before[k]) continue;
    ++changed;
    // The only change: the new node among the owners, in place of one old owner.
    ASSERT_NE(std::find(after.begin(), after.end(), "kvstore-3"), after.end());
    for (const std::string& id : after) {
      if (id != "kvstore-3") {
        EXPECT_NE(std::find(before[k].begin(), before[k].end(), id), before[k].end());
      }
    }
  }
  // The new node owns R / N = 2 / 4 of the values, each of which changed one owner; an
  // exact-order change within the same owners cannot happen (it would need a new weight).
  EXPECT_NEAR(changed, keys.size() / 2.0, keys.size() * 0.03);
}

TEST(PlacementTest, ALeavingNodesValuesGoToTheNextRankedNodeAndNothingElseMoves) {
  const std::vector<std::string> nodes = {"kvstore", "kvstore-1", "kvstore-2", "kvstore-3"};
  const std::vector<std::string> left = {"kvstore", "kvstore-1", "kvstore-3"};  // -2 is lost
  int moved = 0;
  const std::vector<Sha256Digest> keys = Keys(20000);
  for (const Sha256Digest& key : keys) {
    const std::vector<std::string> before = Ids(nodes, Owners(key, nodes, 2));
    const std::vector<std::string> after = Ids(left, Owners(key, left, 2));
    const std::vector<std::string> ranked = Ids(nodes, Owners(key, nodes, 4));
    std::vector<std::string> expected;
    for (const std::string& id : ranked) {
      if (id != "kvstore-2" && expected.size() < 2) expected.push_back(id);
    }
    EXPECT_EQ(after, expected);
    if (after != before) {
      ++moved;
      EXPECT_NE(std::find(before.begin(), before.end(), "kvstore-2"), before.end());
    }
  }
  EXPECT_NEAR(moved, keys.size() / 2.0, keys.size() * 0.03);  // what kvstore-2 owned: 2 / 4
}

}  // namespace
}  // namespace baton::kvstore
