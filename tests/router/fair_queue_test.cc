#include "baton/router/fair_queue.h"

#include <algorithm>
#include <deque>
#include <map>
#include <random>
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

// The request that gives up its place to another tenant's (admission.h) is the newest of its
// tenant's.
TEST(FairQueueTest, NewestIsTheTenantsLastArrivalStillWaiting) {
  FairQueue queue;
  const uint64_t a1 = queue.Push("a");
  const uint64_t b1 = queue.Push("b");
  const uint64_t a2 = queue.Push("a");
  EXPECT_EQ(queue.Newest("a"), a2);
  EXPECT_EQ(queue.Newest("b"), b1);
  EXPECT_EQ(queue.Newest("c"), std::nullopt);
  queue.Remove(a2, /*admitted=*/false);
  EXPECT_EQ(queue.Newest("a"), a1);
  EXPECT_EQ(queue.Head(), a1);
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

// The order the queue keeps, written plainly (a scan of every waiting request per head): the
// least-admitted tenant among those not skipped, levelled on arrival, and its oldest request;
// between tenants level, the request that has waited longest.
class ReferenceQueue {
 public:
  void Push(uint64_t ticket, const std::string& tenant) {
    if (!Waiting(tenant)) {
      uint64_t level = UINT64_MAX;
      for (const auto& w : waiting_) level = std::min(level, admitted_[w.second]);
      admitted_[tenant] = waiting_.empty() ? 0 : level;
    }
    waiting_.push_back({ticket, tenant});
  }
  std::optional<uint64_t> Head(const std::set<std::string>& skip) {
    std::optional<std::pair<uint64_t, uint64_t>> best;  // (admitted, ticket)
    for (const auto& [ticket, tenant] : waiting_) {
      if (skip.contains(tenant)) continue;
      const std::pair<uint64_t, uint64_t> turn{admitted_[tenant], ticket};
      if (!best.has_value() || turn < *best) best = turn;
    }
    return best.has_value() ? std::optional<uint64_t>(best->second) : std::nullopt;
  }
  void Remove(uint64_t ticket, bool admitted) {
    auto it = std::find_if(waiting_.begin(), waiting_.end(),
                           [&](const auto& w) { return w.first == ticket; });
    if (it == waiting_.end()) return;
    const std::string tenant = it->second;
    waiting_.erase(it);
    if (admitted) ++admitted_[tenant];
  }
  bool Waiting(const std::string& tenant) const {
    return std::any_of(waiting_.begin(), waiting_.end(),
                       [&](const auto& w) { return w.second == tenant; });
  }
  std::deque<std::pair<uint64_t, std::string>> waiting_;  // arrival order

 private:
  std::map<std::string, uint64_t> admitted_;
};

// Random pushes, admissions, departures and skips from up to 12 tenants: the queue's head is
// the reference's after every step.
TEST(FairQueueTest, TheHeadIsTheFairOrdersFirstAfterAnySequence) {
  std::mt19937 random(48);
  FairQueue queue;
  ReferenceQueue reference;
  for (int step = 0; step < 20000; ++step) {
    const std::string tenant = "t" + std::to_string(random() % 12);
    const int op = static_cast<int>(random() % 10);
    if (op < 5 || reference.waiting_.empty()) {
      reference.Push(queue.Push(tenant), tenant);
    } else if (op < 8) {
      const uint64_t head = *queue.Head();
      queue.Remove(head, true);
      reference.Remove(head, true);
    } else {
      const uint64_t ticket = reference.waiting_[random() % reference.waiting_.size()].first;
      queue.Remove(ticket, false);
      reference.Remove(ticket, false);
    }
    std::set<std::string> skip;
    for (int t = 0; t < 12; ++t) {
      if (random() % 4 == 0) skip.insert("t" + std::to_string(t));
    }
    ASSERT_EQ(queue.Head(), reference.Head({})) << "step " << step;
    ASSERT_EQ(queue.Head(skip), reference.Head(skip)) << "step " << step;
    ASSERT_EQ(queue.size(), reference.waiting_.size());
    ASSERT_EQ(queue.waiting(tenant) > 0, reference.Waiting(tenant));
  }
}

}  // namespace
}  // namespace baton::router
