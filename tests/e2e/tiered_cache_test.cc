// The prefix cache in tiers, with the real binaries: a prefill node keeps the blocks it
// computes in its local block cache (--block-cache-bytes) and serves a later hit from there,
// with exactly the answer of the cold run; its cache events reach the router, which then
// prices each prefill node by where the prompt's blocks lie (--prefill-policy) and finds a hit
// in a node's own cache even when the shared store is gone.
#include <fstream>

#include "baton/model/model_factory.h"
#include "client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scrape.h"
#include "test_dir.h"
#include "testing/eventually.h"

namespace baton::testing {
namespace {

constexpr int64_t kC = 22, kB = 16;  // tiny preset: ring capacity and block size
constexpr char kCacheBytes[] = "16777216";

class TieredCacheTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = ProcessTempDir() + "/tiered_tiny";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 17, model_).ok());
  }
  // Router (at debug level: its routing decisions are logged), store and decode node; the
  // prefill nodes are the test's.
  void StartCluster(const std::string& policy) {
    cluster_ = std::make_unique<Cluster>(model_);
    const std::string ready = cluster_->dir() + "/router.metrics";
    ASSERT_FALSE(cluster_
                     ->StartRouter({"--require-kvstore", "--prefill-policy", policy, "--log-level",
                                    "debug", "--metrics-port", "0", "--metrics-ready-file", ready})
                     .empty());
    std::ifstream(ready) >> router_metrics_;
    ASSERT_FALSE(router_metrics_.empty());
    ASSERT_FALSE(cluster_->StartKvstore("kvstore", cluster_->dir() + "/store").empty());
    ASSERT_FALSE(cluster_->StartDecode("decode").empty());
  }
  void StartPrefill(const std::string& name) {
    ASSERT_FALSE(cluster_
                     ->StartPrefill(name, {"--kvstore", cluster_->Address("kvstore"),
                                           "--block-cache-bytes", kCacheBytes})
                     .empty());
  }
  v1::KvStoreStats StoreStats() {
    grpc::ClientContext context;
    v1::KvStoreStats stats;
    EXPECT_TRUE(cluster_->Kvstore()->Stats(&context, v1::KvStoreStatsRequest(), &stats).ok());
    return stats;
  }
  Outcome Run(const std::vector<int32_t>& prompt) {
    v1::GenerateRequest request = Request(prompt, 6);
    request.set_logprobs(true);
    Outcome outcome = Generate(*cluster_->Client(), request);
    EXPECT_TRUE(outcome.status.ok()) << outcome.status.error_message();
    return outcome;
  }
  // The router has heard from the node's cache events that it holds the prompt's hit: its
  // routing log prices the prompt with `blocks` local blocks, and none of what the router
  // indexed from its own placements is still unconfirmed (the events, not the router's
  // expectation, hold them).
  ::testing::AssertionResult RouterKnowsLocalBlocks(const std::vector<int32_t>& prompt,
                                                    int64_t blocks) {
    const std::string text = "local_blocks=" + std::to_string(blocks);
    return Eventually([&] {
      Run(prompt);
      return cluster_->Log("router").find(text) != std::string::npos &&
             Sample(Scrape(router_metrics_), "baton_router_cache_expected_blocks") == 0.0;
    });
  }

  static std::string model_;
  std::unique_ptr<Cluster> cluster_;
  std::string router_metrics_;  // the router's metrics address
};
std::string TieredCacheTest::model_;

TEST_F(TieredCacheTest, AHitFromTheNodesOwnCacheGivesTheColdAnswerAndOutlivesTheStore) {
  StartCluster("predicted-ttft");
  StartPrefill("prefill");
  ASSERT_TRUE(cluster_->WaitForHealth(true));
  std::mt19937_64 rng(29);
  const int64_t L = 150, H = (L - kC) / kB * kB;
  const auto prompt = RandomPrompt(rng, L, 512);
  const Outcome cold = Run(prompt);
  EXPECT_EQ(cold.usage.cached_tokens(), 0u);
  EXPECT_EQ(cold.usage.local_cached_tokens(), 0u);
  // Once the store has the blocks the router finds the hit; the node loads it from its cache.
  ASSERT_TRUE(EventuallyThat([&] { return StoreStats().block_kv_values(); },
                             ::testing::Ge(static_cast<uint64_t>(L / kB))));
  const Outcome hit = Run(prompt);
  EXPECT_EQ(hit.usage.cached_tokens(), H);
  EXPECT_EQ(hit.usage.local_cached_tokens(), H);
  EXPECT_EQ(hit.tokens, cold.tokens);
  ASSERT_EQ(hit.logprobs.size(), cold.logprobs.size());
  for (size_t i = 0; i < hit.logprobs.size(); ++i) {
    EXPECT_NEAR(hit.logprobs[i], cold.logprobs[i], 1e-4) << "token " << i;
  }
  // The router's index (from the node's cache events) holds the hit...
  ASSERT_TRUE(RouterKnowsLocalBlocks(prompt, H / kB));
  // ...so without the store the hit is still found and served from the node's memory.
  cluster_->Kill("kvstore");
  const Outcome alone = Run(prompt);
  EXPECT_EQ(alone.usage.cached_tokens(), H);
  EXPECT_EQ(alone.usage.local_cached_tokens(), H);
  EXPECT_EQ(alone.tokens, cold.tokens);
}

class TieredRoutingTest : public TieredCacheTest,
                          public ::testing::WithParamInterface<std::string> {};

// prefill-b computes the prompt alone; then prefill-a (first on a tie of load) joins. The
// priced policies send the prompt back to prefill-b, whose cache holds it; least-loaded sends
// it to prefill-a, which loads the hit from the store.
TEST_P(TieredRoutingTest, ThePolicyDecidesWhetherTheHitComesFromANodesCache) {
  StartCluster(GetParam());
  StartPrefill("prefill-b");
  ASSERT_TRUE(cluster_->WaitForHealth(true));
  std::mt19937_64 rng(31);
  const int64_t L = 150, H = (L - kC) / kB * kB;
  const auto prompt = RandomPrompt(rng, L, 512);
  EXPECT_EQ(Run(prompt).usage.cached_tokens(), 0u);
  ASSERT_TRUE(RouterKnowsLocalBlocks(prompt, H / kB));
  StartPrefill("prefill-a");
  ASSERT_TRUE(cluster_->WaitForLog("router", "node prefill-a registered"));
  const Outcome outcome = Run(prompt);
  EXPECT_EQ(outcome.usage.cached_tokens(), H);
  EXPECT_EQ(outcome.usage.local_cached_tokens(), GetParam() == "least-loaded" ? 0 : H);
}

INSTANTIATE_TEST_SUITE_P(Policies, TieredRoutingTest,
                         ::testing::Values("least-loaded", "longest-prefix", "predicted-ttft"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::erase(name, '-');
                           return name;
                         });

}  // namespace
}  // namespace baton::testing
