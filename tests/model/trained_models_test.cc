// The trained models that ship in models/ (tools/train/train.py): they load, their forward
// pass matches the double-precision reference in every truncation mode as the generated
// models' does, and K >= R is exact. Their greedy text is trained_text_test.
#include <random>
#include <string>
#include <vector>

#include "baton/model/engine.h"
#include "baton/model/engine_factory.h"
#include "ced_reference.h"
#include "gtest/gtest.h"

namespace baton::model {
namespace {

const std::string kModels = BATON_MODELS_DIR;

class TrainedModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string Dir() const { return kModels + "/" + GetParam(); }
};

TEST_P(TrainedModelTest, MatchesTheReferenceInEveryModeAndIsExactFromSpanR) {
  absl::StatusOr<std::unique_ptr<Engine>> loaded = LoadEngine(Dir());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Engine& model = **loaded;
  const ModelConfig& c = model.config();
  const testing::CedReference reference(Dir(), c);
  const int64_t C = c.ring_capacity(), R = c.dependency_span(), V = c.vocab_size;
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t L = 120 + static_cast<int64_t>(rng() % 200);
    const auto mode = static_cast<TruncationMode>(trial % 3);
    const int64_t keep = mode == TruncationMode::kOff ? 0 : C + static_cast<int64_t>(rng() % 60);
    const int64_t s_valid = trial == 4 ? static_cast<int64_t>(rng() % L) : 0;
    const int64_t chunk = static_cast<int64_t>(rng() % (L + 1));
    std::vector<int32_t> tokens(L + 3);
    for (int32_t& t : tokens) t = static_cast<int32_t>(3 + rng() % (V - 3));
    SCOPED_TRACE(::testing::Message() << "L=" << L << " mode=" << TruncationModeName(mode) << " K="
                                      << keep << " s_valid=" << s_valid << " chunk=" << chunk);
    SequenceState state(model.state_layout());
    const std::span<const int32_t> prompt(tokens.data(), L);
    auto result = model.Prefill(
        prompt, {.mode = mode, .keep = keep, .s_valid = s_valid, .chunk_size = chunk}, state);
    ASSERT_TRUE(result.ok()) << result.status();
    std::vector<std::vector<float>> rows = {
        std::vector<float>(result->logits.end() - V, result->logits.end())};
    for (int64_t p = L; p < L + 2; ++p) {
      std::vector<float> row(V);
      const DecodeItem item{.state = &state, .token = tokens[p], .logits = row.data()};
      ASSERT_TRUE(model.Decode({&item, 1}).ok());
      rows.push_back(std::move(row));
    }
    const auto expected =
        reference.Run(tokens, L, mode != TruncationMode::kOff, keep, s_valid).logits;
    for (size_t r = 0; r < rows.size(); ++r) {
      const std::vector<double>& want = expected[L - 1 + r];
      double diff = 0, scale = 1e-12;
      for (int64_t v = 0; v < V; ++v) {
        diff = std::max(diff, std::abs(rows[r][v] - want[v]));
        scale = std::max(scale, std::abs(want[v]));
      }
      EXPECT_LT(diff / scale, 1e-4) << "row " << L - 1 + r;
    }
  }
  // K = R: the retained rows are those off computes; K = C moves a trained model's output.
  std::vector<int32_t> prompt(R + 120);
  for (int32_t& t : prompt) t = static_cast<int32_t>(3 + rng() % (V - 3));
  auto last = [&](TruncationMode mode, int64_t keep) {
    SequenceState state(model.state_layout());
    auto result = model.Prefill(prompt, {.mode = mode, .keep = keep}, state);
    EXPECT_TRUE(result.ok()) << result.status();
    return std::vector<float>(result->logits.end() - V, result->logits.end());
  };
  const std::vector<float> off = last(TruncationMode::kOff, 0);
  auto max_diff = [&](const std::vector<float>& other) {
    double m = 0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, double{std::abs(off[v] - other[v])});
    return m;
  };
  EXPECT_LT(max_diff(last(TruncationMode::kCompact, R)), 1e-3);
  EXPECT_GT(max_diff(last(TruncationMode::kCompact, C)), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Models, TrainedModelTest,
                         ::testing::Values("ced-brown-plain", "ced-brown-replay",
                                           "ced-brown-shared"));

}  // namespace
}  // namespace baton::model
