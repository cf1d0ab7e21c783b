// The decode node's speculation: the flags and the per-request override, the cost fit and the
// pricing of drafts, and a draft model's state kept in step with what the target accepted.
#include "baton/decode_node/speculation.h"

#include <random>

#include "baton/model/engine_factory.h"
#include "baton/model/model_factory.h"
#include "baton/model/speculative.h"
#include "gtest/gtest.h"
#include "test_dir.h"

namespace baton::decode_node {
namespace {

TEST(ParseSpeculative, AcceptsTheDraftersAndRefusesTheRestByName) {
  const ModelConfig tiny = *model::PresetConfig("tiny");  // max_backtrack 5
  auto off = ParseSpeculative("off", 0, SpeculativePolicy::kCost, tiny);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->drafter, Drafter::kOff);
  EXPECT_EQ(off->tokens, 5);  // 0: max_backtrack
  auto draft = ParseSpeculative("draft:/models/d", 3, SpeculativePolicy::kAcceptance, tiny);
  ASSERT_TRUE(draft.ok());
  EXPECT_EQ(draft->drafter, Drafter::kDraft);
  EXPECT_EQ(draft->draft_dir, "/models/d");
  EXPECT_EQ(draft->tokens, 3);
  EXPECT_FALSE(draft->price_drafts);
  EXPECT_STREQ(SpeculativePolicyName(SpeculativePolicy::kCost), "cost");
  EXPECT_STREQ(SpeculativePolicyName(SpeculativePolicy::kAcceptance), "acceptance");
  for (const auto& [value, tokens, field] :
       std::vector<std::tuple<std::string, int64_t, std::string>>{
           {"eagle", 0, "--speculative:"},
           {"draft:", 0, "--speculative:"},
           {"ngram", 6, "--speculative-tokens:"},
           {"ngram", -1, "--speculative-tokens:"}}) {
    auto bad = ParseSpeculative(value, tokens, SpeculativePolicy::kCost, tiny);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_EQ(bad.status().message().rfind(field, 0), 0u) << bad.status();
  }
}

TEST(SpeculationFor, TheRequestOverridesTheNode) {
  SpeculativeConfig node{.drafter = Drafter::kNgram, .tokens = 4};
  v1::SamplingParams sampling;
  auto s = SpeculationFor(sampling, node, false);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->drafter, Drafter::kNgram);
  EXPECT_EQ(s->max_tokens, 4);
  sampling.set_speculative(v1::SPECULATIVE_OFF);
  EXPECT_EQ(SpeculationFor(sampling, node, false)->drafter, Drafter::kOff);
  sampling.set_speculative(v1::SPECULATIVE_NGRAM);
  sampling.set_speculative_tokens(2);
  s = SpeculationFor(sampling, {.drafter = Drafter::kDraft, .tokens = 5}, true);
  EXPECT_EQ(s->drafter, Drafter::kNgram);
  EXPECT_EQ(s->max_tokens, 2);
  sampling.set_speculative(v1::SPECULATIVE_DRAFT);
  auto refused = SpeculationFor(sampling, node, false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("sampling.speculative"), std::string::npos);
  EXPECT_EQ(SpeculationFor(sampling, node, true)->drafter, Drafter::kDraft);
}

// Where the operator turned speculative decoding off, a request cannot turn it on: either
// method is refused by name (even with a draft model loaded), and off or the default is served.
TEST(SpeculationFor, ARequestCannotEnableWhatTheOperatorTurnedOff) {
  const SpeculativeConfig off{.drafter = Drafter::kOff, .tokens = 5};
  v1::SamplingParams sampling;
  for (v1::Speculative method : {v1::SPECULATIVE_NGRAM, v1::SPECULATIVE_DRAFT}) {
    sampling.set_speculative(method);
    for (bool has_draft_model : {false, true}) {
      auto refused = SpeculationFor(sampling, off, has_draft_model);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition)
          << v1::Speculative_Name(method);
      EXPECT_NE(refused.status().message().find("sampling.speculative"), std::string::npos);
    }
  }
  for (v1::Speculative method : {v1::SPECULATIVE_OFF, v1::SPECULATIVE_DEFAULT}) {
    sampling.set_speculative(method);
    auto served = SpeculationFor(sampling, off, false);
    ASSERT_TRUE(served.ok()) << served.status();
    EXPECT_EQ(served->drafter, Drafter::kOff);
  }
}

TEST(ProposeByLookup, SearchesTheLastWindowOfTheContextOnly) {
  const SpeculativeConfig config{.drafter = Drafter::kNgram, .tokens = 3};
  // The suffix (8, 9) and what followed it, then filler (ids 10..) that repeats no pair.
  std::vector<int32_t> context = {8, 9, 5, 6, 7};
  auto propose = [&](std::vector<int32_t> ctx) {
    Speculation s{.drafter = Drafter::kNgram, .max_tokens = 3};
    DraftJob job{.context = &ctx, .speculation = &s, .tokens = 3};
    ProposeByLookup(config, job);
    return s.draft;
  };
  std::vector<int32_t> near = context;
  for (int32_t i = 0; i < 100; ++i) near.push_back(10 + i);
  near.insert(near.end(), {8, 9});
  EXPECT_EQ(propose(near), (std::vector<int32_t>{5, 6, 7}));
  std::vector<int32_t> far = context;
  for (int32_t i = 0; static_cast<size_t>(i) < kLookupWindow; ++i) far.push_back(10 + i);
  far.insert(far.end(), {8, 9});
  EXPECT_TRUE(propose(far).empty()) << "a match before the window is not searched";
}

TEST(CostFit, FindsTheLineThroughStepsThatOtherWorkSlowed) {
  CostFit fit;
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200; ++i) {
    const double rows = 8 + static_cast<double>(rng() % 6);
    double seconds = 0.002 + 0.0005 * rows;
    if (i % 10 == 3) seconds *= 8;  // a prefill ran beside this step
    fit.Add(rows, seconds);
  }
  ASSERT_TRUE(fit.ready());
  EXPECT_NEAR(fit.per_row(), 0.0005, 1e-9);
  EXPECT_NEAR(fit.fixed(), 0.002, 1e-9);
  CostFit same_rows;
  for (int i = 0; i < 64; ++i) same_rows.Add(8, 0.004);
  EXPECT_FALSE(same_rows.ready()) << "one size of step cannot tell the terms apart";
}

// A fit of steps costing `fixed` plus `per_row` a row, at 1 to 6 rows.
DraftCosts Costs(double fixed, double per_row, double draft_share = 0) {
  DraftCosts costs;
  for (int i = 0; i < 64; ++i) costs.target.Add(1 + i % 6, fixed + per_row * (1 + i % 6));
  for (int i = 0; i < 8; ++i) costs.AddDraftRound(draft_share, 1);
  return costs;
}

Speculation WithAcceptance(Drafter drafter, int accepted, int rejected) {
  Speculation s{.drafter = drafter, .max_tokens = 5, .next = 5};
  for (int i = 0; i < accepted; ++i) s.Adapt(1, 1);
  for (int i = 0; i < rejected; ++i) s.Adapt(1, 0);
  return s;
}

TEST(SpeculationPlan, DraftsWhatPaysForItself) {
  // Rows are nearly free (a step reads the weights once, whatever its rows).
  const DraftCosts cheap_rows = Costs(0.004, 0.00005);
  Speculation good = WithAcceptance(Drafter::kNgram, 40, 2);
  EXPECT_EQ(good.Plan(cheap_rows, 1, 5), 5);
  EXPECT_EQ(good.Plan(cheap_rows, 1, 2), 2) << "never past the tokens the request has left";
  // Rows cost as much as the step's fixed part: a poor acceptance drafts nothing but a probe.
  const DraftCosts dear_rows = Costs(0.001, 0.001);
  Speculation poor = WithAcceptance(Drafter::kNgram, 2, 40);
  int64_t drafted = 0;
  for (int step = 0; step < 10 * kProbeSteps; ++step) drafted += poor.Plan(dear_rows, 1, 5);
  EXPECT_EQ(drafted, 10) << "one token every kProbeSteps steps";
  // A draft model whose round costs as much as a step never pays: it is dropped.
  Speculation model = WithAcceptance(Drafter::kDraft, 20, 20);
  EXPECT_EQ(model.Plan(Costs(0.001, 0.0001, 0.0011), 1, 5), 0);
  EXPECT_EQ(model.drafter, Drafter::kOff);
  EXPECT_TRUE(model.draft_unavailable);
  // Without pricing, a request always drafts by its acceptance.
  Speculation unpriced = WithAcceptance(Drafter::kNgram, 2, 40);
  unpriced.price_drafts = false;
  EXPECT_GE(unpriced.Plan(dear_rows, 1, 5), 1);
}

// A tiny model drafting for itself through DraftModel (the draft's weights are the target's),
// so every greedy draft is the target's own next token.
struct SelfDrafting {
  void Make(const std::string& dir) {
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 4, dir).ok());
    auto loaded = model::LoadEngine(dir);
    ASSERT_TRUE(loaded.ok());
    target = *std::move(loaded);
    auto drafting = DraftModel::Load(dir, dir, *target, {}, 5);
    ASSERT_TRUE(drafting.ok()) << drafting.status();
    draft = *std::move(drafting);
  }
  std::unique_ptr<model::Engine> target;
  std::unique_ptr<DraftModel> draft;
};

// The target drafting for itself through DraftModel: the draft state follows what was accepted,
// so every greedy draft is the target's own next token and stands, over several steps and a
// rejection forced by hand.
TEST(DraftModel, ItsStateFollowsTheAcceptedTokens) {
  const std::string dir = baton::testing::ProcessTempDir() + "/draft_self";
  SelfDrafting self;
  ASSERT_NO_FATAL_FAILURE(self.Make(dir));
  model::Engine& engine = *self.target;
  DraftModel* const draft = self.draft.get();
  const int64_t V = engine.config().vocab_size;
  std::vector<int32_t> context = {5, 9, 14, 2, 77, 31, 8};
  model::SequenceState state(engine.state_layout());
  auto prefilled = engine.Prefill(std::span(context).first(context.size() - 1), {}, state);
  ASSERT_TRUE(prefilled.ok());
  Speculation s{.drafter = Drafter::kDraft, .max_tokens = 5, .next = 5};
  int64_t accepted_total = 0, drafted_total = 0;
  for (int step = 0; step < 12; ++step) {
    DraftJob job{.context = &context, .speculation = &s, .tokens = 1 + step % 5};
    ASSERT_TRUE(draft->Propose({&job, 1}, int64_t{1} << 20).ok());
    ASSERT_EQ(static_cast<int64_t>(s.draft.size()), job.tokens);
    std::vector<int32_t> proposal = s.draft;
    if (step == 5) proposal[0] = (proposal[0] + 1) % V;  // a rejection at offset 0
    std::vector<float> logits((1 + proposal.size()) * V);
    const model::DecodeItem item{
        .state = &state, .token = context.back(), .logits = logits.data(), .draft = proposal};
    ASSERT_TRUE(engine.Decode({&item, 1}).ok());
    const model::Verdict verdict = model::VerifyDraft(logits, proposal, {}, {}, 0);
    if (step != 5) EXPECT_EQ(verdict.accepted, job.tokens) << "step " << step;
    state.length -= static_cast<int64_t>(proposal.size()) - verdict.accepted;
    const int64_t before = static_cast<int64_t>(context.size());
    for (const model::SampledToken& t : verdict.tokens) context.push_back(t.token);
    DraftModel::Settle(s, before, static_cast<int64_t>(proposal.size()), verdict.accepted);
    accepted_total += verdict.accepted;
    drafted_total += static_cast<int64_t>(proposal.size());
  }
  EXPECT_EQ(accepted_total, drafted_total - 1);
}

// A long prompt is taken in a piece per call, never more than the call's budget of rows, and
// drafting starts once it has caught up. The target drafting for itself shows that the state
// built piece by piece is exact: every greedy draft is the target's own next token.
TEST(DraftModel, ALongPromptIsTakenInWithinEachCallsBudget) {
  const std::string dir = baton::testing::ProcessTempDir() + "/draft_pieces";
  SelfDrafting self;
  ASSERT_NO_FATAL_FAILURE(self.Make(dir));
  model::Engine& engine = *self.target;
  DraftModel* const draft = self.draft.get();
  const int64_t V = engine.config().vocab_size;
  // Past the tiny preset's rings (W = 16), so the pieces wrap them.
  std::vector<int32_t> context;
  for (int32_t i = 0; i < 61; ++i) context.push_back(5 + (i * 37) % static_cast<int32_t>(V - 8));
  Speculation s{.drafter = Drafter::kDraft, .max_tokens = 5, .next = 5};
  constexpr int64_t kBudget = 7;
  int64_t calls = 0, taken = 0;
  DraftJob job;
  do {
    ASSERT_LT(calls, 60) << "never caught up";
    job = {.context = &context, .speculation = &s, .tokens = 3};
    ProposeStats stats;
    ASSERT_TRUE(draft->Propose({&job, 1}, kBudget, &stats).ok());
    EXPECT_LE(stats.context_rows, kBudget) << "call " << calls;
    taken += stats.context_rows;
    ++calls;
  } while (s.draft.empty());
  // All but the rows the first drafting round feeds (at most 1 + max_backtrack) were taken in,
  // a budget at a time.
  EXPECT_GE(taken, static_cast<int64_t>(context.size()) - 6);
  EXPECT_GE(calls, (static_cast<int64_t>(context.size()) - 6) / kBudget);
  ASSERT_EQ(static_cast<int64_t>(s.draft.size()), job.tokens);
  model::SequenceState state(engine.state_layout());
  ASSERT_TRUE(engine.Prefill(std::span(context).first(context.size() - 1), {}, state).ok());
  std::vector<float> logits((1 + s.draft.size()) * V);
  const model::DecodeItem item{
      .state = &state, .token = context.back(), .logits = logits.data(), .draft = s.draft};
  ASSERT_TRUE(engine.Decode({&item, 1}).ok());
  EXPECT_EQ(model::VerifyDraft(logits, s.draft, {}, {}, 0).accepted, job.tokens);
}

}  // namespace
}  // namespace baton::decode_node
