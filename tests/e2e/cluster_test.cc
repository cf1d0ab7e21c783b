// The cluster end to end (issue: router + prefill + decode as separate processes on
// loopback): greedy tokens equal `batonctl forward` over both transports under concurrency,
// cancelled and expired streams free decode memory, bad input is refused by field, and lost
// decode or prefill nodes are survived without lost or repeated tokens.
#include "cluster.h"

#include <atomic>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "../tools/run_batonctl.h"
#include "baton/model/model_factory.h"
#include "client.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scrape.h"
#include "test_dir.h"
#include "testing/eventually.h"

namespace baton::testing {
namespace {

using ::testing::HasSubstr;

class ClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tiny_ = baton::testing::ProcessTempDir() + "/e2e_tiny";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 5, tiny_).ok());
  }
  static std::string tiny_;
};
std::string ClusterTest::tiny_;

class TransportTest : public ClusterTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(TransportTest, ConcurrentRequestsGiveTheForwardTokens) {
  Cluster cluster(tiny_);
  ASSERT_FALSE(cluster.StartRouter({"--transport", GetParam()}).empty());
  ASSERT_TRUE(cluster.WaitForHealth(false)) << "router SERVING without nodes";
  ASSERT_FALSE(cluster.StartDecode("decode", {"--slots", "32"}).empty()) << cluster.Log("decode");
  ASSERT_FALSE(cluster.StartPrefill("prefill").empty()) << cluster.Log("prefill");
  ASSERT_TRUE(cluster.WaitForHealth(true)) << cluster.Log("router");

  std::mt19937_64 rng(41);
  const int kRequests = 16, kTokens = 10;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kRequests; ++i) prompts.push_back(RandomPrompt(rng, 5 + 11 * i % 90, 512));
  std::vector<Outcome> outcomes(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest request = Request(prompts[i], kTokens);
      if (i % 2 == 1) request.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_OFF);
      auto stub = cluster.Client();
      outcomes[i] = Generate(*stub, request);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(outcomes[i].status.ok()) << i << ": " << outcomes[i].status.error_message();
    // The serving default is compact with K = C (22 for tiny); odd requests asked for off.
    const auto expected = i % 2 == 0 ? ForwardTokens(tiny_, prompts[i], "compact", 22, kTokens)
                                     : ForwardTokens(tiny_, prompts[i], "off", 0, kTokens);
    EXPECT_EQ(outcomes[i].tokens, expected) << "request " << i;
    EXPECT_EQ(outcomes[i].finish, v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(outcomes[i].usage.completion_tokens(), static_cast<uint32_t>(kTokens));
    EXPECT_EQ(outcomes[i].usage.prompt_tokens(), prompts[i].size());
    const uint32_t L = static_cast<uint32_t>(prompts[i].size());
    EXPECT_EQ(outcomes[i].usage.replayed_rows(), i % 2 == 0 ? std::min(L, 22u) : L);
  }
  EXPECT_TRUE(DecodeDrained(cluster, "decode"));
}

INSTANTIATE_TEST_SUITE_P(BothTransports, TransportTest, ::testing::Values("ucx", "grpc"));

// Nodes given --weights bf16 serve with BF16 weight matrices: their tokens are `batonctl
// forward --weights bf16`'s, on a prompt chosen so that those differ from the FP32 forward
// pass's (a node that ignored the flag would give the FP32 tokens).
TEST_F(ClusterTest, Bf16WeightsServeTheBf16ForwardTokens) {
  const int kTokens = 32;
  std::mt19937_64 rng(43);
  std::vector<int32_t> prompt, bf16_tokens;
  for (int tries = 0; tries < 40 && prompt.empty(); ++tries) {
    std::vector<int32_t> candidate = RandomPrompt(rng, 7 + 13 * tries % 60, 512);
    std::vector<int32_t> tokens =
        ForwardTokens(tiny_, candidate, "compact", 22, kTokens, 0, "bf16");
    if (tokens != ForwardTokens(tiny_, candidate, "compact", 22, kTokens)) {
      prompt = std::move(candidate);
      bf16_tokens = std::move(tokens);
    }
  }
  ASSERT_FALSE(prompt.empty()) << "no prompt whose BF16 and FP32 tokens differ";
  Cluster cluster(tiny_);
  ASSERT_FALSE(cluster.StartRouter().empty());
  ASSERT_FALSE(cluster.StartDecode("decode", {"--weights", "bf16"}).empty())
      << cluster.Log("decode");
  ASSERT_FALSE(cluster.StartPrefill("prefill", {"--weights", "bf16"}).empty())
      << cluster.Log("prefill");
  ASSERT_TRUE(cluster.WaitForHealth(true)) << cluster.Log("router");
  auto stub = cluster.Client();
  const Outcome outcome = Generate(*stub, Request(prompt, kTokens));
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  EXPECT_EQ(outcome.tokens, bf16_tokens) << "prompt of " << prompt.size();
  EXPECT_TRUE(DecodeDrained(cluster, "decode"));
}

TEST_F(ClusterTest, CancelledAndExpiredStreamsFreeTheDecodeSlot) {
  Cluster cluster(tiny_);
  ASSERT_FALSE(cluster.StartRouter().empty());
  ASSERT_FALSE(cluster.StartDecode("decode").empty());
  ASSERT_FALSE(cluster.StartPrefill("prefill").empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  auto stub = cluster.Client();
  std::mt19937_64 rng(43);
  const auto prompt = RandomPrompt(rng, 30, 512);

  // Cancel after a few messages.
  Outcome cancelled = Generate(*stub, Request(prompt, 4000), std::chrono::seconds(60),
                               [](const Outcome& o) { return o.tokens.size() < 5; });
  EXPECT_EQ(cancelled.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(DecodeDrained(cluster, "decode")) << "cancelled stream kept decode memory";

  // A deadline that expires mid-stream.
  Outcome expired = Generate(*stub, Request(prompt, 4000), std::chrono::milliseconds(400));
  EXPECT_EQ(expired.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(expired.tokens.size(), 4000u);
  EXPECT_TRUE(DecodeDrained(cluster, "decode")) << "expired stream kept decode memory";

  // The node still serves afterwards.
  Outcome after = Generate(*stub, Request(prompt, 3));
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens.size(), 3u);
}

TEST_F(ClusterTest, BadInputIsRefusedNamingTheField) {
  Cluster cluster(tiny_);
  ASSERT_FALSE(
      cluster.StartRouter({"--max-tokens-limit", "100", "--max-model-len", "200"}).empty());
  ASSERT_FALSE(cluster.StartDecode("decode").empty());
  ASSERT_FALSE(cluster.StartPrefill("prefill").empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  auto stub = cluster.Client();
  const std::vector<int32_t> prompt = {1, 2, 3};
  struct Case {
    v1::GenerateRequest request;
    const char* message;
  };
  std::vector<Case> cases;
  cases.push_back({Request({}, 5), "prompt_token_ids: the prompt is empty"});
  cases.push_back({Request({1, 999}, 5), "prompt_token_ids[1]: 999 is outside the vocabulary"});
  cases.push_back({Request(prompt, 0), "sampling.max_tokens: 0 must lie in [1, 100]"});
  cases.push_back({Request(prompt, 101), "sampling.max_tokens: 101 must lie in [1, 100]"});
  cases.push_back({Request(std::vector<int32_t>(150, 7), 60),
                   "prompt_token_ids + sampling.max_tokens: 150 + 60 exceeds the context limit "
                   "200"});
  v1::GenerateRequest low_keep = Request(prompt, 5);
  low_keep.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_COMPACT);
  low_keep.mutable_truncation()->set_keep(21);
  cases.push_back({low_keep, "truncation.keep: 21 is below the ring capacity C = 22"});
  v1::GenerateRequest logprobs = Request(prompt, 5);
  logprobs.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_MASK);
  logprobs.mutable_truncation()->set_keep(40);
  logprobs.set_prompt_logprobs(true);
  cases.push_back({logprobs, "prompt_logprobs: unavailable with truncation on"});
  for (const Case& c : cases) {
    const Outcome o = Generate(*stub, c.request);
    EXPECT_EQ(o.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message;
    EXPECT_THAT(o.status.error_message(), HasSubstr(c.message));
    EXPECT_TRUE(o.tokens.empty());
  }
  // Prompt logprobs under the server's default truncation are served with truncation off,
  // and are the untruncated model's log P(prompt[i + 1] | prompt[..i]).
  const std::vector<int32_t> long_prompt = {5,  9,  200, 33, 4,  8,  100, 7,  7,  7,  1,  2,
                                            3,  4,  5,   6,  7,  8,  9,   10, 11, 12, 13, 14,
                                            15, 16, 17,  18, 19, 20, 21,  22, 23, 24, 25};
  v1::GenerateRequest default_logprobs = Request(long_prompt, 4);
  default_logprobs.set_prompt_logprobs(true);
  const Outcome served = Generate(*stub, default_logprobs);
  ASSERT_TRUE(served.status.ok()) << served.status.error_message();
  EXPECT_EQ(served.tokens, ForwardTokens(tiny_, long_prompt, "off", 0, 4));
  const Result forward =
      RunBatonctl("forward --model " + tiny_ + " --tokens " + Join(long_prompt) + " --json");
  const auto rows = nlohmann::json::parse(forward.out)["logits"];
  ASSERT_EQ(served.prompt_logprobs.size(), long_prompt.size() - 1);
  for (size_t i = 0; i + 1 < long_prompt.size(); ++i) {
    const std::vector<double> row = rows[i].get<std::vector<double>>();
    const double max_logit = *std::max_element(row.begin(), row.end());
    double total = 0;
    for (double l : row) total += std::exp(l - max_logit);
    const double expected = row[long_prompt[i + 1]] - max_logit - std::log(total);
    EXPECT_NEAR(served.prompt_logprobs[i], expected, 1e-4) << "position " << i;
  }
}

// Lists a server's services through gRPC server reflection (grpc.reflection.v1alpha), with a
// hand-encoded ServerReflectionRequest{list_services: ""}; returns the raw response bytes ("" when
// the server has no reflection).
std::string ReflectionServiceList(const std::string& address,
                                  const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  grpc::GenericStub stub(grpc::CreateChannel(address, credentials));
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &queue);
  auto step = [&](auto&& start) {
    void* tag = nullptr;
    bool ok = false;
    start();
    return queue.Next(&tag, &ok) && ok;
  };
  std::string text;
  grpc::Slice slice(std::string("\x3a\x00", 2));  // field 7 (list_services), empty string
  grpc::ByteBuffer request(&slice, 1), response;
  if (step([&] { call->StartCall(reinterpret_cast<void*>(1)); }) &&
      step([&] { call->Write(request, reinterpret_cast<void*>(2)); }) &&
      step([&] { call->Read(&response, reinterpret_cast<void*>(3)); })) {
    std::vector<grpc::Slice> slices;
    if (response.Dump(&slices).ok()) {
      for (const auto& s : slices) text.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  context.TryCancel();
  grpc::Status ignored;
  step([&] { call->Finish(&ignored, reinterpret_cast<void*>(4)); });
  queue.Shutdown();
  void* tag;
  bool ok;
  while (queue.Next(&tag, &ok)) {
  }
  return text;
}

// Two routers behind one list: every node registers with both (`--router A,B`), so either
// router serves, with the same tokens.
TEST_F(ClusterTest, NodesRegisterWithEveryRouterInTheList) {
  Cluster cluster(tiny_);
  const std::string first = cluster.StartRouter();
  ASSERT_FALSE(first.empty());
  const std::string second = cluster.StartRouter({}, "router-b");
  ASSERT_FALSE(second.empty());
  const std::string both =
      cluster.Address("router-internal") + "," + cluster.Address("router-b-internal");
  for (const std::string role : {"decode", "prefill"}) {
    std::vector<std::string> args = testing::TlsFlags(role);
    args.insert(args.end(), {"--model", tiny_, "--router", both, "--node-id", role});
    ASSERT_FALSE(
        cluster.Start(role, role == "decode" ? BATON_DECODE_PATH : BATON_PREFILL_PATH, args)
            .empty());
  }
  ASSERT_TRUE(cluster.WaitForHealth(true)) << cluster.Log("router");
  std::mt19937_64 rng(7);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 40, 512);
  const auto expected = ForwardTokens(tiny_, prompt, "compact", 22, 6);
  for (const std::string& router : {first, second}) {
    auto stub =
        v1::Generation::NewStub(grpc::CreateChannel(router, grpc::InsecureChannelCredentials()));
    Outcome outcome;
    // The second router may hear from the nodes a heartbeat later than the first: until then it
    // answers UNAVAILABLE.
    Eventually(
        [&] {
          outcome = Generate(*stub, Request(prompt, 6));
          return outcome.status.error_code() != grpc::StatusCode::UNAVAILABLE;
        },
        std::chrono::seconds(10), std::chrono::milliseconds(100));
    ASSERT_TRUE(outcome.status.ok()) << router << ": " << outcome.status.error_message();
    EXPECT_EQ(outcome.tokens, expected) << router;
  }
}

// Two routers share one prefill node: the node tells each that two routers take it, each then
// holds one of its two slots (--prefill-slots 2), and under a load that keeps both routers'
// queues full the node never holds more than two prefills at once.
TEST_F(ClusterTest, TwoRoutersUnderLoadNeverSendANodeMoreThanItsSlots) {
  Cluster cluster(tiny_);
  const std::string first = cluster.StartRouter({"--prefill-slots", "2"});
  ASSERT_FALSE(first.empty());
  const std::string second = cluster.StartRouter({"--prefill-slots", "2"}, "router-b");
  ASSERT_FALSE(second.empty());
  const std::string both =
      cluster.Address("router-internal") + "," + cluster.Address("router-b-internal");
  const std::string metrics_ready = cluster.dir() + "/prefill.metrics";
  ASSERT_FALSE(cluster.StartDecode("decode", {"--router", both, "--slots", "32"}).empty());
  ASSERT_FALSE(cluster
                   .StartPrefill("prefill", {"--router", both, "--metrics-port", "0",
                                             "--metrics-ready-file", metrics_ready})
                   .empty());
  std::string metrics;
  std::ifstream(metrics_ready) >> metrics;
  ASSERT_FALSE(metrics.empty());
  // Both routers have taken a round of the node's registrations; the rounds after it tell them
  // so (once a second round has ended, one that said so has been answered).
  double round = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        const std::string exposition = Scrape(metrics);
        round = Sample(exposition, "baton_node_registration_rounds_total").value_or(0);
        return Sample(exposition, "baton_node_routers").value_or(0) == 2;
      },
      std::chrono::seconds(20), std::chrono::milliseconds(50)))
      << cluster.Log("prefill");
  ASSERT_TRUE(Eventually(
      [&] {
        return Sample(Scrape(metrics), "baton_node_registration_rounds_total").value_or(0) >=
               round + 2;
      },
      std::chrono::seconds(20), std::chrono::milliseconds(50)))
      << Scrape(metrics);
  for (const std::string& router : {first, second}) {
    auto stub =
        v1::Generation::NewStub(grpc::CreateChannel(router, grpc::InsecureChannelCredentials()));
    std::mt19937_64 rng(5);
    // Served by both: each router has the node's report of two routers (a heartbeat later).
    ASSERT_TRUE(Eventually(
        [&] { return Generate(*stub, Request(RandomPrompt(rng, 20, 512), 2)).status.ok(); },
        std::chrono::seconds(20), std::chrono::milliseconds(100)));
  }
  const int kPerRouter = 12;
  std::vector<Outcome> outcomes(2 * kPerRouter);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2 * kPerRouter; ++i) {
    threads.emplace_back([&, i] {
      auto stub = v1::Generation::NewStub(
          grpc::CreateChannel(i % 2 == 0 ? first : second, grpc::InsecureChannelCredentials()));
      std::mt19937_64 rng(100 + i);
      v1::GenerateRequest request = Request(RandomPrompt(rng, 400, 512), 2);
      request.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_OFF);  // a prefill to wait on
      outcomes[i] = Generate(*stub, request);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 2 * kPerRouter; ++i) {
    EXPECT_TRUE(outcomes[i].status.ok()) << i << ": " << outcomes[i].status.error_message();
  }
  const double peak = Sample(Scrape(metrics), "baton_prefill_requests_active_peak").value_or(-1);
  std::cout << "[ two routers ] most prefills on the node at once: " << peak << " of 2 slots\n";
  EXPECT_LE(peak, 2);
  EXPECT_GE(peak, 2) << "the load should have filled both routers' shares";
}

// Health on every port: the client port in plaintext, the internal ones to the `client`
// certificate, which may call nothing else there (no reflection either).
TEST_F(ClusterTest, EveryServerSpeaksHealthAndTheRouterTracksItsNodes) {
  Cluster cluster(tiny_);
  const std::string router = cluster.StartRouter();
  ASSERT_FALSE(router.empty());
  const std::string decode = cluster.StartDecode("decode");
  const std::string prefill = cluster.StartPrefill("prefill");
  ASSERT_TRUE(cluster.WaitForHealth(true));
  const auto client_cert = TlsAs("client");
  for (const auto& [address, credentials] : {std::pair{router, grpc::InsecureChannelCredentials()},
                                             {cluster.router_internal(), client_cert},
                                             {prefill, client_cert},
                                             {decode, client_cert}}) {
    auto health = grpc::health::v1::Health::NewStub(grpc::CreateChannel(address, credentials));
    // A node turns ready a moment after the router takes its registration (its heartbeat
    // reads the answer), so the nodes are asked until they say SERVING.
    EXPECT_TRUE(Eventually(
        [&] {
          grpc::ClientContext context;
          grpc::health::v1::HealthCheckResponse response;
          return health->Check(&context, grpc::health::v1::HealthCheckRequest(), &response)
                     .ok() &&
                 response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
        },
        std::chrono::seconds(10)))
        << address;
    if (address != router) EXPECT_EQ(ReflectionServiceList(address, credentials), "") << address;
  }
  // Without a decode node the router stops reporting SERVING, and says so again once one
  // registers.
  cluster.Kill("decode");
  EXPECT_TRUE(cluster.WaitForHealth(false));
  ASSERT_FALSE(cluster.StartDecode("decode-2").empty());
  EXPECT_TRUE(cluster.WaitForHealth(true));
}

class FaultTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    small_ = baton::testing::ProcessTempDir() + "/e2e_small";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("small"), 9, small_).ok());
    small_shared_ = baton::testing::ProcessTempDir() + "/e2e_small_shared";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("small-shared"), 9, small_shared_).ok());
  }
  // A decode node is killed while it streams the request: the router moves the stream to the
  // other node, which continues it from the StateBlock without a lost or repeated token.
  // `split`: flags of the router and the prefill node (the split they run).
  static void LostDecodeNodeCase(const std::string& model, std::vector<std::string> split = {});
  static std::string small_;
  static std::string small_shared_;
};
std::string FaultTest::small_;
std::string FaultTest::small_shared_;

TEST_F(FaultTest, LostDecodeNodeIsReplacedWithoutLostOrRepeatedTokens) {
  LostDecodeNodeCase(small_);
}

// The same with one block-KV source for the eight consumer layers (a StateBlock whose block KV
// is one group).
TEST_F(FaultTest, LostDecodeNodeOfASharedBlockKvModelIsReplacedAlike) {
  LostDecodeNodeCase(small_shared_);
}

// The same under replay-on-decode: the re-prefill hands the other node the boundary rows of
// prompt + the tokens so far, and its replay continues the stream undisturbed.
TEST_F(FaultTest, LostDecodeNodeUnderReplayOnDecodeIsReplacedAlike) {
  LostDecodeNodeCase(small_, {"--split", "replay-on-decode"});
}

void FaultTest::LostDecodeNodeCase(const std::string& model, std::vector<std::string> split) {
  Cluster cluster(model);
  ASSERT_FALSE(cluster.StartRouter(split).empty());
  ASSERT_FALSE(cluster.StartDecode("decode-a", {"--pages", "256"}).empty());
  ASSERT_FALSE(cluster.StartDecode("decode-b", {"--pages", "256"}).empty());
  ASSERT_FALSE(cluster.StartPrefill("prefill", split).empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  auto stub = cluster.Client();
  std::mt19937_64 rng(47);
  const auto prompt = RandomPrompt(rng, 60, 4096);
  const uint32_t kTokens = 120;
  const Outcome undisturbed = Generate(*stub, Request(prompt, kTokens));
  ASSERT_TRUE(undisturbed.status.ok()) << undisturbed.status.error_message();
  ASSERT_EQ(undisturbed.tokens.size(), kTokens);

  std::string killed;
  const Outcome disturbed = Generate(*stub, Request(prompt, kTokens), std::chrono::seconds(120),
                                     KillTheHoldingDecodeNode(cluster, killed));
  ASSERT_FALSE(killed.empty()) << "no decode node held the request";
  ASSERT_TRUE(disturbed.status.ok()) << disturbed.status.error_message();
  EXPECT_EQ(disturbed.tokens, undisturbed.tokens);
  EXPECT_EQ(disturbed.finish, v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(disturbed.usage.completion_tokens(), kTokens);
  EXPECT_THAT(cluster.Log("router"), HasSubstr("decode node " + killed + " lost after"));
  EXPECT_TRUE(DecodeDrained(cluster, killed == "decode-a" ? "decode-b" : "decode-a"));
}

TEST_F(FaultTest, PrefillNodeLostBeforeCommitIsRetriedAndTheReservationFreed) {
  Cluster cluster(small_);
  ASSERT_FALSE(cluster.StartRouter().empty());
  ASSERT_FALSE(cluster.StartDecode("decode", {"--pages", "256"}).empty());
  // Both prefill nodes are up before the request, so nothing races the prefill: the one the
  // router picked says so on its metrics (baton_prefill_running) and is killed mid-compute.
  std::map<std::string, std::string> metrics;
  for (const std::string node : {"prefill-a", "prefill-b"}) {
    const std::string ready = cluster.dir() + "/" + node + ".metrics";
    ASSERT_FALSE(
        cluster.StartPrefill(node, {"--metrics-port", "0", "--metrics-ready-file", ready}).empty());
    std::ifstream(ready) >> metrics[node];
    ASSERT_FALSE(metrics[node].empty())
        << node << " wrote no metrics address before its ready file";
  }
  ASSERT_TRUE(cluster.WaitForHealth(true));
  // 30 s for both waits below.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  ASSERT_TRUE(EventuallyThat([&] { return cluster.Log("router"); },
                             HasSubstr("node prefill-b registered"), until));
  std::mt19937_64 rng(53);
  const auto prompt = RandomPrompt(rng, 2500, 4096);
  v1::GenerateRequest request = Request(prompt, 4);
  request.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_OFF);  // a long prefill to cut
  Outcome outcome;
  std::thread client([&] {
    auto stub = cluster.Client();
    outcome = Generate(*stub, request);
  });
  // A 2,500-token off prefill takes seconds, long enough to be seen between scrapes; the node
  // computing it is killed before it can commit, and the router must retry on the other. (Each
  // node's metrics file is there once StartPrefill returns: a node writes its ready file last.)
  std::string computing;
  Eventually(
      [&] {
        for (const auto& [node, address] : metrics) {
          if (Sample(Scrape(address), "baton_prefill_running").value_or(0) == 1) computing = node;
        }
        return !computing.empty();
      },
      until, std::chrono::milliseconds(10));
  if (computing.empty()) {
    client.join();
    FAIL() << "no prefill node was seen computing the request";
  }
  EXPECT_EQ(Reservations(cluster, "decode"), 1u) << "the request should hold a reservation";
  cluster.Kill(computing);
  client.join();
  EXPECT_THAT(cluster.Log("router"), HasSubstr("prefill node " + computing + " lost"));
  // The retry is asserted: the request completes on the other node with the undisturbed tokens.
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  EXPECT_EQ(outcome.tokens, ForwardTokens(small_, prompt, "off", 0, 4));
  EXPECT_TRUE(DecodeDrained(cluster, "decode")) << "the reservation was not released";
}

// Transfers that go wrong (the fault-injecting transport in the decode node) fail the request
// with the checksum's DATA_LOSS or the deadline, free the reservation, and leave the cluster
// serving: the next good transfer decodes the undisturbed tokens.
TEST_F(FaultTest, CorruptedOrDroppedTransfersFailCleanlyAndFreeTheReservation) {
  Cluster cluster(small_);
  ASSERT_FALSE(cluster.StartRouter({"--reservation-timeout-ms", "3000"}).empty());
  ASSERT_FALSE(
      cluster.StartDecode("decode", {"--inject-transfer-faults", "corrupt=0.5,drop=0.3,seed=3"})
          .empty());
  ASSERT_FALSE(cluster.StartPrefill("prefill").empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  auto stub = cluster.Client();
  std::mt19937_64 rng(53);
  const auto prompt = RandomPrompt(rng, 40, 4096);
  std::map<grpc::StatusCode, int> outcomes;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 8; ++i) {
    const Outcome outcome = Generate(*stub, Request(prompt, 4), std::chrono::seconds(60));
    ++outcomes[outcome.status.error_code()];
    if (outcome.status.ok()) {
      if (!tokens.empty()) EXPECT_EQ(outcome.tokens, tokens);  // good transfers agree
      tokens = outcome.tokens;
    } else if (outcome.status.error_code() == grpc::StatusCode::DATA_LOSS) {
      EXPECT_THAT(outcome.status.error_message(), ::testing::HasSubstr("failed its checksum"));
    }
    EXPECT_TRUE(DecodeDrained(cluster, "decode")) << "request " << i << " left its reservation";
  }
  // The seeded draws give each outcome at least once in eight requests.
  EXPECT_GT(outcomes[grpc::StatusCode::DATA_LOSS], 0);
  EXPECT_GT(outcomes[grpc::StatusCode::DEADLINE_EXCEEDED], 0);
  EXPECT_GT(outcomes[grpc::StatusCode::OK], 0);
  EXPECT_EQ(outcomes[grpc::StatusCode::DATA_LOSS] + outcomes[grpc::StatusCode::DEADLINE_EXCEEDED] +
                outcomes[grpc::StatusCode::OK],
            8);
}

}  // namespace
}  // namespace baton::testing
