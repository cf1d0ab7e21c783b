// The prefix store end to end (router + kvstore + prefill + decode as processes): cached
// token counts equal the hit policy's H around block and cap boundaries, a hit gives exactly
// the cold result with s_valid = H (and the plain cold result when H <= L - K), the store holds
// only the stored regions, survives a restart, isolates cache salts, and its absence only
// makes requests cold.
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

class PrefixTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = ProcessTempDir() + "/prefix_tiny";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 13, model_).ok());
    // One block-KV source (YOCO's shared cache): every consumer layer reads layer 4's pages.
    ModelConfig shared = *model::PresetConfig("tiny");
    shared.block_kv_sources = {shared.n_prefill_layer};
    shared_model_ = ProcessTempDir() + "/prefix_tiny_shared";
    ASSERT_TRUE(model::MakeModel(shared, 13, shared_model_).ok());
  }
  void StartCluster(std::vector<std::string> router_flags = {}, const std::string& model = model_) {
    cluster_ = std::make_unique<Cluster>(model);
    router_flags.push_back("--require-kvstore");
    ASSERT_FALSE(cluster_->StartRouter(router_flags).empty());
    store_dir_ = cluster_->dir() + "/store";
    ASSERT_FALSE(cluster_->StartKvstore("kvstore", store_dir_).empty());
    ASSERT_FALSE(cluster_->StartDecode("decode").empty());
    ASSERT_FALSE(cluster_->StartPrefill("prefill", {"--kvstore", Address("kvstore")}).empty());
    ASSERT_TRUE(cluster_->WaitForHealth(true));
  }
  std::string Address(const std::string& name) {
    std::ifstream in(cluster_->dir() + "/" + name + ".addr");
    std::string address;
    in >> address;
    return address;
  }
  v1::KvStoreStats StoreStats() {
    grpc::ClientContext context;
    v1::KvStoreStats stats;
    EXPECT_TRUE(cluster_->Kvstore()->Stats(&context, v1::KvStoreStatsRequest(), &stats).ok());
    return stats;
  }
  // Waits until the store holds `values` block-KV values (write-back is asynchronous).
  ::testing::AssertionResult WaitForBlocks(uint64_t values) {
    return EventuallyThat([&] { return StoreStats().block_kv_values(); }, ::testing::Ge(values));
  }
  Outcome Run(const std::vector<int32_t>& prompt, const std::string& salt = "", int64_t keep = 0) {
    v1::GenerateRequest request = Request(prompt, 6);
    request.set_cache_salt(salt);
    request.set_logprobs(true);
    if (keep > 0) {
      request.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_COMPACT);
      request.mutable_truncation()->set_keep(keep);
    }
    auto stub = cluster_->Client();
    Outcome outcome = Generate(*stub, request);
    EXPECT_TRUE(outcome.status.ok()) << outcome.status.error_message();
    return outcome;
  }

  static std::string model_;
  static std::string shared_model_;
  std::unique_ptr<Cluster> cluster_;
  std::string store_dir_;
};
std::string PrefixTest::model_;
std::string PrefixTest::shared_model_;

TEST_F(PrefixTest, CachedTokensFollowThePolicyAndHitsChangeNoAnswer) {
  StartCluster();
  std::mt19937_64 rng(61);
  uint64_t stored = 0;
  // Around the cap floor((L - C) / B): L - 22 = 16n - 1, 16n, 16n + 1; and short prompts.
  for (int64_t L : {21, 22, 37, 38, 39, 53, 54, 55, 85, 86, 87, 150}) {
    SCOPED_TRACE("L=" + std::to_string(L));
    const auto prompt = RandomPrompt(rng, L, 512);
    const Outcome cold = Run(prompt);
    EXPECT_EQ(cold.usage.cached_tokens(), 0u);
    stored += L / kB;
    ASSERT_TRUE(WaitForBlocks(stored));
    const Outcome hit = Run(prompt);
    const int64_t H = std::max<int64_t>(0, L - kC) / kB * kB;
    EXPECT_EQ(hit.usage.cached_tokens(), H);
    // With K = C, H <= L - K: the hit is the cold answer, down to the log-probabilities.
    EXPECT_EQ(hit.tokens, cold.tokens);
    ASSERT_EQ(hit.logprobs.size(), cold.logprobs.size());
    for (size_t i = 0; i < hit.logprobs.size(); ++i) {
      EXPECT_NEAR(hit.logprobs[i], cold.logprobs[i], 1e-4) << "token " << i;
    }
    EXPECT_EQ(hit.tokens, ForwardTokens(model_, prompt, "compact", kC, 6));
    EXPECT_EQ(hit.usage.replayed_rows(), std::min<int64_t>(kC, L));
  }
}

// A model whose consumer layers share one block-KV source: the store keeps one group's page per
// block (a quarter of the plain model's), and a hit, cold and capped, gives the forward pass's
// tokens exactly as for the plain model.
TEST_F(PrefixTest, SharedBlockKvStoresOneGroupAndHitsExactly) {
  StartCluster({}, shared_model_);
  std::mt19937_64 rng(79);
  const uint64_t kv_dim = 32, P = 4, G = 1, header = 89;
  const uint64_t page = 4 * G * 2 * kB * kv_dim, swa = 4 * P * 2 * kB * kv_dim;
  uint64_t stored = 0;
  for (int64_t L : {39, 87}) {
    SCOPED_TRACE("L=" + std::to_string(L));
    const auto prompt = RandomPrompt(rng, L, 512);
    const Outcome cold = Run(prompt);
    stored += L / kB;
    ASSERT_TRUE(WaitForBlocks(stored));
    const Outcome hit = Run(prompt);
    EXPECT_EQ(hit.usage.cached_tokens(), std::max<int64_t>(0, L - kC) / kB * kB);
    EXPECT_EQ(hit.tokens, cold.tokens);
    EXPECT_EQ(hit.tokens, ForwardTokens(shared_model_, prompt, "compact", kC, 6));
  }
  const int64_t L = kC + 4 * kB, K = kC + 6, H = L - kC;
  const auto prompt = RandomPrompt(rng, L, 512);
  Run(prompt, "", K);
  stored += L / kB;
  ASSERT_TRUE(WaitForBlocks(stored));
  const Outcome hit = Run(prompt, "", K);
  EXPECT_EQ(hit.usage.cached_tokens(), H);
  EXPECT_EQ(hit.tokens, ForwardTokens(shared_model_, prompt, "compact", K, 6, H));
  const v1::KvStoreStats stats = StoreStats();
  EXPECT_EQ(stats.stored_bytes(), stats.block_kv_values() * (header + page) +
                                      stats.producer_swa_values() * (header + swa));
}

TEST_F(PrefixTest, ExactCapHitEqualsTheColdRunWithSValidH) {
  StartCluster();
  std::mt19937_64 rng(67);
  // L - C = 64 = 4 blocks, K = C + 6: H = L - C lies inside the retained region (seed 9.4.1).
  const int64_t L = kC + 4 * kB, K = kC + 6, H = L - kC;
  const auto prompt = RandomPrompt(rng, L, 512);
  Run(prompt, "", K);
  ASSERT_TRUE(WaitForBlocks(L / kB));
  const Outcome hit = Run(prompt, "", K);
  EXPECT_EQ(hit.usage.cached_tokens(), H);
  EXPECT_EQ(hit.usage.replayed_rows(), L - H);  // consumers start at H, not at L - K
  EXPECT_EQ(hit.tokens, ForwardTokens(model_, prompt, "compact", K, 6, H));
}

TEST_F(PrefixTest, KeepCapNeverReachesIntoTheRetainedRegion) {
  StartCluster({"--hit-cap", "keep"});
  std::mt19937_64 rng(71);
  const int64_t L = 100, K = 40;
  const auto prompt = RandomPrompt(rng, L, 512);
  const Outcome cold = Run(prompt, "", K);
  ASSERT_TRUE(WaitForBlocks(L / kB));
  const Outcome hit = Run(prompt, "", K);
  EXPECT_EQ(hit.usage.cached_tokens(), (L - K) / kB * kB);
  EXPECT_EQ(hit.tokens, cold.tokens);
}

TEST_F(PrefixTest, StoreHoldsOnlyStoredRegionsSurvivesRestartAndIsolatesSalts) {
  StartCluster();
  std::mt19937_64 rng(73);
  const int64_t L = 120;
  const auto prompt = RandomPrompt(rng, L, 512);
  Run(prompt, "tenant-a");
  ASSERT_TRUE(WaitForBlocks(L / kB));
  // Every value is a block's block KV (one page) or its producer SWA rows; nothing else.
  const v1::KvStoreStats stats = StoreStats();
  const uint64_t kv_dim = 32, P = 4, D = 4, header = 89;
  const uint64_t page = 4 * D * 2 * kB * kv_dim, swa = 4 * P * 2 * kB * kv_dim;
  EXPECT_EQ(stats.block_kv_values(), static_cast<uint64_t>(L / kB));
  EXPECT_EQ(stats.producer_swa_values(), static_cast<uint64_t>(L / kB));
  EXPECT_EQ(stats.stored_bytes(), stats.block_kv_values() * (header + page) +
                                      stats.producer_swa_values() * (header + swa));
  // Another salt never shares the entries.
  EXPECT_EQ(Run(prompt, "tenant-b").usage.cached_tokens(), 0u);
  // Restart the store on the same folder and address (a Service keeps its address across pod
  // restarts): the prefix still hits.
  const std::string address = Address("kvstore");
  const std::string port = address.substr(address.rfind(':') + 1);
  cluster_->Kill("kvstore", SIGTERM);
  ASSERT_FALSE(cluster_->StartKvstore("kvstore-2", store_dir_, {"--port", port}).empty());
  ASSERT_TRUE(cluster_->WaitForHealth(true));
  // The router's and the prefill node's channels reconnect to the new process with gRPC's
  // backoff; until then a lookup misses (a cold request, never a failure).
  uint32_t cached = 0;
  Eventually(
      [&] {
        cached = Run(prompt, "tenant-a").usage.cached_tokens();
        return cached != 0;
      },
      std::chrono::seconds(20));
  EXPECT_EQ(cached, (L - kC) / kB * kB);
}

TEST_F(PrefixTest, LostStoreMakesRequestsColdNotFailed) {
  const std::string metrics_file = ProcessTempDir() + "/lost-store-router.metrics";
  StartCluster({"--metrics-port", "0", "--metrics-ready-file", metrics_file});
  std::string metrics;
  std::ifstream(metrics_file) >> metrics;
  ASSERT_FALSE(metrics.empty()) << "the router wrote no metrics address";
  std::mt19937_64 rng(79);
  const auto prompt = RandomPrompt(rng, 90, 512);
  const Outcome first = Run(prompt);
  ASSERT_TRUE(WaitForBlocks(90 / kB));
  cluster_->Kill("kvstore");
  // The router stays ready without the store (it needed one only to become ready): once it no
  // longer counts the store live (past the node TTL), it still reports SERVING.
  auto live_stores = [&] {
    return Sample(Scrape(metrics), "baton_nodes", {{"role", "kvstore"}}).value_or(-1);
  };
  ASSERT_TRUE(EventuallyThat(live_stores, 0.0));
  ASSERT_TRUE(cluster_->WaitForHealth(true, std::chrono::seconds(1)));
  const Outcome without = Run(prompt);
  EXPECT_EQ(without.usage.cached_tokens(), 0u);
  EXPECT_EQ(without.tokens, first.tokens);
}

}  // namespace
}  // namespace baton::testing
