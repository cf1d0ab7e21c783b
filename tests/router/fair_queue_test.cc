#include "baton/router/fair_queue.h"

#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace baton::router {
namespace {

// Admits the head n times; the tenants in admission order.
std::vector<std::string> Drain(FairQueue& queue, std::map<uint64_t, std::string>& tenant_of,
                               int n) {
  std::vector<std::string> order;
  for (int i = 0; i < n && !queue.empty(); ++i) {
    const uint64_t head = *queue.Head();
    order.push_back(tenant_of.at(head));
    queue.Remove(head, /*admitted=*/true);
  }
  return order;
}

TEST(FairQueueTest, OneTenantIsFirstComeFirstServed) {
  FairQueue queue;
  std::vector<uint64_t> tickets;
  for (int i = 0; i < 5; ++i) tickets.push_back(queue.Push(""));
  for (uint64_t t : tickets) {
    ASSERT_EQ(queue.Head(), t);
    queue.Remove(t, true);
  }
  EXPECT_TRUE(queue.empty());
  EXPECT_EQ(queue.Head(), std::nullopt);
}

TEST(FairQueueTest, ATenantArrivingBehindAFloodAlternatesWithIt) {
  FairQueue queue;
  std::map<uint64_t, std::string> tenant_of;
  for (int i = 0; i < 20; ++i) tenant_of[queue.Push("flood")] = "flood";
  // The flood has had 5 admitted before the second tenant arrives.
  EXPECT_EQ(Drain(queue, tenant_of, 5), std::vector<std::string>(5, "flood"));
  for (int i = 0; i < 3; ++i) tenant_of[queue.Push("small")] = "small";
  // Levelled on arrival: the small tenant gets every other turn, not 5 in a row (no credit
  // banked while idle) and not after the 15 still waiting (FIFO).
  EXPECT_EQ(Drain(queue, tenant_of, 6),
            (std::vector<std::string>{"flood", "small", "flood", "small", "flood", "small"}));
  EXPECT_EQ(Drain(queue, tenant_of, 20), std::vector<std::string>(12, "flood"));
}

TEST(FairQueueTest, RequestsThatLeaveWithoutAdmissionDoNotCountAndOrderIsKept) {
  FairQueue queue;
  const uint64_t a1 = queue.Push("a");
  const uint64_t a2 = queue.Push("a");
  const uint64_t b1 = queue.Push("b");
  EXPECT_EQ(queue.Head(), a1);
  queue.Remove(a1, /*admitted=*/false);  // cancelled while waiting
  EXPECT_EQ(queue.Head(), a2);           // still a's turn: nothing was admitted
  queue.Remove(a2, true);
  EXPECT_EQ(queue.Head(), b1);
  queue.Remove(b1, true);
  EXPECT_TRUE(queue.empty());
  queue.Remove(b1, true);  // unknown tickets are ignored
  EXPECT_EQ(queue.size(), 0u);
}

// A tenant at its share of the decode slots is skipped: the turn goes to the next tenant, in
// the same fair order, and comes back to it once it may be admitted again.
TEST(FairQueueTest, SkippedTenantsLoseTheirTurnToTheOthersUntilTheyMayGoAgain) {
  FairQueue queue;
  const uint64_t a1 = queue.Push("a");
  const uint64_t a2 = queue.Push("a");
  const uint64_t b1 = queue.Push("b");
  const uint64_t c1 = queue.Push("c");
  EXPECT_EQ(queue.Head({"a"}), b1);
  EXPECT_EQ(queue.Head({"a", "b"}), c1);
  EXPECT_EQ(queue.Head({"a", "b", "c"}), std::nullopt);
  EXPECT_EQ(queue.Head(), a1);  // skipping is per call: nothing was reordered
  queue.Remove(b1, true);
  EXPECT_EQ(queue.Head({"a"}), c1);
  queue.Remove(c1, true);
  EXPECT_EQ(queue.Head({"a"}), std::nullopt);
  EXPECT_EQ(queue.Head({}), a1);
  queue.Remove(a1, true);
  EXPECT_EQ(queue.Head({"b"}), a2);
}

}  // namespace
}  // namespace baton::router
