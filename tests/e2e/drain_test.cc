// Graceful drain (common/rpc.h ServeUntilShutdown): a node or router that gets SIGTERM while it
// holds streams finishes them, takes nothing new, and exits on its own; the router stops
// sending a draining node work from its draining registration on.
#include <sys/wait.h>

#include <atomic>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "baton/model/model_factory.h"
#include "client.h"
#include "cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_dir.h"
#include "testing/eventually.h"

namespace baton::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kStreams = 12;
constexpr uint32_t kTokens = 64;
constexpr auto kDrainTimeout = std::chrono::seconds(90);

class DrainTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    small_ = baton::testing::ProcessTempDir() + "/drain_small";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("small"), 9, small_).ok());
  }
  static std::vector<std::vector<int32_t>> Prompts() {
    std::mt19937_64 rng(61);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < kStreams; ++i) prompts.push_back(RandomPrompt(rng, 40 + i, 4096));
    return prompts;
  }
  // Runs every prompt as its own concurrent stream. `progress[i]` counts the tokens stream i
  // has received so far.
  static std::vector<Outcome> RunStreams(Cluster& cluster,
                                         const std::vector<std::vector<int32_t>>& prompts,
                                         std::vector<std::atomic<int>>& progress) {
    std::vector<Outcome> outcomes(prompts.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < prompts.size(); ++i) {
      threads.emplace_back([&, i] {
        auto stub = cluster.Client();
        outcomes[i] = Generate(*stub, Request(prompts[i], kTokens), std::chrono::seconds(300),
                               [&, i](const Outcome& o) {
                                 progress[i] = static_cast<int>(o.tokens.size());
                                 return true;
                               });
      });
    }
    for (std::thread& t : threads) t.join();
    return outcomes;
  }
  // Every prompt's stream once, without disturbance; empty (with a failure recorded) when one
  // did not complete.
  static std::vector<Outcome> Undisturbed(Cluster& cluster,
                                          const std::vector<std::vector<int32_t>>& prompts) {
    std::vector<std::atomic<int>> quiet(prompts.size());
    std::vector<Outcome> outcomes = RunStreams(cluster, prompts, quiet);
    for (const Outcome& o : outcomes) {
      EXPECT_TRUE(o.status.ok()) << "undisturbed: " << o.status.error_message();
      if (!o.status.ok()) return {};
    }
    return outcomes;
  }
  // Polls until every stream has at least `tokens` tokens (a failure, with each stream's count,
  // at the deadline).
  static ::testing::AssertionResult AllStreaming(const std::vector<std::atomic<int>>& progress,
                                                 int tokens) {
    auto counts = [&] {
      std::vector<int> now;
      for (const std::atomic<int>& p : progress) now.push_back(p.load());
      return now;
    };
    return EventuallyThat(counts, ::testing::Each(::testing::Ge(tokens)), std::chrono::seconds(120),
                          std::chrono::milliseconds(10));
  }
  static std::string small_;
};
std::string DrainTest::small_;

// The decode node of each "request finished" line of the router's (text) log, by request id.
std::map<std::string, std::string> FinishedOn(const std::string& router_log) {
  std::map<std::string, std::string> nodes;
  std::istringstream lines(router_log);
  std::string line;
  auto field = [&line](const std::string& key) {
    const std::string marker = key + "=\"";
    const size_t at = line.find(marker);
    if (at == std::string::npos) return std::string();
    const size_t start = at + marker.size();
    return line.substr(start, line.find('"', start) - start);
  };
  while (std::getline(lines, line)) {
    if (line.find("request finished") != std::string::npos) {
      nodes[field("request_id")] = field("decode_node");
    }
  }
  return nodes;
}

TEST_F(DrainTest, ADrainedDecodeNodeFinishesItsStreamsGetsNothingNewAndExits) {
  Cluster cluster(small_);
  ASSERT_FALSE(cluster.StartRouter().empty());
  const std::string drain = std::to_string(kDrainTimeout.count()) + "s";
  for (const char* node : {"decode-a", "decode-b"}) {
    ASSERT_FALSE(cluster.StartDecode(node, {"--pages", "512", "--drain-timeout", drain}).empty());
  }
  ASSERT_FALSE(cluster.StartPrefill("prefill").empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  ASSERT_TRUE(cluster.WaitForLog("router", "node decode-b registered"));
  const auto prompts = Prompts();
  const std::vector<Outcome> undisturbed = Undisturbed(cluster, prompts);
  ASSERT_EQ(undisturbed.size(), prompts.size());

  // The same streams again; once all of them stream, decode-a gets SIGTERM while it holds some.
  std::vector<std::atomic<int>> progress(kStreams);
  std::vector<Outcome> disturbed;
  std::thread client([&] { disturbed = RunStreams(cluster, prompts, progress); });
  const ::testing::AssertionResult streaming = AllStreaming(progress, 4);
  const uint32_t held = streaming ? Reservations(cluster, "decode-a") : 0;
  if (streaming && held > 0) cluster.Signal("decode-a", SIGTERM);
  // Told to drain, the router sends new requests to decode-b only; the node refuses none
  // (none reaches it).
  bool after_ok = false;
  if (streaming && held > 0 && cluster.WaitForLog("decode-a", "decode node draining") &&
      cluster.WaitForLog("router", "node decode-a is draining")) {
    auto stub = cluster.Client();
    after_ok = true;
    for (int i = 0; i < 4; ++i) {
      v1::GenerateRequest request = Request(prompts[i], 4);
      request.set_request_id("after-drain-" + std::to_string(i));
      const Outcome o = Generate(*stub, request);
      after_ok = after_ok && o.status.ok();
    }
  }
  client.join();
  ASSERT_TRUE(streaming) << "the streams never all started";
  ASSERT_GT(held, 0u) << "decode-a held no stream when it was to be drained";
  EXPECT_TRUE(after_ok) << "requests after the drain began failed";

  // Every stream completed with the undisturbed tokens, none re-prefilled elsewhere.
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(disturbed[i].status.ok()) << i << ": " << disturbed[i].status.error_message();
    EXPECT_EQ(disturbed[i].tokens, undisturbed[i].tokens) << "stream " << i;
    EXPECT_EQ(disturbed[i].usage.completion_tokens(), kTokens);
  }
  const std::string router_log = cluster.Log("router");
  EXPECT_THAT(router_log, HasSubstr("node decode-a is draining"));
  EXPECT_THAT(router_log, Not(HasSubstr("decode node decode-a lost")));
  // The node exits on its own, with everything finished before its drain timeout.
  const std::optional<int> status = cluster.WaitExit("decode-a", kDrainTimeout);
  ASSERT_TRUE(status.has_value()) << "decode-a still runs past its drain timeout";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
  const std::string node_log = cluster.Log("decode-a");
  EXPECT_THAT(node_log, HasSubstr("drained=true"));
  EXPECT_THAT(node_log, Not(HasSubstr("reserve refused: draining")));
  // The four requests sent after the node said it was draining all finished on decode-b.
  const std::map<std::string, std::string> nodes = FinishedOn(router_log);
  for (int i = 0; i < 4; ++i) {
    const std::string id = "after-drain-" + std::to_string(i);
    EXPECT_EQ(nodes.count(id) ? nodes.at(id) : "", "decode-b") << id;
  }
  EXPECT_TRUE(DecodeDrained(cluster, "decode-b"));
}

TEST_F(DrainTest, ADrainedRouterFinishesItsClientsStreamsRefusesNewOnesAndExits) {
  Cluster cluster(small_);
  const std::string drain = std::to_string(kDrainTimeout.count()) + "s";
  ASSERT_FALSE(cluster.StartRouter({"--drain-timeout", drain}).empty());
  ASSERT_FALSE(cluster.StartDecode("decode", {"--pages", "512"}).empty());
  ASSERT_FALSE(cluster.StartPrefill("prefill").empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  const auto prompts = Prompts();
  const std::vector<Outcome> undisturbed = Undisturbed(cluster, prompts);
  ASSERT_EQ(undisturbed.size(), prompts.size());

  std::vector<std::atomic<int>> progress(kStreams);
  std::vector<Outcome> disturbed;
  std::thread client([&] { disturbed = RunStreams(cluster, prompts, progress); });
  const ::testing::AssertionResult streaming = AllStreaming(progress, 4);
  if (streaming) cluster.Signal("router", SIGTERM);
  // A request after the drain began is refused as UNAVAILABLE (a client's cue to use another
  // router), whether the router still drains or has gone.
  Outcome refused;
  if (streaming && cluster.WaitForLog("router", "router draining open_calls=")) {
    auto stub = cluster.Client();
    refused = Generate(*stub, Request(prompts[0], 4));
  }
  client.join();
  ASSERT_TRUE(streaming) << "the streams never all started";
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << refused.status.error_message();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(disturbed[i].status.ok()) << i << ": " << disturbed[i].status.error_message();
    EXPECT_EQ(disturbed[i].tokens, undisturbed[i].tokens) << "stream " << i;
  }
  const std::optional<int> status = cluster.WaitExit("router", kDrainTimeout);
  ASSERT_TRUE(status.has_value()) << "the router still runs past its drain timeout";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
  EXPECT_THAT(cluster.Log("router"), HasSubstr("drained=true"));
  EXPECT_TRUE(DecodeDrained(cluster, "decode"));
}

}  // namespace
}  // namespace baton::testing
