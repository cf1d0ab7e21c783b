// The routing cost model (kvstore/ttft_model.h): a hit over both tiers reads each block from
// the local tier where it lies and from the store otherwise, and a prediction prices the rows
// a CED hit still costs: L - H computed, the consumer replay from max(s_keep, H).
#include "baton/kvstore/ttft_model.h"

#include <cmath>
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

TEST(TtftModelTest, AWorkTimeFitFindsTheFixedTimeAndTheRateOfMixedWork) {
  WorkTimeFit fit;
  EXPECT_EQ(fit.per_unit_ms(), 0);
  // Prefills of 0.2 to 150 GFLOP on a line of 6 ms + 3.7 ms per GFLOP: the ratio of time to
  // work would price the small ones near the large ones' rate and the mix in between.
  const double units[] = {0.2, 120, 0.3, 60, 150, 0.2, 15, 90, 0.5, 3};
  for (int round = 0; round < 4; ++round) {
    for (double u : units) fit.Add(u, 6 + 3.7 * u);
  }
  EXPECT_NEAR(fit.per_unit_ms(), 3.7, 1e-9);
  EXPECT_NEAR(fit.fixed_ms(), 6, 1e-9);
  EXPECT_NEAR(fit.Predict(0.2), 6.74, 1e-9);
  // Bad samples are ignored.
  fit.Add(0, 50);
  fit.Add(10, -1);
  fit.Add(std::nan(""), 5);
  EXPECT_NEAR(fit.per_unit_ms(), 3.7, 1e-9);
}

TEST(TtftModelTest, AWorkTimeFitClipsASlowSampleAndFollowsTheNodeWhenItChanges) {
  WorkTimeFit fit;
  const double units[] = {1, 100, 2, 50, 80, 0.5};
  for (int round = 0; round < 5; ++round) {
    for (double u : units) fit.Add(u, 5 + 4 * u);
  }
  // A small prefill that waited out another node's on shared cores: taken at twice the line.
  WorkTimeFit clipped = fit;
  clipped.Add(1, 500);
  WorkTimeFit bounded = fit;
  bounded.Add(1, WorkTimeFit::kClip * fit.Predict(1));
  EXPECT_DOUBLE_EQ(clipped.fixed_ms(), bounded.fixed_ms());
  EXPECT_DOUBLE_EQ(clipped.per_unit_ms(), bounded.per_unit_ms());
  EXPECT_LT(clipped.Predict(1), 2 * fit.Predict(1));
  // A node that became twice as fast is followed within a few dozen prefills; one that became
  // twice as slow within a hundred, the bound notwithstanding (its slow samples weigh a quarter
  // of the fast ones they replace: each weighs by its error relative to its time).
  WorkTimeFit faster = fit;
  for (int round = 0; round < 8; ++round) {
    for (double u : units) faster.Add(u, (5 + 4 * u) / 2);
  }
  EXPECT_NEAR(faster.per_unit_ms(), 2, 0.1);
  EXPECT_NEAR(faster.fixed_ms(), 2.5, 0.5);
  for (int round = 0; round < 16; ++round) {
    for (double u : units) fit.Add(u, 2 * (5 + 4 * u));
  }
  EXPECT_NEAR(fit.per_unit_ms(), 8, 0.1);
  EXPECT_NEAR(fit.fixed_ms(), 10, 0.5);
}

// A node's large prefills swing with what shares its cores, by a factor; its small ones swing by
// a few ms. The line's fixed time follows the small ones, which measure it, rather than the large
// ones' swings (least squares of absolute errors put it at 60 ms here, four times the truth).
TEST(TtftModelTest, AWorkTimeFitTakesItsFixedTimeFromTheSmallPrefillsNotTheLargeOnesSwings) {
  WorkTimeFit fit;
  const double units[] = {0.2, 150, 0.5, 60, 0.3, 120, 0.7, 90, 0.4, 180};
  const double slowed[] = {1.0, 0.9, 1.0, 1.3, 1.0, 1.0, 1.0, 1.3, 1.0, 0.9};
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 10; ++i) fit.Add(units[i], (15 + 8.5 * units[i]) * slowed[i]);
  }
  EXPECT_NEAR(fit.fixed_ms(), 15, 1.5);
  EXPECT_NEAR(fit.per_unit_ms(), 8.5, 0.5);
  EXPECT_NEAR(fit.Predict(0.3), 15 + 8.5 * 0.3, 2);
}

TEST(TtftModelTest, AWorkTimeFitIsARatioWhenTheWorkDoesNotSpreadOrTheLineIsNotPlausible) {
  // One size of work cannot tell a slope from a constant: the ratio prices that size exactly.
  WorkTimeFit one_size;
  for (int i = 0; i < 30; ++i) one_size.Add(40, 200);
  EXPECT_DOUBLE_EQ(one_size.per_unit_ms(), 5);
  EXPECT_DOUBLE_EQ(one_size.fixed_ms(), 0);
  // A node's first few prefills do not make a line (two points always would): the ratio until
  // they weigh WorkTimeFit::kMinSamples.
  WorkTimeFit early;
  early.Add(0.2, 40);
  early.Add(100, 400);
  EXPECT_DOUBLE_EQ(early.fixed_ms(), 0);
  EXPECT_NEAR(early.per_unit_ms(), (0.95 * 40 + 400) / (0.95 * 0.2 + 100), 1e-9);
  for (int i = 0; i < 12; ++i) early.Add(i % 2 == 0 ? 0.2 : 100, i % 2 == 0 ? 40 : 400);
  EXPECT_NEAR(early.fixed_ms(), 40 - 0.2 * 360 / 99.8, 1e-6);
  EXPECT_NEAR(early.per_unit_ms(), 360 / 99.8, 1e-9);
  // Small work slower per unit than large would need a negative fixed time: the ratio instead
  // (the older sample of each pair weighs 0.95 of the newer).
  WorkTimeFit concave;
  for (int i = 0; i < 20; ++i) {
    concave.Add(10, 30);
    concave.Add(100, 400);
  }
  EXPECT_DOUBLE_EQ(concave.fixed_ms(), 0);
  EXPECT_NEAR(concave.per_unit_ms(), (0.95 * 30 + 400) / (0.95 * 10 + 100), 0.01);
  // Time that falls as work grows has no positive slope: the ratio.
  WorkTimeFit falling;
  for (int i = 0; i < 20; ++i) {
    falling.Add(10, 100);
    falling.Add(20, 95);
  }
  EXPECT_DOUBLE_EQ(falling.fixed_ms(), 0);
  EXPECT_NEAR(falling.per_unit_ms(), (0.95 * 100 + 95) / (0.95 * 10 + 20), 0.01);
}

}  // namespace
}  // namespace baton::kvstore
