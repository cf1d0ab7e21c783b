// The seed's figures that do not need the CED model (DESIGN section 3 "Figures"): lab 19 in
// exact fractions, the span R over all 5,456 0/1 inputs, the lab-20 table, the chunked
// example and the row-work ratios.
//
// Lab 19's toy model runs here on the plan's visibility rule: replaying a suffix of n rows is a
// plan with s_valid = L - n, and each row averages the keys in [lo_i, i].
#include <cstdlib>
#include <numeric>
#include <vector>

#include "baton/model/plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::model {
namespace {

// Exact rational arithmetic, small enough for the toy model's sums.
struct Rational {
  int64_t num = 0;
  int64_t den = 1;
  Rational(int64_t n = 0, int64_t d = 1) : num(n), den(d) {
    if (den < 0) num = -num, den = -den;
    const int64_t g = std::gcd(num < 0 ? -num : num, den);
    if (g > 1) num /= g, den /= g;
  }
  Rational operator+(const Rational& o) const { return {num * o.den + o.num * den, den * o.den}; }
  Rational operator/(int64_t k) const { return {num, den * k}; }
  bool operator==(const Rational& o) const { return num == o.num && den == o.den; }
};

std::ostream& operator<<(std::ostream& os, const Rational& r) {
  return os << r.num << "/" << r.den;
}

struct ToyRun {
  Rational last;                             // final prefill row
  std::vector<std::vector<Rational>> cache;  // per layer: KV of the last W positions
  Rational next;                             // one decode step on `next_input`
};

// Lab 19: `depth` layers, each adding the mean of its visible cached values to its input; the
// cached values are the boundary input (shared) or the layer's own input (per-layer). Rows
// before L - replay are not computed at all.
ToyRun RunToy(const std::vector<Rational>& inputs, int64_t window, int depth, bool shared,
              int64_t replay, Rational next_input) {
  const int64_t L = static_cast<int64_t>(inputs.size());
  auto plan = BuildTruncationPlan(
      {{.prompt_len = L, .window = window, .max_backtrack = 0, .s_valid = L - replay}, {}});
  EXPECT_TRUE(plan.ok()) << plan.status();
  const ChunkPlan& chunk = plan->chunks[0];
  std::vector<Rational> hidden = inputs;
  std::vector<std::vector<Rational>> kv_per_layer;
  for (int layer = 0; layer < depth; ++layer) {
    const std::vector<Rational>& kv = shared ? inputs : hidden;
    kv_per_layer.push_back(kv);
    std::vector<Rational> output = hidden;
    for (size_t r = 0; r < chunk.consumer_positions.size(); ++r) {
      const int64_t i = chunk.consumer_positions[r];
      Rational sum;
      for (int64_t j = chunk.swa_lo[r]; j <= i; ++j) sum = sum + kv[j];
      output[i] = hidden[i] + sum / (i + 1 - chunk.swa_lo[r]);
    }
    hidden = output;
  }
  ToyRun run;
  run.last = hidden[L - 1];
  for (const auto& kv : kv_per_layer) {
    run.cache.emplace_back(kv.end() - std::min<int64_t>(window, replay), kv.end());
  }
  // Decode of position L sees [lo_L, L] in every layer's cache plus its own new entry.
  const int64_t lo = DecodeSwaLowerBound(L, window, L - replay);
  Rational h = next_input;
  for (int layer = 0; layer < depth; ++layer) {
    const Rational own = shared ? next_input : h;
    Rational sum = own;
    for (int64_t j = lo; j < L; ++j) sum = sum + kv_per_layer[layer][j];
    h = h + sum / (L + 1 - lo);
  }
  run.next = h;
  return run;
}

TEST(SeedFiguresTest, Lab19ReplayOfOneWindow) {
  std::vector<Rational> inputs;
  for (int v = 1; v <= 8; ++v) inputs.emplace_back(v);
  const ToyRun shared_full = RunToy(inputs, 3, 2, true, 8, 9);
  const ToyRun shared_suffix = RunToy(inputs, 3, 2, true, 3, 9);
  const ToyRun layer_full = RunToy(inputs, 3, 2, false, 8, 9);
  const ToyRun layer_suffix = RunToy(inputs, 3, 2, false, 3, 9);
  EXPECT_EQ(shared_full.last, Rational(22));
  EXPECT_EQ(shared_suffix.last, Rational(22));
  EXPECT_EQ(shared_full.next, Rational(25));
  EXPECT_EQ(shared_suffix.next, Rational(25));
  EXPECT_EQ(layer_full.last, Rational(28));
  EXPECT_EQ(layer_suffix.last, Rational(57, 2));
  EXPECT_EQ(layer_full.next, Rational(32));
  EXPECT_EQ(layer_suffix.next, Rational(193, 6));
  // Replaying inputs 4..8 (R = 5 for W = 3, D = 2) restores the per-layer result exactly.
  const ToyRun layer_span = RunToy(inputs, 3, 2, false, 5, 9);
  EXPECT_EQ(layer_span.last, Rational(28));
  EXPECT_EQ(layer_span.next, Rational(32));
  EXPECT_EQ(layer_span.cache, layer_full.cache);
}

TEST(SeedFiguresTest, SpanRIsExactAndTight) {
  EXPECT_EQ(128 + (20 - 1) * (128 - 1), 2541);
  int cases = 0;
  for (int64_t window = 2; window <= 4; ++window) {
    for (int depth = 1; depth <= 3; ++depth) {
      const int64_t span = window + (depth - 1) * (window - 1);
      const int64_t length = span + 2;
      bool shorter_fails = false;
      for (int64_t bits = 0; bits < (int64_t{1} << length); ++bits, ++cases) {
        std::vector<Rational> inputs;
        for (int64_t p = 0; p < length; ++p) inputs.emplace_back((bits >> p) & 1);
        const Rational next(1);
        const ToyRun shared_full = RunToy(inputs, window, depth, true, length, next);
        const ToyRun shared_window = RunToy(inputs, window, depth, true, window, next);
        ASSERT_EQ(shared_window.last, shared_full.last);
        ASSERT_EQ(shared_window.next, shared_full.next);
        ASSERT_EQ(shared_window.cache, shared_full.cache);
        const ToyRun full = RunToy(inputs, window, depth, false, length, next);
        const ToyRun replay = RunToy(inputs, window, depth, false, span, next);
        ASSERT_EQ(replay.last, full.last) << "W=" << window << " D=" << depth;
        ASSERT_EQ(replay.next, full.next) << "W=" << window << " D=" << depth;
        ASSERT_EQ(replay.cache, full.cache) << "W=" << window << " D=" << depth;
        const ToyRun shorter = RunToy(inputs, window, depth, false, span - 1, next);
        shorter_fails |= !(shorter.last == full.last) || !(shorter.next == full.next);
      }
      EXPECT_TRUE(shorter_fails) << "R - 1 replay was exact for every input, W=" << window
                                 << " D=" << depth;
    }
  }
  EXPECT_EQ(cases, 5456);
}

struct Lab20Row {
  int64_t prompt_len;
  int64_t s_valid;
  std::vector<int64_t> chunks;
  size_t chunk;
  int64_t off_rows, off_pairs, mask_rows, mask_pairs, compact_rows, compact_pairs;
};

TEST(SeedFiguresTest, Lab20Table) {
  // short, long, clipped (positions 0-3), crossing (6-9), valid-start (from 10).
  const Lab20Row rows[] = {{2, 0, {2}, 0, 2, 3, 2, 3, 2, 3},
                           {12, 0, {12}, 0, 12, 33, 12, 9, 4, 9},
                           {12, 0, {4, 8}, 0, 4, 9, 4, 0, 1, 0},
                           {12, 0, {6, 4, 2}, 1, 4, 12, 4, 3, 2, 3},
                           {12, 10, {2}, 0, 2, 3, 2, 3, 2, 3}};
  for (const Lab20Row& row : rows) {
    const std::pair<TruncationMode, std::pair<int64_t, int64_t>> expected[] = {
        {TruncationMode::kOff, {row.off_rows, row.off_pairs}},
        {TruncationMode::kMask, {row.mask_rows, row.mask_pairs}},
        {TruncationMode::kCompact, {row.compact_rows, row.compact_pairs}}};
    for (const auto& [mode, counts] : expected) {
      auto plan = BuildTruncationPlan({{.prompt_len = row.prompt_len,
                                        .keep = 4,
                                        .mode = mode,
                                        .window = 3,
                                        .max_backtrack = 0,
                                        .s_valid = row.s_valid},
                                       row.chunks});
      ASSERT_TRUE(plan.ok()) << plan.status();
      const ChunkPlan& chunk = plan->chunks[row.chunk];
      EXPECT_EQ(chunk.work.consumer_rows, counts.first)
          << "L=" << row.prompt_len << " mode " << TruncationModeName(mode);
      EXPECT_EQ(chunk.work.consumer_swa_pairs, counts.second)
          << "L=" << row.prompt_len << " mode " << TruncationModeName(mode);
    }
  }
}

TEST(SeedFiguresTest, ChunkedPromptRunsOnePlaceholderPerClippedChunk) {
  const TruncationSpec spec{.prompt_len = 1024,
                            .keep = 140,
                            .mode = TruncationMode::kCompact,
                            .window = 128,
                            .max_backtrack = 5};
  auto four = BuildTruncationPlan({spec, {256, 256, 256, 256}});
  ASSERT_TRUE(four.ok());
  EXPECT_EQ(four->total_consumer_rows(), 143);
  EXPECT_EQ(four->chunks[3].work.consumer_rows, 140);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(four->chunks[i].work.consumer_rows, 1);
  auto one = BuildTruncationPlan({spec, {}});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->total_consumer_rows(), 140);
  EXPECT_EQ(one->ring_capacity, 134);
}

TEST(SeedFiguresTest, RowWorkRatios) {
  ModelConfig config;  // 20 + 20 equal layers; only the group sizes matter for row work
  config.num_hidden_layers = 40;
  config.n_prefill_layer = 20;
  const std::pair<int64_t, const char*> expected[] = {
      {64, "1.0000"}, {1024, "0.5684"}, {16384, "0.5043"}};
  const int64_t compact_rows[] = {2560, 23280, 330480};
  for (size_t i = 0; i < 3; ++i) {
    const int64_t L = expected[i].first;
    const TruncationSpec spec{.prompt_len = L,
                              .keep = 140,
                              .mode = TruncationMode::kCompact,
                              .window = 128,
                              .max_backtrack = 5};
    const int64_t lens[] = {L};
    const WorkEstimate estimate = EstimateWork(spec, lens, &config);
    ASSERT_TRUE(estimate.layer_rows.has_value());
    EXPECT_EQ(*estimate.layer_rows, compact_rows[i]);
    char ratio[16];
    std::snprintf(ratio, sizeof(ratio), "%.4f",
                  static_cast<double>(*estimate.layer_rows) / static_cast<double>(40 * L));
    EXPECT_STREQ(ratio, expected[i].second) << "L=" << L;
  }
}

}  // namespace
}  // namespace baton::model
