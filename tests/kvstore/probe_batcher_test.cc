// kvstore::ProbeBatcher: a store node's probes coalesced while its call is out, each lookup
// given exactly its own keys' answers, and each lookup's deadline kept whether its probe is
// queued or out. The store nodes are gRPC's generated mock stubs, held or answering on cue.
#include "baton/kvstore/probe_batcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "baton/v1/kvstore_mock.grpc.pb.h"

namespace baton::kvstore {
namespace {

using ::testing::_;
using ::testing::NiceMock;
using Clock = ProbeBatcher::Clock;
using Answers = std::vector<ProbeBatcher::Answer>;

// A store node that holds block KV for the keys whose first byte is odd, and producer SWA rows
// for those whose first byte is a multiple of 3. It records every call's keys, and holds each
// call while `hold` is set, until released or the call's deadline.
class FakeStore {
 public:
  FakeStore() : stub(std::make_shared<NiceMock<v1::MockKvStoreStub>>()) {
    ON_CALL(*stub, Probe(_, _, _))
        .WillByDefault([this](grpc::ClientContext* context, const v1::ProbeRequest& request,
                              v1::ProbeResponse* held) {
          std::unique_lock<std::mutex> lock(mutex);
          calls.push_back({request.keys().begin(), request.keys().end()});
          arrived.notify_all();
          if (!released.wait_until(lock, context->deadline(), [&] { return !hold; })) {
            return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "held past the deadline");
          }
          for (const std::string& key : request.keys()) {
            held->add_block_kv(static_cast<uint8_t>(key[0]) % 2 == 1);
            held->add_producer_swa(static_cast<uint8_t>(key[0]) % 3 == 0);
          }
          if (answer_short) held->mutable_block_kv()->RemoveLast();
          return grpc::Status::OK;
        });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mutex);
    hold = false;
    released.notify_all();
  }
  // Waits until `n` calls have arrived (false after 10 s).
  bool AwaitCalls(size_t n) {
    std::unique_lock<std::mutex> lock(mutex);
    return arrived.wait_for(lock, std::chrono::seconds(10), [&] { return calls.size() >= n; });
  }
  std::vector<std::vector<std::string>> Calls() {
    std::lock_guard<std::mutex> lock(mutex);
    return calls;
  }

  std::shared_ptr<NiceMock<v1::MockKvStoreStub>> stub;
  std::mutex mutex;
  std::condition_variable arrived, released;
  bool hold = false;
  bool answer_short = false;
  std::vector<std::vector<std::string>> calls;
};

// Waits until `n` lookups' parts are queued in `batcher` (false after 10 s).
bool AwaitQueued(const ProbeBatcher& batcher, size_t n) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (batcher.queued() < n) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

std::string Key(int first, int second = 0) {
  std::string key(32, '\0');
  key[0] = static_cast<char>(first);
  key[1] = static_cast<char>(second);
  return key;
}

ProbeBatcher::Ask AskOf(const std::string& node, const FakeStore& store,
                        std::vector<std::string> keys) {
  return {.node_id = node, .stub = store.stub, .keys = std::move(keys)};
}

Clock::time_point In(std::chrono::milliseconds ms) {
  return Clock::now() + ms;
}

// A lookup of `keys` on `store` alone, run on its own thread.
std::future<Answers> ProbeLater(ProbeBatcher& batcher, const FakeStore& store,
                                std::vector<std::string> keys, Clock::time_point deadline) {
  return std::async(std::launch::async, [&batcher, &store, keys, deadline] {
    return batcher.Probe({AskOf("s", store, keys)}, deadline);
  });
}

// A held store's first call, out once this returns: the lookup of `keys` that sent it.
std::future<Answers> HoldAFirstCall(ProbeBatcher& batcher, FakeStore& store,
                                    std::vector<std::string> keys, Clock::time_point deadline) {
  store.hold = true;
  std::future<Answers> first = ProbeLater(batcher, store, std::move(keys), deadline);
  EXPECT_TRUE(store.AwaitCalls(1));
  return first;
}

// `answer` is OK and is what a FakeStore holds of `keys`, in their order.
void ExpectAnswerFor(const ProbeBatcher::Answer& answer, const std::vector<std::string>& keys) {
  ASSERT_TRUE(answer.status.ok()) << answer.status.error_message();
  ASSERT_EQ(answer.response.block_kv_size(), static_cast<int>(keys.size()));
  ASSERT_EQ(answer.response.producer_swa_size(), static_cast<int>(keys.size()));
  for (size_t k = 0; k < keys.size(); ++k) {
    EXPECT_EQ(answer.response.block_kv(static_cast<int>(k)),
              static_cast<uint8_t>(keys[k][0]) % 2 == 1);
    EXPECT_EQ(answer.response.producer_swa(static_cast<int>(k)),
              static_cast<uint8_t>(keys[k][0]) % 3 == 0);
  }
}

TEST(ProbeBatcherTest, ALookupAloneIsSentAtOnceToEachOwner) {
  FakeStore a, b;
  ProbeBatcher batcher({.max_keys_per_call = 64});
  const std::vector<std::string> keys_a = {Key(1), Key(2), Key(3)}, keys_b = {Key(6), Key(7)};
  const Answers answers = batcher.Probe({AskOf("a", a, keys_a), AskOf("b", b, keys_b)},
                                        In(std::chrono::seconds(10)), {{"traceparent", "t"}});
  ASSERT_EQ(answers.size(), 2u);
  ExpectAnswerFor(answers[0], keys_a);
  ExpectAnswerFor(answers[1], keys_b);
  EXPECT_EQ(a.Calls(), std::vector<std::vector<std::string>>{keys_a});
  EXPECT_EQ(b.Calls(), std::vector<std::vector<std::string>>{keys_b});
  EXPECT_EQ(batcher.calls(), 2u);
  EXPECT_EQ(batcher.lookups(), 2u);
}

TEST(ProbeBatcherTest, LookupsQueuedWhileACallIsOutGoTogetherInTheNextEachKeyOnce) {
  FakeStore store;
  ProbeBatcher batcher({.max_keys_per_call = 64});
  const auto deadline = In(std::chrono::seconds(20));
  // The first lookup's call is out and held; three more queue behind it, sharing keys.
  auto first = HoldAFirstCall(batcher, store, {Key(1), Key(2)}, deadline);
  const std::vector<std::vector<std::string>> queued = {
      {Key(1), Key(3)}, {Key(3), Key(4), Key(5)}, {Key(9)}};
  std::vector<std::future<Answers>> later;
  for (const auto& keys : queued) later.push_back(ProbeLater(batcher, store, keys, deadline));
  ASSERT_TRUE(AwaitQueued(batcher, queued.size()));
  EXPECT_EQ(store.Calls().size(), 1u) << "a second call went out while the first was held";
  store.Release();
  ExpectAnswerFor(first.get()[0], {Key(1), Key(2)});
  for (size_t i = 0; i < queued.size(); ++i) ExpectAnswerFor(later[i].get()[0], queued[i]);

  const auto calls = store.Calls();
  ASSERT_EQ(calls.size(), 2u) << "the queued lookups were not sent together";
  std::vector<std::string> second = calls[1];
  std::sort(second.begin(), second.end());
  EXPECT_EQ(second, (std::vector<std::string>{Key(1), Key(3), Key(4), Key(5), Key(9)}));
  EXPECT_EQ(batcher.calls(), 2u);
  EXPECT_EQ(batcher.lookups(), 4u);
}

TEST(ProbeBatcherTest, ACallCarriesNoMoreKeysThanTheStoreTakes) {
  FakeStore store;
  ProbeBatcher batcher({.max_keys_per_call = 4});
  const auto deadline = In(std::chrono::seconds(20));
  auto first = HoldAFirstCall(batcher, store, {Key(1)}, deadline);
  std::vector<std::future<Answers>> later;
  for (int i = 0; i < 3; ++i) {
    later.push_back(
        ProbeLater(batcher, store, {Key(10 + i, 0), Key(10 + i, 1), Key(10 + i, 2)}, deadline));
  }
  ASSERT_TRUE(AwaitQueued(batcher, 3));
  store.Release();
  first.get();
  for (auto& f : later) EXPECT_TRUE(f.get()[0].status.ok());
  // Three queued lookups of 3 keys each under a bound of 4 keys: one call each.
  const auto calls = store.Calls();
  ASSERT_EQ(calls.size(), 4u);
  for (const auto& call : calls) EXPECT_LE(call.size(), 4u);
}

TEST(ProbeBatcherTest, ANodeThatDoesNotAnswerMissesEachLookupsOwnDeadline) {
  FakeStore slow, quick;
  slow.hold = true;
  ProbeBatcher batcher({.max_keys_per_call = 64});
  // Out: the first lookup's call to the held node, cut at that lookup's deadline.
  auto first = std::async(std::launch::async, [&] {
    return batcher.Probe({AskOf("slow", slow, {Key(1)}), AskOf("quick", quick, {Key(3)})},
                         In(std::chrono::milliseconds(3000)));
  });
  ASSERT_TRUE(slow.AwaitCalls(1));
  // Queued behind it: a lookup whose deadline comes first. It ends then, not with the call out.
  const Answers second =
      batcher.Probe({AskOf("slow", slow, {Key(5)})}, In(std::chrono::milliseconds(50)));
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(first.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "the call out ended before the queued lookup's deadline";
  const Answers answers = first.get();
  EXPECT_EQ(answers[0].status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ExpectAnswerFor(answers[1], {Key(3)});  // the other node's answer is kept
  // The queued lookup, past its deadline, was never sent: the next call carries only the next.
  slow.Release();
  const Answers after =
      batcher.Probe({AskOf("slow", slow, {Key(7)})}, In(std::chrono::seconds(10)));
  ExpectAnswerFor(after[0], {Key(7)});
  const auto calls = slow.Calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1], std::vector<std::string>{Key(7)});
}

TEST(ProbeBatcherTest, AnAnswerOfTheWrongSizeGivesAnEmptyResponse) {
  FakeStore store;
  store.answer_short = true;
  ProbeBatcher batcher({.max_keys_per_call = 64});
  const Answers answers =
      batcher.Probe({AskOf("s", store, {Key(1), Key(3)})}, In(std::chrono::seconds(10)));
  ASSERT_TRUE(answers[0].status.ok());
  EXPECT_EQ(answers[0].response.block_kv_size(), 0);
  EXPECT_EQ(answers[0].response.producer_swa_size(), 0);
}

TEST(ProbeBatcherTest, StoppingCancelsWhatIsQueuedAndWaitsForTheCallOut) {
  FakeStore store;
  auto batcher = std::make_unique<ProbeBatcher>(ProbeBatcher::Options{.max_keys_per_call = 64});
  const auto deadline = In(std::chrono::seconds(20));
  auto first = HoldAFirstCall(*batcher, store, {Key(1)}, deadline);
  auto queued = ProbeLater(*batcher, store, {Key(3)}, deadline);
  ASSERT_TRUE(AwaitQueued(*batcher, 1));
  auto stop = std::async(std::launch::async, [&] { batcher.reset(); });
  EXPECT_EQ(queued.get()[0].status.error_code(), grpc::StatusCode::CANCELLED);
  // The call out still ends with its answer, and only then is the batcher gone.
  EXPECT_EQ(stop.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  store.Release();
  ExpectAnswerFor(first.get()[0], {Key(1)});
  stop.get();
  EXPECT_EQ(store.Calls().size(), 1u);
}

}  // namespace
}  // namespace baton::kvstore
