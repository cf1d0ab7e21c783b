// The truncation plan on its own: the seed's worked examples, the ring-write rule, the
// exact-cap case and the errors for bad input.
#include "baton/model/plan.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TruncationSpec Spec(int64_t L, int64_t K, TruncationMode mode, int64_t W, int64_t backtrack,
                    int64_t s_valid = 0) {
  return {.prompt_len = L,
          .keep = K,
          .mode = mode,
          .window = W,
          .max_backtrack = backtrack,
          .s_valid = s_valid};
}

TEST(PlanTest, OneChunkCompactKeepsTheSuffixWithOriginalPositions) {
  // Seed figure 9.2: L = 12, K = 4, W = 3; retained positions 8..11.
  auto plan = BuildTruncationPlan({Spec(12, 4, TruncationMode::kCompact, 3, 0), {}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->chunks.size(), 1u);
  const ChunkPlan& c = plan->chunks[0];
  EXPECT_EQ(plan->ring_capacity, 4);
  EXPECT_EQ(c.clip_prefix, 8);
  EXPECT_THAT(c.consumer_positions, ElementsAre(8, 9, 10, 11));
  // Query 8's window 6..8 is raised to 8 by the retained bound; query 10 sees 8..10.
  EXPECT_THAT(c.swa_lo, ElementsAre(8, 8, 8, 9));
  EXPECT_THAT(c.consumer_slots, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(c.producer_slots, ElementsAre(-1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 2, 3));
}

TEST(PlanTest, PlaceholderRowWritesNoSlot) {
  // Seed 9.3.1: a four-row chunk over positions 0..3 keeps position 3 as a placeholder.
  auto plan = BuildTruncationPlan({Spec(12, 4, TruncationMode::kCompact, 3, 0), {4, 4, 4}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const ChunkPlan& first = plan->chunks[0];
  EXPECT_EQ(first.clip_prefix, 3);
  EXPECT_THAT(first.consumer_positions, ElementsAre(3));
  EXPECT_THAT(first.swa_lo, ElementsAre(4));  // lo = i + 1: nothing visible
  EXPECT_THAT(first.consumer_slots, ElementsAre(-1));
  // Experiment 3 of seed 9.6: chunk 4..7 also runs only its placeholder, position 7.
  EXPECT_THAT(plan->chunks[1].consumer_positions, ElementsAre(7));
  EXPECT_THAT(plan->chunks[1].consumer_slots, ElementsAre(-1));
  EXPECT_THAT(plan->chunks[2].consumer_positions, ElementsAre(8, 9, 10, 11));
  EXPECT_EQ(plan->chunks[2].consumer_offset, 2);
  EXPECT_EQ(plan->total_consumer_rows(), 6);
}

TEST(PlanTest, MaskRunsEveryRowButWritesOnlyRetainedOnes) {
  auto plan = BuildTruncationPlan({Spec(12, 4, TruncationMode::kMask, 3, 0), {}});
  ASSERT_TRUE(plan.ok());
  const ChunkPlan& c = plan->chunks[0];
  EXPECT_EQ(c.consumer_positions.size(), 12u);
  EXPECT_THAT(c.swa_lo, ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 9));
  EXPECT_THAT(c.consumer_slots, ElementsAre(-1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 2, 3));
}

TEST(PlanTest, OnlyTheChunksLastCRowsWriteTheRing) {
  // W = 2, backtrack 0: C = 3; a 6-row chunk in off mode writes rows 3..5 only.
  auto plan = BuildTruncationPlan({Spec(6, 0, TruncationMode::kOff, 2, 0), {}});
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(plan->chunks[0].consumer_slots, ElementsAre(-1, -1, -1, 0, 1, 2));
  EXPECT_THAT(plan->chunks[0].swa_lo, ElementsAre(0, 0, 1, 2, 3, 4));
}

TEST(PlanTest, ValidStartRaisesEveryLowerBound) {
  auto plan = BuildTruncationPlan({Spec(12, 0, TruncationMode::kOff, 3, 0, 10), {}});
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(plan->chunks[0].consumer_positions, ElementsAre(10, 11));
  EXPECT_THAT(plan->chunks[0].swa_lo, ElementsAre(10, 10));
}

TEST(PlanTest, ExactCapHitReadsNoConsumerEntryBeforeTheHit) {
  // Seed 9.4.1: H = L - 134, K = 140, W = 128. Without s_valid the first query would see six
  // ring entries before the hit; with s_valid = H (DESIGN section 5) it sees none.
  const int64_t L = 1000, H = L - 134;
  auto unguarded = BuildTruncationPlan({Spec(L, 140, TruncationMode::kCompact, 128, 5), {}});
  ASSERT_TRUE(unguarded.ok());
  EXPECT_EQ(unguarded->chunks[0].consumer_positions.front(), L - 140);
  auto plan = BuildTruncationPlan({Spec(L, 140, TruncationMode::kCompact, 128, 5, H), {}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const ChunkPlan& c = plan->chunks[0];
  EXPECT_EQ(c.consumer_positions.front(), H);
  EXPECT_EQ(c.consumer_positions.size(), 134u);
  for (int32_t lo : c.swa_lo) EXPECT_GE(lo, H);
  EXPECT_EQ(c.swa_lo.front(), H);
}

TEST(PlanTest, EvenChunksCutTheLastOneShorter) {
  auto lens = EvenChunks(1000, 300);
  ASSERT_TRUE(lens.ok());
  EXPECT_THAT(*lens, ElementsAre(300, 300, 300, 100));
  EXPECT_FALSE(EvenChunks(10, 0).ok());
}

struct BadPlanCase {
  PlanRequest request;
  const char* message;
};

TEST(PlanTest, BadInputGetsAClearError) {
  const BadPlanCase cases[] = {
      {{Spec(0, 0, TruncationMode::kOff, 3, 0), {}}, "prompt length L is 0; it must lie in [1,"},
      {{Spec(-5, 0, TruncationMode::kOff, 3, 0), {}}, "prompt length L is -5"},
      {{Spec(12, 3, TruncationMode::kCompact, 3, 0), {}},
       "keep K is 3 with truncation mode 'compact'; it must be >= the ring capacity C = W + "
       "max_backtrack + 1 = 4"},
      {{Spec(12, 133, TruncationMode::kMask, 128, 5), {}},
       "ring capacity C = W + "
       "max_backtrack + 1 = 134"},
      {{Spec(12, -1, TruncationMode::kOff, 3, 0), {}}, "keep K is -1; it must be >= 0"},
      {{Spec(12, 4, TruncationMode::kOff, 0, 0), {}}, "window W is 0"},
      {{Spec(12, 4, TruncationMode::kOff, 3, -1), {}}, "max_backtrack is -1"},
      {{Spec(12, 4, TruncationMode::kOff, 3, 0, 12), {}},
       "s_valid is 12; it must lie in [0, L) = [0, 12)"},
      {{Spec(12, 4, TruncationMode::kOff, 3, 0, -1), {}}, "s_valid is -1"},
      {{Spec(12, 4, TruncationMode::kOff, 3, 0), {4, 4}},
       "chunks: lengths sum to 8; they must tile [s_valid, L) = [0, 12)"},
      {{Spec(12, 4, TruncationMode::kOff, 3, 0, 2), {6, 6}},
       "they must tile [s_valid, L) = [2, 12), i.e. sum to L - s_valid = 10"},
      {{Spec(12, 4, TruncationMode::kOff, 3, 0), {4, 0, 8}},
       "chunks: chunk 1 has length 0; every chunk length must be >= 1"},
      {{Spec(12, 4, TruncationMode::kOff, 3, 0), {int64_t{1} << 62, 4}}, "chunks: lengths sum"},
  };
  for (const BadPlanCase& c : cases) {
    auto plan = BuildTruncationPlan(c.request);
    ASSERT_FALSE(plan.ok()) << c.message;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(plan.status().message(), HasSubstr(c.message));
  }
}

TEST(PlanTest, ModeNamesParseAndUnknownOnesAreRejected) {
  for (TruncationMode mode :
       {TruncationMode::kOff, TruncationMode::kMask, TruncationMode::kCompact}) {
    auto parsed = ParseTruncationMode(TruncationModeName(mode));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, mode);
  }
  auto bad = ParseTruncationMode("Compact", "--mode");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              HasSubstr("--mode: 'Compact' is not a truncation mode; allowed: off, mask, compact"));
}

TEST(PlanTest, DescribePlanNamesEveryChunk) {
  auto plan = BuildTruncationPlan({Spec(12, 4, TruncationMode::kCompact, 3, 0), {4, 8}});
  ASSERT_TRUE(plan.ok());
  const std::string text = DescribePlan(*plan);
  EXPECT_THAT(text, HasSubstr("chunk 0: rows [0, 4) clip_prefix=3"));
  EXPECT_THAT(text, HasSubstr("chunk 1: rows [4, 12) clip_prefix=4"));
  EXPECT_THAT(text, HasSubstr("total: consumer_rows=5 swa_pairs=9"));
}

}  // namespace
}  // namespace baton::model
