// Token sampling on the CPU (model/sampling.cc): the top-k and top-p cuts, ties, and the
// determinism a re-prefilled request relies on. The CUDA sampler is held to the same draws by
// tests/kernels/cuda_consistency_test.cc.
#include "baton/model/sampling.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace baton::model {
namespace {

// The tokens drawn over `draws` seeds.
std::set<int32_t> Drawn(const std::vector<float>& logits, SamplingParams params, int draws) {
  std::set<int32_t> drawn;
  for (int i = 0; i < draws; ++i) {
    params.seed = 1000 + i;
    drawn.insert(SampleToken(logits, params, /*step=*/i % 3).token);
  }
  return drawn;
}

std::set<int32_t> Range(int32_t begin, int32_t end) {
  std::set<int32_t> ids;
  for (int32_t i = begin; i < end; ++i) ids.insert(i);
  return ids;
}

// 20 tied logits, p = 0.5: ten of them carry exactly half the weight, so exactly the ten
// lowest ids stay (dividing each weight by the total first rounded the sum below 0.5 and kept
// eleven).
TEST(SamplingTest, TopPKeepsExactlyTheTiedPrefixThatReachesP) {
  std::vector<float> logits(50, -4.0f);
  for (int i = 0; i < 20; ++i) logits[5 + i] = 2.0f;  // ids 5..24 tie
  const SamplingParams params{.temperature = 1.0f, .top_k = 20, .top_p = 0.5f};
  EXPECT_EQ(Drawn(logits, params, 400), Range(5, 15));
  // Without top_p, top_k 20 keeps all twenty.
  EXPECT_EQ(Drawn(logits, {.temperature = 1.0f, .top_k = 20}, 400), Range(5, 25));
}

TEST(SamplingTest, TopPCutsAtTheFirstPrefixReachingP) {
  // Weights (temperature 1) e^0 : e^-ln2 : ... = 8 : 4 : 2 : 1 : 1 of 16: the first two carry
  // 0.75 of the total, so p = 0.74 keeps two and p = 0.76 three.
  const float ln2 = 0.69314718f;
  std::vector<float> logits = {0.0f, -ln2, -2 * ln2, -3 * ln2, -3 * ln2};
  EXPECT_EQ(Drawn(logits, {.temperature = 1.0f, .top_p = 0.74f}, 300), Range(0, 2));
  EXPECT_EQ(Drawn(logits, {.temperature = 1.0f, .top_p = 0.76f}, 300), Range(0, 3));
  // A p no prefix short of all reaches keeps everything.
  EXPECT_EQ(Drawn(logits, {.temperature = 1.0f, .top_p = 0.99f}, 600), Range(0, 5));
}

TEST(SamplingTest, GreedyTakesTheLowestIdAmongTiedMaxima) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f};
  const SampledToken token = SampleToken(logits, {}, 0);
  EXPECT_EQ(token.token, 1);
  EXPECT_NEAR(token.logprob, LogSoftmaxAt(logits, 1), 1e-7f);
  EXPECT_EQ(SampleToken(logits, {.temperature = 1.0f, .top_k = 1}, 5).token, 1);
}

TEST(SamplingTest, ADrawIsAFunctionOfSeedAndStep) {
  std::vector<float> logits(300);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 37) % 11) * 0.3f;
  const SamplingParams params{.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .seed = 7};
  std::set<int32_t> over_steps;
  for (uint64_t step = 0; step < 32; ++step) {
    const SampledToken first = SampleToken(logits, params, step);
    EXPECT_EQ(first.token, SampleToken(logits, params, step).token) << "step " << step;
    over_steps.insert(first.token);
  }
  EXPECT_GT(over_steps.size(), 1u) << "the step moves the random stream";
}

}  // namespace
}  // namespace baton::model
