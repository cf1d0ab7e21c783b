// Load and faults against the real binaries (issue: under load and faults every request is
// answered, nothing wedges): hundreds of concurrent streams all complete with their tokens
// because requests wait in the router's admission queue, not in decode reservations that
// expire; past `--max-queued` the surplus is refused at once with a retry hint; and a decode
// node killed under load costs no stream, because a failure the prefill node reports for the
// decode node is retried on another decode node instead of taking the prefill node down.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "baton/common/model_config.h"
#include "baton/model/model_factory.h"
#include "baton_up.h"
#include "client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scrape.h"
#include "test_dir.h"
#include "testing/eventually.h"

namespace baton::testing {
namespace {

struct Answer {
  Outcome outcome;
  std::string retry_after_ms;  // the trailer of a RESOURCE_EXHAUSTED refusal
};

// Generate, keeping the trailing metadata's retry hint.
Answer GenerateWithTrailers(v1::Generation::Stub& stub, const v1::GenerateRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
  Answer answer;
  auto reader = stub.Generate(&context, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    answer.outcome.tokens.insert(answer.outcome.tokens.end(), response.token_ids().begin(),
                                 response.token_ids().end());
  }
  answer.outcome.status = reader->Finish();
  const auto& trailers = context.GetServerTrailingMetadata();
  if (auto it = trailers.find("retry-after-ms"); it != trailers.end()) {
    answer.retry_after_ms = std::string(it->second.data(), it->second.size());
  }
  return answer;
}

// Runs `n` requests at once (request i uses prompts[i % prompts.size()]).
std::vector<Answer> RunConcurrently(v1::Generation::Stub& stub,
                                    const std::vector<std::vector<int32_t>>& prompts, int n,
                                    uint32_t max_tokens) {
  std::vector<Answer> answers(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      answers[i] = GenerateWithTrailers(stub, Request(prompts[i % prompts.size()], max_tokens));
    });
  }
  for (auto& t : threads) t.join();
  return answers;
}

class LoadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = ProcessTempDir() + "/load_small";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("small"), 31, model_).ok());
    std::mt19937_64 rng(61);
    for (int i = 0; i < 4; ++i) prompts_.push_back(RandomPrompt(rng, 128, 4096));
  }
  // Each prompt's tokens from one request at a time.
  static std::vector<std::vector<int32_t>> Undisturbed(v1::Generation::Stub& stub,
                                                       uint32_t max_tokens) {
    std::vector<std::vector<int32_t>> tokens;
    for (const auto& prompt : prompts_) {
      const Outcome outcome = Generate(stub, Request(prompt, max_tokens));
      EXPECT_TRUE(outcome.status.ok()) << outcome.status.error_message();
      tokens.push_back(outcome.tokens);
    }
    return tokens;
  }
  static std::string model_;
  static std::vector<std::vector<int32_t>> prompts_;
};
std::string LoadTest::model_;
std::vector<std::vector<int32_t>> LoadTest::prompts_;

// The reproducer: 256 concurrent streams of 128-token prompts and 8 tokens against `baton up`
// (before: a third ended NOT_FOUND, their reservations expired in the prefill queue; or
// RESOURCE_EXHAUSTED from the decode node's wait bound).
TEST_F(LoadTest, TwoHundredFiftySixConcurrentStreamsAllCompleteWithTheirTokens) {
  BatonUp up(ProcessTempDir() + "/load_up", model_);
  ASSERT_TRUE(up.WaitUntilUp()) << up.log();
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(up.Address("router.addr"), grpc::InsecureChannelCredentials()));
  const auto expected = Undisturbed(*stub, 8);
  const std::vector<Answer> answers = RunConcurrently(*stub, prompts_, 256, 8);
  std::map<grpc::StatusCode, int> codes;
  for (size_t i = 0; i < answers.size(); ++i) {
    const Outcome& o = answers[i].outcome;
    ++codes[o.status.error_code()];
    EXPECT_TRUE(o.status.ok()) << "stream " << i << ": " << o.status.error_message();
    if (o.status.ok()) {
      EXPECT_EQ(o.tokens, expected[i % expected.size()]) << "stream " << i;
    }
  }
  EXPECT_EQ(codes[grpc::StatusCode::OK], 256);
  EXPECT_THAT(up.log(), ::testing::Not(::testing::HasSubstr("reservation expired")));
}

TEST_F(LoadTest, BeyondMaxQueuedTheSurplusIsRefusedWithARetryHint) {
  Cluster cluster(model_);
  ASSERT_FALSE(cluster.StartRouter({"--max-queued", "8"}).empty());
  ASSERT_FALSE(cluster.StartDecode("decode").empty());
  ASSERT_FALSE(cluster.StartPrefill("prefill").empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  auto stub = cluster.Client();
  const auto expected = Undisturbed(*stub, 4);
  const std::vector<Answer> answers = RunConcurrently(*stub, prompts_, 64, 4);
  int ok = 0, refused = 0;
  for (size_t i = 0; i < answers.size(); ++i) {
    const Answer& a = answers[i];
    if (a.outcome.status.ok()) {
      ++ok;
      EXPECT_EQ(a.outcome.tokens, expected[i % expected.size()]) << "stream " << i;
    } else {
      ++refused;
      EXPECT_EQ(a.outcome.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << a.outcome.status.error_message();
      EXPECT_THAT(a.outcome.status.error_message(), ::testing::HasSubstr("admission queue"));
      EXPECT_TRUE(a.outcome.tokens.empty());
      EXPECT_FALSE(a.retry_after_ms.empty()) << "stream " << i << " got no retry hint";
    }
  }
  // At most 8 wait and 2 prefill at a time, so some of 64 are refused; many complete.
  EXPECT_GT(refused, 0);
  EXPECT_GE(ok, 10);
  EXPECT_EQ(ok + refused, 64);
  EXPECT_TRUE(DecodeDrained(cluster, "decode"));
}

// The reproducer: a second decode node killed under load used to take the prefill node (and
// so the cluster) down with it: the prefill node's failed commit read as its own death.
TEST_F(LoadTest, ADecodeNodeKilledUnderLoadCostsNoStream) {
  Cluster cluster(model_);
  ASSERT_FALSE(cluster.StartRouter().empty());
  ASSERT_FALSE(cluster.StartDecode("decode-a", {"--pages", "512"}).empty());
  ASSERT_FALSE(cluster.StartDecode("decode-b", {"--pages", "512"}).empty());
  ASSERT_FALSE(cluster.StartPrefill("prefill").empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  auto stub = cluster.Client();
  const auto expected = Undisturbed(*stub, 48);
  std::atomic<int> started{0};
  std::vector<Outcome> outcomes(16);
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      outcomes[i] = Generate(*stub, Request(prompts_[i % prompts_.size()], 48),
                             std::chrono::seconds(180), [&](const Outcome& o) {
                               if (o.tokens.size() == 1) ++started;
                               return true;
                             });
    });
  }
  // Kill decode-b once streams are running and it holds some of them.
  const ::testing::AssertionResult holding =
      Eventually([&] { return started >= 2 && Reservations(cluster, "decode-b") > 0; },
                 std::chrono::seconds(60), std::chrono::milliseconds(5));
  if (holding) cluster.Kill("decode-b");
  for (auto& t : threads) t.join();
  ASSERT_TRUE(holding) << "decode-b never held a stream";
  for (int i = 0; i < 16; ++i) {
    EXPECT_TRUE(outcomes[i].status.ok()) << "stream " << i << ": "
                                         << outcomes[i].status.error_message();
    EXPECT_EQ(outcomes[i].tokens, expected[i % expected.size()]) << "stream " << i;
  }
  EXPECT_THAT(cluster.Log("router"),
              ::testing::Not(::testing::HasSubstr("no prefill node is available")));
  EXPECT_TRUE(DecodeDrained(cluster, "decode-a"));
}

// The same, made deterministic: the decode node dies while the prefill node's commit to it is
// in flight (its read held back by an injected delay). The prefill node reports the failure as
// the decode node's, and the router retries on the other decode node.
TEST_F(LoadTest, ADecodeNodeDyingDuringTheCommitIsRetriedOnAnotherDecodeNode) {
  Cluster cluster(model_);
  ASSERT_FALSE(cluster.StartRouter().empty());
  // More free pages: the router's first choice.
  ASSERT_FALSE(cluster
                   .StartDecode("decode-b", {"--pages", "1024", "--inject-transfer-faults",
                                             "delay_ms=20000"})
                   .empty());
  ASSERT_FALSE(cluster.StartDecode("decode-a", {"--pages", "256"}).empty());
  ASSERT_FALSE(cluster.StartPrefill("prefill").empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  // The server default: compact with K = C.
  const int64_t C = LoadModelConfig(model_ + "/config.json")->ring_capacity();
  const std::vector<int32_t> expected = ForwardTokens(model_, prompts_[0], "compact", C, 6);
  Outcome outcome;
  std::thread client([&] {
    auto stub = cluster.Client();
    outcome = Generate(*stub, Request(prompts_[0], 6), std::chrono::seconds(120));
  });
  // Kill decode-b once the prefill node's commit to it is in flight: decode-b reads the
  // StateBlock (its read held back 20 s by the injected delay).
  const ::testing::AssertionResult committing =
      EventuallyThat([&] { return Transferring(cluster, "decode-b"); }, ::testing::Gt(0u),
                     std::chrono::seconds(30), std::chrono::milliseconds(5));
  cluster.Kill("decode-b");
  client.join();
  ASSERT_TRUE(committing) << "decode-b never read the StateBlock";
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  EXPECT_EQ(outcome.tokens, expected);
  const std::string router_log = cluster.Log("router");
  EXPECT_THAT(router_log, ::testing::HasSubstr("decode node lost before its commit"));
  EXPECT_THAT(router_log, ::testing::Not(::testing::HasSubstr("prefill node lost")));
  EXPECT_TRUE(DecodeDrained(cluster, "decode-a"));
}

// Liveness: a decode node whose loop is held up (an injected stall before each step) turns
// NOT_SERVING on "liveness" while it has work, and SERVING again once the loop advances.
TEST_F(LoadTest, AWedgedDecodeLoopTurnsLivenessNotServing) {
  Cluster cluster(model_);
  ASSERT_FALSE(cluster.StartRouter().empty());
  ASSERT_FALSE(cluster
                   .StartDecode("decode", {"--watchdog-ms", "300", "--inject-step-stall-ms",
                                           "2500"})
                   .empty());
  ASSERT_FALSE(cluster.StartPrefill("prefill").empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(cluster.Address("decode"), TlsAs("client")));
  auto liveness = [&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::health::v1::HealthCheckRequest request;
    request.set_service("liveness");
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status status = health->Check(&context, request, &response);
    return status.ok() ? response.status() : grpc::health::v1::HealthCheckResponse::UNKNOWN;
  };
  auto wait_for = [&](grpc::health::v1::HealthCheckResponse::ServingStatus want) {
    return EventuallyThat(liveness, want, std::chrono::seconds(30));
  };
  EXPECT_EQ(liveness(), grpc::health::v1::HealthCheckResponse::SERVING);  // idle: not wedged
  Outcome outcome;
  std::thread client([&] {
    auto stub = cluster.Client();
    outcome = Generate(*stub, Request(prompts_[0], 3), std::chrono::seconds(60));
  });
  EXPECT_TRUE(wait_for(grpc::health::v1::HealthCheckResponse::NOT_SERVING));
  client.join();
  EXPECT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  EXPECT_TRUE(wait_for(grpc::health::v1::HealthCheckResponse::SERVING));
  EXPECT_THAT(cluster.Log("decode"), ::testing::HasSubstr("worker loop wedged"));
}

// `baton up --prefill-nodes 2 --decode-nodes 2`: a decode node killed while 16 streams run
// costs no stream, and baton up starts it again on its port; the router, killed in turn, comes
// back on its client port and serves again.
TEST_F(LoadTest, BatonUpRunsSeveralNodesAndRestartsOneThatExits) {
  BatonUp up(ProcessTempDir() + "/restart_up", model_,
             {"--prefill-nodes", "2", "--decode-nodes", "2"});
  ASSERT_TRUE(up.WaitUntilUp()) << up.log();
  for (const char* file : {"prefill.addr", "prefill-1.addr", "decode.addr", "decode-1.addr"}) {
    EXPECT_FALSE(up.Address(file).empty()) << file;
  }
  const std::string router = up.Address("router.addr");
  const std::string decode_1 = up.Address("decode-1.addr");
  auto stub = v1::Generation::NewStub(grpc::CreateChannel(router, grpc::InsecureChannelCredentials()));
  const auto expected = Undisturbed(*stub, 32);
  std::atomic<int> started{0};
  std::vector<Outcome> outcomes(16);
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      outcomes[i] = Generate(*stub, Request(prompts_[i % prompts_.size()], 32),
                             std::chrono::seconds(180), [&](const Outcome& o) {
                               if (o.tokens.size() == 1) ++started;
                               return true;
                             });
    });
  }
  const pid_t victim = up.Child("decode-1");
  ASSERT_GT(victim, 0) << "no decode-1 child of baton up";
  // Killed once 4 streams have started (or after a minute: the streams' outcomes are the test).
  Eventually([&] { return started >= 4; }, std::chrono::seconds(60), std::chrono::milliseconds(5));
  kill(victim, SIGKILL);
  for (auto& t : threads) t.join();
  for (int i = 0; i < 16; ++i) {
    EXPECT_TRUE(outcomes[i].status.ok()) << "stream " << i << ": "
                                         << outcomes[i].status.error_message();
    EXPECT_EQ(outcomes[i].tokens, expected[i % expected.size()]) << "stream " << i;
  }
  EXPECT_TRUE(Eventually(
      [&] {
        const pid_t again = up.Child("decode-1");
        return again > 0 && again != victim && up.Address("decode-1.addr") == decode_1;
      },
      std::chrono::seconds(60)))
      << up.log();
  EXPECT_THAT(up.log(), ::testing::HasSubstr("decode-1 exited (killed by signal 9); restarting"));

  const pid_t router_pid = up.Child("", "baton-router");
  ASSERT_GT(router_pid, 0);
  kill(router_pid, SIGKILL);
  // Back on the same client port, with the nodes registered again.
  Outcome after;
  EXPECT_TRUE(Eventually(
      [&] {
        auto again = v1::Generation::NewStub(
            grpc::CreateChannel(router, grpc::InsecureChannelCredentials()));
        after = Generate(*again, Request(prompts_[0], 32), std::chrono::seconds(20));
        return after.status.ok();
      },
      std::chrono::seconds(60)))
      << after.status.error_message() << "\n"
      << up.log();
  EXPECT_EQ(after.tokens, expected[0]);
  EXPECT_THAT(up.log(), ::testing::HasSubstr("router restarted"));
}

// A client that stops reading: once its HTTP/2 window and the router's write buffer are full,
// the router's write blocks; after --stream-idle-timeout the router cancels the stream and the
// decode node frees the slot and pages behind it (before: held until the client's deadline).
TEST_F(LoadTest, AClientThatStopsReadingIsCancelledAndItsSlotFreed) {
  Cluster cluster(model_);
  ASSERT_FALSE(cluster.StartRouter({"--stream-idle-timeout", "1s"}).empty());
  ASSERT_FALSE(cluster.StartDecode("decode").empty());
  ASSERT_FALSE(cluster.StartPrefill("prefill").empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  // A small receive window, never grown, and no reads at all.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  auto stub = v1::Generation::NewStub(grpc::CreateCustomChannel(
      cluster.Address("router"), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  auto reader = stub->Generate(&context, Request(prompts_[0], 4000));
  // The request reaches the decode node, then its tokens back up until the router gives up.
  bool held = false;
  const ::testing::AssertionResult cancelled = Eventually(
      [&] {
        held = held || Reservations(cluster, "decode") > 0;
        return cluster.Log("router").find("its client took no message") != std::string::npos;
      },
      std::chrono::seconds(120));
  EXPECT_TRUE(held);
  ASSERT_TRUE(cancelled) << cluster.Log("router");
  EXPECT_TRUE(DecodeDrained(cluster, "decode"));
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

// Fairness across tenants (API keys): "flood" queues 24 requests behind one prefill slot, then
// "small" sends 3. Each of small's requests is admitted within a turn or two of arriving, so
// it finishes among the first completions; first come, first served would finish all three
// after all 24 of flood's.
// A cluster of one prefill slot whose router takes two API keys (tenants "flood" and "small",
// keys "<tenant>-key-0123456789") and `router_flags`; the address of the router's metrics.
std::string StartTwoTenantCluster(Cluster& cluster, std::vector<std::string> router_flags,
                                  std::vector<std::string> decode_flags = {}) {
  const std::string keys = cluster.dir() + "/tenant_keys.yaml";
  std::ofstream(keys) << "\"flood-key-0123456789\": flood\n\"small-key-0123456789\": small\n";
  const std::string metrics = cluster.dir() + "/router.metrics";
  router_flags.insert(router_flags.end(), {"--api-keys", keys, "--prefill-slots", "1",
                                           "--metrics-port", "0", "--metrics-ready-file", metrics});
  EXPECT_FALSE(cluster.StartRouter(router_flags).empty());
  EXPECT_FALSE(cluster.StartDecode("decode", std::move(decode_flags)).empty());
  EXPECT_FALSE(cluster.StartPrefill("prefill").empty());
  EXPECT_TRUE(cluster.WaitForHealth(true));
  std::string address;
  std::ifstream(metrics) >> address;
  return address;
}

// Polls the router's queue depth until it reaches `depth` (or a minute passes; what the test
// then asserts tells whether the queue was ever that deep).
void WaitForQueueDepth(const std::string& metrics, double depth) {
  EventuallyThat([&] { return Sample(Scrape(metrics), "baton_router_queue_depth").value_or(0); },
                 ::testing::Ge(depth), std::chrono::seconds(60), std::chrono::milliseconds(5));
}

TEST_F(LoadTest, ATenantFloodingTheQueueDoesNotHoldBackAnother) {
  Cluster cluster(model_);
  const std::string metrics = StartTwoTenantCluster(cluster, {});
  ASSERT_FALSE(metrics.empty());
  auto stub = cluster.Client();
  std::mutex mutex;
  std::vector<std::string> finished;  // tenants in completion order
  std::vector<std::thread> threads;
  auto send = [&](const std::string& tenant, int i) {
    threads.emplace_back([&, tenant, i] {
      const Outcome o = Generate(*stub, Request(prompts_[i % prompts_.size()], 2),
                                 std::chrono::seconds(300), nullptr, tenant + "-key-0123456789");
      EXPECT_TRUE(o.status.ok()) << tenant << ": " << o.status.error_message();
      std::lock_guard<std::mutex> lock(mutex);
      finished.push_back(tenant);
    });
  };
  for (int i = 0; i < 24; ++i) send("flood", i);
  WaitForQueueDepth(metrics, 16);
  for (int i = 0; i < 3; ++i) send("small", i);
  for (auto& t : threads) t.join();
  ASSERT_EQ(finished.size(), 27u);
  int last_small = -1;
  for (int i = 0; i < 27; ++i) {
    if (finished[i] == "small") last_small = i;
  }
  // 24 - 16 = at most 8 of flood's were admitted before small arrived; fair turns then finish
  // small's 3 within the next ~6 completions.
  EXPECT_LT(last_small, 18) << "small's last request finished " << last_small + 1 << " of 27";
}

// A tenant's share of the admission queue is bounded (tenant_share.h: alone, all of
// --max-queued; beside another, half): a flood from one tenant gets that tenant
// RESOURCE_EXHAUSTED, while another tenant's requests, sent into the full queue, take the places
// of the flood's newest and are all queued and served.
TEST_F(LoadTest, AFloodingTenantIsRefusedItsShareWhileAnotherIsServed) {
  Cluster cluster(model_);
  const std::string metrics = StartTwoTenantCluster(cluster, {"--max-queued", "8"});
  ASSERT_FALSE(metrics.empty());
  auto stub = cluster.Client();
  std::mutex mutex;
  int flood_ok = 0, flood_refused = 0, small_ok = 0;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  auto send = [&](const std::string& tenant, int i) {
    threads.emplace_back([&, tenant, i] {
      const Outcome o = Generate(*stub, Request(prompts_[i % prompts_.size()], 2),
                                 std::chrono::seconds(300), nullptr, tenant + "-key-0123456789");
      std::lock_guard<std::mutex> lock(mutex);
      if (tenant == "small") {
        small_ok += o.status.ok();
        if (!o.status.ok()) errors.push_back(o.status.error_message());
      } else if (o.status.ok()) {
        ++flood_ok;
      } else if (o.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
                 o.status.error_message().find("this tenant holds") != std::string::npos) {
        ++flood_refused;
      } else {
        errors.push_back(o.status.error_message());
      }
    });
  };
  for (int i = 0; i < 16; ++i) send("flood", i);
  // The flood fills the queue before the other tenant comes.
  WaitForQueueDepth(metrics, 8);
  for (int i = 0; i < 3; ++i) send("small", i);
  for (auto& t : threads) t.join();
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(small_ok, 3);
  EXPECT_GE(flood_refused, 1);
  EXPECT_GE(flood_ok, 1);
  EXPECT_EQ(flood_ok + flood_refused, 16);
}

// A tenant holds at most its share of the decode slots (tenant_share.h, from the slots the
// decode node reports; alone, all but the two kept for newcomers): a flood of long requests
// never has more than 2 of the node's 4 in flight, and the other tenant's requests are admitted
// past the flood's queued ones and finish while the flood still streams.
TEST_F(LoadTest, AFloodingTenantHoldsAtMostItsShareOfTheDecodeSlots) {
  Cluster cluster(model_);
  // Tenant names in the metrics (hashed by default) for baton_router_tenant_streams{tenant}.
  const std::string metrics =
      StartTwoTenantCluster(cluster, {"--metrics-tenant-names"}, {"--slots", "4"});
  ASSERT_FALSE(metrics.empty());
  auto stub = cluster.Client();
  auto flood_streams = [&] {
    return Sample(Scrape(metrics), "baton_router_tenant_streams", {{"tenant", "flood"}})
        .value_or(0);
  };
  std::atomic<bool> sampling{true};
  std::atomic<double> most{0};
  std::thread sampler([&] {
    while (sampling) {
      const double n = flood_streams();
      if (n > most) most = n;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  std::mutex mutex;
  std::vector<std::string> finished, errors;  // tenants in completion order
  std::vector<std::thread> threads;
  auto send = [&](const std::string& tenant, int i, uint32_t max_tokens) {
    threads.emplace_back([&, tenant, i, max_tokens] {
      const Outcome o = Generate(*stub, Request(prompts_[i % prompts_.size()], max_tokens),
                                 std::chrono::seconds(300), nullptr, tenant + "-key-0123456789");
      std::lock_guard<std::mutex> lock(mutex);
      if (!o.status.ok()) errors.push_back(tenant + ": " + o.status.error_message());
      finished.push_back(tenant);
    });
  };
  for (int i = 0; i < 6; ++i) send("flood", i, 160);
  // The flood holds its share and queues the rest before the other tenant comes.
  EventuallyThat(flood_streams, ::testing::Ge(2), std::chrono::seconds(60),
                 std::chrono::milliseconds(2));
  WaitForQueueDepth(metrics, 4);
  for (int i = 0; i < 2; ++i) send("small", i, 2);
  for (auto& t : threads) t.join();
  sampling = false;
  sampler.join();
  EXPECT_TRUE(errors.empty()) << errors.front();
  ASSERT_EQ(finished.size(), 8u);
  EXPECT_EQ(most.load(), 2);
  // Both small requests finished before the flood's last (4 of its 6 were still waiting or
  // streaming when they came).
  EXPECT_NE(finished.back(), "small");
  const auto small_last = std::find(finished.rbegin(), finished.rend(), "small");
  EXPECT_GE(std::distance(finished.rbegin(), small_last), 2) << "small finished among the last";
}

}  // namespace
}  // namespace baton::testing
