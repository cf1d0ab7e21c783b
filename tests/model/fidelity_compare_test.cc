// model/fidelity.h: the comparison of a served run with the untruncated one.
#include <cmath>

#include "baton/model/fidelity.h"
#include "gtest/gtest.h"

namespace baton::model {
namespace {

TEST(CompareLogitsTest, KlIsOfTheReferenceFromTheVariantInNats) {
  // softmax([0, 0]) = (1/2, 1/2); softmax([ln 3, 0]) = (3/4, 1/4).
  const std::vector<float> reference = {0.0f, 0.0f};
  const std::vector<float> variant = {static_cast<float>(std::log(3.0)), 0.0f};
  const LogitsError e = CompareLogits(reference, variant);
  // KL(p || q) = 1/2 ln((1/2)/(3/4)) + 1/2 ln((1/2)/(1/4)) = 1/2 ln(4/3).
  EXPECT_NEAR(e.kl, 0.5 * std::log(4.0 / 3.0), 1e-7);
  EXPECT_NEAR(e.max_abs, std::log(3.0), 1e-6);
  EXPECT_TRUE(e.top1);  // ties: the first index in both
  const std::vector<float> up = {1.0f, 0.0f}, down = {0.0f, 1.0f};
  EXPECT_FALSE(CompareLogits(up, down).top1);
}

TEST(CompareRunsTest, SumsThePositionsAndFindsTheFirstDisagreement) {
  const std::vector<std::vector<float>> full = {{2, 0, 0}, {0, 2, 0}, {0, 0, 2}, {2, 0, 0}};
  std::vector<std::vector<float>> served = full;
  FidelitySummary same = CompareRuns(full, served);
  EXPECT_EQ(same.positions, 4);
  EXPECT_EQ(same.top1_agreements, 4);
  EXPECT_EQ(same.first_disagreement, -1);
  EXPECT_EQ(same.kl_sum, 0.0);
  EXPECT_EQ(same.max_logit_diff, 0.0);

  served[2] = {0, 3, 0};  // argmax 1 where the full model says 2
  served[3] = {0, 0, 3};
  const FidelitySummary moved = CompareRuns(full, served);
  EXPECT_EQ(moved.top1_agreements, 2);
  EXPECT_EQ(moved.first_disagreement, 2);
  EXPECT_NEAR(moved.max_logit_diff, 3.0, 1e-9);
  EXPECT_GT(moved.kl_sum, 0.0);
  EXPECT_NEAR(moved.mean_kl(), moved.kl_sum / 4, 1e-12);
  EXPECT_NEAR(moved.max_kl, std::max(moved.per_position[2].kl, moved.per_position[3].kl), 1e-12);
  // Only the positions both runs hold.
  EXPECT_EQ(CompareRuns(full, std::span(served).first(3)).positions, 3);
}

}  // namespace
}  // namespace baton::model
