// Several hosts on one machine (netns.h): router, kvstore, two prefill and two decode nodes
// each in its own network namespace, StateBlocks over UCX on TCP between them, and faults
// injected on the network itself: a decode node's link cut mid-transfer and mid-stream, a
// prefill node killed mid-transfer, the store slowed. Every request must still complete with
// exactly the tokens of an undisturbed run, within its deadline, and no process may wedge.
// Skipped where network namespaces cannot be made (not root, no iproute2).
#include "netns.h"

#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <random>
#include <thread>

#include "baton/common/model_config.h"
#include "baton/model/model_factory.h"
#include "client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_dir.h"
#include "testing/eventually.h"

namespace baton::testing {
namespace {

using ::testing::Ge;
using ::testing::Gt;
using ::testing::HasSubstr;

// How long the tests wait for a state they then act on (a transfer in flight, streams
// flowing), and how often they look.
constexpr auto kWait = std::chrono::seconds(60);
constexpr auto kPoll = std::chrono::milliseconds(10);

class NetnsTest : public ::testing::Test {
 protected:
  // One network per test process: the process joins its "client" member before anything
  // starts gRPC's threads, which inherit the namespace.
  static void SetUpTestSuite() {
    if (!Netns::Available(&unavailable_)) return;
    net_ = new Netns("bt" + std::to_string(getpid() % 100000));
    for (const char* m :
         {"client", "router", "kvstore", "prefill-a", "prefill-b", "decode-a", "decode-b"}) {
      ASSERT_TRUE(net_->Add(m)) << "cannot make network namespace member " << m;
    }
    ASSERT_TRUE(net_->Join("client"));
    // StateBlocks cross the veth links: UCX over TCP on each member's eth0, which the nodes
    // accept only with --ucx-allow-unprotected-tcp (see Start).
    setenv("UCX_TLS", "tcp", 1);
    setenv("UCX_NET_DEVICES", "eth0", 1);
    model_ = ProcessTempDir() + "/netns_small";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("small"), 43, model_).ok());
    ring_ = LoadModelConfig(model_ + "/config.json")->ring_capacity();
  }
  static void TearDownTestSuite() {
    delete net_;
    net_ = nullptr;
  }
  void SetUp() override {
    if (net_ == nullptr) GTEST_SKIP() << unavailable_;
  }
  void TearDown() override {
    if (net_ == nullptr) return;
    for (const char* m : {"prefill-a", "prefill-b", "decode-a", "decode-b", "kvstore"}) {
      net_->Restore(m);
    }
  }

  // Starts `name` (a netns member) as `role` with `extra` flags, listening on its address.
  static std::string Start(Cluster& cluster, const std::string& role, const std::string& name,
                           std::vector<std::string> extra = {}) {
    cluster.WrapIn(name, net_->Exec(name));
    extra.insert(extra.begin(), {"--host", net_->Address(name)});
    // The test's own veth network is the trusted one UCX over TCP needs (transfer/ucx.h).
    if (role == "prefill" || role == "decode") {
      extra.insert(extra.begin(), "--ucx-allow-unprotected-tcp");
    }
    if (role == "router") return cluster.StartRouter(extra, name);
    if (role == "prefill") return cluster.StartPrefill(name, extra);
    if (role == "decode") return cluster.StartDecode(name, extra);
    return cluster.StartKvstore(name, cluster.dir() + "/store", extra);
  }
  // What greedy decoding of `prompt` gives, undisturbed (batonctl forward with the router's
  // default truncation: compact at K = C).
  static std::vector<int32_t> Expected(const std::vector<int32_t>& prompt, int n) {
    return ForwardTokens(model_, prompt, "compact", ring_, n);
  }
  static inline Netns* net_ = nullptr;
  static inline std::string unavailable_;
  static inline std::string model_;
  static inline int64_t ring_ = 0;
};

// The decode node the router chose is cut off while its read of the StateBlock is held back:
// the prefill node's commit fails within --commit-timeout-ms (not the client's deadline), the
// failure is the decode node's, and the request completes on the other decode node. Once the
// link is back, the cut-off node has freed the reservation on its own.
TEST_F(NetnsTest, ADecodeNodeCutOffMidTransferIsRetriedElsewhereAndNothingWedges) {
  Cluster cluster(model_);
  ASSERT_FALSE(Start(cluster, "router", "router").empty());
  // More free pages: the router's first choice; its reads wait 3 s, so the cut lands in one.
  ASSERT_FALSE(Start(cluster, "decode", "decode-b",
                     {"--pages", "1024", "--inject-transfer-faults", "delay_ms=3000"})
                   .empty());
  ASSERT_FALSE(Start(cluster, "decode", "decode-a", {"--pages", "256"}).empty());
  ASSERT_FALSE(Start(cluster, "prefill", "prefill-a", {"--commit-timeout-ms", "8000"}).empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  std::mt19937_64 rng(7);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 128, 4096);
  const std::vector<int32_t> expected = Expected(prompt, 12);

  auto stub = cluster.Client();
  Outcome outcome;
  const auto start = std::chrono::steady_clock::now();
  std::thread client(
      [&] { outcome = Generate(*stub, Request(prompt, 12), std::chrono::seconds(90)); });
  // The decode node's read waits 3 s once the commit arrives: cut inside that wait.
  ASSERT_TRUE(
      EventuallyThat([&] { return Transferring(cluster, "decode-b"); }, Gt(0u), kWait, kPoll));
  ASSERT_TRUE(net_->Cut("decode-b"));
  client.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message() << "\n"
                                   << cluster.Log("router");
  EXPECT_EQ(outcome.tokens, expected);
  EXPECT_LT(seconds, 90);
  EXPECT_THAT(cluster.Log("router"), HasSubstr("retrying on another"));
  EXPECT_THAT(cluster.Log("router"), ::testing::Not(HasSubstr("prefill node lost")));

  // Nothing wedged: the same prefill node serves the next request at once.
  const Outcome next = Generate(*stub, Request(prompt, 12), std::chrono::seconds(60));
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.tokens, expected);
  // Back on the network, the cut-off node holds nothing: its read gave up at its deadline.
  ASSERT_TRUE(net_->Restore("decode-b"));
  EXPECT_TRUE(DecodeDrained(cluster, "decode-b"));
  EXPECT_TRUE(DecodeDrained(cluster, "decode-a"));
}

// Streams running on a decode node whose link is cut: no connection error ever arrives, so
// the router finds the loss by HTTP/2 keepalive, prefills prompt + tokens so far on the
// other decode node, and every stream ends with exactly its undisturbed tokens.
TEST_F(NetnsTest, StreamsOnADecodeNodeCutOffMidStreamFinishOnAnother) {
  Cluster cluster(model_);
  ASSERT_FALSE(Start(cluster, "router", "router").empty());
  // Slow steps keep the streams mid-way when the link goes.
  ASSERT_FALSE(
      Start(cluster, "decode", "decode-b", {"--pages", "1024", "--inject-step-stall-ms", "150"})
          .empty());
  ASSERT_FALSE(Start(cluster, "decode", "decode-a", {"--pages", "256"}).empty());
  ASSERT_FALSE(Start(cluster, "prefill", "prefill-a").empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  std::mt19937_64 rng(11);
  std::vector<std::vector<int32_t>> prompts, expected;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(RandomPrompt(rng, 96, 4096));
    expected.push_back(Expected(prompts.back(), 40));
  }
  auto stub = cluster.Client();
  std::vector<Outcome> outcomes(4);
  std::atomic<int> flowing{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] {
      outcomes[i] = Generate(*stub, Request(prompts[i], 40), std::chrono::seconds(120),
                             [&](const Outcome& o) {
                               if (o.tokens.size() == 3) ++flowing;
                               return true;
                             });
    });
  }
  ASSERT_TRUE(Eventually([&] { return flowing >= 2 && Reservations(cluster, "decode-b") > 0; },
                         kWait, kPoll));
  ASSERT_TRUE(net_->Cut("decode-b"));
  for (auto& c : clients) c.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(outcomes[i].status.ok())
        << "stream " << i << ": " << outcomes[i].status.error_message();
    EXPECT_EQ(outcomes[i].tokens, expected[i]) << "stream " << i;
  }
  EXPECT_THAT(cluster.Log("router"), HasSubstr("decode node lost; re-prefilling"));
  ASSERT_TRUE(net_->Restore("decode-b"));
  // The cut-off node's server finds its reader gone and frees the streams: by its own
  // keepalive (a ping every 10 s, unanswered for 10 s), or once the link is back, by the
  // reset its next TCP retransmission draws, which the cut's backoff may hold for many seconds
  // (a loaded CI machine needed more than 15).
  EXPECT_TRUE(DecodeDrained(cluster, "decode-b", std::chrono::seconds(60)));
  EXPECT_TRUE(DecodeDrained(cluster, "decode-a"));
}

// A prefill node killed while the decode node reads its StateBlock over TCP: the read fails,
// the router takes the prefill node for lost and prefills again on the other one; all 16
// streams end with their undisturbed tokens, none lost or repeated.
TEST_F(NetnsTest, APrefillNodeKilledMidTransferCostsNoStream) {
  Cluster cluster(model_);
  ASSERT_FALSE(Start(cluster, "router", "router").empty());
  // Every read waits 2 s, so the kill lands while reads are in flight.
  ASSERT_FALSE(
      Start(cluster, "decode", "decode-a", {"--inject-transfer-faults", "delay_ms=2000"}).empty());
  ASSERT_FALSE(Start(cluster, "prefill", "prefill-a").empty());
  ASSERT_FALSE(Start(cluster, "prefill", "prefill-b").empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  std::mt19937_64 rng(13);
  std::vector<std::vector<int32_t>> prompts, expected;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(RandomPrompt(rng, 128, 4096));
    expected.push_back(Expected(prompts.back(), 8));
  }
  auto stub = cluster.Client();
  std::vector<Outcome> outcomes(16);
  std::vector<std::thread> clients;
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] {
      outcomes[i] = Generate(*stub, Request(prompts[i % 4], 8), std::chrono::seconds(180));
    });
  }
  // Each prefill node has at most two commits out (its two prefill slots): once the decode
  // node reads three StateBlocks, both nodes have a read inside the 2 s wait.
  ASSERT_TRUE(
      EventuallyThat([&] { return Transferring(cluster, "decode-a"); }, Ge(3u), kWait, kPoll));
  cluster.Kill("prefill-b");
  for (auto& c : clients) c.join();
  for (int i = 0; i < 16; ++i) {
    EXPECT_TRUE(outcomes[i].status.ok())
        << "stream " << i << ": " << outcomes[i].status.error_message();
    EXPECT_EQ(outcomes[i].tokens, expected[i % 4]) << "stream " << i;
  }
  EXPECT_THAT(cluster.Log("router"), HasSubstr("prefill node lost; retrying on another"));
  EXPECT_TRUE(DecodeDrained(cluster, "decode-a"));
}

// The prefix store slowed on the network (netem delay, or a 1 Mbit/s tbf where the kernel has
// no netem): lookups past the router's budget make requests cold, write-backs queue behind the
// first token, and every request completes with its tokens; the prefill node stays live.
TEST_F(NetnsTest, AStoreSlowedOnTheNetworkMakesRequestsColdNotFailed) {
  Cluster cluster(model_);
  ASSERT_FALSE(Start(cluster, "router", "router", {"--require-kvstore"}).empty());
  const std::string store = Start(cluster, "kvstore", "kvstore");
  ASSERT_FALSE(store.empty());
  ASSERT_FALSE(Start(cluster, "decode", "decode-a").empty());
  ASSERT_FALSE(Start(cluster, "prefill", "prefill-a", {"--kvstore", store}).empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  std::string how;
  ASSERT_TRUE(net_->Slow("kvstore", 400, &how));
  std::cout << "store slowed: " << how << std::endl;
  std::mt19937_64 rng(17);
  std::vector<std::vector<int32_t>> prompts, expected;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(RandomPrompt(rng, 160, 4096));
    expected.push_back(Expected(prompts.back(), 8));
  }
  auto stub = cluster.Client();
  std::vector<Outcome> outcomes(6);
  std::vector<std::thread> clients;
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&, i] {
      outcomes[i] = Generate(*stub, Request(prompts[i], 8), std::chrono::seconds(60));
    });
  }
  for (auto& c : clients) c.join();
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(outcomes[i].status.ok())
        << "request " << i << ": " << outcomes[i].status.error_message();
    EXPECT_EQ(outcomes[i].tokens, expected[i]) << "request " << i;
  }
  EXPECT_TRUE(DecodeDrained(cluster, "decode-a"));
}

}  // namespace
}  // namespace baton::testing
