// kvstore/prefill_placement.h on its own: the load order and its ties, each policy's rank, the
// runner-up, what a node's cache keeps of a hit, the two rules by which routers that share
// nodes agree, and how far a node's own measured rates price it.
#include "baton/kvstore/prefill_placement.h"

#include <cmath>
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

// How far a node's own rates price it: whole after kFullEvidenceSamples prefills (0 samples with
// rates: a node that does not count them), and half as far for every half-life without work.
TEST_F(PrefillPlacementTest, RateEvidenceGrowsWithSamplesAndHalvesWhileANodeHasNoWork) {
  EXPECT_DOUBLE_EQ(RateEvidence(5, 0), 5 / kFullEvidenceSamples);
  EXPECT_DOUBLE_EQ(RateEvidence(20, 0), 1);
  EXPECT_DOUBLE_EQ(RateEvidence(400, 0), 1);
  EXPECT_DOUBLE_EQ(RateEvidence(0, 0), 1);
  EXPECT_DOUBLE_EQ(RateEvidence(20, kEvidenceHalfLifeMs), 0.5);
  EXPECT_DOUBLE_EQ(RateEvidence(10, 2 * kEvidenceHalfLifeMs), 0.125);
  EXPECT_DOUBLE_EQ(RateEvidence(20, -100), 1);  // a clock read out of order is no age
  EXPECT_DOUBLE_EQ(RateEvidence(20, std::nan("")), 1);
}

// The pool is a geometric mean weighted by evidence; a node is priced between its own rates and
// the pool's by its evidence, and at the pool's for a rate it has not measured.
TEST_F(PrefillPlacementTest, CredibleRatesLieBetweenANodesOwnAndItsPeersByItsEvidence) {
  const PrefillRates fallback = DefaultPrefillRates();
  EXPECT_DOUBLE_EQ(PooledRates().Pooled(fallback).fixed_ms, fallback.fixed_ms);
  PooledRates pool;
  pool.Add({.compute_ms_per_gflop = 10, .fixed_ms = 20}, 1);
  pool.Add({.compute_ms_per_gflop = 1000, .fixed_ms = 0}, 1);   // fixed not measured
  pool.Add({.compute_ms_per_gflop = 1e9, .fixed_ms = 1e9}, 0);  // aged away: a whisper
  const PrefillRates pooled = pool.Pooled(fallback);
  EXPECT_NEAR(pooled.compute_ms_per_gflop, 100, 0.01);  // sqrt(10 x 1000), not 505
  EXPECT_NEAR(pooled.fixed_ms, 20, 0.01);
  EXPECT_DOUBLE_EQ(pooled.local_ms_per_mib, fallback.local_ms_per_mib);  // none measured
  // A lone node whose evidence has aged away is still priced at what it measured.
  PooledRates alone;
  alone.Add({.compute_ms_per_gflop = 40}, 0);
  EXPECT_NEAR(alone.Pooled(fallback).compute_ms_per_gflop, 40, 1e-9);
  // Nodes that measured one value are priced at exactly it, whatever their evidence: a price a
  // bit apart would break their ties (least loaded first) differently.
  PooledRates same;
  for (const double evidence : {1.0, 0.3, 0.05})
    same.Add({.compute_ms_per_gflop = 0.1 * 3}, evidence);
  const PrefillRates same_pooled = same.Pooled(fallback);
  EXPECT_EQ(same_pooled.compute_ms_per_gflop, 0.1 * 3);
  EXPECT_EQ(CredibleRates({.compute_ms_per_gflop = 0.1 * 3}, 0.3, same_pooled).compute_ms_per_gflop,
            0.1 * 3);

  const PrefillRates own{.compute_ms_per_gflop = 400, .fixed_ms = 180, .replay_ms_per_gflop = 7};
  const PrefillRates whole = CredibleRates(own, 1, pooled);
  EXPECT_DOUBLE_EQ(whole.compute_ms_per_gflop, 400);
  EXPECT_DOUBLE_EQ(whole.fixed_ms, 180);
  EXPECT_NEAR(whole.store_ms_per_mib, pooled.store_ms_per_mib, 1e-9);  // not measured here
  EXPECT_DOUBLE_EQ(whole.replay_ms_per_gflop, 7);
  const PrefillRates half = CredibleRates(own, 0.5, pooled);
  EXPECT_NEAR(half.compute_ms_per_gflop, 200, 0.01);  // sqrt(400 x 100)
  EXPECT_NEAR(half.fixed_ms, 60, 0.01);               // sqrt(180 x 20)
  const PrefillRates none = CredibleRates(own, 0, pooled);
  EXPECT_NEAR(none.compute_ms_per_gflop, 100, 0.01);
  EXPECT_NEAR(none.fixed_ms, 20, 0.01);
  // Less evidence, nearer the pool, from either side.
  EXPECT_LT(CredibleRates(own, 0.2, pooled).fixed_ms, CredibleRates(own, 0.6, pooled).fixed_ms);
  const PrefillRates fast{.compute_ms_per_gflop = 25};
  EXPECT_GT(CredibleRates(fast, 0.2, pooled).compute_ms_per_gflop,
            CredibleRates(fast, 0.6, pooled).compute_ms_per_gflop);
}

}  // namespace
}  // namespace baton::kvstore
