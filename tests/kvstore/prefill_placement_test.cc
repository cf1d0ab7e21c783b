// kvstore/prefill_placement.h on its own: the load order and its ties, each policy's rank, the
// runner-up, what a node's cache keeps of a hit, and the two rules by which routers that share
// nodes agree.
#include "baton/kvstore/prefill_placement.h"

#include <vector>

#include "baton/model/model_factory.h"
#include "gtest/gtest.h"

namespace baton::kvstore {
namespace {

class PrefillPlacementTest : public ::testing::Test {
 protected:
  PrefillPlacementTest() : config_(*model::PresetConfig("tiny")) {
    request_.hit = {.prompt_len = 20 * config_.kv_block_size,
                    .keep = config_.ring_capacity(),
                    .truncation_on = true,
                    .ring_capacity = config_.ring_capacity(),
                    .window = config_.sliding_window,
                    .block_size = config_.kv_block_size,
                    .cap = HitCap::kRing};
    request_.payload = BlockPayloadBytes(config_);
    request_.config = &config_;
  }
  // A node whose local cache holds the first `local` blocks (both regions).
  PrefillNodeView Node(int64_t prefilling, int64_t queued, double queue_ms, int64_t local) {
    PrefillNodeView view{.prefilling = prefilling,
                         .reported_queued = queued,
                         .queue_ms = queue_ms,
                         .rates = DefaultPrefillRates()};
    view.tiers.local.block_kv_blocks = local;
    view.tiers.local.swa_present.assign(static_cast<size_t>(local), true);
    return view;
  }
  ModelConfig config_;
  PlacementRequest request_;
};

TEST_F(PrefillPlacementTest, LeastLoadedTakesFewestInFlightThenTheShortestReportedQueue) {
  request_.policy = RoutingPolicy::kLeastLoaded;
  const std::vector<PrefillNodeView> nodes = {Node(1, 0, 0, 0), Node(0, 3, 0, 10), Node(0, 1, 0, 0),
                                              Node(0, 1, 0, 5)};
  const Placement p = PlacePrefill(nodes, request_);
  EXPECT_EQ(p.chosen, 2);     // fewest in flight, then queue 1, then the first given
  EXPECT_EQ(p.runner_up, 3);  // the next in load order
  EXPECT_TRUE(p.least_loaded);
  // Its hit and cost are still priced (for the log and the predicted TTFT).
  EXPECT_GT(p.plan.cost.total_ms(), 0);
  EXPECT_EQ(p.runner_up_plan.hit.local_blocks, p.runner_up_plan.hit.hit_blocks);
  EXPECT_GT(p.runner_up_plan.hit.hit_blocks, 0);
}

TEST_F(PrefillPlacementTest, LongestPrefixAndPredictedTtftRankByTheirOwnMeasure) {
  const std::vector<PrefillNodeView> nodes = {Node(0, 0, 0, 0), Node(1, 0, 0, 12),
                                              Node(1, 0, 1e6, 14)};
  request_.policy = RoutingPolicy::kLongestPrefix;
  const Placement longest = PlacePrefill(nodes, request_);
  EXPECT_EQ(longest.chosen, 2);  // the most local blocks, whatever its queue
  EXPECT_EQ(longest.runner_up, 1);
  EXPECT_FALSE(longest.least_loaded);
  request_.policy = RoutingPolicy::kPredictedTtft;
  const Placement priced = PlacePrefill(nodes, request_);
  EXPECT_EQ(priced.chosen, 1);  // a long hit without the other's queue
  EXPECT_LT(priced.plan.cost.total_ms(), priced.runner_up_plan.cost.total_ms());
  EXPECT_DOUBLE_EQ(priced.plan.cost.queue_ms, 0);
  // Without any view there is no placement.
  EXPECT_EQ(PlacePrefill({}, request_).chosen, -1);
}

TEST_F(PrefillPlacementTest, ACacheKeepsWhatTheHitReadAndTheWriteBackWhatWasComputed) {
  const int64_t W = config_.sliding_window, B = config_.kv_block_size;
  const HitReads reads = ReadsForHit(6, W, B);
  const std::vector<WriteBackStep> kept = CacheKeptReads(6, W, B);
  ASSERT_EQ(kept.size(),
            static_cast<size_t>(6 + reads.producer_swa_end - reads.producer_swa_begin));
  for (int64_t b = 0; b < 6; ++b) {
    EXPECT_EQ(kept[b].block, b);
    EXPECT_EQ(kept[b].region, Region::kBlockKv);
    EXPECT_EQ(kept[b].parent, b - 1);
  }
  // Only the producer SWA rows the window needs: not those of the early blocks.
  EXPECT_GT(reads.producer_swa_begin, 0);
  EXPECT_EQ(kept[6].block, reads.producer_swa_begin);
  EXPECT_EQ(kept.back().region, Region::kProducerSwa);
  EXPECT_TRUE(CacheKeptReads(0, W, B).empty());
}

TEST_F(PrefillPlacementTest, RoutersShareSlotsAndSeeEachOthersWork) {
  EXPECT_EQ(RouterSlotShare(2, 0), 2);  // not reported: this router alone
  EXPECT_EQ(RouterSlotShare(2, 1), 2);
  EXPECT_EQ(RouterSlotShare(4, 2), 2);
  EXPECT_EQ(RouterSlotShare(5, 2), 2);
  EXPECT_EQ(RouterSlotShare(2, 3), 1);                 // never none
  EXPECT_DOUBLE_EQ(QueueAhead(300, 1000, 300), 1000);  // 700 of another router's
  EXPECT_DOUBLE_EQ(QueueAhead(500, 1000, 300), 1200);  // and 200 sent since the report
  EXPECT_DOUBLE_EQ(QueueAhead(300, 100, 300), 300);    // the node has run part of ours
}

// A router's own prefills on a node count down as the node runs them, one at a time.
TEST_F(PrefillPlacementTest, OwnPrefillsDrainAsTheNodeRunsThem) {
  OwnPrefills own;
  EXPECT_DOUBLE_EQ(own.Ahead(0), 0);
  own.Took(300, 1000);
  EXPECT_DOUBLE_EQ(own.Ahead(1000), 300);
  EXPECT_DOUBLE_EQ(own.Ahead(1250), 50);  // 250 ms into the first
  own.Took(200, 1100);                    // queued behind the first's remaining 200
  EXPECT_DOUBLE_EQ(own.Ahead(1100), 400);
  EXPECT_DOUBLE_EQ(own.Ahead(1400), 100);
  EXPECT_DOUBLE_EQ(own.Ahead(1600), 0);  // predictions ran out: nothing more is assumed
  EXPECT_EQ(own.count, 2);
  // The first is answered early: the second's whole prediction is ahead from then on.
  own.Ended(300, 1150);
  EXPECT_DOUBLE_EQ(own.pending_ms, 200);
  EXPECT_DOUBLE_EQ(own.Ahead(1150), 200);
  EXPECT_DOUBLE_EQ(own.Ahead(1250), 100);
  // A node idle for a while starts the next one when it is sent, not when the last ended.
  own.Ended(200, 1500);
  EXPECT_EQ(own.count, 0);
  EXPECT_DOUBLE_EQ(own.Ahead(1500), 0);
  own.Took(100, 5000);
  EXPECT_DOUBLE_EQ(own.Ahead(5000), 100);
  // Late answers: the queue stays at 0, never below.
  own.Ended(100, 6000);
  EXPECT_DOUBLE_EQ(own.Ahead(6000), 0);
  EXPECT_DOUBLE_EQ(own.pending_ms, 0);
}

}  // namespace
}  // namespace baton::kvstore
