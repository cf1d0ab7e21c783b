// The one home of each CED rule (common/ced_rules.h): the seed's numbers and the names every
// component shares.
#include "baton/common/ced_rules.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

TEST(CedRulesTest, RingCapacityAndDependencySpanFollowTheSeed) {
  EXPECT_EQ(RingCapacity(128, 5), 134);  // the documented L - 134 cap
  EXPECT_EQ(RingCapacity(16, 5), 22);    // the tiny preset
  // R = W + (D - 1)(W - 1): one consumer layer sees W; each further one W - 1 more.
  EXPECT_EQ(DependencySpan(128, 1), 128);
  EXPECT_EQ(DependencySpan(128, 4), 128 + 3 * 127);
}

TEST(CedRulesTest, ProducerDependenciesStartAWindowBack) {
  EXPECT_EQ(ProducerLowerBound(0, 16), 0);
  EXPECT_EQ(ProducerLowerBound(15, 16), 0);
  EXPECT_EQ(ProducerLowerBound(16, 16), 1);
  EXPECT_EQ(ProducerLowerBound(100, 16), 85);
  // A hit of H = 64 with W = 16: the row at 64 attends back to 49, in block 3 of B = 16.
  EXPECT_EQ(FirstProducerBlock(64, 16, 16), 3);
  EXPECT_EQ(FirstProducerBlock(64, 17, 16), 3);  // back to 48, still block 3
  EXPECT_EQ(FirstProducerBlock(64, 18, 16), 2);  // back to 47, block 2
  EXPECT_EQ(FirstProducerBlock(64, 128, 16), 0);
}

TEST(CedRulesTest, KeepMustCoverTheRingWhenTruncated) {
  EXPECT_EQ(EffectiveKeep(0, 22), 22);
  EXPECT_EQ(EffectiveKeep(40, 22), 40);
  EXPECT_TRUE(CheckKeep(true, 22, 22, "truncation.keep").ok());
  EXPECT_TRUE(CheckKeep(false, 0, 22, "truncation.keep").ok());  // off keeps nothing
  const absl::Status low = CheckKeep(true, 21, 22, "truncation.keep");
  EXPECT_EQ(low.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(low.message()),
              HasSubstr("truncation.keep: 21 is below the ring capacity C = 22"));
}

TEST(CedRulesTest, ModeNamesRoundTripAndUnknownNamesAreRefusedByField) {
  for (v1::TruncationMode mode :
       {v1::TRUNCATION_MODE_OFF, v1::TRUNCATION_MODE_MASK, v1::TRUNCATION_MODE_COMPACT}) {
    EXPECT_TRUE(IsTruncationMode(mode));
    const absl::StatusOr<v1::TruncationMode> parsed =
        ParseTruncationModeName(TruncationModeName(mode), "--mode");
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, mode);
  }
  EXPECT_FALSE(IsTruncationMode(v1::TRUNCATION_MODE_UNSPECIFIED));
  EXPECT_FALSE(IsTruncationMode(static_cast<v1::TruncationMode>(42)));  // from the wire
  const absl::StatusOr<v1::TruncationMode> upper = ParseTruncationModeName("Mask", "--mode");
  ASSERT_FALSE(upper.ok());
  EXPECT_THAT(std::string(upper.status().message()),
              HasSubstr("--mode: 'Mask' is not a truncation mode; allowed: off, mask, compact"));
  // A client's value (the HTTP front's truncation_mode) comes back cut to a bound.
  const absl::StatusOr<v1::TruncationMode> long_name =
      ParseTruncationModeName(std::string(100000, 'x'), "truncation_mode");
  ASSERT_FALSE(long_name.ok());
  EXPECT_LT(long_name.status().message().size(), 200u);
  EXPECT_THAT(std::string(long_name.status().message()), HasSubstr("xxx...' is not a truncation"));
}

}  // namespace
}  // namespace baton
