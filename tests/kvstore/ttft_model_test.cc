// The routing cost model (kvstore/ttft_model.h): a hit over both tiers reads each block from
// the local tier where it lies and from the store otherwise, and a prediction prices the rows
// a CED hit still costs: L - H computed, the consumer replay from max(s_keep, H).
#include "baton/kvstore/ttft_model.h"

#include <limits>

#include "baton/model/model_factory.h"
#include "gtest/gtest.h"

namespace baton::kvstore {
namespace {

constexpr int64_t kB = 16, kW = 8, kC = 22;

HitPolicyInput Input(int64_t L, int64_t keep = kC, bool on = true) {
  return {.prompt_len = L,
          .keep = keep,
          .truncation_on = on,
          .ring_capacity = kC,
          .window = kW,
          .block_size = kB,
          .cap = HitCap::kRing};
}

ChainLookup Blocks(int64_t n) {
  return {.block_kv_blocks = n, .swa_present = std::vector<bool>(n, true)};
}

TEST(TtftModelTest, AHitReadsEachBlockFromTheLocalTierWhereItLies) {
  const BlockBytes bytes{.block_kv = 1000, .swa = 10};
  // L = 200: the ring cap allows floor((200 - 22) / 16) = 11 blocks.
  const TieredHit only_store = PlanTieredHit(Input(200), {.local = {}, .store = Blocks(12)}, bytes);
  EXPECT_EQ(only_store.hit_blocks, 11);
  EXPECT_EQ(only_store.local_blocks, 0);
  EXPECT_EQ(only_store.local_bytes, 0u);
  // Block KV of [0, 11), and SWA rows of the blocks the window needs before H = 176 (one).
  EXPECT_EQ(only_store.store_bytes, 11 * 1000u + 10u);

  const TieredHit mixed =
      PlanTieredHit(Input(200), {.local = Blocks(4), .store = Blocks(12)}, bytes);
  EXPECT_EQ(mixed.hit_blocks, 11);
  EXPECT_EQ(mixed.local_blocks, 4);
  EXPECT_EQ(mixed.local_bytes, 4 * 1000u);
  EXPECT_EQ(mixed.store_bytes, 7 * 1000u + 10u);

  // The local tier alone serves a hit the store no longer holds.
  const TieredHit local =
      PlanTieredHit(Input(200), {.local = Blocks(11), .store = Blocks(2)}, bytes);
  EXPECT_EQ(local.hit_blocks, 11);
  EXPECT_EQ(local.local_blocks, 11);
  EXPECT_EQ(local.store_bytes, 0u);

  // A block whose SWA rows neither tier holds backs the hit off, as the policy does.
  ChainLookup no_swa = Blocks(12);
  no_swa.swa_present[10] = false;
  EXPECT_EQ(PlanTieredHit(Input(200), {.local = {}, .store = no_swa}, bytes).hit_blocks, 10);
  // Truncation off: no hit at all.
  EXPECT_EQ(PlanTieredHit(Input(200, 0, false), {.local = Blocks(12), .store = Blocks(12)}, bytes)
                .hit_blocks,
            0);
}

// The small preset's shapes with this test's window and block size.
ModelConfig SmallConfig() {
  ModelConfig config = *model::PresetConfig("small");
  config.sliding_window = kW;
  config.kv_block_size = kB;
  return config;
}

TEST(TtftModelTest, APredictionPricesComputedAndReplayedRowsAndTheLoad) {
  const ModelConfig config = SmallConfig();
  const PrefillRates rates{
      .compute_ms_per_gflop = 10, .local_ms_per_mib = 1, .store_ms_per_mib = 10, .fixed_ms = 5};
  const double mib = 1024.0 * 1024.0;
  // A capped hit: L - H lies in [C, C + B - 1], and with K = C the replay is those rows.
  TieredHit hit{.hit_blocks = 11, .local_blocks = 11, .local_bytes = 2 * 1048576, .store_bytes = 0};
  PrefillCost cost = PredictPrefill(rates, 7, Input(200), hit, config);
  EXPECT_EQ(cost.computed_rows, 200 - 176);
  EXPECT_GE(cost.computed_rows, kC);
  EXPECT_LE(cost.computed_rows, kC + kB - 1);
  EXPECT_EQ(cost.replayed_rows, 22);  // L - max(L - K, H) = 200 - 178
  EXPECT_DOUBLE_EQ(cost.queue_ms, 7);
  EXPECT_DOUBLE_EQ(cost.load_ms, 2);
  const PrefillWork work = EstimatePrefillWork(config, 200, 176, 178);
  EXPECT_DOUBLE_EQ(cost.compute_ms, work.computed_gflop * 10);
  EXPECT_DOUBLE_EQ(cost.replay_ms, work.replayed_gflop * 10);
  EXPECT_DOUBLE_EQ(cost.total_ms(), 7 + 2 + cost.compute_ms + cost.replay_ms + 5);
  EXPECT_DOUBLE_EQ(cost.service_ms(), cost.total_ms() - 7);
  EXPECT_DOUBLE_EQ(cost.node_ms(), cost.service_ms());  // the replay runs here
  // Replay-on-decode: the replay at the decode node's rate, and no part of the node's own time.
  PrefillRates on_decode = rates;
  on_decode.replay_ms_per_gflop = 3;
  const PrefillCost elsewhere = PredictPrefill(on_decode, 7, Input(200), hit, config);
  EXPECT_TRUE(elsewhere.replay_elsewhere);
  EXPECT_DOUBLE_EQ(elsewhere.replay_ms, work.replayed_gflop * 3);
  EXPECT_DOUBLE_EQ(elsewhere.compute_ms, cost.compute_ms);
  EXPECT_DOUBLE_EQ(elsewhere.total_ms(), 7 + 2 + cost.compute_ms + elsewhere.replay_ms + 5);
  EXPECT_DOUBLE_EQ(elsewhere.node_ms(), 2 + cost.compute_ms + 5);
  // The same hit from the store costs its bytes at the store's rate.
  hit.local_bytes = 0;
  hit.store_bytes = static_cast<uint64_t>(2 * mib);
  EXPECT_DOUBLE_EQ(PredictPrefill(rates, 0, Input(200), hit, config).load_ms, 20);
  // No hit: K consumer rows, every row computed.
  cost = PredictPrefill(rates, 0, Input(200, 64), TieredHit{}, config);
  EXPECT_EQ(cost.computed_rows, 200);
  EXPECT_EQ(cost.replayed_rows, 64);
  // Truncation off: every consumer row.
  EXPECT_EQ(PredictPrefill(rates, 0, Input(200, 0, false), TieredHit{}, config).replayed_rows, 200);
}

TEST(TtftModelTest, WorkGrowsWithTheRowsAndAReplayedRowWithItsPrefix) {
  const ModelConfig config = SmallConfig();
  const PrefillWork none = EstimatePrefillWork(config, 4096, 4096, 4096);
  EXPECT_DOUBLE_EQ(none.computed_gflop, 0);
  // Only the last row's logits.
  EXPECT_DOUBLE_EQ(none.replayed_gflop,
                   2.0 * static_cast<double>(config.hidden_size * config.vocab_size) / 1e9);
  const PrefillWork cold = EstimatePrefillWork(config, 4096, 0, 4096 - 134);
  const PrefillWork hit = EstimatePrefillWork(config, 4096, 3904, 4096 - 134);
  EXPECT_GT(cold.computed_gflop, 15 * hit.computed_gflop);
  // The replay is the same rows over the same prefix, whatever was computed.
  EXPECT_DOUBLE_EQ(cold.replayed_gflop, hit.replayed_gflop);
  // A replayed row after 4K positions costs more than after 1K: it attends to all of them.
  const double late = EstimatePrefillWork(config, 4096, 4096, 4095).replayed_gflop;
  const double early = EstimatePrefillWork(config, 1024, 1024, 1023).replayed_gflop;
  EXPECT_GT(late, early);
}

TEST(TtftModelTest, UnmeasuredRatesTakeThePriors) {
  v1::PrefillRates reported;
  reported.set_compute_ms_per_gflop(0.5);
  reported.set_store_ms_per_mib(std::numeric_limits<double>::quiet_NaN());
  reported.set_fixed_ms(-3);
  const PrefillRates rates = RatesOrDefaults(reported);
  const PrefillRates priors = DefaultPrefillRates();
  EXPECT_DOUBLE_EQ(rates.compute_ms_per_gflop, 0.5);
  EXPECT_DOUBLE_EQ(rates.local_ms_per_mib, priors.local_ms_per_mib);
  EXPECT_DOUBLE_EQ(rates.store_ms_per_mib, priors.store_ms_per_mib);
  EXPECT_DOUBLE_EQ(rates.fixed_ms, priors.fixed_ms);
  const v1::PrefillRates proto = ToProto(rates, 9);
  EXPECT_EQ(proto.samples(), 9u);
  EXPECT_DOUBLE_EQ(proto.compute_ms_per_gflop(), 0.5);
}

TEST(TtftModelTest, BlockPayloadBytesFollowTheStateLayout) {
  ModelConfig config;
  config.num_hidden_layers = 8;
  config.n_prefill_layer = 4;
  config.num_key_value_heads = 2;
  config.head_dim = 16;
  config.kv_block_size = 64;
  const BlockBytes plain = BlockPayloadBytes(config);
  EXPECT_EQ(plain.block_kv, 4u * 2 * 64 * 32 * 4);  // four groups
  EXPECT_EQ(plain.swa, 4u * 2 * 64 * 32 * 4);       // four producers
  config.block_kv_sources = {4};
  EXPECT_EQ(BlockPayloadBytes(config).block_kv, 1u * 2 * 64 * 32 * 4);
}

}  // namespace
}  // namespace baton::kvstore
