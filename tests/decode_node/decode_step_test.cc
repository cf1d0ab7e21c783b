// The decode step's planning and settling (decode_step.h) as properties over many random
// requests: no model, no gRPC, no threads. Batch formation, the replay budgets in rows and in
// time, draft clamping, the finish rule token by token, the rows taken back, and a replay's
// progress to its first token.
#include "baton/decode_node/decode_step.h"

#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace baton::decode_node {
namespace {

constexpr int64_t kVocab = 16;
constexpr int64_t kEos = 2;

// A request decoding with `left` tokens to go, drafting up to `k` by prompt lookup when it has
// a context.
Generation Decoding(int64_t left, int64_t k, bool context) {
  Generation g;
  g.max_tokens = 100;
  g.completion = static_cast<uint32_t>(100 - left);
  g.eos_token_id = kEos;
  if (context) g.context = {5, 6, 7};
  g.speculation.drafter = Drafter::kNgram;
  g.speculation.max_tokens = k;
  g.speculation.next = k;  // before the node has measured its costs, it drafts `next`
  return g;
}

// A request replaying a prompt of `length` rows from row `next`.
Generation Replaying(int64_t length, int64_t next) {
  Generation g;
  g.max_tokens = 10;
  g.eos_token_id = kEos;
  g.replay.prompt_len = length;
  g.replay.s_valid = next;
  g.replay_next = next;
  return g;
}

struct Requests {
  std::vector<Generation> generations;
  std::vector<StepCandidate> candidates;
  void Add(Generation g, StepCandidate::Work work) {
    generations.push_back(std::move(g));
    candidates.push_back({.work = work});
  }
  // After every Add: the candidates point into `generations`, which no longer moves.
  std::span<const StepCandidate> Seal() {
    for (size_t i = 0; i < candidates.size(); ++i) candidates[i].generation = &generations[i];
    return candidates;
  }
};

TEST(PlanStepTest, TheBatchIsTheFirstDecodingRequestsUpToMaxBatch) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    Requests requests;
    const int n = std::uniform_int_distribution<int>(0, 30)(rng);
    std::vector<size_t> decoding;
    for (int i = 0; i < n; ++i) {
      if (rng() % 3 == 0) {
        requests.Add(Replaying(64, 0), StepCandidate::Work::kReplay);
      } else {
        decoding.push_back(static_cast<size_t>(i));
        requests.Add(Decoding(10, 0, false), StepCandidate::Work::kDecode);
      }
    }
    const StepPolicy policy{.max_batch = std::uniform_int_distribution<int64_t>(1, 12)(rng)};
    const DecodePlan plan = PlanStep(requests.Seal(), policy, {}, {});
    const size_t expected = std::min<size_t>(decoding.size(), policy.max_batch);
    ASSERT_EQ(plan.decode.size(), expected) << DescribePlan(plan);
    for (size_t i = 0; i < expected; ++i) EXPECT_EQ(plan.decode[i].candidate, decoding[i]);
    for (const DecodePlan::Replay& r : plan.replay) {
      EXPECT_EQ(requests.candidates[r.candidate].work, StepCandidate::Work::kReplay);
    }
    EXPECT_EQ(plan.empty(), n == 0);
  }
}

TEST(PlanStepTest, ReplayRowsFillTheRowBudgetInOrderFromEachRequestsNextRow) {
  std::mt19937 rng(11);
  for (int round = 0; round < 300; ++round) {
    Requests requests;
    const bool streams = rng() % 2 == 0;
    if (streams) requests.Add(Decoding(10, 0, false), StepCandidate::Work::kDecode);
    int64_t rows_left = 0;
    const int n = std::uniform_int_distribution<int>(1, 6)(rng);
    for (int i = 0; i < n; ++i) {
      const int64_t length = std::uniform_int_distribution<int64_t>(2, 700)(rng);
      const int64_t next = std::uniform_int_distribution<int64_t>(0, length - 1)(rng);
      rows_left += length - next;
      requests.Add(Replaying(length, next), StepCandidate::Work::kReplay);
    }
    const StepPolicy policy{.replay_rows = std::uniform_int_distribution<int64_t>(1, 64)(rng),
                            .idle_replay_rows = 512};
    const DecodePlan plan = PlanStep(requests.Seal(), policy, {}, {});
    // With streams decoding, the row bound; with none, the idle bound.
    const int64_t budget = streams ? policy.replay_rows : 512;
    EXPECT_EQ(plan.replay_budget, budget);
    EXPECT_EQ(plan.replay_rows(), std::min(budget, rows_left)) << DescribePlan(plan);
    EXPECT_EQ(plan.replay_budget_ms, -1);  // no costs measured: the row bound alone
    size_t previous = 0;
    for (size_t i = 0; i < plan.replay.size(); ++i) {
      const DecodePlan::Replay& r = plan.replay[i];
      const Generation& g = requests.generations[r.candidate];
      EXPECT_EQ(r.first_row, g.replay_next);
      EXPECT_GT(r.rows, 0);
      EXPECT_LE(r.rows, g.replay_rows_left());
      if (i > 0) {
        EXPECT_GT(r.candidate, previous);
        // A request gets rows only once every earlier one has all of its rows in the step.
        const DecodePlan::Replay& before = plan.replay[i - 1];
        EXPECT_EQ(before.rows, requests.generations[before.candidate].replay_rows_left());
      }
      previous = r.candidate;
    }
  }
}

// Costs as a node measures them: decode steps of `seconds_per_row` a row beside a fixed part,
// and replay pieces over L positions costing (piece + row x rows) x L / 1024.
struct MeasuredCosts {
  DraftCosts decode;
  ReplayCosts replay;
  MeasuredCosts(double fixed, double seconds_per_row, double piece, double row, bool lengths) {
    for (int i = 0; i < 64; ++i) {
      const int64_t rows = 1 + i % 8;
      decode.AddStep(rows, rows, fixed + seconds_per_row * rows);
      for (int64_t L : lengths ? std::vector<int64_t>{600, 1500, 3000, 6000, 12000}
                               : std::vector<int64_t>{1024}) {
        const int64_t replayed = lengths ? rows : 8;
        replay.AddPiece((piece + row * replayed) * L / 1024.0, {.prompt_len = L, .rows = replayed});
      }
    }
  }
};

TEST(PlanStepTest, TheTimeBudgetKeepsTheReplayWithinItsShareOfTheStreamsStep) {
  const MeasuredCosts costs(0.010, 0.001, 0.002, 0.0005, /*lengths=*/true);
  ASSERT_TRUE(costs.decode.target.ready());
  std::mt19937 rng(3);
  for (int round = 0; round < 300; ++round) {
    Requests requests;
    const int streams = std::uniform_int_distribution<int>(1, 8)(rng);
    for (int i = 0; i < streams; ++i) {
      requests.Add(Decoding(10, 0, false), StepCandidate::Work::kDecode);
    }
    const int n = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int i = 0; i < n; ++i) {
      requests.Add(Replaying(std::uniform_int_distribution<int64_t>(600, 12000)(rng), 0),
                   StepCandidate::Work::kReplay);
    }
    const StepPolicy policy{
        .replay_rows = 256,
        .replay_step_budget = std::uniform_real_distribution<double>(0.05, 2.0)(rng)};
    const DecodePlan plan = PlanStep(requests.Seal(), policy, costs.decode, costs.replay);
    const double streams_ms = costs.decode.TargetFor(streams).At(plan.decode_rows()) * 1e3;
    EXPECT_NEAR(plan.replay_budget_ms, policy.replay_step_budget * streams_ms, 1e-9);
    double replay_ms = 0;
    for (const DecodePlan::Replay& r : plan.replay) {
      const int64_t length = requests.generations[r.candidate].replay.prompt_len;
      replay_ms += costs.replay.PieceSeconds({.prompt_len = length, .rows = r.rows}) * 1e3;
    }
    // Within the budget, or the one row that keeps a replay moving.
    ASSERT_FALSE(plan.replay.empty());
    if (plan.replay_rows() > 1) {
      EXPECT_LE(replay_ms, plan.replay_budget_ms + 1e-9) << DescribePlan(plan);
    }
    // And as many rows as fit: one more row of the last piece would not.
    const DecodePlan::Replay& last = plan.replay.back();
    const Generation& g = requests.generations[last.candidate];
    if (last.rows < g.replay_rows_left() && plan.replay_rows() < policy.replay_rows) {
      const double more = replay_ms -
                          costs.replay.PieceSeconds({g.replay.prompt_len, last.rows}) * 1e3 +
                          costs.replay.PieceSeconds({g.replay.prompt_len, last.rows + 1}) * 1e3;
      EXPECT_GT(more, plan.replay_budget_ms) << DescribePlan(plan);
    }
    EXPECT_LE(plan.replay_rows(), policy.replay_rows);
  }
}

TEST(PlanStepTest, ShorterPromptsReplayMoreRowsInTheSameTimeAndZeroLeavesTheRowBound) {
  const MeasuredCosts costs(0.010, 0.001, 0.002, 0.0005, /*lengths=*/true);
  auto rows_at = [&](int64_t length, double budget) {
    Requests requests;
    for (int i = 0; i < 8; ++i) requests.Add(Decoding(10, 0, false), StepCandidate::Work::kDecode);
    requests.Add(Replaying(length, 0), StepCandidate::Work::kReplay);
    const StepPolicy policy{.replay_rows = 1000, .replay_step_budget = budget};
    return PlanStep(requests.Seal(), policy, costs.decode, costs.replay).replay_rows();
  };
  EXPECT_GT(rows_at(1500, 0.5), rows_at(6000, 0.5));
  EXPECT_GT(rows_at(3000, 1.0), rows_at(3000, 0.25));
  EXPECT_EQ(rows_at(3000, 0), 1000);
  // Before the node has measured a replay piece, the unpriced rows within the row bound.
  Requests requests;
  requests.Add(Decoding(10, 0, false), StepCandidate::Work::kDecode);
  requests.Add(Replaying(4096, 0), StepCandidate::Work::kReplay);
  const std::span<const StepCandidate> candidates = requests.Seal();
  const StepPolicy unpriced{
      .replay_rows = 64, .replay_step_budget = 0.5, .unpriced_replay_rows = 6};
  DecodePlan plan = PlanStep(candidates, unpriced, costs.decode, {});
  EXPECT_EQ(plan.replay_rows(), 6);
  EXPECT_EQ(plan.replay_budget_ms, -1);
  plan = PlanStep(candidates, {.replay_rows = 4, .replay_step_budget = 0.5}, costs.decode, {});
  EXPECT_EQ(plan.replay_rows(), 4);
}

TEST(ReplayCostsTest, APieceIsFittedPerLengthBandAndPricedByTheLengthBeforeThat) {
  const MeasuredCosts costs(0.010, 0.001, 0.002, 0.0005, /*lengths=*/true);
  // Fitted: a piece's own part and a part per row, in its band.
  EXPECT_NEAR(costs.replay.PieceSeconds({.prompt_len = 3000, .rows = 4}),
              (0.002 + 0.0005 * 4) * 3000 / 1024.0, 1e-9);
  EXPECT_EQ(costs.replay.RowsWithin(0.001, 3000), 0);  // less than the piece's own part
  EXPECT_EQ(costs.replay.RowsWithin((0.002 + 0.0005 * 5.5) * 3000 / 1024.0, 3000), 5);
  // A band none was seen in: the fit over every band of a piece's seconds per position.
  ASSERT_TRUE(costs.replay.per_position.ready());
  EXPECT_NEAR(costs.replay.PieceSeconds({.prompt_len = 20000, .rows = 3}),
              (0.002 + 0.0005 * 3) * 20000 / 1024.0, 1e-9);
  EXPECT_EQ(costs.replay.RowsWithin((0.002 + 0.0005 * 7.5) * 20000 / 1024.0, 20000), 7);
  // What a node reports of that fit prices as the node does (the cluster simulation's costs).
  const ReplayCosts reported = ReplayCosts::Proportional(costs.replay.per_position.fixed(),
                                                         costs.replay.per_position.per_row());
  ASSERT_TRUE(reported.ready());
  EXPECT_NEAR(reported.PieceSeconds({.prompt_len = 20000, .rows = 3}),
              costs.replay.PieceSeconds({.prompt_len = 20000, .rows = 3}), 1e-12);
  EXPECT_EQ(reported.RowsWithin((0.002 + 0.0005 * 4.5) * 5000 / 1024.0, 5000), 4);
  // One size seen: a row's share, in proportion to the length.
  const MeasuredCosts one(0.010, 0.001, 0.002, 0.0005, /*lengths=*/false);
  const double at = one.replay.PieceSeconds({.prompt_len = 1024, .rows = 1});
  EXPECT_NEAR(at, 0.002 / 8 + 0.0005, 1e-9);
  EXPECT_NEAR(one.replay.PieceSeconds({.prompt_len = 4096, .rows = 2}), 8 * at, 1e-9);
}

// The stretch is what the node's steps took over what its reported fits price them at, summed
// over its recent steps: what a simulation at those fits must multiply its steps by.
// Steps whose time is a known line (10 ms + 2 ms a row; a piece over L positions L x (2 us +
// 0.5 us a row)) times a factor spread evenly over [0.5, 1.5]: the log fits the line back, and
// the spread of each step about its price is the factor's.
TEST(StepLogTest, ItFitsItsStepsAndReportsTheirSpreadAboutTheirPrice) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> factor(0.5, 1.5);
  StepLog log;
  for (int i = 0; i < 4096; ++i) {
    const int64_t rows = std::uniform_int_distribution<int64_t>(1, 12)(rng);
    std::vector<PieceSize> pieces;
    if (i % 3 == 0) {
      pieces.push_back({.prompt_len = std::uniform_int_distribution<int64_t>(500, 8000)(rng),
                        .rows = std::uniform_int_distribution<int64_t>(1, 16)(rng)});
    }
    double seconds = 0.010 + 0.002 * static_cast<double>(rows);
    for (const PieceSize& p : pieces) {
      seconds += static_cast<double>(p.prompt_len) * (2e-6 + 0.5e-6 * static_cast<double>(p.rows));
    }
    log.Add(rows, pieces, seconds * factor(rng));
  }
  const StepLog::Summary s = log.Summarize(CostFit{}, CostFit{});
  ASSERT_TRUE(s.line_ready);
  ASSERT_TRUE(s.pieces_ready);
  EXPECT_NEAR(s.fixed, 0.010, 0.0015);
  EXPECT_NEAR(s.per_row, 0.002, 0.0002);
  EXPECT_NEAR(s.piece_fixed, 2e-6, 0.4e-6);
  EXPECT_NEAR(s.piece_row, 0.5e-6, 0.05e-6);
  EXPECT_NEAR(s.stretch, 1, 0.03);
  const std::array<double, 4> expected = {0.6, 1.0, 1.4, 1.49};
  for (size_t q = 0; q < 4; ++q) EXPECT_NEAR(s.quantiles[q], expected[q], 0.05) << q;
  const PieceSize piece{.prompt_len = 2048, .rows = 8};
  EXPECT_NEAR(s.Price(4, {&piece, 1}),
              s.fixed + 4 * s.per_row + 2048 * (s.piece_fixed + 8 * s.piece_row), 1e-12);
}

TEST(StepLogTest, ItKeepsItsLastStepsAndFallsBackToThePlannersFitsWhileItHasTooFew) {
  StepLog log;
  // Nothing logged and nothing fitted: nothing is priced.
  StepLog::Summary none = log.Summarize(CostFit{}, CostFit{});
  EXPECT_FALSE(none.line_ready);
  EXPECT_FALSE(none.pieces_ready);
  EXPECT_EQ(none.stretch, 0);
  EXPECT_EQ(none.quantiles[1], 0);
  EXPECT_EQ(none.Price(4, {}), 0);
  // Nothing logged: the planner's fits, as they are.
  const StepLog::Summary planner =
      log.Summarize(CostFit::Line(0.005, 0.001), CostFit::Line(1e-6, 2e-7));
  EXPECT_DOUBLE_EQ(planner.fixed, 0.005);
  EXPECT_DOUBLE_EQ(planner.per_row, 0.001);
  EXPECT_DOUBLE_EQ(planner.piece_fixed, 1e-6);
  EXPECT_DOUBLE_EQ(planner.piece_row, 2e-7);
  // Steps of one size: the slope is the planner's, the line goes through their mean, and each
  // is at its price.
  for (int i = 0; i < 100; ++i) log.Add(4, {}, 0.018);
  const StepLog::Summary one_size = log.Summarize(CostFit::Line(0.005, 0.001), CostFit{});
  EXPECT_DOUBLE_EQ(one_size.per_row, 0.001);
  EXPECT_NEAR(one_size.fixed, 0.014, 1e-12);
  EXPECT_NEAR(one_size.quantiles[0], 1, 1e-9);
  EXPECT_NEAR(one_size.quantiles[3], 1, 1e-9);
  // A full log of another line forgets the first; half a log of the first again blends them.
  auto fill = [&log](int steps, double fixed, double per_row) {
    for (int i = 0; i < steps; ++i) {
      const int64_t rows = 1 + i % 8;
      log.Add(rows, {}, fixed + per_row * static_cast<double>(rows));
    }
  };
  fill(StepLog::kSteps, 0.020, 0.003);
  const StepLog::Summary second = log.Summarize(CostFit{}, CostFit{});
  EXPECT_NEAR(second.fixed, 0.020, 1e-9);
  EXPECT_NEAR(second.per_row, 0.003, 1e-9);
  EXPECT_EQ(log.size(), StepLog::kSteps);
  fill(StepLog::kSteps / 2, 0.005, 0.001);
  const StepLog::Summary blend = log.Summarize(CostFit{}, CostFit{});
  EXPECT_GT(blend.fixed, 0.006);
  EXPECT_LT(blend.fixed, 0.019);
  EXPECT_LT(blend.quantiles[0], 0.9);  // each line's steps sit off the blend
  EXPECT_GT(blend.quantiles[3], 1.1);
  // A line whose intercept would be below 0 goes through the origin.
  StepLog steep;
  for (int i = 0; i < 64; ++i) {
    const int64_t rows = 1 + i % 8;
    steep.Add(rows, {}, 0.004 * static_cast<double>(rows) - 0.002);
  }
  const StepLog::Summary origin = steep.Summarize(CostFit{}, CostFit{});
  EXPECT_EQ(origin.fixed, 0);
  EXPECT_GT(origin.per_row, 0.003);
  // The spread weighs each step by its price: short steps that waited out a neighbour's time
  // slice (100x their price, 1.5% of the steps) leave the quantiles of the node's time alone.
  StepLog stalled;
  for (int i = 0; i < 2000; ++i) {
    const int64_t rows = 1 + i % 8;
    stalled.Add(rows, {}, 0.010 + 0.002 * static_cast<double>(rows));
    const PieceSize big{.prompt_len = 4000 + 500 * (i % 5), .rows = 1 + i % 16};
    stalled.Add(
        0, {&big, 1},
        static_cast<double>(big.prompt_len) * (2e-6 + 0.5e-6 * static_cast<double>(big.rows)));
    if (i % 33 == 0) {
      const PieceSize tiny{.prompt_len = 100, .rows = 1};
      stalled.Add(0, {&tiny, 1}, 100 * 100 * 2.5e-6);
    }
  }
  const StepLog::Summary weighed = stalled.Summarize(CostFit{}, CostFit{});
  EXPECT_NEAR(weighed.quantiles[0], 1, 0.01);
  EXPECT_NEAR(weighed.quantiles[3], 1, 0.01);
  // A failed or empty measurement is not logged.
  StepLog empty;
  empty.Add(4, {}, 0);
  empty.Add(4, {}, std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(empty.size(), 0u);
}

TEST(FoldStepTimeTest, AReplayStepCountsWhatItAddsToTheStreamsStep) {
  DraftCosts costs;
  ReplayCosts replay;
  const PieceSize piece{.prompt_len = 2048, .rows = 8};
  // Until the streams' step is known, a step with streams and replay says nothing of a piece.
  FoldStepTime(costs, replay, 4, 4, {&piece, 1}, 0.030);
  EXPECT_FALSE(replay.ready());
  // A replay alone counts whole.
  const PieceSize alone{.prompt_len = 1000, .rows = 100};
  FoldStepTime(costs, replay, 0, 0, {&alone, 1}, 0.100);
  EXPECT_NEAR(replay.PieceSeconds(alone), 0.100, 1e-12);
  ReplayCosts beside;
  for (int i = 0; i < 32; ++i) {
    const int64_t rows = 2 + i % 6;
    FoldStepTime(costs, beside, rows, rows, {}, 0.010 + 0.002 * rows);
  }
  ASSERT_TRUE(costs.TargetFor(4).ready());
  // 4 streams take 18 ms: of a 26 ms step, 8 ms is the piece's; two pieces share by rows x L.
  FoldStepTime(costs, beside, 4, 4, {&piece, 1}, 0.026);
  EXPECT_NEAR(beside.PieceSeconds(piece), 0.008, 1e-9);
  ReplayCosts shared;
  const PieceSize two[] = {{.prompt_len = 2048, .rows = 8}, {.prompt_len = 1024, .rows = 8}};
  FoldStepTime(costs, shared, 4, 4, two, 0.030);
  EXPECT_NEAR(shared.PieceSeconds(two[0]), 0.008, 1e-9);
}

TEST(FoldStepTimeTest, ABatchThatKeepsOneSizeIsPricedFromItsRecentStepsAlone) {
  DraftCosts costs;
  ReplayCosts replay;
  for (int i = 0; i < 40; ++i) FoldStepTime(costs, replay, 8, 8, {}, 0.020);
  EXPECT_FALSE(costs.TargetFor(8).ready());  // one size: the fit cannot split its terms
  EXPECT_NEAR(StreamsSeconds(costs, replay, 8, 8), 0.020, 1e-12);
  EXPECT_EQ(StreamsSeconds(costs, replay, 6, 6), 0);
  const PieceSize piece{.prompt_len = 4096, .rows = 4};
  FoldStepTime(costs, replay, 8, 8, {&piece, 1}, 0.024);
  EXPECT_NEAR(replay.PieceSeconds(piece), 0.004, 1e-12);
  // So the planner holds such a batch's replay to its share.
  Requests requests;
  for (int i = 0; i < 8; ++i) requests.Add(Decoding(10, 0, false), StepCandidate::Work::kDecode);
  requests.Add(Replaying(4096, 0), StepCandidate::Work::kReplay);
  const DecodePlan plan =
      PlanStep(requests.Seal(), {.replay_rows = 64, .replay_step_budget = 0.5}, costs, replay);
  EXPECT_NEAR(plan.replay_budget_ms, 10, 1e-9);
  EXPECT_EQ(plan.replay_rows(), 10);
}

TEST(PlanStepTest, DraftsNeverOutrunTheTokensLeftOrTheRequestsK) {
  std::mt19937 rng(5);
  for (int round = 0; round < 300; ++round) {
    Requests requests;
    std::vector<std::tuple<int64_t, int64_t, bool>> asked;
    const int n = std::uniform_int_distribution<int>(1, 10)(rng);
    for (int i = 0; i < n; ++i) {
      const int64_t left = std::uniform_int_distribution<int64_t>(1, 12)(rng);
      const int64_t k = std::uniform_int_distribution<int64_t>(0, 8)(rng);
      const bool context = rng() % 4 != 0;
      asked.emplace_back(left, k, context);
      requests.Add(Decoding(left, k, context), StepCandidate::Work::kDecode);
    }
    const DecodePlan plan = PlanStep(requests.Seal(), {.max_batch = 64}, {}, {});
    ASSERT_EQ(plan.decode.size(), static_cast<size_t>(n));
    int64_t rows = 0;
    for (const DecodePlan::Decode& d : plan.decode) {
      const auto [left, k, context] = asked[d.candidate];
      // A step emits at most drafts + 1 tokens: never past the request's last.
      EXPECT_EQ(d.drafts, context ? std::min(k, left - 1) : 0) << DescribePlan(plan);
      rows += 1 + d.drafts;
    }
    EXPECT_EQ(plan.decode_rows(), rows);
  }
}

model::Verdict VerdictOf(int64_t accepted, std::vector<int32_t> tokens) {
  model::Verdict verdict{.accepted = accepted};
  for (int32_t t : tokens) verdict.tokens.push_back({.token = t, .logprob = -0.5f});
  return verdict;
}

TEST(SettleDecodeTest, TokensStopAtTheFinishRuleAndRejectedRowsAreTakenBack) {
  std::mt19937 rng(13);
  for (int round = 0; round < 500; ++round) {
    const int64_t left = std::uniform_int_distribution<int64_t>(1, 8)(rng);
    const int64_t drafts = std::uniform_int_distribution<int64_t>(0, 5)(rng);
    const int64_t accepted = std::uniform_int_distribution<int64_t>(0, drafts)(rng);
    Generation g = Decoding(left, drafts, true);
    g.stop_ids = {9};
    g.ignore_eos = rng() % 2 == 0;
    std::vector<int32_t> tokens;
    for (int64_t i = 0; i <= accepted; ++i) {
      tokens.push_back(std::uniform_int_distribution<int32_t>(0, 11)(rng));
    }
    const size_t context_before = g.context.size();
    const DecodeSettled settled = SettleDecode(g, drafts, VerdictOf(accepted, tokens));
    EXPECT_EQ(settled.taken_back, drafts - accepted);
    // The tokens emitted: the verdict's, up to and including the first that finishes.
    int64_t expected = 0;
    v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
    for (size_t i = 0; i < tokens.size() && finish == v1::FINISH_REASON_UNSPECIFIED; ++i) {
      ++expected;
      finish = FinishReasonFor(tokens[i], static_cast<uint32_t>(100 - left + expected), 100, {9},
                               g.ignore_eos, kEos);
    }
    EXPECT_EQ(settled.emitted, expected);
    EXPECT_EQ(g.finish, finish);
    EXPECT_EQ(g.tokens, std::vector<int32_t>(tokens.begin(), tokens.begin() + expected));
    EXPECT_EQ(g.logprobs.size(), g.tokens.size());
    EXPECT_EQ(g.completion, 100 - left + expected);
    EXPECT_EQ(g.context.size(), context_before + expected);
    EXPECT_EQ(g.next_input, g.tokens.back());
    EXPECT_LE(g.completion, g.max_tokens);
    EXPECT_EQ(settled.drafted, drafts);
    EXPECT_EQ(settled.accepted, drafts > 0 ? std::min(accepted, expected) : 0);
    EXPECT_EQ(g.speculation.drafted, static_cast<uint32_t>(drafts));
    EXPECT_EQ(g.speculation.accepted, static_cast<uint32_t>(settled.accepted));
  }
}

TEST(SettleDecodeTest, TheLengthLimitEndsTheRequestInsideItsAcceptedDrafts) {
  Generation g = Decoding(/*left=*/2, 4, true);
  const DecodeSettled settled = SettleDecode(g, 4, VerdictOf(4, {5, 6, 7, 8, 10}));
  EXPECT_EQ(settled.emitted, 2);
  EXPECT_EQ(settled.accepted, 2);
  EXPECT_EQ(settled.taken_back, 0);
  EXPECT_EQ(g.finish, v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(g.tokens, (std::vector<int32_t>{5, 6}));
}

// Logits with `best` highest in each row, as a replay step returns them.
std::vector<float> RowsFavouring(const std::vector<int32_t>& best) {
  std::vector<float> logits(best.size() * kVocab, 0.0f);
  for (size_t r = 0; r < best.size(); ++r) logits[r * kVocab + best[r]] = 5.0f;
  return logits;
}

TEST(SettleReplayTest, PiecesMoveThePromptOnAndItsLastRowSamplesTheFirstToken) {
  std::mt19937 rng(17);
  for (int round = 0; round < 200; ++round) {
    const int64_t length = std::uniform_int_distribution<int64_t>(2, 40)(rng);
    const int64_t begin = std::uniform_int_distribution<int64_t>(0, length - 1)(rng);
    Generation g = Replaying(length, begin);
    const bool logprobs = rng() % 2 == 0;
    if (logprobs) {
      for (int64_t i = 0; i < length; ++i) g.prompt_tokens.push_back(static_cast<int32_t>(i % 11));
    }
    int64_t pieces = 0;
    bool ended = false;
    while (!ended) {
      const int64_t rows =
          std::min(g.replay_rows_left(), std::uniform_int_distribution<int64_t>(1, 9)(rng));
      const bool last = rows == g.replay_rows_left();
      // Every row's logits with logprobs; else the last row's, and only in the piece that ends.
      const int64_t logit_rows = logprobs ? rows : (last ? 1 : 0);
      std::vector<int32_t> best(static_cast<size_t>(logit_rows), 3);
      if (logit_rows > 0) best.back() = 7;
      const int64_t before = g.replay_next;
      ended = SettleReplay(g, rows, RowsFavouring(best), kVocab);
      ++pieces;
      EXPECT_EQ(g.replay_next, before + rows);
      EXPECT_EQ(ended, last);
      EXPECT_EQ(g.tokens.empty(), !ended);
    }
    // Greedy: the last row's favourite is the first token; a prompt logprob per row but the last.
    EXPECT_EQ(g.tokens, (std::vector<int32_t>{7}));
    EXPECT_EQ(g.completion, 1u);
    EXPECT_EQ(g.prompt_logprobs.size(), logprobs ? static_cast<size_t>(length - begin - 1) : 0u);
  }
}

TEST(SettleReplayTest, AFirstTokenThatStopsFinishesTheRequest) {
  Generation g = Replaying(4, 0);
  g.stop_ids = {7};
  EXPECT_TRUE(SettleReplay(g, 4, RowsFavouring({7}), kVocab));
  EXPECT_EQ(g.finish, v1::FINISH_REASON_STOP);
}

TEST(DescribePlanTest, NamesEachRequestsRowsAndTheBudget) {
  DecodePlan plan;
  plan.decode = {{.candidate = 0, .drafts = 3}, {.candidate = 4, .drafts = 0}};
  plan.replay = {{.candidate = 2, .first_row = 128, .rows = 8}};
  plan.replay_budget = 8;
  EXPECT_EQ(DescribePlan(plan), "decode 2 [0+3 4+0] replay 1 [2:128+8] budget 8 rows");
  plan.replay_budget_ms = 3.14;
  EXPECT_EQ(DescribePlan(plan), "decode 2 [0+3 4+0] replay 1 [2:128+8] budget 8 rows 3.1 ms");
}

}  // namespace
}  // namespace baton::decode_node
