// Polling with a deadline, for tests that wait on another thread or process: a test asserts what
// it has observed, never what ought to hold after a blind sleep. `Eventually` polls a condition
// until it holds; `EventuallyThat` polls a value until a matcher accepts it. Both return
// ::testing::AssertionResult, so a caller writes `ASSERT_TRUE(Eventually(...))`, and a failure
// says how long the poll waited and what it saw last.
//
// What a poll promises: the check runs at least once, and once more at or after the deadline,
// so a poll never gives up before its timeout however long one check takes; between checks the
// calling thread sleeps `every`. Everything runs on the calling thread. A test that must act on
// a state (kill a node once it holds a stream) waits for that state with a poll and acts on what
// the poll saw, not on what a sleep is hoped to have brought about.
#pragma once

#include <chrono>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>

#include "gtest/gtest.h"

namespace baton::testing {

// When a poll gives up: a timeout counted from the call, or a time point several polls share.
struct Deadline {
  template <typename Rep, typename Period>
  Deadline(std::chrono::duration<Rep, Period> timeout)  // NOLINT: implicit, read as a timeout
      : at(std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout)) {}
  Deadline(std::chrono::steady_clock::time_point at) : at(at) {}  // NOLINT
  std::chrono::steady_clock::time_point at;
};

inline constexpr std::chrono::seconds kPollTimeout{10};
inline constexpr std::chrono::milliseconds kPollEvery{20};

// Calls `done` until it holds or `deadline` has passed, sleeping `every` between calls. `done`
// returns bool, or a ::testing::AssertionResult whose message says what it saw (the last one
// goes into the failure).
template <typename Done>
::testing::AssertionResult Eventually(Done&& done, Deadline deadline = kPollTimeout,
                                      std::chrono::milliseconds every = kPollEvery) {
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    const ::testing::AssertionResult seen(done());
    if (seen) return seen;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline.at) {
      ::testing::AssertionResult failure = ::testing::AssertionFailure();
      failure << "gave up after "
              << std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count()
              << " ms, polling every " << every.count() << " ms";
      if (*seen.message() != '\0') failure << "; last seen: " << seen.message();
      return failure;
    }
    std::this_thread::sleep_for(every);
  }
}

// Calls `observe` until `matcher` (a gtest matcher, or a value to equal) accepts what it
// returns; on failure, the last value seen and what was wanted.
template <typename Observe, typename M>
::testing::AssertionResult EventuallyThat(Observe&& observe, const M& matcher,
                                          Deadline deadline = kPollTimeout,
                                          std::chrono::milliseconds every = kPollEvery) {
  using T = std::decay_t<std::invoke_result_t<Observe&>>;
  const ::testing::Matcher<const T&> wanted = matcher;
  std::optional<T> seen;
  const ::testing::AssertionResult matched = Eventually(
      [&] {
        seen.emplace(observe());
        return wanted.Matches(*seen);
      },
      deadline, every);
  if (matched) return matched;
  std::ostringstream want;
  wanted.DescribeTo(&want);
  return ::testing::AssertionFailure()
         << matched.message() << "; last seen: " << ::testing::PrintToString(*seen)
         << ", wanted one that " << want.str();
}

}  // namespace baton::testing
