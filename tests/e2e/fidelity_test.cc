// Shadow verification end to end (docs/fidelity.md): the real router, prefill and decode
// binaries on loopback. A request that asks for its own comparison (fidelity_tokens) gets, in its
// usage, the figures an offline computation over the same prompt and the tokens it was served
// gives (the untruncated model against the served truncation, teacher-forced, as `batonctl
// approx-error` compares them), under both splits; an untruncated request is not shadowed; the
// router's --fidelity-sample-rate shadows every truncated request into the decode node's
// baton_fidelity_* metrics and `batonctl fidelity`, and none served with mode off; a consumer
// replay made wrong drives the agreement down; and a node without spare capacity drops shadows
// and counts them, while every request is served.
#include "baton/model/fidelity.h"

#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "../tools/run_batonctl.h"
#include "baton/model/engine_factory.h"
#include "baton/model/model_factory.h"
#include "client.h"
#include "cluster.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scrape.h"
#include "test_dir.h"
#include "testing/eventually.h"

namespace baton::testing {
namespace {

const std::vector<std::string> kReplay = {"--split", "replay-on-decode"};

class FidelityTest : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() {
    tiny_ = ProcessTempDir() + "/fidelity_tiny";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 11, tiny_).ok());
  }
  // A router, one prefill node and one decode node (of replay-on-decode when `replay`); the
  // decode node's metrics address in `metrics`.
  static void Start(Cluster& cluster, bool replay, std::vector<std::string> router,
                    std::vector<std::string> decode, std::string* metrics,
                    std::string* router_address = nullptr) {
    if (replay) router.insert(router.end(), kReplay.begin(), kReplay.end());
    const std::string address = cluster.StartRouter(router);
    ASSERT_FALSE(address.empty());
    if (router_address != nullptr) *router_address = address;
    const std::string ready = cluster.dir() + "/decode.metrics";
    decode.insert(decode.end(), {"--metrics-port", "0", "--metrics-ready-file", ready});
    ASSERT_FALSE(cluster.StartDecode("decode", decode).empty()) << cluster.Log("decode");
    ASSERT_FALSE(
        cluster.StartPrefill("prefill", replay ? kReplay : std::vector<std::string>{}).empty())
        << cluster.Log("prefill");
    ASSERT_TRUE(cluster.WaitForHealth(true)) << cluster.Log("router");
    std::ifstream(ready) >> *metrics;
  }
  static std::string tiny_;
};
std::string FidelityTest::tiny_;

// The decode node's shadows of one outcome (run, dropped, failed) so far.
double Shadows(const std::string& metrics, const char* outcome) {
  return Sample(Scrape(metrics), "baton_fidelity_shadows_total", {{"outcome", outcome}})
      .value_or(0);
}

// The offline comparison of what the request was served: the untruncated model and the served
// truncation (compact at `keep`), each teacher-forced along `tokens` from `prompt`.
model::FidelitySummary Offline(const std::string& dir, const std::vector<int32_t>& prompt,
                               const std::vector<int32_t>& tokens, int64_t keep) {
  auto engine = model::LoadEngine(dir);
  EXPECT_TRUE(engine.ok()) << engine.status();
  auto full = model::TeacherForcedLogits(**engine, prompt, tokens, {});
  auto served = model::TeacherForcedLogits(**engine, prompt, tokens,
                                           {.mode = model::TruncationMode::kCompact, .keep = keep});
  EXPECT_TRUE(full.ok() && served.ok());
  return model::CompareRuns(*full, *served);
}

TEST_P(FidelityTest, ARequestsOwnComparisonEqualsTheOfflineOne) {
  Cluster cluster(tiny_);
  std::string metrics;
  Start(cluster, GetParam(), {}, {}, &metrics);
  std::mt19937_64 rng(5);
  auto stub = cluster.Client();
  // The serving default is compact at K = C (22 for tiny): a prompt of 90 tokens is truncated.
  const std::vector<int32_t> prompt = RandomPrompt(rng, 90, 512);
  v1::GenerateRequest request = Request(prompt, 12);
  request.set_fidelity_tokens(8);
  const Outcome served = Generate(*stub, request);
  ASSERT_TRUE(served.status.ok()) << served.status.error_message() << cluster.Log("decode");
  ASSERT_EQ(served.tokens.size(), 12u);
  ASSERT_TRUE(served.usage.has_fidelity());
  const v1::Fidelity& f = served.usage.fidelity();
  EXPECT_FALSE(f.dropped());
  EXPECT_FALSE(f.not_truncated());
  ASSERT_EQ(f.positions(), 8u);
  const std::vector<int32_t> compared(served.tokens.begin(), served.tokens.begin() + 8);
  const model::FidelitySummary offline = Offline(tiny_, prompt, compared, 22);
  // A truncated model of random weights moves its distributions: the comparison is of
  // something, not of two equal runs.
  EXPECT_GT(offline.max_logit_diff, 1e-4);
  EXPECT_EQ(f.top1_agreements(), offline.top1_agreements);
  EXPECT_EQ(f.first_disagreement(), offline.first_disagreement);
  // The decode node's steps and the offline decode compute the same rows (bit-equal here); the
  // bound leaves room for summation order only, and KL(served || untruncated), nearly the same
  // for small differences, falls outside it.
  EXPECT_NEAR(f.mean_kl(), offline.mean_kl(), 1e-6 * offline.mean_kl());
  EXPECT_NEAR(f.max_kl(), offline.max_kl, 1e-6 * offline.max_kl);
  EXPECT_NEAR(f.max_logit_diff(), offline.max_logit_diff, 1e-6 * offline.max_logit_diff);

  // The same prompt untruncated: nothing to compare, said so, and no shadow run for it.
  request.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_OFF);
  const Outcome off = Generate(*stub, request);
  ASSERT_TRUE(off.status.ok()) << off.status.error_message();
  ASSERT_TRUE(off.usage.has_fidelity());
  EXPECT_TRUE(off.usage.fidelity().not_truncated());
  EXPECT_EQ(off.usage.fidelity().positions(), 0u);
  EXPECT_EQ(Sample(Scrape(metrics), "baton_fidelity_shadows_total", {{"outcome", "run"}}), 1.0);

  // Past the bound: refused, naming the field.
  request.set_fidelity_tokens(257);
  const Outcome refused = Generate(*stub, request);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status.error_message().find("fidelity_tokens"), std::string::npos);
}

TEST_P(FidelityTest, TheSampleRateShadowsEveryTruncatedRequestAndNoOther) {
  Cluster cluster(tiny_);
  std::string metrics;
  std::string router;
  Start(cluster, GetParam(), {"--fidelity-sample-rate", "1", "--fidelity-tokens", "5"}, {},
        &metrics, &router);
  std::mt19937_64 rng(6);
  auto stub = cluster.Client();
  for (int i = 0; i < 4; ++i) {
    v1::GenerateRequest request = Request(RandomPrompt(rng, 60 + 7 * i, 512), 6);
    if (i == 3) request.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_OFF);
    const Outcome outcome = Generate(*stub, request);
    ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
    // Sampled, not asked for: nothing in the client's usage.
    EXPECT_FALSE(outcome.usage.has_fidelity());
  }
  // Compact at K = C = 22: keep bucket 32, no hit.
  auto positions = [&]() -> double {
    const std::string page = Scrape(metrics);
    double sum = 0;
    // The model label is the fingerprint's first 16 hex digits: any value.
    std::istringstream lines(page);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("baton_fidelity_positions_total{", 0) == 0 &&
          line.find("mode=\"compact\"") != std::string::npos &&
          line.find("keep=\"32\"") != std::string::npos &&
          line.find("hit=\"false\"") != std::string::npos) {
        sum += std::stod(line.substr(line.rfind(' ') + 1));
      }
    }
    return sum;
  };
  ASSERT_TRUE(Eventually([&] { return positions() == 15.0; }, std::chrono::seconds(30)))
      << positions() << "\n"
      << Scrape(metrics);
  EXPECT_EQ(Sample(Scrape(metrics), "baton_fidelity_shadows_total", {{"outcome", "run"}}), 3.0);
  EXPECT_FALSE(Sample(Scrape(metrics), "baton_fidelity_shadows_total", {{"outcome", "dropped"}})
                   .has_value());
  // The live figures through the router, as the decode node's next heartbeat reports them.
  nlohmann::json live;
  ASSERT_TRUE(Eventually(
      [&] {
        const Result r = RunBatonctl("fidelity --addr " + router + " --json");
        if (r.exit_status != 0) return false;
        live = nlohmann::json::parse(r.out);
        return live["shadows_run"] == 3;
      },
      std::chrono::seconds(20)))
      << live.dump();
  ASSERT_EQ(live["results"].size(), 1u) << live.dump();
  const nlohmann::json& row = live["results"][0];
  EXPECT_EQ(row["mode"], "compact");
  EXPECT_EQ(row["keep_bucket"], 32);
  EXPECT_EQ(row["hit"], false);
  EXPECT_EQ(row["positions"], 15);
  EXPECT_EQ(live["shadows_dropped"], 0);
  const double agreement = row["top1_agreement"].get<double>();
  EXPECT_GE(agreement, 0.0);
  EXPECT_LE(agreement, 1.0);
}

// A consumer replay made wrong (the decode node's test fault zeroes each request's consumer
// rings once its prompt is in) drives the live agreement down: the same requests on a sound
// cluster and on a faulty one, compared through `batonctl fidelity`.
TEST_P(FidelityTest, AWrongConsumerReplayDrivesAgreementDown) {
  std::map<bool, nlohmann::json> live;
  for (const bool faulty : {false, true}) {
    Cluster cluster(tiny_);
    std::string metrics, router;
    // Room for every shadow: a busy machine may leave them all waiting until the requests end.
    std::vector<std::string> decode = {"--fidelity-queue", "64"};
    if (faulty) decode.push_back("--inject-consumer-ring-fault");
    Start(cluster, GetParam(), {"--fidelity-sample-rate", "1", "--fidelity-tokens", "12"}, decode,
          &metrics, &router);
    std::mt19937_64 rng(8);
    auto stub = cluster.Client();
    for (int i = 0; i < 6; ++i) {
      const Outcome outcome = Generate(*stub, Request(RandomPrompt(rng, 50 + 9 * i, 512), 12));
      ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
    }
    ASSERT_TRUE(Eventually(
        [&] {
          const Result r = RunBatonctl("fidelity --addr " + router + " --json");
          if (r.exit_status != 0) return false;
          live[faulty] = nlohmann::json::parse(r.out);
          return live[faulty]["shadows_run"] == 6;
        },
        std::chrono::seconds(30)))
        << live[faulty].dump();
    ASSERT_EQ(live[faulty]["results"].size(), 1u);
    EXPECT_EQ(live[faulty]["results"][0]["positions"], 72);
  }
  const nlohmann::json& sound = live[false]["results"][0];
  const nlohmann::json& wrong = live[true]["results"][0];
  EXPECT_GT(wrong["kl_mean"].get<double>(), 10 * sound["kl_mean"].get<double>());
  EXPECT_GT(wrong["top1_disagreements"].get<int64_t>(), sound["top1_disagreements"].get<int64_t>());
}

// A node whose shadows cannot keep up (each waits 3 s, one may queue) drops the rest and counts
// them; every request is served in full meanwhile.
TEST_P(FidelityTest, ShadowsWithoutSpareCapacityAreDroppedAndCounted) {
  Cluster cluster(tiny_);
  std::string metrics;
  Start(cluster, GetParam(), {"--fidelity-sample-rate", "1", "--fidelity-tokens", "4"},
        {"--fidelity-queue", "1", "--fidelity-inject-stall-ms", "3000"}, &metrics);
  std::mt19937_64 rng(7);
  auto stub = cluster.Client();
  const int kRequests = 5;
  for (int i = 0; i < kRequests; ++i) {
    const Outcome outcome = Generate(*stub, Request(RandomPrompt(rng, 70, 512), 4));
    ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
    EXPECT_EQ(outcome.tokens.size(), 4u);
  }
  auto count = [&](const char* outcome) { return Shadows(metrics, outcome); };
  EXPECT_GE(count("dropped"), 1.0);
  // The ones kept run once their stall ends: every request is accounted for.
  ASSERT_TRUE(Eventually([&] { return count("run") + count("dropped") == kRequests; },
                         std::chrono::seconds(30)))
      << Scrape(metrics);
  EXPECT_GE(count("run"), 1.0);
}

// The served rows a node holds are bounded too: with --fidelity-queue 1, of three requests
// decoding at once (each step stalled 20 ms, so that each of their 100 tokens takes a step
// while the others commit) only the first keeps its rows; the others are dropped at their
// commit, and counted, and all three are served in full.
TEST_P(FidelityTest, RequestsBeyondTheQueueHoldNoServedRows) {
  Cluster cluster(tiny_);
  std::string metrics;
  Start(cluster, GetParam(), {"--fidelity-sample-rate", "1", "--fidelity-tokens", "100"},
        {"--fidelity-queue", "1", "--inject-step-stall-ms", "20"}, &metrics);
  std::mt19937_64 rng(9);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(RandomPrompt(rng, 40 + i, 512));
  std::vector<Outcome> outcomes(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      auto stub = cluster.Client();
      outcomes[i] = Generate(*stub, Request(prompts[i], 100));
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Outcome& outcome : outcomes) {
    ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
    EXPECT_EQ(outcome.tokens.size(), 100u);
  }
  auto count = [&](const char* outcome) { return Shadows(metrics, outcome); };
  EXPECT_GE(count("dropped"), 2.0);
  ASSERT_TRUE(
      Eventually([&] { return count("run") + count("dropped") == 3; }, std::chrono::seconds(30)))
      << Scrape(metrics);
}

INSTANTIATE_TEST_SUITE_P(Splits, FidelityTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "replay_on_decode" : "prefill_all";
                         });

}  // namespace
}  // namespace baton::testing
