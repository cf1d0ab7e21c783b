// The cluster half of `batonctl simulate`: routing policies over prefill nodes with local block
// caches, priced by the router's cost model. A workload of a few shared prefixes, each asked
// again and again, shows what each policy does with them.
#include "cluster_sim.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "baton/kvstore/chain.h"
#include "baton/model/model_factory.h"
#include "capacity.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::tools {
namespace {

constexpr int64_t kB = 16, kC = 22, kL = 16 * 20;

// `n` requests, one every `gap_ms`, cycling over `prefixes` prompts of kL tokens.
std::vector<ClusterRequest> Workload(int n, int prefixes, double gap_ms) {
  std::vector<ClusterRequest> requests;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> tokens(kL);
    std::iota(tokens.begin(), tokens.end(), 1000 * (i % prefixes));
    requests.push_back({.arrival_ms = i * gap_ms,
                        .prompt_len = kL,
                        .chain = kvstore::ChainKeys("f", "", "", tokens, kB)});
  }
  return requests;
}

// The small preset's shapes (the work each prefill is priced by), with this test's window
// and block size.
ModelConfig Config() {
  ModelConfig config = *model::PresetConfig("small");
  config.sliding_window = 8;
  config.kv_block_size = kB;
  return config;
}

ClusterOptions Options(RoutePolicy policy, uint64_t cache_bytes) {
  return {.policy = policy,
          .prefill_nodes = 2,
          .slots = 2,
          .block_cache_bytes = cache_bytes,
          .store_budget = std::nullopt,
          .hit = {.keep = kC,
                  .truncation_on = true,
                  .ring_capacity = kC,
                  .window = 8,
                  .block_size = kB,
                  .cap = kvstore::HitCap::kRing},
          .payload = {.block_kv = 1 << 16, .swa = 1 << 12},
          .config = Config(),
          .rates = {.compute_ms_per_gflop = 10,
                    .local_ms_per_mib = 0.5,
                    .store_ms_per_mib = 20,
                    .fixed_ms = 5}};
}

double Mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

TEST(ClusterSimTest, WithoutACacheEveryHitComesFromTheStore) {
  const ClusterResult r =
      SimulateCluster(Workload(20, 2, 1000), Options(RoutePolicy::kLeastLoaded, 0));
  EXPECT_EQ(r.local_hit_tokens, 0);
  // Every request after each prefix's first hits the ring cap: floor((L - C) / B) blocks.
  EXPECT_EQ(r.store_hit_tokens, 18 * ((kL - kC) / kB * kB));
  EXPECT_EQ(r.prompt_tokens, 20 * kL);
  ASSERT_EQ(r.ttft_ms.size(), 20u);
  // Unloaded (a request every second): a cold one costs its work, a hit far less.
  const kvstore::PrefillWork cold = kvstore::EstimatePrefillWork(Config(), kL, 0, kL - kC);
  EXPECT_NEAR(r.ttft_ms[0], (cold.computed_gflop + cold.replayed_gflop) * 10 + 5, 1e-9);
  EXPECT_LT(r.ttft_ms[2], r.ttft_ms[0] / 2);
}

TEST(ClusterSimTest, PricedRoutingKeepsEachPrefixOnTheNodeThatHoldsIt) {
  // Eight prefixes, each node's cache holding about four: a node cannot keep them all, so
  // where a prefix is sent decides whether its blocks are still near the compute. Requests
  // arrive about as fast as the two nodes serve hits from the store.
  const auto workload = Workload(120, 8, 60);
  const uint64_t cache = uint64_t{6} << 20;
  const ClusterResult least = SimulateCluster(workload, Options(RoutePolicy::kLeastLoaded, cache));
  const ClusterResult longest =
      SimulateCluster(workload, Options(RoutePolicy::kLongestPrefix, cache));
  const ClusterResult priced =
      SimulateCluster(workload, Options(RoutePolicy::kPredictedTtft, cache));
  for (const ClusterResult* r : {&least, &longest, &priced}) EXPECT_EQ(r->ttft_ms.size(), 120u);
  // Pricing the load sends hits where their blocks lie: more come from a local cache, and the
  // mean TTFT is lower than routing by load alone.
  EXPECT_GT(priced.local_hit_tokens, 2 * least.local_hit_tokens);
  EXPECT_GT(longest.local_hit_tokens, 2 * least.local_hit_tokens);
  EXPECT_LT(Mean(priced.ttft_ms), Mean(least.ttft_ms));
  // Both nodes take work under every policy here.
  for (const ClusterResult* r : {&least, &longest, &priced}) {
    EXPECT_THAT(r->requests_per_node, ::testing::Each(::testing::Gt(0)));
  }
}

// The simulator prices only the nodes that can win a placement (the holders of a request's
// first block, the least loaded and the shortest queues); it chooses exactly as pricing every
// open node does, here with many idle nodes tied at queue 0, bursts that fill nodes, caches
// that hold some prefixes, and every policy.
TEST(ClusterSimTest, PricingOnlyTheNodesThatCanWinChoosesAsPricingAll) {
  std::mt19937_64 rng(7);
  std::vector<ClusterRequest> workload;
  double now = 0;
  for (int i = 0; i < 400; ++i) {
    // Bursts of arrivals at one time, then gaps; prompts of 1 to 20 blocks over 12 prefixes.
    now += rng() % 4 == 0 ? static_cast<double>(rng() % 400) : 0;
    const int64_t len = kB * static_cast<int64_t>(1 + rng() % 20);
    std::vector<int32_t> tokens(static_cast<size_t>(len));
    std::iota(tokens.begin(), tokens.end(), 1000 * static_cast<int32_t>(rng() % 12));
    workload.push_back({.arrival_ms = now,
                        .prompt_len = len,
                        .chain = kvstore::ChainKeys("f", "", "", tokens, kB)});
  }
  for (const RoutePolicy policy :
       {RoutePolicy::kLeastLoaded, RoutePolicy::kLongestPrefix, RoutePolicy::kPredictedTtft}) {
    for (const int64_t nodes : {3, 40}) {
      SCOPED_TRACE(absl::StrCat(kvstore::RoutingPolicyName(policy), ", ", nodes, " nodes"));
      ClusterOptions o = Options(policy, uint64_t{3} << 20);
      o.prefill_nodes = nodes;
      o.record_steps = true;
      ClusterOptions all = o;
      all.exhaustive_placement = true;
      const ClusterResult few = SimulateCluster(workload, o);
      const ClusterResult every = SimulateCluster(workload, all);
      ASSERT_EQ(few.steps.size(), every.steps.size());
      for (size_t i = 0; i < few.steps.size(); ++i) {
        ASSERT_EQ(few.steps[i].kind, every.steps[i].kind) << i;
        ASSERT_EQ(few.steps[i].request, every.steps[i].request) << i;
        ASSERT_EQ(few.steps[i].node, every.steps[i].node) << "step " << i;
        ASSERT_EQ(few.steps[i].hit_blocks, every.steps[i].hit_blocks) << i;
        ASSERT_EQ(few.steps[i].runner_up, every.steps[i].runner_up) << "step " << i;
      }
      EXPECT_EQ(few.ttft_ms, every.ttft_ms);
      EXPECT_EQ(few.local_hit_tokens, every.local_hit_tokens);
      // The workload exercises what the reduction relies on: local hits and more than one
      // node taking requests.
      EXPECT_GT(every.local_hit_tokens, 0);
      EXPECT_GT(std::count_if(every.requests_per_node.begin(), every.requests_per_node.end(),
                              [](int64_t n) { return n > 0; }),
                1);
    }
  }
}

// Keys made from a trace line's hash ids name the same blocks, one prompt against another, as
// SHA-256 chain keys over the tokens TraceTokens makes: equal exactly where those are equal,
// for trace blocks larger and smaller than a chain block and prompts ending mid-block.
TEST(ClusterSimTest, TraceChainKeysAgreeWithChainKeysOverTheTraceTokens) {
  std::vector<TraceRequest> lines;
  auto line = [&](std::vector<int64_t> ids, int64_t input_length) {
    lines.push_back({.input_length = input_length, .output_length = 1, .hash_ids = ids});
  };
  line({1, 2, 3, 4, 5, 6, 7, 8}, 8 * 512);
  line({1, 2, 3, 4, 5, 6, 7, 9}, 8 * 512);          // shares seven trace blocks with the first
  line({1, 2, 3, 10, 5, 6, 7, 8}, 8 * 512);         // shares three, then the first's later ids
  line({1, 2, 3, 4, 5}, 5 * 512 - 100);             // a prefix of the first, ending mid-block
  line({11, 2, 3, 4, 5, 6, 7, 8}, 8 * 512);         // shares nothing: its first block differs
  line({2, 3, 4, 5, 6, 7, 8, 1}, 8 * 512);          // the first's ids in another order
  for (double scale : {1.0, 0.25, 0.0625, 0.03}) {  // 512, 128, 32 and 15 tokens a trace block
    const TokenOptions tokens{.length_scale = scale};
    for (int64_t block : {int64_t{16}, int64_t{64}}) {
      std::vector<std::vector<Sha256Digest>> made, over_tokens;
      for (const TraceRequest& r : lines) {
        made.push_back(TraceChainKeys(r, tokens, block));
        over_tokens.push_back(kvstore::ChainKeys("f", "", "", TraceTokens(r, tokens), block));
        ASSERT_EQ(made.back().size(), over_tokens.back().size()) << scale << " " << block;
      }
      int agreeing = 0;
      for (size_t a = 0; a < lines.size(); ++a) {
        for (size_t c = 0; c < lines.size(); ++c) {
          const size_t n = std::min(made[a].size(), made[c].size());
          for (size_t b = 0; b < n; ++b) {
            EXPECT_EQ(made[a][b] == made[c][b], over_tokens[a][b] == over_tokens[c][b])
                << "lines " << a << " and " << c << ", block " << b << ", scale " << scale
                << ", block size " << block;
            agreeing += a != c && made[a][b] == made[c][b];
          }
        }
      }
      EXPECT_GT(agreeing, 0) << "no two lines share a block at scale " << scale;
    }
  }
}

// A trace's requests, made from its lines as the simulation needs them, simulate exactly as
// the same requests with their chains made up front.
TEST(ClusterSimTest, ChainsMadeFromTheTraceAsNeededSimulateAsChainsGivenUpFront) {
  std::vector<TraceRequest> trace;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 120; ++i) {
    std::vector<int64_t> ids;
    const int64_t shared = static_cast<int64_t>(rng() % 4);  // one of four system prompts
    for (int64_t k = 0; k < 3; ++k) ids.push_back(shared * 100 + k);
    for (int64_t k = 0; k < 2; ++k) ids.push_back(1000 + i * 10 + k);  // its own blocks
    trace.push_back({.timestamp_ms = 40.0 * i,
                     .input_length = static_cast<int64_t>(ids.size()) * 512 - 37,
                     .output_length = 4,
                     .hash_ids = ids});
  }
  const TokenOptions tokens{.length_scale = 0.125};
  // A small trace's chains are made up front; the same requests made from their lines.
  const std::vector<ClusterRequest> eager = ClusterRequestsFromTrace(trace, tokens, kB, 1.0, 0);
  std::vector<ClusterRequest> lazy = eager;
  for (size_t i = 0; i < lazy.size(); ++i) {
    ASSERT_EQ(eager[i].from, nullptr);
    EXPECT_EQ(eager[i].chain, TraceChainKeys(trace[i], tokens, kB));
    lazy[i].chain.clear();
    lazy[i].from = &trace[i];
  }
  ClusterOptions options = Options(RoutePolicy::kPredictedTtft, uint64_t{4} << 20);
  options.record_steps = true;
  const ClusterResult a = SimulateCluster(lazy, options);
  const ClusterResult b = SimulateCluster(eager, options);
  EXPECT_EQ(a.ttft_ms, b.ttft_ms);
  EXPECT_EQ(a.local_hit_tokens, b.local_hit_tokens);
  EXPECT_EQ(a.store_hit_tokens, b.store_hit_tokens);
  EXPECT_GT(a.store_hit_tokens + a.local_hit_tokens, 0);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].node, b.steps[i].node) << "step " << i;
    EXPECT_EQ(a.steps[i].hit_blocks, b.steps[i].hit_blocks) << "step " << i;
  }
}

// Each request as it was placed and priced (`batonctl simulate --per-request`): the node and
// hit of its placement step, and a TTFT that is its wait for a slot, the work ahead of it on
// its node and its own service (one prefill at a time, no decode).
TEST(ClusterSimTest, EachRequestsPlacementIsRecordedAsItsTtftIsMade) {
  // Arrivals closer than a prefill takes, so that requests wait for a slot and queue.
  const auto workload = Workload(30, 3, 5);
  ClusterOptions options = Options(RoutePolicy::kPredictedTtft, uint64_t{3} << 20);
  options.record_steps = true;
  options.record_requests = true;
  const ClusterResult r = SimulateCluster(workload, options);
  ASSERT_EQ(r.placed.size(), workload.size());
  bool waited = false, queued = false;
  for (const ClusterStep& step : r.steps) {
    if (step.kind != ClusterStep::kPlaced) continue;
    const PlacedRequest& p = r.placed[step.request];
    SCOPED_TRACE(step.request);
    EXPECT_EQ(p.node, step.node);
    EXPECT_EQ(p.cached_tokens, step.hit_blocks * kB);
    EXPECT_LE(p.local_cached_tokens, p.cached_tokens);
    EXPECT_NEAR(p.admitted_ms, step.time_ms - workload[step.request].arrival_ms, 1e-9);
    EXPECT_GT(p.service_ms, 0);
    EXPECT_NEAR(r.ttft_ms[step.request], p.admitted_ms + p.queue_ms + p.service_ms, 1e-6);
    waited |= p.admitted_ms > 0;
    queued |= p.queue_ms > 0;
  }
  EXPECT_TRUE(waited);
  EXPECT_TRUE(queued);
  EXPECT_GT(r.local_hit_tokens, 0);
  // Off by default: a simulation of a million requests keeps no such row.
  options.record_requests = false;
  EXPECT_TRUE(SimulateCluster(workload, options).placed.empty());
}

TEST(ClusterSimTest, ACacheTooSmallForABlockHoldsNothing) {
  const ClusterResult r =
      SimulateCluster(Workload(10, 1, 1000), Options(RoutePolicy::kPredictedTtft, 1024));
  EXPECT_EQ(r.local_hit_tokens, 0);
  EXPECT_GT(r.store_hit_tokens, 0);
}

// The store fleet's load: every value written back goes to each of its R owners, every value
// a hit reads from the store comes from exactly one, and each request's lookup probes each
// owner of its keys once; rendezvous placement spreads all three over the nodes.
TEST(ClusterSimTest, StoreOperationsFollowTheFleetsPlacement) {
  const auto workload = Workload(40, 4, 200);
  ClusterOptions one = Options(RoutePolicy::kLeastLoaded, 0);
  ClusterOptions fleet = one;
  fleet.store_nodes = 4;
  fleet.store_replication = 2;
  const ClusterResult single = SimulateCluster(workload, one);
  const ClusterResult spread = SimulateCluster(workload, fleet);
  ASSERT_EQ(single.store_ops.size(), 1u);
  EXPECT_EQ(single.store_ids[0], "kvstore");
  ASSERT_EQ(spread.store_ops.size(), 4u);
  EXPECT_EQ(spread.store_ids[3], "kvstore-3");
  // The placement does not change the hits.
  EXPECT_EQ(spread.store_hit_tokens, single.store_hit_tokens);
  const StoreNodeOps& alone = single.store_ops[0];
  // One lookup per request; with 20 blocks a prompt, every one of the 4 nodes owns some keys.
  EXPECT_EQ(alone.lookups, 40);
  EXPECT_EQ(alone.probe_keys, 40 * (kL / kB));
  StoreNodeOps total;
  for (const StoreNodeOps& ops : spread.store_ops) {
    total.lookups += ops.lookups;
    total.probe_keys += ops.probe_keys;
    total.reads += ops.reads;
    total.writes += ops.writes;
    total.write_bytes += ops.write_bytes;
    // Each node takes part of every kind of work, and less than all of it.
    EXPECT_GT(ops.reads, 0);
    EXPECT_LT(ops.reads, alone.reads);
    EXPECT_GT(ops.writes, 0);
    EXPECT_LT(ops.writes, 2 * alone.writes);
  }
  EXPECT_EQ(total.lookups, 4 * 40);
  EXPECT_EQ(total.probe_keys, 2 * alone.probe_keys);  // every key asked of both its owners
  EXPECT_EQ(total.reads, alone.reads);                // one owner serves each read
  EXPECT_EQ(total.writes, 2 * alone.writes);          // every owner takes each write
  EXPECT_EQ(total.write_bytes, 2 * alone.write_bytes);
  // Four prefixes of 20 blocks written whole once each (both regions); each of the 36 repeats
  // hits at the ring cap and writes back the blocks after it.
  const int64_t capped = (kL - kC) / kB;
  EXPECT_EQ(alone.writes, 4 * 2 * (kL / kB) + 36 * 2 * (kL / kB - capped));
  EXPECT_GT(alone.reads, 0);
}

// Decode: each token after the first comes from a decode step whose time is the fitted cost of
// its rows; a request holds a decode slot from admission to its last token, so a full decode
// pool holds the next prefill back.
TEST(ClusterSimTest, DecodeStepsGiveEachTokenItsGap) {
  ClusterOptions o = Options(RoutePolicy::kLeastLoaded, 0);
  o.decode_nodes = 1;
  o.decode_slots = 1;
  o.decode = {.step_fixed_ms = 10, .step_per_row_ms = 2, .tokens_per_step = 1};
  std::vector<ClusterRequest> two = Workload(2, 2, 0);  // both at once
  for (ClusterRequest& r : two) r.output_len = 5;
  const ClusterResult r = SimulateCluster(two, o);
  // Alone in its step: 10 + 2 x 1 ms a token, four tokens after the prefill's.
  ASSERT_EQ(r.itl_ms.size(), 8u);
  EXPECT_THAT(r.itl_ms, ::testing::Each(::testing::DoubleEq(12)));
  EXPECT_DOUBLE_EQ(r.tpot_ms[0], 12);
  EXPECT_DOUBLE_EQ(r.e2e_ms[0], r.ttft_ms[0] + 48);
  // One slot: the second prefill starts only once the first request's last token is out.
  EXPECT_GE(r.ttft_ms[1], r.e2e_ms[0]);
  EXPECT_THAT(r.requests_per_decode_node, ::testing::ElementsAre(2));
  EXPECT_DOUBLE_EQ(r.decode_busy_ms[0], 2 * 48);

  // A step takes at most --decode-max-batch requests; the others wait for a later step: with
  // one a step, every step is one row (12 ms), and the second request's first gap waits out
  // the first's four steps.
  o.decode_slots = 2;
  o.decode_step.max_batch = 1;
  const ClusterResult capped = SimulateCluster(two, o);
  ASSERT_EQ(capped.itl_ms.size(), 8u);
  EXPECT_DOUBLE_EQ(capped.decode_busy_ms[0], 8 * 12);
  EXPECT_DOUBLE_EQ(*std::max_element(capped.itl_ms.begin(), capped.itl_ms.end()), 4 * 12 + 12);
  o.decode_step.max_batch = 64;

  // Two slots: both decode in one batch (steps of two rows); with two tokens a step, each
  // step's gap is shared by its two tokens.
  o.decode_slots = 2;
  o.decode.tokens_per_step = 2;
  std::vector<ClusterRequest> together = Workload(2, 1, 0);
  for (ClusterRequest& q : together) q.output_len = 5;
  const ClusterResult batched = SimulateCluster(together, o);
  EXPECT_EQ(batched.itl_ms.size(), 8u);
  EXPECT_LT(batched.ttft_ms[1], batched.e2e_ms[0]);  // no wait for the slot
  // A step of both rows takes 14 ms for two tokens each; the request that joined while the
  // first step ran waited that step out too.
  EXPECT_THAT(batched.itl_ms, ::testing::Contains(::testing::DoubleEq(7)));
  for (double gap : batched.itl_ms) EXPECT_LE(gap, (12 + 14) / 2.0 + 1e-9);
  // Steps that took twice their fitted time on the node (step_stretch): every gap doubles.
  o.decode.step_stretch = 2;
  const ClusterResult stretched = SimulateCluster(together, o);
  ASSERT_EQ(stretched.itl_ms.size(), batched.itl_ms.size());
  for (size_t i = 0; i < stretched.itl_ms.size(); ++i) {
    EXPECT_NEAR(stretched.itl_ms[i], 2 * batched.itl_ms[i], 1e-9);
  }
  // A spread given as quantiles: each step draws its factor, so the gaps spread between the
  // 0.1 and 0.99 quantiles' factors (the same draws in the same order every run).
  o.decode.step_stretch_quantiles = {0.5, 1, 2, 4};
  std::vector<ClusterRequest> longer = Workload(1, 1, 0);
  longer[0].output_len = 400;
  o.decode.step_stretch = 0;
  o.decode.tokens_per_step = 1;
  const ClusterResult even = [&] {
    ClusterOptions plain = o;
    plain.decode.step_stretch_quantiles = {};
    return SimulateCluster(longer, plain);
  }();
  const ClusterResult spread = SimulateCluster(longer, o);
  ASSERT_EQ(spread.itl_ms.size(), even.itl_ms.size());
  std::vector<double> factors;
  for (size_t i = 0; i < spread.itl_ms.size(); ++i) {
    factors.push_back(spread.itl_ms[i] / even.itl_ms[i]);
  }
  EXPECT_GE(*std::min_element(factors.begin(), factors.end()), 0.5 - 1e-9);
  EXPECT_LE(*std::max_element(factors.begin(), factors.end()), 4 + 1e-9);
  EXPECT_NEAR(NearestRank(factors, 50), 1, 0.15);
  EXPECT_NEAR(NearestRank(factors, 90), 2, 0.3);
  EXPECT_EQ(SimulateCluster(longer, o).itl_ms, spread.itl_ms);
  // With the node's mean stretch too, the drawn factors keep the spread's shape and average
  // to it.
  o.decode.step_stretch = 1.2;
  const ClusterResult scaled = SimulateCluster(longer, o);
  ASSERT_EQ(scaled.itl_ms.size(), even.itl_ms.size());
  double sum = 0;
  for (size_t i = 0; i < scaled.itl_ms.size(); ++i) {
    const double factor = scaled.itl_ms[i] / even.itl_ms[i];
    EXPECT_NEAR(factor / factors[i], 1.2 / StretchMean(o.decode.step_stretch_quantiles), 1e-9);
    sum += factor;
  }
  EXPECT_NEAR(sum / static_cast<double>(scaled.itl_ms.size()), 1.2, 0.12);
  o.decode.step_stretch = 0;
  o.decode.step_stretch_quantiles = {};
  // A request of one token is done at its prefill.
  std::vector<ClusterRequest> one = Workload(1, 1, 0);
  const ClusterResult single = SimulateCluster(one, o);
  EXPECT_TRUE(single.itl_ms.empty());
  EXPECT_DOUBLE_EQ(single.e2e_ms[0], single.ttft_ms[0]);
  EXPECT_DOUBLE_EQ(single.tpot_ms[0], -1);
}

// A decode node plans the steps its plan holds for at once (a cruise: one event for them all,
// cut short at the step in flight when a request joins). Its steps, each token's gap and each
// request's times are those of its steps one at a time: with fractional tokens a step, a spread
// of step times, replay in the steps, a batch bound that leaves requests waiting, and arrivals
// that join mid-cruise.
TEST(ClusterSimTest, DecodeCruisesGiveTheStepsOfOneStepAtATime) {
  std::mt19937_64 rng(11);
  std::vector<ClusterRequest> workload = Workload(300, 7, 0);
  double now = 0;
  for (ClusterRequest& r : workload) {
    now += static_cast<double>(rng() % 90);
    r.arrival_ms = now;
    r.output_len = 1 + static_cast<int64_t>(rng() % 300);
  }
  struct Case {
    const char* name;
    DecodeRates rates;
    int64_t max_batch;
  };
  const Case cases[] = {
      {"plain", {.step_fixed_ms = 10, .step_per_row_ms = 2, .tokens_per_step = 1}, 64},
      {"fractional tokens, batch bound",
       {.step_fixed_ms = 10, .step_per_row_ms = 2, .tokens_per_step = 1.7},
       3},
      {"spread",
       {.step_fixed_ms = 10,
        .step_per_row_ms = 2,
        .tokens_per_step = 1.3,
        .step_stretch = 1.1,
        .step_stretch_quantiles = {0.8, 1, 1.5, 3}},
       64},
      {"replay in steps",
       {.step_fixed_ms = 10,
        .step_per_row_ms = 2,
        .tokens_per_step = 1,
        .replay_ms_per_gflop = 200,
        .replay_piece_fixed_ms = 3.2,
        .replay_piece_row_ms = 0.64},
       64}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ClusterOptions o = Options(RoutePolicy::kPredictedTtft, 0);
    o.prefill_nodes = 3;
    o.decode_nodes = 3;
    o.decode_slots = 8;
    o.decode = c.rates;
    o.decode_step.max_batch = c.max_batch;
    ClusterOptions alone = o;
    alone.decode_cruises = false;
    const ClusterResult cruising = SimulateCluster(workload, o);
    const ClusterResult stepping = SimulateCluster(workload, alone);
    EXPECT_EQ(cruising.ttft_ms, stepping.ttft_ms);
    EXPECT_EQ(cruising.e2e_ms, stepping.e2e_ms);
    EXPECT_EQ(cruising.tpot_ms, stepping.tpot_ms);
    EXPECT_EQ(cruising.decode_busy_ms, stepping.decode_busy_ms);
    EXPECT_EQ(cruising.makespan_ms, stepping.makespan_ms);
    // The gaps come in another order (a cruise's at its end), the same ones.
    std::vector<double> a = cruising.itl_ms, b = stepping.itl_ms;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    EXPECT_EQ(a, b);
    EXPECT_GT(a.size(), 10000u);
    // The histogram holds every gap: its percentiles are NearestRank's within a bin's 0.1%.
    EXPECT_EQ(cruising.itl.count(), static_cast<int64_t>(a.size()));
    for (const double q : {1.0, 50.0, 90.0, 99.0, 100.0}) {
      EXPECT_NEAR(cruising.itl.Percentile(q), NearestRank(a, q), 1e-3 * NearestRank(a, q)) << q;
    }
  }
}

// The token gaps' histogram: exact where a bin's samples are equal (0 included), within a
// bin's width otherwise, and as NearestRank ranks them.
TEST(ClusterSimTest, LatencyHistogramGivesNearestRankPercentiles) {
  LatencyHistogram empty;
  EXPECT_EQ(empty.Percentile(99), 0);
  EXPECT_EQ(empty.count(), 0);
  LatencyHistogram h;
  std::vector<double> samples;
  h.Add(12, 97);
  samples.insert(samples.end(), 97, 12);
  h.Add(0, 2);
  samples.insert(samples.end(), 2, 0);
  h.Add(-1);  // counted as 0
  samples.push_back(0);
  EXPECT_EQ(h.count(), 100);
  EXPECT_EQ(h.Percentile(1), 0);
  EXPECT_EQ(h.Percentile(3), 0);
  EXPECT_EQ(h.Percentile(4), 12);
  EXPECT_EQ(h.Percentile(100), 12);
  EXPECT_DOUBLE_EQ(h.Mean(), 12 * 0.97);
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> gaps(3, 1);
  for (int i = 0; i < 20000; ++i) {
    const double gap = gaps(rng);
    h.Add(gap);
    samples.push_back(std::max(0.0, gap));
  }
  for (const double q : {0.5, 10.0, 50.0, 90.0, 99.0, 99.9, 100.0}) {
    const double exact = NearestRank(samples, q);
    EXPECT_NEAR(h.Percentile(q), exact, 1e-3 * exact) << q;
  }
  EXPECT_NEAR(h.Mean(), Mean(samples), 1e-9 * Mean(samples));
}

// One prefill node of one slot and one decode node of four, stepping at 10 + 2 ms a row.
ClusterOptions OneSlotOneDecodeNode() {
  ClusterOptions o = Options(RoutePolicy::kLeastLoaded, 0);
  o.prefill_nodes = 1;
  o.slots = 1;
  o.decode_nodes = 1;
  o.decode_slots = 4;
  o.decode = {.step_fixed_ms = 10, .step_per_row_ms = 2, .tokens_per_step = 1};
  return o;
}

// Replay-on-decode: a request's replay is priced at the decode node's rate and runs after its
// prefill, on the decode node; the prefill node's slot is free from the prefill's end.
TEST(ClusterSimTest, ReplayOnDecodeRunsAfterThePrefillAtTheDecodeNodesRate) {
  ClusterOptions o = OneSlotOneDecodeNode();
  std::vector<ClusterRequest> two = Workload(2, 2, 0);  // both at once, no shared prefix
  for (ClusterRequest& r : two) r.output_len = 3;
  const ClusterResult here = SimulateCluster(two, o);
  o.decode.replay_ms_per_gflop = 200;  // far slower than the prefill node's 10
  const ClusterResult on_decode = SimulateCluster(two, o);
  const kvstore::PrefillWork work = kvstore::EstimatePrefillWork(o.config, kL, 0, kL - o.hit.keep);
  const double replay_here = work.replayed_gflop * 10, replay_there = work.replayed_gflop * 200;
  // The first request: the same prefill, its replay at the decode node's rate.
  EXPECT_NEAR(on_decode.ttft_ms[0], here.ttft_ms[0] - replay_here + replay_there, 1e-6);
  // The second waited for the one slot: for the first's prefill only, not for its replay.
  EXPECT_NEAR(on_decode.ttft_ms[1] - on_decode.ttft_ms[0],
              here.ttft_ms[1] - here.ttft_ms[0] - replay_here, 1e-6);
  // Its tokens follow from its first token on, as without a replay.
  EXPECT_NEAR(on_decode.e2e_ms[0] - on_decode.ttft_ms[0], 2 * 12, 1e-6);
}

// Replay in the decode node's steps: the node's own plan takes the replay's rows a piece at a
// time beside its streams, each piece adding its cost to the step (so the streams' gaps
// stretch while it is in flight), within the row bound and the time budget; the first token
// comes at the end of the step that ends the replay.
TEST(ClusterSimTest, ReplayInTheDecodeStepsStretchesTheStreamsGapsAsTheNodePlansIt) {
  ClusterOptions o = OneSlotOneDecodeNode();
  // A piece over kL = 320 positions costs (3.2 + 0.64 r) x 320 / 1024 = 1 + 0.2 r ms.
  o.decode.replay_ms_per_gflop = 200;
  o.decode.replay_piece_fixed_ms = 3.2;
  o.decode.replay_piece_row_ms = 0.64;
  o.decode_step.replay_rows = 8;
  o.decode_step.replay_step_budget = 0;  // the row bound alone
  // A stream decoding long, and a prompt whose replay (its last kC = 22 rows) arrives while
  // the stream's steps run.
  std::vector<ClusterRequest> requests = Workload(2, 2, 0);
  requests[0].output_len = 2000;
  requests[1].arrival_ms = 5000;
  requests[1].output_len = 3;
  ClusterOptions as_delay = o;
  as_delay.decode.replay_piece_fixed_ms = as_delay.decode.replay_piece_row_ms = 0;
  const ClusterResult delayed = SimulateCluster(requests, as_delay);
  const double replay_delay =
      kvstore::EstimatePrefillWork(o.config, kL, 0, kL - o.hit.keep).replayed_gflop * 200;
  const double prefill_end = requests[1].arrival_ms + delayed.ttft_ms[1] - replay_delay;

  // The gaps of steps with a replay piece: not the stream's step alone (12 ms) nor the steps
  // of both requests decoding (14 ms).
  auto gaps_other_than = [](const ClusterResult& r) {
    std::vector<double> other;
    for (double gap : r.itl_ms) {
      if (std::abs(gap - 12) > 1e-6 && std::abs(gap - 14) > 1e-6) other.push_back(gap);
    }
    return other;
  };
  // As a delay, the stream's steps are untouched: what is neither is the second request's
  // first gap, which waited out the step in flight at its first token.
  const std::vector<double> delayed_other = gaps_other_than(delayed);
  ASSERT_EQ(delayed_other.size(), 1u);
  EXPECT_LE(delayed_other[0], 12 + 14 + 1e-6);
  // Pieces of 8, 8 and 6 rows beside the stream's one-row steps (the second request's first
  // token comes at a step's end: its first gap is a step of both, 14 ms).
  const ClusterResult in_steps = SimulateCluster(requests, o);
  EXPECT_THAT(gaps_other_than(in_steps),
              ::testing::UnorderedElementsAre(::testing::DoubleNear(14.6, 1e-6),
                                              ::testing::DoubleNear(14.6, 1e-6),
                                              ::testing::DoubleNear(14.2, 1e-6)));
  // The first token at the third piece's step's end: after the stream's step in flight at the
  // prefill's end (at most 12 ms) and the three pieces' steps.
  const double waited = requests[1].arrival_ms + in_steps.ttft_ms[1] - prefill_end;
  EXPECT_GE(waited, 14.6 + 14.6 + 14.2 - 1e-6);
  EXPECT_LE(waited, 12 + 14.6 + 14.6 + 14.2 + 1e-6);
  // Then its two tokens in steps of both requests' rows.
  EXPECT_NEAR(in_steps.e2e_ms[1] - in_steps.ttft_ms[1], 2 * 14, 1e-6);

  // A time budget of a tenth of the stream's 12 ms step: 1.2 ms, one row a step.
  o.decode_step.replay_step_budget = 0.1;
  const ClusterResult budgeted = SimulateCluster(requests, o);
  const std::vector<double> stretched = gaps_other_than(budgeted);
  EXPECT_EQ(stretched.size(), 22u);
  EXPECT_THAT(stretched, ::testing::Each(::testing::DoubleNear(13.2, 1e-6)));

  // Two replays in flight beside the stream (two prefill nodes: their prefills end together):
  // the first takes pieces of 8, 8 and 6 rows, the second the 2 rows left in the third step,
  // then 8 and 8 beside the stream and the first request decoding (10 + 2 x 2 + 2.6 ms each)
  // and its last 4 beside the stream alone, the first request having finished (12 + 1.8).
  o.decode_step.replay_step_budget = 0;
  o.prefill_nodes = 2;
  std::vector<ClusterRequest> three = Workload(3, 3, 0);
  three[0].output_len = 2000;
  for (size_t i : {1, 2}) {
    three[i].arrival_ms = 5000;
    three[i].output_len = 3;
  }
  const ClusterResult two_replays = SimulateCluster(three, o);
  EXPECT_NEAR(std::abs(two_replays.ttft_ms[2] - two_replays.ttft_ms[1]), 16.6 + 16.6 + 13.8, 1e-6);
  o.prefill_nodes = 1;
  o.decode_step.replay_step_budget = 0.1;

  // With no stream decoding, one step takes the whole replay (up to 512 rows): 1 + 0.2 x 22.
  std::vector<ClusterRequest> alone(requests.begin() + 1, requests.end());
  alone[0].arrival_ms = 0;
  const ClusterResult idle = SimulateCluster(alone, o);
  const ClusterResult idle_delayed = SimulateCluster(alone, as_delay);
  EXPECT_NEAR(idle.ttft_ms[0], idle_delayed.ttft_ms[0] - replay_delay + 1 + 0.2 * 22, 1e-6);
}

// A cluster's measured rates as the simulator's flags: each the mean over the nodes that
// measured it (a prefill node's weighing the prefills it measured), of the model asked for;
// what none measured is left out.
TEST(ClusterSimTest, MeasuredRatesAreTheMeansOfWhatTheNodesReport) {
  v1::ListRatesResponse reply;
  auto prefill = [&](const std::string& model, double compute, double fixed, bool producers,
                     uint32_t samples = 0) {
    v1::NodeRates& node = *reply.add_nodes();
    node.set_role("prefill");
    node.set_model(model);
    node.set_producers_only(producers);
    node.mutable_prefill()->set_compute_ms_per_gflop(compute);
    node.mutable_prefill()->set_fixed_ms(fixed);
    node.mutable_prefill()->set_samples(samples);
  };
  auto decode = [&](const std::string& model, double fixed, double replay) {
    v1::NodeRates& node = *reply.add_nodes();
    node.set_role("decode");
    node.set_model(model);
    node.mutable_decode()->set_step_fixed_ms(fixed);
    node.mutable_decode()->set_step_per_row_ms(1.5);
    node.mutable_decode()->set_tokens_per_step(1);
    node.mutable_decode()->set_replay_ms_per_gflop(replay);
    if (replay > 0) {
      node.mutable_decode()->set_replay_piece_fixed_ms(3);
      node.mutable_decode()->set_replay_piece_row_ms(0.5);
      node.mutable_decode()->set_step_stretch(1.5);
      node.mutable_decode()->set_step_stretch_p10(0.8);
      node.mutable_decode()->set_step_stretch_p50(1);
      node.mutable_decode()->set_step_stretch_p90(1.5);
      node.mutable_decode()->set_step_stretch_p99(3);
    }
  };
  prefill("a", 2, 10, true);
  prefill("a", 4, 0, true);  // no fixed cost measured yet
  prefill("b", 100, 100, false);
  decode("a", 20, 0);
  decode("a", 30, 8);
  const MeasuredRates a = MeanRates(reply, "a");
  EXPECT_EQ(a.prefill_nodes, 2);
  EXPECT_EQ(a.decode_nodes, 2);
  EXPECT_TRUE(a.replay_on_decode);
  EXPECT_EQ(a.rates, "compute_ms_per_gflop=3,fixed_ms=10");
  EXPECT_EQ(a.decode_rates,
            "step_fixed_ms=25,step_per_row_ms=1.5,tokens_per_step=1,replay_ms_per_gflop=8,"
            "replay_piece_fixed_ms=3,replay_piece_row_ms=0.5,step_stretch=1.5,"
            "step_stretch_p10=0.8,step_stretch_p50=1,step_stretch_p90=1.5,step_stretch_p99=3");
  // What the flags take back.
  const absl::StatusOr<kvstore::PrefillRates> rates = ParseRates(a.rates);
  ASSERT_TRUE(rates.ok());
  EXPECT_DOUBLE_EQ(rates->compute_ms_per_gflop, 3);
  const absl::StatusOr<DecodeRates> decode_rates = ParseDecodeRates(a.decode_rates);
  ASSERT_TRUE(decode_rates.ok());
  EXPECT_DOUBLE_EQ(decode_rates->replay_ms_per_gflop, 8);
  EXPECT_DOUBLE_EQ(decode_rates->replay_piece_row_ms, 0.5);
  EXPECT_TRUE(decode_rates->replays_in_steps());
  EXPECT_TRUE(decode_rates->stretch_spread());
  const MeasuredRates all = MeanRates(reply, "");
  EXPECT_EQ(all.prefill_nodes, 3);
  EXPECT_EQ(all.rates, "compute_ms_per_gflop=35.3333,fixed_ms=55");
  EXPECT_TRUE(MeanRates(v1::ListRatesResponse(), "").rates.empty());
  // A node that measured 90 prefills against one that measured 10 (kept from traffic after a
  // slow start): the mean weighs them 9 to 1.
  prefill("c", 4, 10, false, 90);
  prefill("c", 13, 100, false, 10);
  EXPECT_EQ(MeanRates(reply, "c").rates, "compute_ms_per_gflop=4.9,fixed_ms=19");
}

// A simulation told to stop once N requests miss a TTFT stops at the N-th such placement, with
// the TTFT of the requests placed so far, in order; a threshold nothing reaches changes nothing.
TEST(ClusterSimTest, StopsOnceEnoughRequestsMissTheTtftTarget) {
  ClusterOptions options = Options(RoutePolicy::kPredictedTtft, 0);
  options.prefill_nodes = 1;
  const std::vector<ClusterRequest> requests = Workload(40, 4, 1);  // far beyond one node
  const ClusterResult full = SimulateCluster(requests, options);
  ASSERT_FALSE(full.stopped);
  const double target = NearestRank(full.ttft_ms, 50);
  options.stop_over_ttft_ms = target;
  options.stop_over_count = 3;
  const ClusterResult stopped = SimulateCluster(requests, options);
  ASSERT_TRUE(stopped.stopped);
  ASSERT_LT(stopped.ttft_ms.size(), requests.size());
  // Admission is first come first served: the placed ones are the first, with the same TTFT.
  int64_t over = 0;
  for (size_t i = 0; i < stopped.ttft_ms.size(); ++i) {
    EXPECT_DOUBLE_EQ(stopped.ttft_ms[i], full.ttft_ms[i]) << i;
    over += stopped.ttft_ms[i] > target;
  }
  EXPECT_EQ(over, 3);
  EXPECT_GT(stopped.ttft_ms.back(), target);  // it stopped at the third miss, not later
  options.stop_over_count = static_cast<int64_t>(requests.size()) + 1;
  const ClusterResult unreached = SimulateCluster(requests, options);
  EXPECT_FALSE(unreached.stopped);
  EXPECT_EQ(unreached.ttft_ms, full.ttft_ms);
}

// Whether `prefill` + `decode` nodes meet both of `goal`'s targets on `requests`, simulated
// whole.
bool MeetsGoal(const std::vector<ClusterRequest>& requests, const ClusterOptions& base,
               const CapacityGoal& goal, int64_t prefill, int64_t decode) {
  ClusterOptions o = base;
  o.prefill_nodes = prefill;
  o.decode_nodes = decode;
  const ClusterResult r = SimulateCluster(requests, o);
  return NearestRank(r.ttft_ms, 99) <= goal.ttft_p99_ms &&
         NearestRank(r.itl_ms, 99) <= goal.itl_p99_ms;
}

// The planner's answer meets the targets in the simulation, and one node fewer of either role
// does not; targets no cluster meets get no answer.
TEST(ClusterSimTest, CapacityPlanIsTheFewestNodesThatMeetTheTargets) {
  ClusterOptions base = Options(RoutePolicy::kPredictedTtft, 0);
  base.decode_slots = 4;
  base.decode = {.step_fixed_ms = 5, .step_per_row_ms = 2, .tokens_per_step = 1};
  // Requests far faster than one prefill node serves them, each of 20 tokens.
  std::vector<ClusterRequest> requests = Workload(60, 6, 5);
  for (ClusterRequest& r : requests) r.output_len = 20;
  const ClusterResult one = SimulateCluster(requests, [&] {
    ClusterOptions o = base;
    o.prefill_nodes = 1;
    o.decode_nodes = 1;
    return o;
  }());
  const double cold_ms = one.ttft_ms[0];
  const CapacityGoal goal{.ttft_p99_ms = 4 * cold_ms, .itl_p99_ms = 20, .max_nodes = 32};
  const CapacityPlan plan = PlanCapacity(requests, base, goal);
  ASSERT_TRUE(plan.best.has_value());
  EXPECT_TRUE(plan.best->meets);
  EXPECT_LE(plan.best->ttft_p99_ms, goal.ttft_p99_ms);
  EXPECT_LE(plan.best->itl_p99_ms, goal.itl_p99_ms);
  EXPECT_GT(plan.best->prefill_nodes, 1);  // one node is too few for this load
  EXPECT_GT(plan.best->decode_nodes, 1);   // four slots a node are too few for 60 requests
  auto meets = [&](int64_t prefill, int64_t decode) {
    return MeetsGoal(requests, base, goal, prefill, decode);
  };
  EXPECT_TRUE(meets(plan.best->prefill_nodes, plan.best->decode_nodes));
  EXPECT_FALSE(meets(plan.best->prefill_nodes - 1, plan.best->decode_nodes));
  EXPECT_FALSE(meets(plan.best->prefill_nodes, plan.best->decode_nodes - 1));
  // Every point it ran is in the frontier, the answer among them; the points of one prefill
  // node (far too few) stopped once their TTFT p99 was sure to miss, and no point that met did.
  EXPECT_GT(plan.explored.size(), 3u);
  int64_t stopped = 0;
  for (const CapacityPoint& p : plan.explored) {
    stopped += p.stopped;
    EXPECT_FALSE(p.stopped && p.meets);
    if (p.prefill_nodes == 1) {
      EXPECT_TRUE(p.stopped) << p.decode_nodes;
    }
  }
  EXPECT_GT(stopped, 0);
  const CapacityPlan none =
      PlanCapacity(requests, base, {.ttft_p99_ms = cold_ms / 2, .itl_p99_ms = 20, .max_nodes = 8});
  EXPECT_FALSE(none.best.has_value());
  // Points run several at once (a round of T doublings, steps down or bisections) find what
  // one at a time finds, and no point runs twice.
  for (const int64_t threads : {1, 2, 3, 5}) {
    SCOPED_TRACE(threads);
    CapacityGoal at = goal;
    at.threads = threads;
    const CapacityPlan parallel = PlanCapacity(requests, base, at);
    ASSERT_TRUE(parallel.best.has_value());
    EXPECT_EQ(parallel.best->prefill_nodes, plan.best->prefill_nodes);
    EXPECT_EQ(parallel.best->decode_nodes, plan.best->decode_nodes);
    std::set<std::pair<int64_t, int64_t>> shapes;
    for (const CapacityPoint& p : parallel.explored) {
      EXPECT_TRUE(shapes.emplace(p.prefill_nodes, p.decode_nodes).second)
          << p.prefill_nodes << " + " << p.decode_nodes << " ran twice";
      EXPECT_GE(p.seconds, 0);
    }
  }
}

// A plan searched on a sample of one prefix group in K, at 1/K of the nodes, answers with a
// point of the whole trace that meets the targets there, its counts the sample's times K; the
// sample's points are listed at those counts before the whole trace's. A sample lighter than
// 1/K of the load answers too few nodes, and the whole trace's misses step the role that
// missed up by K until the targets are met.
TEST(ClusterSimTest, ASampledPlanAnswersWithAPointOfTheWholeTraceThatMeets) {
  ClusterOptions base = Options(RoutePolicy::kPredictedTtft, 0);
  base.decode_slots = 16;
  base.decode = {.step_fixed_ms = 5, .step_per_row_ms = 2, .tokens_per_step = 1};
  constexpr int kPrefixes = 8, kOneIn = 4;
  std::vector<ClusterRequest> requests = Workload(240, kPrefixes, 2);
  for (ClusterRequest& r : requests) r.output_len = 20;
  // Two prefixes of the eight, whole: every request of them, a quarter of the load.
  std::vector<ClusterRequest> sample;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i % kPrefixes == 0 || i % kPrefixes == 4) sample.push_back(requests[i]);
  }
  const double cold_ms = SimulateCluster({requests[0]},
                                         [&] {
                                           ClusterOptions o = base;
                                           o.decode_nodes = 1;
                                           return o;
                                         }())
                             .ttft_ms[0];
  const CapacityGoal goal{.ttft_p99_ms = 4 * cold_ms, .itl_p99_ms = 20, .max_nodes = 64};
  auto meets_whole = [&](int64_t prefill, int64_t decode) {
    return MeetsGoal(requests, base, goal, prefill, decode);
  };
  const CapacityPlan whole = PlanCapacity(requests, base, goal);
  ASSERT_TRUE(whole.best.has_value());
  ASSERT_GT(whole.best->prefill_nodes, kOneIn);  // the sample needs more than one node
  // The decode nodes first found beside every prefill node (42 here) are searched again beside
  // the prefill nodes the answer has, which pace the requests into decode: one fewer misses.
  EXPECT_FALSE(
      MeetsGoal(requests, base, goal, whole.best->prefill_nodes, whole.best->decode_nodes - 1));
  EXPECT_FALSE(
      MeetsGoal(requests, base, goal, whole.best->prefill_nodes - 1, whole.best->decode_nodes));

  const CapacityPlan sampled = PlanCapacitySampled(requests, sample, kOneIn, base, goal);
  ASSERT_TRUE(sampled.best.has_value());
  EXPECT_EQ(sampled.best->sample_one_in, 1);
  EXPECT_TRUE(sampled.best->meets);
  EXPECT_TRUE(meets_whole(sampled.best->prefill_nodes, sampled.best->decode_nodes));
  // This sample is a quarter of the same periodic load: its answer is the whole plan's to
  // within K nodes a role, never fewer.
  EXPECT_GE(sampled.best->prefill_nodes, whole.best->prefill_nodes);
  EXPECT_LT(sampled.best->prefill_nodes, whole.best->prefill_nodes + kOneIn);
  EXPECT_LT(sampled.best->decode_nodes, whole.best->decode_nodes + kOneIn);
  bool whole_seen = false;
  for (const CapacityPoint& p : sampled.explored) {
    if (p.sample_one_in == kOneIn) {
      EXPECT_FALSE(whole_seen) << "the sample's points come first";
      EXPECT_EQ(p.prefill_nodes % kOneIn, 0);
      EXPECT_EQ(p.decode_nodes % kOneIn, 0);
    } else {
      EXPECT_EQ(p.sample_one_in, 1);
      whole_seen = true;
    }
  }
  EXPECT_TRUE(whole_seen);

  // One prefix of the eight at K = 4: half the load a quarter of the nodes would serve, so the
  // sample's answer is too few for the whole trace.
  std::vector<ClusterRequest> light;
  for (size_t i = 0; i < requests.size(); i += kPrefixes) light.push_back(requests[i]);
  const CapacityPlan stepped = PlanCapacitySampled(requests, light, kOneIn, base, goal);
  ASSERT_TRUE(stepped.best.has_value());
  EXPECT_TRUE(meets_whole(stepped.best->prefill_nodes, stepped.best->decode_nodes));
  std::vector<CapacityPoint> on_whole;
  for (const CapacityPoint& p : stepped.explored) {
    if (p.sample_one_in == 1) on_whole.push_back(p);
  }
  ASSERT_GE(on_whole.size(), 2u);
  for (size_t i = 0; i + 1 < on_whole.size(); ++i) {
    EXPECT_FALSE(on_whole[i].meets) << i;
    // Each miss adds K nodes to a role that missed.
    const int64_t more = (on_whole[i + 1].prefill_nodes - on_whole[i].prefill_nodes) +
                         (on_whole[i + 1].decode_nodes - on_whole[i].decode_nodes);
    EXPECT_TRUE(more == kOneIn || more == 2 * kOneIn) << i;
  }
  EXPECT_TRUE(on_whole.back().meets);

  // The whole trace offered as a sample of one in 4: no count up to 64 / 4 meets it (it needs
  // about 20 decode nodes), so the whole trace is run at 64 of each, which meets.
  const CapacityPlan heavy = PlanCapacitySampled(requests, requests, kOneIn, base, goal);
  ASSERT_TRUE(heavy.best.has_value());
  EXPECT_EQ(heavy.best->sample_one_in, 1);
  EXPECT_EQ(heavy.best->prefill_nodes, 64);
  EXPECT_EQ(heavy.best->decode_nodes, 64);
  EXPECT_EQ(heavy.explored.back().sample_one_in, 1);
  EXPECT_FALSE(heavy.explored.front().meets);
}

// A prompt of `blocks` blocks of its own tokens (no prefix any other shares), arriving at
// `arrival_ms`.
ClusterRequest Prompt(int64_t blocks, int first_token, double arrival_ms) {
  std::vector<int32_t> tokens(static_cast<size_t>(blocks * kB));
  std::iota(tokens.begin(), tokens.end(), first_token);
  return {.arrival_ms = arrival_ms,
          .prompt_len = blocks * kB,
          .chain = kvstore::ChainKeys("f", "", "", tokens, kB)};
}

// One node, a long prompt and then a short one just after it. In arrival order the short one
// waits out the long one's whole prefill; shared, both compute at half the node's speed until
// the short one's work is done, and the long one ends when it would have in arrival order.
TEST(ClusterSimTest, ANodesPrefillsGoOneAtATimeOrShareTheNode) {
  ClusterOptions o = Options(RoutePolicy::kLeastLoaded, 0);
  o.prefill_nodes = 1;
  const double gap = 0.001;
  const std::vector<ClusterRequest> both = {Prompt(60, 0, 0), Prompt(10, 100000, gap)};
  // Each alone: its service on an idle node.
  const double long_alone = SimulateCluster({both[0]}, o).ttft_ms[0];
  const double short_alone = SimulateCluster({Prompt(10, 100000, 0)}, o).ttft_ms[0];
  ASSERT_GT(long_alone, 2 * short_alone);

  const ClusterResult in_order = SimulateCluster(both, o);
  EXPECT_NEAR(in_order.ttft_ms[0], long_alone, 1e-9);
  EXPECT_NEAR(in_order.ttft_ms[1], long_alone + short_alone - gap, 1e-9);

  o.sharing = PrefillSharing::kShared;
  const ClusterResult shared = SimulateCluster(both, o);
  // Alone for `gap`, then half speed: the short one's work takes twice its time.
  EXPECT_NEAR(shared.ttft_ms[1], 2 * short_alone, 1e-6);
  EXPECT_NEAR(shared.ttft_ms[0], long_alone + short_alone, 1e-6);
  // One prompt alone computes alike either way.
  EXPECT_NEAR(SimulateCluster({both[0]}, o).ttft_ms[0], long_alone, 1e-9);
}

TEST(ClusterSimTest, FlagsAreParsedOrRefusedByName) {
  EXPECT_EQ(*ParsePrefillSharing("shared"), PrefillSharing::kShared);
  EXPECT_EQ(*ParsePrefillSharing("arrival-order"), PrefillSharing::kArrivalOrder);
  EXPECT_THAT(std::string(ParsePrefillSharing("fair").status().message()),
              ::testing::HasSubstr("--prefill-sharing: 'fair' is unknown; allowed: "
                                   "arrival-order, shared"));
  EXPECT_THAT(*ParseRoutePolicies("least-loaded,predicted-ttft"),
              ::testing::ElementsAre(RoutePolicy::kLeastLoaded, RoutePolicy::kPredictedTtft));
  const absl::StatusOr<std::vector<RoutePolicy>> bad = ParseRoutePolicies("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("--policy: 'random'"));
  const absl::StatusOr<kvstore::PrefillRates> rates =
      ParseRates("compute_ms_per_gflop=0.5,fixed_ms=3");
  ASSERT_TRUE(rates.ok());
  EXPECT_DOUBLE_EQ(rates->compute_ms_per_gflop, 0.5);
  EXPECT_DOUBLE_EQ(rates->fixed_ms, 3);
  EXPECT_DOUBLE_EQ(rates->store_ms_per_mib, kvstore::DefaultPrefillRates().store_ms_per_mib);
  EXPECT_THAT(std::string(ParseRates("speed=1").status().message()),
              ::testing::HasSubstr("--rates: 'speed' is unknown"));
  EXPECT_THAT(std::string(ParseRates("fixed_ms=-1").status().message()),
              ::testing::HasSubstr("finite value >= 0"));
  EXPECT_FALSE(ParseRates("fixed_ms=nan").ok());
  const absl::StatusOr<DecodeRates> decode =
      ParseDecodeRates("step_fixed_ms=12.5,tokens_per_step=1.8");
  ASSERT_TRUE(decode.ok());
  EXPECT_DOUBLE_EQ(decode->step_fixed_ms, 12.5);
  EXPECT_DOUBLE_EQ(decode->tokens_per_step, 1.8);
  EXPECT_DOUBLE_EQ(decode->step_per_row_ms, DecodeRates{}.step_per_row_ms);
  EXPECT_THAT(std::string(ParseDecodeRates("rows=1").status().message()),
              ::testing::HasSubstr("--decode-rates: 'rows' is unknown"));
  EXPECT_THAT(std::string(ParseDecodeRates("tokens_per_step=0.5").status().message()),
              ::testing::HasSubstr("in [1, 1e6]"));
  EXPECT_FALSE(ParseDecodeRates("step_fixed_ms=inf").ok());
  EXPECT_DOUBLE_EQ(ParseDecodeRates("replay_ms_per_gflop=4")->replay_ms_per_gflop, 4);
  EXPECT_THAT(std::string(ParseDecodeRates("replay_ms_per_gflop=-4").status().message()),
              ::testing::HasSubstr("in [0, 1e6]"));
  // The step stretch's quantiles: all four, in order, or none.
  const absl::StatusOr<DecodeRates> spread = ParseDecodeRates(
      "step_stretch_p10=0.8,step_stretch_p50=1,step_stretch_p90=1.5,step_stretch_p99=3");
  ASSERT_TRUE(spread.ok()) << spread.status();
  EXPECT_TRUE(spread->stretch_spread());
  EXPECT_DOUBLE_EQ(spread->step_stretch_quantiles[3], 3);
  EXPECT_FALSE(ParseDecodeRates("step_stretch=1.2")->stretch_spread());
  for (const char* bad : {"step_stretch_p50=1",
                          "step_stretch_p10=0.8,step_stretch_p50=1,"
                          "step_stretch_p90=0.9,step_stretch_p99=3"}) {
    EXPECT_THAT(std::string(ParseDecodeRates(bad).status().message()),
                ::testing::HasSubstr("go together, each > 0 and none below the one before"))
        << bad;
  }
  // Between the quantiles the factor is linear; below 0.1 and above 0.99 it is theirs.
  const std::array<double, 4> q = {0.5, 1, 2, 4};
  EXPECT_DOUBLE_EQ(StretchAt(q, 0), 0.5);
  EXPECT_DOUBLE_EQ(StretchAt(q, 0.3), 0.75);
  EXPECT_DOUBLE_EQ(StretchAt(q, 0.5), 1);
  EXPECT_DOUBLE_EQ(StretchAt(q, 0.7), 1.5);
  EXPECT_DOUBLE_EQ(StretchAt(q, 0.999), 4);
  double integral = 0;
  for (int i = 0; i < 100000; ++i) integral += StretchAt(q, (i + 0.5) / 100000);
  EXPECT_NEAR(StretchMean(q), integral / 100000, 1e-6);
}

}  // namespace
}  // namespace baton::tools
