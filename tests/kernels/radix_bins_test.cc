// The CUDA sampler's per-digit bin choice (kernels/cuda/radix_bins.h), run on the CPU: it is
// plain arithmetic, and the case that matters (histogram sums that round below the target)
// cannot be produced on demand on a GPU.
#include "radix_bins.h"

#include <gtest/gtest.h>

#include <array>

namespace baton::kernels::cuda {
namespace {

using Histogram = std::array<double, 256>;

TEST(RadixBinsTest, PicksTheHighestBinWhereTheRunningWeightReachesTheTarget) {
  Histogram h{};
  h[200] = 1.0;  // earliest in the order
  h[100] = 2.0;
  h[7] = 4.0;
  BinChoice c = ChooseBin(h.data(), 0.5, 3.5, /*strict=*/false);
  EXPECT_EQ(c.bin, 100);  // 0.5 + 1 + 2 = 3.5 reaches 3.5
  EXPECT_DOUBLE_EQ(c.above, 1.5);
  EXPECT_TRUE(c.reached);
  // Strictly above 3.5 needs bin 7.
  c = ChooseBin(h.data(), 0.5, 3.5, /*strict=*/true);
  EXPECT_EQ(c.bin, 7);
  EXPECT_DOUBLE_EQ(c.above, 3.5);
  EXPECT_TRUE(c.reached);
  // A zero target (a draw at u = 0) takes the first bin of positive weight.
  c = ChooseBin(h.data(), 0.0, 0.0, /*strict=*/true);
  EXPECT_EQ(c.bin, 200);
  EXPECT_DOUBLE_EQ(c.above, 0.0);
}

// A later pass whose bins, summed by atomics in another order, fall a rounding step short of
// the target that an earlier pass saw this prefix reach: the choice is the prefix's lowest bin
// of positive weight, not "nothing" (which skipped the top-p cut).
TEST(RadixBinsTest, ATargetMissedByRoundingEndsAtTheLowestBinOfPositiveWeight) {
  Histogram h{};
  h[90] = 0.1;
  h[60] = 0.2;
  h[3] = 0.0;  // candidates whose weight underflowed: never chosen
  const double target = 0.1 + 0.2 + 1e-12;
  const BinChoice c = ChooseBin(h.data(), 0.0, target, /*strict=*/false);
  EXPECT_FALSE(c.reached);
  EXPECT_EQ(c.bin, 60);
  EXPECT_DOUBLE_EQ(c.above, 0.1);
}

TEST(RadixBinsTest, AnEmptyHistogramChoosesNoBin) {
  Histogram h{};
  const BinChoice c = ChooseBin(h.data(), 0.0, 1.0, /*strict=*/false);
  EXPECT_EQ(c.bin, -1);
  EXPECT_FALSE(c.reached);
}

}  // namespace
}  // namespace baton::kernels::cuda
