// The cluster half of `batonctl simulate`: routing policies over prefill nodes with local block
// caches, priced by the router's cost model. A workload of a few shared prefixes, each asked
// again and again, shows what each policy does with them.
#include "cluster_sim.h"

#include <numeric>
#include <string>

#include "baton/kvstore/chain.h"
#include "baton/model/model_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::tools {
namespace {

constexpr int64_t kB = 16, kC = 22, kL = 16 * 20;

// `n` requests, one every `gap_ms`, cycling over `prefixes` prompts of kL tokens.
std::vector<ClusterRequest> Workload(int n, int prefixes, double gap_ms) {
  std::vector<ClusterRequest> requests;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> tokens(kL);
    std::iota(tokens.begin(), tokens.end(), 1000 * (i % prefixes));
    requests.push_back({.arrival_ms = i * gap_ms,
                        .prompt_len = kL,
                        .chain = kvstore::ChainKeys("f", "", "", tokens, kB)});
  }
  return requests;
}

// The small preset's shapes (the work each prefill is priced by), with this test's window
// and block size.
ModelConfig Config() {
  ModelConfig config = *model::PresetConfig("small");
  config.sliding_window = 8;
  config.kv_block_size = kB;
  return config;
}

ClusterOptions Options(RoutePolicy policy, uint64_t cache_bytes) {
  return {.policy = policy,
          .prefill_nodes = 2,
          .slots = 2,
          .block_cache_bytes = cache_bytes,
          .store_budget = std::nullopt,
          .hit = {.keep = kC,
                  .truncation_on = true,
                  .ring_capacity = kC,
                  .window = 8,
                  .block_size = kB,
                  .cap = kvstore::HitCap::kRing},
          .payload = {.block_kv = 1 << 16, .swa = 1 << 12},
          .config = Config(),
          .rates = {.compute_ms_per_gflop = 10,
                    .local_ms_per_mib = 0.5,
                    .store_ms_per_mib = 20,
                    .fixed_ms = 5}};
}

double Mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

TEST(ClusterSimTest, WithoutACacheEveryHitComesFromTheStore) {
  const ClusterResult r =
      SimulateCluster(Workload(20, 2, 1000), Options(RoutePolicy::kLeastLoaded, 0));
  EXPECT_EQ(r.local_hit_tokens, 0);
  // Every request after each prefix's first hits the ring cap: floor((L - C) / B) blocks.
  EXPECT_EQ(r.store_hit_tokens, 18 * ((kL - kC) / kB * kB));
  EXPECT_EQ(r.prompt_tokens, 20 * kL);
  ASSERT_EQ(r.ttft_ms.size(), 20u);
  // Unloaded (a request every second): a cold one costs its work, a hit far less.
  const kvstore::PrefillWork cold = kvstore::EstimatePrefillWork(Config(), kL, 0, kL - kC);
  EXPECT_NEAR(r.ttft_ms[0], (cold.computed_gflop + cold.replayed_gflop) * 10 + 5, 1e-9);
  EXPECT_LT(r.ttft_ms[2], r.ttft_ms[0] / 2);
}

TEST(ClusterSimTest, PricedRoutingKeepsEachPrefixOnTheNodeThatHoldsIt) {
  // Eight prefixes, each node's cache holding about four: a node cannot keep them all, so
  // where a prefix is sent decides whether its blocks are still near the compute. Requests
  // arrive about as fast as the two nodes serve hits from the store.
  const auto workload = Workload(120, 8, 60);
  const uint64_t cache = uint64_t{6} << 20;
  const ClusterResult least = SimulateCluster(workload, Options(RoutePolicy::kLeastLoaded, cache));
  const ClusterResult longest =
      SimulateCluster(workload, Options(RoutePolicy::kLongestPrefix, cache));
  const ClusterResult priced =
      SimulateCluster(workload, Options(RoutePolicy::kPredictedTtft, cache));
  for (const ClusterResult* r : {&least, &longest, &priced}) EXPECT_EQ(r->ttft_ms.size(), 120u);
  // Pricing the load sends hits where their blocks lie: more come from a local cache, and the
  // mean TTFT is lower than routing by load alone.
  EXPECT_GT(priced.local_hit_tokens, 2 * least.local_hit_tokens);
  EXPECT_GT(longest.local_hit_tokens, 2 * least.local_hit_tokens);
  EXPECT_LT(Mean(priced.ttft_ms), Mean(least.ttft_ms));
  // Both nodes take work under every policy here.
  for (const ClusterResult* r : {&least, &longest, &priced}) {
    EXPECT_THAT(r->requests_per_node, ::testing::Each(::testing::Gt(0)));
  }
}

TEST(ClusterSimTest, ACacheTooSmallForABlockHoldsNothing) {
  const ClusterResult r =
      SimulateCluster(Workload(10, 1, 1000), Options(RoutePolicy::kPredictedTtft, 1024));
  EXPECT_EQ(r.local_hit_tokens, 0);
  EXPECT_GT(r.store_hit_tokens, 0);
}

TEST(ClusterSimTest, FlagsAreParsedOrRefusedByName) {
  EXPECT_THAT(*ParseRoutePolicies("least-loaded,predicted-ttft"),
              ::testing::ElementsAre(RoutePolicy::kLeastLoaded, RoutePolicy::kPredictedTtft));
  const absl::StatusOr<std::vector<RoutePolicy>> bad = ParseRoutePolicies("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("--policy: 'random'"));
  const absl::StatusOr<kvstore::PrefillRates> rates =
      ParseRates("compute_ms_per_gflop=0.5,fixed_ms=3");
  ASSERT_TRUE(rates.ok());
  EXPECT_DOUBLE_EQ(rates->compute_ms_per_gflop, 0.5);
  EXPECT_DOUBLE_EQ(rates->fixed_ms, 3);
  EXPECT_DOUBLE_EQ(rates->store_ms_per_mib, kvstore::DefaultPrefillRates().store_ms_per_mib);
  EXPECT_THAT(std::string(ParseRates("speed=1").status().message()),
              ::testing::HasSubstr("--rates: 'speed' is unknown"));
  EXPECT_THAT(std::string(ParseRates("fixed_ms=-1").status().message()),
              ::testing::HasSubstr("finite value >= 0"));
  EXPECT_FALSE(ParseRates("fixed_ms=nan").ok());
}

}  // namespace
}  // namespace baton::tools
