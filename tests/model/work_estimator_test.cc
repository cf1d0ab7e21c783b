// The estimator's prefix-sum counts against a direct enumeration of the plan's visible
// (query, key) pairs over thousands of generated cases (seed 9.5.1 and lab 20).
#include "baton/model/work_estimator.h"

#include <random>
#include <set>

#include "baton/model/plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::model {
namespace {

bool SwaKeyVisible(const TruncationSpec& spec, int64_t query, int64_t key) {
  if (key > query || key < query - spec.window + 1 || key < spec.s_valid) return false;
  return !spec.truncated() || key >= spec.prompt_len - spec.keep;
}

// Rows the definition (not the clamp formula) says a chunk's consumers compute: every row in
// off and mask; in compact the retained rows, or the last row alone when none is retained.
std::vector<int32_t> ExpectedConsumerRows(const TruncationSpec& spec, int64_t q_start,
                                          int64_t q_len) {
  std::vector<int32_t> rows;
  for (int64_t pos = q_start; pos < q_start + q_len; ++pos) {
    if (spec.mode != TruncationMode::kCompact || pos >= spec.prompt_len - spec.keep) {
      rows.push_back(static_cast<int32_t>(pos));
    }
  }
  if (rows.empty()) rows.push_back(static_cast<int32_t>(q_start + q_len - 1));
  return rows;
}

struct GeneratedCase {
  PlanRequest request;
  std::string describe() const {
    std::string s = "L=" + std::to_string(request.spec.prompt_len) +
                    " K=" + std::to_string(request.spec.keep) +
                    " mode=" + std::string(TruncationModeName(request.spec.mode)) +
                    " W=" + std::to_string(request.spec.window) +
                    " mb=" + std::to_string(request.spec.max_backtrack) +
                    " s_valid=" + std::to_string(request.spec.s_valid) + " chunks=";
    for (int64_t len : request.chunk_lens) s += std::to_string(len) + ",";
    return s;
  }
};

GeneratedCase Generate(std::mt19937_64& rng) {
  auto uniform = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  GeneratedCase c;
  TruncationSpec& spec = c.request.spec;
  spec.prompt_len = uniform(1, 48);
  spec.window = uniform(1, 10);
  spec.max_backtrack = uniform(0, 4);
  spec.mode = static_cast<TruncationMode>(uniform(0, 2));
  const int64_t capacity = spec.ring_capacity();
  // K from C up to past L, so that K >= L and short prompts are covered.
  spec.keep = spec.truncated() ? uniform(capacity, capacity + spec.prompt_len + 4) : uniform(0, 8);
  spec.s_valid = uniform(0, 2) == 0 ? uniform(0, spec.prompt_len - 1) : 0;
  int64_t remaining = spec.prompt_len - spec.s_valid;
  while (remaining > 0) {
    const int64_t len = uniform(0, 3) == 0 ? remaining : uniform(1, remaining);
    c.request.chunk_lens.push_back(len);
    remaining -= len;
  }
  return c;
}

TEST(WorkEstimatorTest, PrefixSumMatchesItsDefinition) {
  for (int64_t window = 1; window <= 6; ++window) {
    int64_t sum = 0;
    for (int64_t n = 0; n <= 20; ++n) {
      EXPECT_EQ(SwaPrefixPairs(n, window), sum) << "n=" << n << " W=" << window;
      sum += std::min(n + 1, window);
    }
  }
}

TEST(WorkEstimatorTest, CountsEqualDirectEnumerationOfThePlan) {
  std::mt19937_64 rng(20261130);
  int checked_chunks = 0;
  for (int trial = 0; trial < 6000; ++trial) {
    const GeneratedCase c = Generate(rng);
    SCOPED_TRACE(c.describe());
    const TruncationSpec& spec = c.request.spec;
    auto plan = BuildTruncationPlan(c.request);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->chunks.size(), c.request.chunk_lens.size());
    int64_t total_rows = 0, total_pairs = 0;
    int64_t expected_start = spec.s_valid;
    for (const ChunkPlan& chunk : plan->chunks) {
      ASSERT_EQ(chunk.q_start, expected_start);
      expected_start += chunk.q_len;
      EXPECT_EQ(chunk.consumer_positions, ExpectedConsumerRows(spec, chunk.q_start, chunk.q_len));
      ASSERT_EQ(chunk.swa_lo.size(), chunk.consumer_positions.size());
      ASSERT_EQ(chunk.consumer_slots.size(), chunk.consumer_positions.size());

      int64_t pairs = 0, global_pairs = 0, producer_pairs = 0;
      std::set<int32_t> consumer_slots, producer_slots;
      for (size_t r = 0; r < chunk.consumer_positions.size(); ++r) {
        const int64_t pos = chunk.consumer_positions[r];
        int64_t visible = 0;
        for (int64_t key = 0; key <= pos; ++key) visible += SwaKeyVisible(spec, pos, key);
        // The bound is exactly where visibility starts: [lo, pos] is the visible set.
        EXPECT_EQ(visible, pos + 1 - chunk.swa_lo[r]) << "pos=" << pos;
        EXPECT_GE(chunk.swa_lo[r], spec.s_valid);
        pairs += visible;
        global_pairs += pos + 1;
        const int32_t slot = chunk.consumer_slots[r];
        const bool retained = !spec.truncated() || pos >= spec.prompt_len - spec.keep;
        const bool last_c = chunk.q_start + chunk.q_len - pos <= spec.ring_capacity();
        EXPECT_EQ(slot, retained && last_c ? pos % spec.ring_capacity() : -1) << "pos=" << pos;
        if (slot >= 0) {
          EXPECT_TRUE(consumer_slots.insert(slot).second) << "slot " << slot;
        }
      }
      for (int64_t j = 0; j < chunk.q_len; ++j) {
        const int64_t pos = chunk.q_start + j;
        for (int64_t key = std::max<int64_t>(0, pos - spec.window + 1); key <= pos; ++key) {
          ++producer_pairs;
        }
        const int32_t slot = chunk.producer_slots[j];
        if (slot >= 0) {
          EXPECT_TRUE(producer_slots.insert(slot).second) << "slot " << slot;
        }
      }
      EXPECT_EQ(producer_slots.size(),
                static_cast<size_t>(std::min<int64_t>(chunk.q_len, spec.ring_capacity())));
      EXPECT_EQ(chunk.work.consumer_rows, static_cast<int64_t>(chunk.consumer_positions.size()));
      EXPECT_EQ(chunk.work.consumer_swa_pairs, pairs);
      EXPECT_EQ(chunk.work.global_pairs, global_pairs);
      EXPECT_EQ(chunk.work.producer_swa_pairs, producer_pairs);
      total_rows += chunk.work.consumer_rows;
      total_pairs += pairs;
      ++checked_chunks;
    }
    EXPECT_EQ(expected_start, spec.prompt_len);
    EXPECT_EQ(plan->total_consumer_rows(), total_rows);
    EXPECT_EQ(plan->total_swa_pairs(), total_pairs);
    if (HasFailure()) return;
  }
  EXPECT_GT(checked_chunks, 10000);
}

TEST(WorkEstimatorTest, ConfigAddsLayerRowsAndFlops) {
  ModelConfig config;
  config.vocab_size = 100;
  config.hidden_size = 8;
  config.intermediate_size = 16;
  config.num_hidden_layers = 4;
  config.n_prefill_layer = 2;
  config.num_attention_heads = 2;
  config.num_key_value_heads = 1;
  config.head_dim = 4;
  config.sliding_window = 3;
  config.max_backtrack = 0;
  config.kv_block_size = 4;
  const TruncationSpec spec{.prompt_len = 12,
                            .keep = 4,
                            .mode = TruncationMode::kCompact,
                            .window = 3,
                            .max_backtrack = 0,
                            .s_valid = 0};
  const int64_t lens[] = {12};
  const WorkEstimate estimate = EstimateWork(spec, lens, &config);
  ASSERT_TRUE(estimate.layer_rows.has_value());
  EXPECT_EQ(*estimate.layer_rows, 2 * 12 + 2 * 4);
  ASSERT_TRUE(estimate.flops.has_value());
  // Row: q (8x8) + k, v (2 x 8x4) + o (8x8) + MLP (3 x 8x16), 2 FLOPs per multiply-add.
  const double row = 2.0 * (64 + 64 + 64 + 384);
  const double pair = 4.0 * 8;
  EXPECT_DOUBLE_EQ(estimate.flops->producer, 2 * (12 * row + 33 * pair));
  // Consumer rows 8..11 see 9 SWA pairs and 9 + 10 + 11 + 12 = 42 global pairs.
  EXPECT_DOUBLE_EQ(estimate.flops->consumer, 2 * (12 * 2.0 * 64 + 4 * row + (9 + 42) * pair));
  EXPECT_DOUBLE_EQ(estimate.flops->lm_head, 2.0 * 8 * 100);
  const WorkEstimate off =
      EstimateWork({.prompt_len = 12, .window = 3, .max_backtrack = 0}, lens, &config);
  EXPECT_LT(estimate.flops->total(), off.flops->total());
}

}  // namespace
}  // namespace baton::model
