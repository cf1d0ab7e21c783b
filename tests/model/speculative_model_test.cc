// Speculative decoding's model side: drafted rows verified in one decode step give the logits
// one-token steps give, a rejection at any offset leaves the rings and pages as a run that never
// drafted (DESIGN section 3's backtracking within C = W + max_backtrack + 1), and verification
// keeps greedy output token for token and sampled output at exactly the target's distribution.
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <random>

#include "baton/model/engine_factory.h"
#include "baton/model/model_factory.h"
#include "baton/model/speculative.h"
#include "gtest/gtest.h"
#include "test_dir.h"

namespace baton::model {
namespace {

// ---- Prompt lookup ------------------------------------------------------------------------

TEST(ProposeByLookup, TakesWhatFollowedTheLatestOccurrenceOfTheLongestSuffix) {
  // The last two tokens (7, 8) occurred twice; the later occurrence is followed by 9, 4.
  const std::vector<int32_t> context = {7, 8, 1, 2, 7, 8, 9, 4, 5, 7, 8};
  EXPECT_EQ(ProposeByLookup(context, 3, 1, 4), (std::vector<int32_t>{9, 4, 5}));
  // At most max_tokens, and no more than the context holds after the match.
  EXPECT_EQ(ProposeByLookup(context, 1, 1, 4), (std::vector<int32_t>{9}));
  const std::vector<int32_t> tail = {3, 1, 2, 3};
  EXPECT_EQ(ProposeByLookup(tail, 5, 1, 4), (std::vector<int32_t>{1, 2, 3}));
}

TEST(ProposeByLookup, FallsBackToShorterSuffixesAndProposesNothingWithoutAMatch) {
  // (5, 6) never occurred before; 6 did, followed by 2.
  const std::vector<int32_t> context = {6, 2, 3, 5, 6};
  EXPECT_EQ(ProposeByLookup(context, 2, 1, 3), (std::vector<int32_t>{2, 3}));
  // With min_n 2 the one-token suffix is not tried.
  EXPECT_TRUE(ProposeByLookup(context, 2, 2, 3).empty());
  EXPECT_TRUE(ProposeByLookup(std::vector<int32_t>{1, 2, 3}, 4, 1, 3).empty());
  EXPECT_TRUE(ProposeByLookup(std::vector<int32_t>{1}, 4, 1, 3).empty());
  EXPECT_TRUE(ProposeByLookup(context, 0, 1, 3).empty());
}

// ---- Verification --------------------------------------------------------------------------

// Rows of logits [rows, V] from a generator.
std::vector<float> Rows(const std::vector<std::vector<float>>& rows) {
  std::vector<float> out;
  for (const auto& row : rows) out.insert(out.end(), row.begin(), row.end());
  return out;
}

TEST(VerifyDraft, GreedyKeepsTheLongestPrefixTheArgmaxAgreesWith) {
  // Argmaxes per row: 2, 0, 3, 1.
  const std::vector<float> logits = Rows({{0, 1, 5, 2}, {4, 1, 0, 2}, {0, 1, 2, 9}, {1, 8, 0, 0}});
  const SamplingParams greedy;
  Verdict all = VerifyDraft(logits, std::vector<int32_t>{2, 0, 3}, {}, greedy, 10);
  EXPECT_EQ(all.accepted, 3);
  ASSERT_EQ(all.tokens.size(), 4u);
  EXPECT_EQ(all.tokens[3].token, 1);  // the bonus from the row after the last draft
  Verdict some = VerifyDraft(logits, std::vector<int32_t>{2, 1, 3}, {}, greedy, 10);
  EXPECT_EQ(some.accepted, 1);
  ASSERT_EQ(some.tokens.size(), 2u);
  EXPECT_EQ(some.tokens[0].token, 2);
  EXPECT_EQ(some.tokens[1].token, 0);  // the correction: the target's own choice
  Verdict none = VerifyDraft(logits, std::vector<int32_t>{1, 0, 3}, {}, greedy, 10);
  EXPECT_EQ(none.accepted, 0);
  ASSERT_EQ(none.tokens.size(), 1u);
  EXPECT_EQ(none.tokens[0].token, 2);
  // Without drafts it is an ordinary step.
  Verdict plain = VerifyDraft(std::span<const float>(logits).first(4), {}, {}, greedy, 10);
  ASSERT_EQ(plain.tokens.size(), 1u);
  EXPECT_EQ(plain.tokens[0].token, 2);
  EXPECT_FLOAT_EQ(plain.tokens[0].logprob,
                  LogSoftmaxAt(std::span<const float>(logits).first(4), 2));
}

// A chi-square statistic of observed counts against expected probabilities.
double ChiSquare(const std::vector<int64_t>& observed, const std::vector<double>& expected) {
  int64_t n = 0;
  for (int64_t o : observed) n += o;
  double chi = 0;
  for (size_t i = 0; i < observed.size(); ++i) {
    const double e = expected[i] * static_cast<double>(n);
    chi += (observed[i] - e) * (observed[i] - e) / e;
  }
  return chi;
}

std::vector<double> Probabilities(std::span<const float> logits, const SamplingParams& params,
                                  size_t vocab) {
  const KeptWeights kept = KeepTokens(logits, params);
  std::vector<double> p(vocab, 0.0);
  for (size_t i = 0; i < kept.tokens.size(); ++i) p[kept.tokens[i]] = kept.weights[i] / kept.total;
  return p;
}

// Sampled requests: two tokens generated with drafts of two, over many seeds, against the target
// (whose per-position logits do not depend on earlier tokens, so the pair's law is p0 x p1).
// The draft is either a point mass (prompt lookup proposes fixed tokens) or a draft model's own
// distribution q. The statistic's threshold is the chi-square quantile of 1 - 1e-6 for 35
// degrees of freedom: a correct sampler fails it with probability 1e-6 over the choice of
// seeds (the seeds are fixed, so the test itself is deterministic). The same statistic of the
// draft's own law must exceed it, so the test can tell a wrong distribution.
TEST(VerifyDraft, SampledOutputHasTheTargetsDistribution) {
  constexpr size_t V = 6;
  constexpr int64_t kSeeds = 40000;
  constexpr double kThreshold = 89.95;  // chi-square(35) at 1 - 1e-6
  const std::vector<std::vector<float>> target_rows = {{0.2f, 1.1f, -0.3f, 0.8f, 0.0f, 0.5f},
                                                       {1.0f, -0.2f, 0.4f, 0.1f, 0.9f, -0.5f},
                                                       {0.3f, 0.3f, 0.3f, 0.3f, 0.3f, 0.3f}};
  const std::vector<float> draft_row = {1.5f, 0.0f, 0.7f, -0.4f, 0.2f, 0.6f};
  for (const SamplingParams params :
       {SamplingParams{.temperature = 1.0f}, SamplingParams{.temperature = 0.7f, .top_k = 5}}) {
    const std::vector<float> logits = Rows(target_rows);
    const std::vector<double> p0 = Probabilities(target_rows[0], params, V);
    const std::vector<double> p1 = Probabilities(target_rows[1], params, V);
    std::vector<double> expected(V * V);
    for (size_t a = 0; a < V; ++a) {
      for (size_t b = 0; b < V; ++b) expected[a * V + b] = p0[a] * p1[b];
    }
    // Cells the top-k cut leaves empty take no part.
    // (Counts in cells of probability 0 make the statistic infinite.)
    auto statistic = [&](const std::vector<int64_t>& counts, const std::vector<double>& law) {
      std::vector<int64_t> o;
      std::vector<double> e;
      for (size_t i = 0; i < counts.size(); ++i) {
        if (law[i] > 0) {
          o.push_back(counts[i]);
          e.push_back(law[i]);
        } else if (counts[i] > 0) {
          return std::numeric_limits<double>::infinity();
        }
      }
      return ChiSquare(o, e);
    };
    for (const bool point_mass : {true, false}) {
      std::vector<int64_t> counts(V * V, 0), draft_counts(V * V, 0);
      const KeptWeights q = KeepTokens(draft_row, params);
      for (int64_t seed = 1; seed <= kSeeds; ++seed) {
        SamplingParams request = params;
        request.seed = static_cast<uint64_t>(seed);
        std::vector<int32_t> draft;
        std::vector<KeptWeights> weights;
        if (point_mass) {
          draft = {3, 4};  // what a lookup proposed, whatever the seed
        } else {
          for (uint64_t i = 0; i < 2; ++i) {
            draft.push_back(DrawFrom(q, SamplingUniform(request.seed, 100 + i, kDraftStream)));
            weights.push_back(q);
          }
        }
        const Verdict verdict = VerifyDraft(logits, draft, weights, request, 100);
        int32_t first = verdict.tokens[0].token;
        // The second token: the verdict's, or the next ordinary step's after a rejection.
        int32_t second = verdict.tokens.size() > 1
                             ? verdict.tokens[1].token
                             : SampleToken(target_rows[1], request, 101).token;
        ++counts[first * V + second];
        ++draft_counts[draft[0] * V + draft[1]];
      }
      const double chi = statistic(counts, expected);
      std::cout << (point_mass ? "point-mass" : "model") << " draft, top_k " << params.top_k
                << ": chi-square " << chi << " (threshold " << kThreshold << ")\n";
      EXPECT_LT(chi, kThreshold) << (point_mass ? "point-mass" : "model") << " draft, top_k "
                                 << params.top_k;
      if (!point_mass) {
        // The draft's own law is far from the target's: the statistic sees it.
        EXPECT_GT(statistic(draft_counts, expected), 10 * kThreshold);
      }
    }
  }
}

// ---- Drafted rows in the engine ------------------------------------------------------------

class SpeculativeEngineTest : public ::testing::TestWithParam<const char*> {};

// Every float of a state's rings and of its pages over [0, positions).
struct Snapshot {
  std::vector<float> producer, consumer, pages;
};

Snapshot Take(const SequenceState& state, int64_t positions) {
  const StateLayout& l = state.layout();
  Snapshot s;
  s.producer.assign(state.producer_swa(), state.producer_swa() + l.producer_swa_floats());
  s.consumer.assign(state.consumer_swa(), state.consumer_swa() + l.consumer_swa_floats());
  const int64_t pages = (positions + l.block_size - 1) / l.block_size;
  for (int64_t p = 0; p < pages; ++p) {
    const float* page = state.pages()[p];
    for (int64_t g = 0; g < l.block_kv_groups; ++g) {
      for (const int64_t offset : {l.page_k_offset(g), l.page_v_offset(g)}) {
        // Only the rows of positions < `positions`.
        const int64_t rows = std::min(l.block_size, positions - p * l.block_size);
        s.pages.insert(s.pages.end(), page + offset, page + offset + rows * l.kv_dim);
      }
    }
  }
  return s;
}

// The ring floats of every slot except `skip` (slots a rejected draft wrote), all layers.
std::vector<float> RingsExcept(const std::vector<float>& rings, const StateLayout& l,
                               int64_t layers, const std::vector<int64_t>& skip) {
  std::vector<float> out;
  for (int64_t layer = 0; layer < layers; ++layer) {
    for (const int64_t base : {l.ring_k_offset(layer), l.ring_v_offset(layer)}) {
      for (int64_t slot = 0; slot < l.ring_capacity; ++slot) {
        if (std::find(skip.begin(), skip.end(), slot) != skip.end()) continue;
        const float* row = rings.data() + base + slot * l.kv_dim;
        out.insert(out.end(), row, row + l.kv_dim);
      }
    }
  }
  return out;
}

float MaxDifference(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  float worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
  }
  return worst;
}

// For k = max_backtrack drafts and a rejection at every offset j (j = k: all accepted), after a
// prompt whose rings have wrapped several times, in off and compact truncation and after a
// prefix hit (s_valid > 0): the verify step's rows 0..j equal one-token steps' logits, the rings
// after the backtrack equal a plain run's in every slot no rejected row wrote, and C more plain
// steps later the rings and pages equal it everywhere (every stale slot was written again before
// anything read it).
TEST_P(SpeculativeEngineTest, DraftedRowsEqualOneTokenStepsAndRejectionsLeaveThePlainRunsState) {
  ModelConfig config = *PresetConfig("tiny");
  const std::string variant = GetParam();
  if (variant == "shared") config.block_kv_sources = {4, 6};
  if (variant == "share-hidden") config.yoco_swa_share_hidden = true;
  const std::string dir = baton::testing::ProcessTempDir() + "/spec_" + variant;
  ASSERT_TRUE(MakeModel(config, 11, dir, Dtype::kF32).ok());
  auto loaded = LoadEngine(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Engine& engine = **loaded;
  const ModelConfig& c = engine.config();
  const int64_t V = c.vocab_size, C = c.ring_capacity(), k = c.max_backtrack;
  const StateLayout layout = engine.state_layout();
  ASSERT_EQ(C, c.sliding_window + k + 1);
  std::mt19937_64 rng(5);
  std::vector<int32_t> prompt(3 * C + 7);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % V);

  struct Case {
    TruncationMode mode;
    int64_t keep;
    int64_t s_valid;
  };
  for (const Case& tc : {Case{TruncationMode::kOff, 0, 0}, Case{TruncationMode::kCompact, C, 0},
                         Case{TruncationMode::kMask, C + 3, 32}}) {
    const PrefillOptions options{.mode = tc.mode, .keep = tc.keep, .s_valid = tc.s_valid};
    // A plain run: greedy one-token steps, its logits and state after each.
    auto fresh = [&] {
      auto state = std::make_unique<SequenceState>(layout);
      auto r = engine.Prefill(prompt, options, *state);
      EXPECT_TRUE(r.ok()) << r.status();
      return std::make_pair(
          std::move(state),
          r.ok() ? Argmax({r->logits.data() + r->logits.size() - V, static_cast<size_t>(V)}) : 0);
    };
    auto step = [&](SequenceState& state, int32_t token, std::vector<float>& row) {
      row.resize(V);
      const DecodeItem item{.state = &state, .token = token, .logits = row.data()};
      EXPECT_TRUE(engine.Decode({&item, 1}).ok());
      return Argmax(row);
    };
    // Plain: decode `warm` tokens, then the k + 1 + C + 2 tokens the comparisons cover.
    const int64_t warm = C + 3;  // the decode positions wrap the rings too
    const int64_t span = k + 1 + C + 2;
    auto [plain, next] = fresh();
    std::vector<int32_t> inputs;
    std::vector<std::vector<float>> plain_logits;
    std::map<int64_t, Snapshot> plain_at;  // state by length
    for (int64_t i = 0; i < warm + span; ++i) {
      inputs.push_back(next);
      std::vector<float> row;
      next = step(*plain, next, row);
      plain_logits.push_back(row);
      plain_at[plain->length] = Take(*plain, plain->length);
    }
    for (int64_t j = 0; j <= k; ++j) {
      SCOPED_TRACE(::testing::Message() << TruncationModeName(tc.mode) << " rejection at " << j);
      auto [spec, first] = fresh();
      std::vector<float> row;
      for (int64_t i = 0; i < warm; ++i) step(*spec, inputs[i], row);
      const int64_t t = spec->length;
      // Drafts: the plain run's next k inputs, the one at offset j replaced by another token.
      std::vector<int32_t> draft(inputs.begin() + warm + 1, inputs.begin() + warm + 1 + k);
      if (j < k) draft[j] = (draft[j] + 1) % static_cast<int32_t>(V);
      std::vector<float> rows((k + 1) * V);
      const DecodeItem item{
          .state = spec.get(), .token = inputs[warm], .logits = rows.data(), .draft = draft};
      ASSERT_TRUE(engine.Decode({&item, 1}).ok());
      ASSERT_EQ(spec->length, t + k + 1);
      // Rows 0..j saw only accepted tokens: the plain run's logits at those positions.
      for (int64_t r = 0; r <= j; ++r) {
        EXPECT_LT(
            MaxDifference({rows.data() + r * V, static_cast<size_t>(V)}, plain_logits[warm + r]),
            1e-5f)
            << "row " << r;
      }
      // The rejected rows are taken back.
      spec->length = t + j + 1;
      std::vector<int64_t> stale;
      for (int64_t p = t + j + 1; p <= t + k; ++p) stale.push_back(p % C);
      const Snapshot now = Take(*spec, spec->length);
      const Snapshot& want = plain_at.at(spec->length);
      EXPECT_LT(MaxDifference(RingsExcept(now.producer, layout, layout.producer_layers, stale),
                              RingsExcept(want.producer, layout, layout.producer_layers, stale)),
                1e-5f);
      EXPECT_LT(MaxDifference(RingsExcept(now.consumer, layout, layout.consumer_layers, stale),
                              RingsExcept(want.consumer, layout, layout.consumer_layers, stale)),
                1e-5f);
      EXPECT_LT(MaxDifference(now.pages, want.pages), 1e-5f);
      // The plain run's tokens from here on: the same logits, then the same state everywhere.
      for (int64_t i = warm + j + 1; i < warm + span; ++i) {
        step(*spec, inputs[i], row);
        EXPECT_LT(MaxDifference(row, plain_logits[i]), 1e-5f) << "step " << i;
      }
      const Snapshot after = Take(*spec, spec->length);
      const Snapshot& plain_after = plain_at.at(spec->length);
      EXPECT_LT(MaxDifference(after.producer, plain_after.producer), 1e-5f);
      EXPECT_LT(MaxDifference(after.consumer, plain_after.consumer), 1e-5f);
      EXPECT_LT(MaxDifference(after.pages, plain_after.pages), 1e-5f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, SpeculativeEngineTest,
                         ::testing::Values("tiny", "shared", "share-hidden"));

TEST(SpeculativeEngine, MoreDraftsThanMaxBacktrackAreRefusedByName) {
  const ModelConfig config = *PresetConfig("tiny");
  const std::string dir = baton::testing::ProcessTempDir() + "/spec_refuse";
  ASSERT_TRUE(MakeModel(config, 3, dir, Dtype::kF32).ok());
  auto engine = LoadEngine(dir);
  ASSERT_TRUE(engine.ok());
  SequenceState state((*engine)->state_layout());
  ASSERT_TRUE((*engine)->Prefill(std::vector<int32_t>{1, 2, 3}, {}, state).ok());
  const std::vector<int32_t> draft(config.max_backtrack + 1, 4);
  std::vector<float> logits((draft.size() + 1) * config.vocab_size);
  const DecodeItem item{.state = &state, .token = 5, .logits = logits.data(), .draft = draft};
  const absl::Status s = (*engine)->Decode({&item, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_backtrack"), std::string::npos) << s;
  EXPECT_EQ(state.length, 3);  // nothing appended
}

}  // namespace
}  // namespace baton::model
