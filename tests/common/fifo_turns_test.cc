// FifoTurns (common/fifo_turns.h): one holder at a time, and turns in the order callers came,
// whoever is woken first.
#include "baton/common/fifo_turns.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "testing/eventually.h"

namespace baton {
namespace {

using ::baton::testing::Eventually;

// The waits below poll every millisecond: each round waits for twelve callers in turn.
constexpr std::chrono::milliseconds kEvery{1};

// While one caller holds the turn, callers 0..N-1 arrive one after another (each only once the
// one before is seen waiting); the turn then passes through them in that order, each holder
// alone.
TEST(FifoTurnsTest, TurnsGoInArrivalOrderOneHolderAtATime) {
  constexpr int kCallers = 12;
  for (int round = 0; round < 20; ++round) {
    FifoTurns turns;
    // Held in a unique_ptr, not an optional: GCC's -Wmaybe-uninitialized misreads an optional
    // Turn destroyed on an ASSERT's early return.
    auto first = std::make_unique<FifoTurns::Turn>(turns.Take());
    EXPECT_EQ(turns.waiting(), 0);
    std::mutex order_mutex;
    std::vector<int> order;
    std::atomic<int> holders{0};
    std::atomic<bool> overlapped{false};
    std::vector<std::thread> callers;
    for (int i = 0; i < kCallers; ++i) {
      callers.emplace_back([&, i] {
        FifoTurns::Turn turn = turns.Take();
        if (holders.fetch_add(1) != 0) overlapped = true;
        {
          std::lock_guard<std::mutex> lock(order_mutex);
          order.push_back(i);
        }
        std::this_thread::yield();
        holders.fetch_sub(1);
      });
      ASSERT_TRUE(Eventually([&] { return turns.waiting() == i + 1; },
                             ::baton::testing::kPollTimeout, kEvery))
          << "caller " << i;
    }
    first.reset();  // the callers go, in turn
    for (std::thread& t : callers) t.join();
    std::vector<int> arrival(kCallers);
    for (int i = 0; i < kCallers; ++i) arrival[i] = i;
    EXPECT_EQ(order, arrival) << "round " << round;
    EXPECT_FALSE(overlapped) << "two callers held the turn at once in round " << round;
    EXPECT_EQ(turns.waiting(), 0);
  }
}

// A turn moved from one owner to another ends once, when the last owner lets it go.
TEST(FifoTurnsTest, AMovedTurnEndsOnceWhereItEnds) {
  FifoTurns turns;
  std::optional<FifoTurns::Turn> held;
  {
    FifoTurns::Turn turn = turns.Take();
    held.emplace(std::move(turn));
  }  // the moved-from turn ends nothing
  std::atomic<bool> second_went{false};
  std::thread second([&] {
    FifoTurns::Turn turn = turns.Take();
    second_went = true;
  });
  ASSERT_TRUE(
      Eventually([&] { return turns.waiting() == 1; }, ::baton::testing::kPollTimeout, kEvery));
  EXPECT_FALSE(second_went.load());
  held.reset();
  second.join();
  EXPECT_TRUE(second_went.load());
  // Both turns ended exactly once: a third caller goes at once.
  FifoTurns::Turn third = turns.Take();
  EXPECT_EQ(turns.waiting(), 0);
}

}  // namespace
}  // namespace baton
