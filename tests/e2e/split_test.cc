// The replay-on-decode split end to end (DESIGN section 6): a router, a prefill node that holds
// the producers only and decode nodes that replay the consumer layers, as separate processes.
// The tokens are prefill-all's (`batonctl forward`) in every truncation mode over both
// transports, prompt logprobs are computed on the decode node, prefix hits stay exact, a lost
// decode node is survived without a lost or repeated token, and a node of the other split is
// refused naming both sides.
#include <cmath>
#include <fstream>
#include <random>
#include <thread>

#include "../tools/run_batonctl.h"
#include "baton/model/model_factory.h"
#include "client.h"
#include "cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scrape.h"
#include "test_dir.h"
#include "testing/eventually.h"

namespace baton::testing {
namespace {

using ::testing::HasSubstr;

const std::vector<std::string> kReplay = {"--split", "replay-on-decode"};

class SplitTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    tiny_ = ProcessTempDir() + "/split_tiny";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 5, tiny_).ok());
  }
  // Router and prefill node of replay-on-decode; the decode node replays 7 rows a step, so
  // that a prompt's replay takes several steps beside other streams' tokens.
  static void StartReplayCluster(Cluster& cluster, std::vector<std::string> router = {}) {
    router.insert(router.end(), kReplay.begin(), kReplay.end());
    ASSERT_FALSE(cluster.StartRouter(router).empty());
    ASSERT_FALSE(
        cluster.StartDecode("decode", {"--slots", "32", "--replay-rows-per-step", "7"}).empty())
        << cluster.Log("decode");
    ASSERT_FALSE(cluster.StartPrefill("prefill", kReplay).empty()) << cluster.Log("prefill");
    ASSERT_TRUE(cluster.WaitForHealth(true)) << cluster.Log("router");
  }
  static std::string tiny_;
};
std::string SplitTest::tiny_;

TEST_P(SplitTest, ConcurrentRequestsGiveThePrefillAllTokens) {
  Cluster cluster(tiny_);
  StartReplayCluster(cluster, {"--transport", GetParam()});
  std::mt19937_64 rng(71);
  const int kRequests = 12, kTokens = 9;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kRequests; ++i) prompts.push_back(RandomPrompt(rng, 4 + 13 * i % 80, 512));
  std::vector<Outcome> outcomes(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest request = Request(prompts[i], kTokens);
      if (i % 3 == 1) request.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_OFF);
      if (i % 3 == 2) {
        request.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_MASK);
        request.mutable_truncation()->set_keep(25);
      }
      auto stub = cluster.Client();
      outcomes[i] = Generate(*stub, request);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    ASSERT_TRUE(outcomes[i].status.ok()) << outcomes[i].status.error_message();
    // The serving default is compact with K = C (22 for tiny).
    const std::string mode = i % 3 == 0 ? "compact" : i % 3 == 1 ? "off" : "mask";
    const int64_t keep = i % 3 == 0 ? 22 : i % 3 == 1 ? 0 : 25;
    EXPECT_EQ(outcomes[i].tokens, ForwardTokens(tiny_, prompts[i], mode, keep, kTokens));
    EXPECT_EQ(outcomes[i].finish, v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(outcomes[i].usage.completion_tokens(), static_cast<uint32_t>(kTokens));
    // The decode node replayed the consumer layers over [s_keep, L): no placeholder row.
    const int64_t L = static_cast<int64_t>(prompts[i].size());
    EXPECT_EQ(outcomes[i].usage.replayed_rows(), keep > 0 ? std::min(L, keep) : L);
  }
  EXPECT_TRUE(DecodeDrained(cluster, "decode"));
}

INSTANTIATE_TEST_SUITE_P(BothTransports, SplitTest, ::testing::Values("ucx", "grpc"));

class SplitClusterTest : public SplitTest {};

// Prompt logprobs (truncation off) come from the decode node's replay, chunk by chunk: each is
// the log-softmax of the forward pass's row at the next prompt token.
TEST_F(SplitClusterTest, PromptLogprobsAreComputedOnTheDecodeNode) {
  Cluster cluster(tiny_);
  StartReplayCluster(cluster);
  std::mt19937_64 rng(73);
  const auto prompt = RandomPrompt(rng, 30, 512);
  v1::GenerateRequest request = Request(prompt, 3);
  request.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_OFF);
  request.set_prompt_logprobs(true);
  auto stub = cluster.Client();
  const Outcome outcome = Generate(*stub, request);
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  ASSERT_EQ(outcome.prompt_logprobs.size(), prompt.size() - 1);
  const Result forward =
      RunBatonctl("forward --model " + tiny_ + " --tokens " + Join(prompt) + " --json");
  ASSERT_EQ(forward.exit_status, 0) << forward.err;
  const auto rows = nlohmann::json::parse(forward.out)["logits"];
  for (size_t p = 0; p + 1 < prompt.size(); ++p) {
    const std::vector<double> row = rows[p].get<std::vector<double>>();
    double top = row[0], sum = 0;
    for (double v : row) top = std::max(top, v);
    for (double v : row) sum += std::exp(v - top);
    const double expected = row[prompt[p + 1]] - top - std::log(sum);
    EXPECT_NEAR(outcome.prompt_logprobs[p], expected, 1e-3) << "position " << p;
  }
}

// With a prefix store: the second run of a prompt loads its blocks, replays only the suffix,
// and gives the cold run's tokens and the forward pass's.
TEST_F(SplitClusterTest, PrefixHitsStayExact) {
  Cluster cluster(tiny_);
  ASSERT_FALSE(cluster.StartRouter({"--require-kvstore", "--split", "replay-on-decode"}).empty());
  ASSERT_FALSE(cluster.StartKvstore("kvstore", cluster.dir() + "/store").empty());
  ASSERT_FALSE(cluster.StartDecode("decode", {"--replay-rows-per-step", "5"}).empty());
  std::string kvstore_address;
  std::ifstream(cluster.dir() + "/kvstore.addr") >> kvstore_address;
  ASSERT_FALSE(
      cluster.StartPrefill("prefill", {"--split", "replay-on-decode", "--kvstore", kvstore_address})
          .empty());
  ASSERT_TRUE(cluster.WaitForHealth(true)) << cluster.Log("router");
  auto stub = cluster.Client();
  std::mt19937_64 rng(79);
  const auto prompt = RandomPrompt(rng, 87, 512);
  const Outcome cold = Generate(*stub, Request(prompt, 6));
  ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
  EXPECT_EQ(cold.usage.cached_tokens(), 0u);
  auto stats = [&] {
    grpc::ClientContext context;
    v1::KvStoreStats out;
    EXPECT_TRUE(cluster.Kvstore()->Stats(&context, v1::KvStoreStatsRequest(), &out).ok());
    return out.block_kv_values();
  };
  ASSERT_TRUE(EventuallyThat(stats, ::testing::Ge(87u / 16)));
  const Outcome hit = Generate(*stub, Request(prompt, 6));
  ASSERT_TRUE(hit.status.ok()) << hit.status.error_message();
  EXPECT_EQ(hit.usage.cached_tokens(), (87u - 22) / 16 * 16);
  EXPECT_EQ(hit.tokens, cold.tokens);
  EXPECT_EQ(hit.tokens, ForwardTokens(tiny_, prompt, "compact", 22, 6));
  EXPECT_EQ(hit.usage.replayed_rows(), 22u);
}

// A prefill node must hold what the router's split runs there: each side's mismatch is refused
// at registration, naming the node's split and the router's, and the router never serves.
TEST_F(SplitClusterTest, APrefillNodeOfTheOtherSplitIsRefusedNamingBothSides) {
  for (const bool router_replays : {false, true}) {
    SCOPED_TRACE(router_replays ? "router replay-on-decode" : "router prefill-all");
    Cluster cluster(tiny_);
    ASSERT_FALSE(
        cluster.StartRouter(router_replays ? kReplay : std::vector<std::string>{}).empty());
    ASSERT_FALSE(cluster.StartDecode("decode").empty());
    ASSERT_FALSE(
        cluster.StartPrefill("prefill", router_replays ? std::vector<std::string>{} : kReplay)
            .empty());
    const std::string expected =
        router_replays ? "prefill node prefill holds every layer (--split prefill-all); this "
                         "router runs --split replay-on-decode"
                       : "prefill node prefill holds the producer layers only (--split "
                         "replay-on-decode); this router runs --split prefill-all";
    EXPECT_TRUE(EventuallyThat([&] { return cluster.Log("router"); }, HasSubstr(expected)));
    EXPECT_TRUE(cluster.WaitForHealth(false));
  }
}

// The decode node measures its replay (commit to first token, per GFLOP of the replayed work,
// and what each replay piece adds to a step) and reports it with its step fit on its
// heartbeats; the router's registry lists it beside the prefill node's rates
// (Generation/ListRates), and `batonctl rates` gives their means as `batonctl simulate` takes
// them, naming the split.
TEST_F(SplitClusterTest, TheDecodeNodesReplayRateReachesTheRouterAndBatonctlRates) {
  Cluster cluster(tiny_);
  StartReplayCluster(cluster);
  std::mt19937_64 rng(79);
  auto stub = cluster.Client();
  // Untruncated prompts of ten lengths, one at a time: each replay is one piece of all its
  // rows, and pieces of eight sizes or more fit a piece's cost (decode_node::ReplayCosts).
  for (int i = 0; i < 10; ++i) {
    v1::GenerateRequest request = Request(RandomPrompt(rng, 40 + 10 * i, 512), 4);
    request.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_OFF);
    const Outcome outcome = Generate(*stub, request);
    ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
    ASSERT_EQ(outcome.usage.replayed_rows(), static_cast<uint64_t>(40 + 10 * i));
  }
  const std::string addr = cluster.router();
  nlohmann::json rates;
  ASSERT_TRUE(Eventually(
      [&] {
        const Result listed = RunBatonctl("rates --addr " + addr);
        if (listed.exit_status != 0) return ::testing::AssertionFailure() << listed.err;
        rates = nlohmann::json::parse(listed.out);
        // Each side's rates ride its own heartbeats: wait for both.
        bool replay_measured = false;
        bool compute_measured = false;
        for (const nlohmann::json& node : rates["nodes"]) {
          if (node["role"] == "decode") {
            replay_measured |= node["replay_samples"].get<int64_t>() >= 8 &&
                               node["replay_piece_fixed_ms"].get<double>() +
                                       node["replay_piece_row_ms"].get<double>() >
                                   0;
          } else {
            compute_measured |= node["compute_ms_per_gflop"].get<double>() > 0;
          }
        }
        if (replay_measured && compute_measured) return ::testing::AssertionSuccess();
        return ::testing::AssertionFailure() << listed.out;
      },
      std::chrono::seconds(30), std::chrono::milliseconds(200)));
  EXPECT_EQ(rates["split"], "replay-on-decode");
  EXPECT_EQ(rates["prefill_nodes"], 1);
  EXPECT_EQ(rates["decode_nodes"], 1);
  for (const nlohmann::json& node : rates["nodes"]) {
    if (node["role"] == "decode") {
      EXPECT_EQ(node["node_id"], "decode");
      EXPECT_GT(node["replay_ms_per_gflop"].get<double>(), 0);
      EXPECT_GE(node["tokens_per_step"].get<double>(), 1);
      // Its steps' spread about what its reported costs price them at, in order.
      const double p10 = node["step_stretch_p10"].get<double>();
      EXPECT_GT(p10, 0);
      EXPECT_LE(p10, node["step_stretch_p50"].get<double>());
      EXPECT_LE(node["step_stretch_p50"].get<double>(), node["step_stretch_p90"].get<double>());
      EXPECT_LE(node["step_stretch_p90"].get<double>(), node["step_stretch_p99"].get<double>());
    } else {
      EXPECT_EQ(node["node_id"], "prefill");
      EXPECT_EQ(node["producers_only"], true);
      EXPECT_GT(node["compute_ms_per_gflop"].get<double>(), 0);
    }
  }
  EXPECT_THAT(rates["decode_rates"].get<std::string>(), HasSubstr("replay_ms_per_gflop="));
  EXPECT_THAT(rates["decode_rates"].get<std::string>(), HasSubstr("replay_piece_"));
  EXPECT_THAT(rates["decode_rates"].get<std::string>(), HasSubstr("step_stretch_p99="));
  EXPECT_THAT(rates["rates"].get<std::string>(), HasSubstr("compute_ms_per_gflop="));
  // The flags form, which the simulator takes back as given.
  const Result flags = RunBatonctl("rates --addr " + addr + " --flags");
  ASSERT_EQ(flags.exit_status, 0) << flags.err;
  EXPECT_THAT(flags.out, ::testing::StartsWith("--rates compute_ms_per_gflop="));
  EXPECT_THAT(flags.out, HasSubstr(" --decode-rates "));
  // Only another model's nodes: none.
  const Result other = RunBatonctl("rates --addr " + addr + " --model elsewhere");
  ASSERT_EQ(other.exit_status, 0) << other.err;
  EXPECT_EQ(nlohmann::json::parse(other.out)["nodes"].size(), 0u);
}

// The prefill node of replay-on-decode reports its resident weight bytes, the producers' and
// the block-KV projections' (about half the model's), on its metrics and through the router
// (batonctl models), beside the split and the decode node's.
TEST_F(SplitClusterTest, ThePrefillNodeHoldsAboutHalfTheWeights) {
  std::map<std::string, double> bytes;
  for (const bool replay : {false, true}) {
    const std::string split = replay ? "replay" : "all";
    Cluster cluster(tiny_);
    const std::string router = cluster.StartRouter(replay ? kReplay : std::vector<std::string>{});
    ASSERT_FALSE(router.empty());
    const std::string ready = cluster.dir() + "/prefill.metrics";
    std::vector<std::string> flags = {"--metrics-port", "0", "--metrics-ready-file", ready};
    if (replay) flags.insert(flags.end(), kReplay.begin(), kReplay.end());
    ASSERT_FALSE(cluster.StartDecode("decode").empty());
    ASSERT_FALSE(cluster.StartPrefill("prefill", flags).empty());
    ASSERT_TRUE(cluster.WaitForHealth(true)) << cluster.Log("router");
    std::string metrics;
    std::ifstream(ready) >> metrics;
    const auto value = Sample(Scrape(metrics), "baton_prefill_weight_bytes");
    ASSERT_TRUE(value.has_value());
    bytes[split] = *value;
    const Result listed = RunBatonctl("models --addr " + router);
    ASSERT_EQ(listed.exit_status, 0) << listed.err;
    const nlohmann::json model = nlohmann::json::parse(listed.out)["models"][0];
    EXPECT_EQ(model["split"], replay ? "replay-on-decode" : "prefill-all");
    EXPECT_EQ(model["prefill_weight_bytes"].get<double>(), *value);
    bytes[split + " decode"] = model["decode_weight_bytes"].get<double>();
  }
  EXPECT_EQ(bytes["all"], bytes["all decode"]);
  EXPECT_EQ(bytes["replay decode"], bytes["all decode"]);  // the decode node holds every layer
  EXPECT_GT(bytes["replay"], 0);
  EXPECT_LT(bytes["replay"], 0.6 * bytes["all"]);
}

}  // namespace
}  // namespace baton::testing
