// The replay-on-decode split in the engine (DESIGN section 6): a prefill engine that holds the
// producers only hands over boundary rows, and a full engine replays the consumer layers over
// them in pieces, inside decode steps of other requests. The tokens must be prefill-all's: the
// logits agree with one full prefill and with the double-precision reference in every
// truncation mode, after prefix hits, for any piece sizes, and decode continues identically.
#include <cstring>
#include <map>
#include <random>

#include "baton/model/engine_factory.h"
#include "baton/model/model_factory.h"
#include "ced_reference.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "relative_error.h"
#include "test_dir.h"

namespace baton::model {
namespace {

using ::testing::HasSubstr;

std::vector<int32_t> RandomTokens(std::mt19937_64& rng, int64_t n, int64_t vocab) {
  std::vector<int32_t> tokens(n);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % vocab);
  return tokens;
}

struct Variant {
  const char* name;
  ModelConfig config;
};

std::vector<Variant> Variants() {
  ModelConfig tiny = *PresetConfig("tiny");
  ModelConfig variant = tiny;  // GQA, untied lm_head, SWA from the shared rows
  variant.num_key_value_heads = 2;
  variant.tie_word_embeddings = false;
  variant.yoco_swa_share_hidden = true;
  ModelConfig shared = tiny;  // one block-KV source for every consumer layer
  shared.block_kv_sources = {4};
  return {{"tiny", tiny}, {"variant", variant}, {"shared", shared}};
}

class ReplayOnDecodeTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    const Variant v = Variants()[GetParam()];
    dir_ = baton::testing::ProcessTempDir() + "/replay_" + v.name;
    ASSERT_TRUE(MakeModel(v.config, 13, dir_, Dtype::kF32).ok());
    auto full = LoadEngine(dir_);
    ASSERT_TRUE(full.ok()) << full.status();
    full_ = *std::move(full);
    auto producers = LoadEngine(dir_, Device::kCpu, WeightType::kFp32, HeldLayers::kProducers);
    ASSERT_TRUE(producers.ok()) << producers.status();
    producers_ = *std::move(producers);
  }

  std::string dir_;
  std::unique_ptr<Engine> full_, producers_;
};

// The prompt's state after a replay-on-decode prefill: what the prefill node computed and the
// decode node pulled (block KV and producer rings), the boundary rows, and the replay's plan.
struct Handover {
  std::unique_ptr<SequenceState> state;
  std::vector<float> boundary;
  TruncationSpec spec;
};

Handover PrefillProducers(Engine& producers, const std::vector<int32_t>& prompt,
                          TruncationMode mode, int64_t keep, int64_t s_valid, int64_t chunk) {
  const ModelConfig& c = producers.config();
  const int64_t L = static_cast<int64_t>(prompt.size());
  Handover h;
  h.boundary.resize(BoundaryRowCount(L, mode, keep, s_valid) * c.hidden_size);
  SequenceState prefill_state(producers.state_layout());
  auto result = producers.Prefill(prompt,
                                  {.mode = mode,
                                   .keep = keep,
                                   .s_valid = s_valid,
                                   .chunk_size = chunk,
                                   .boundary_rows = h.boundary},
                                  prefill_state);
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return h;
  EXPECT_TRUE(result->positions.empty());
  EXPECT_EQ(result->consumer_rows, BoundaryRowCount(L, mode, keep, s_valid));
  // The transfer: block KV and producer rings into the decode node's state.
  h.state = std::make_unique<SequenceState>(producers.state_layout());
  EXPECT_TRUE(h.state->EnsurePages(L).ok());
  for (const StageCopy& copy : StateCopies(prefill_state, *h.state, L)) {
    std::memcpy(copy.dst, copy.src, copy.bytes);
  }
  h.state->length = L;
  h.state->s_valid = s_valid;
  h.spec = *ReplaySpec(c, L, mode, keep, s_valid);
  return h;
}

TEST_P(ReplayOnDecodeTest, ReplayInPiecesGivesThePrefillAllLogitsInEveryMode) {
  const ModelConfig& c = full_->config();
  const testing::CedReference reference(dir_, c);
  const int64_t C = c.ring_capacity(), V = c.vocab_size;
  std::mt19937_64 rng(17 + GetParam());
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t L = trial % 4 == 1 ? 120 + static_cast<int64_t>(rng() % 80)
                                     : 3 + static_cast<int64_t>(rng() % 60);
    const auto mode = static_cast<TruncationMode>(trial % 3);
    const int64_t keep = mode == TruncationMode::kOff ? 0 : C + static_cast<int64_t>(rng() % 20);
    const int64_t s_valid = trial % 4 == 3 ? static_cast<int64_t>(rng() % L) : 0;
    const int64_t chunk = static_cast<int64_t>(rng() % (L + 1));
    const int64_t budget = 1 + static_cast<int64_t>(rng() % 40);  // replay rows per step
    const bool all_logits = mode == TruncationMode::kOff;         // prompt logprobs
    const auto prompt = RandomTokens(rng, L, V);
    const auto continuation = RandomTokens(rng, 3, V);
    SCOPED_TRACE(::testing::Message()
                 << "L=" << L << " mode=" << TruncationModeName(mode) << " K=" << keep
                 << " s_valid=" << s_valid << " chunk=" << chunk << " budget=" << budget);

    // Prefill-all: one engine runs every layer.
    SequenceState all_state(full_->state_layout());
    auto all = full_->Prefill(prompt,
                              {.mode = mode,
                               .keep = keep,
                               .s_valid = s_valid,
                               .chunk_size = chunk,
                               .result_logits = all_logits},
                              all_state);
    ASSERT_TRUE(all.ok()) << all.status();
    std::map<int64_t, std::vector<float>> expected;
    for (size_t r = 0; r < all->positions.size(); ++r) {
      expected[all->positions[r]].assign(all->logits.begin() + r * V,
                                         all->logits.begin() + (r + 1) * V);
    }

    // Replay-on-decode: producers here, consumers on the "decode node" in pieces of `budget`
    // rows, each in a step beside a decode row of an unrelated request.
    Handover h = PrefillProducers(*producers_, prompt, mode, keep, s_valid, chunk);
    ASSERT_NE(h.state, nullptr);
    const int64_t begin = h.spec.s_valid;
    ASSERT_EQ(begin, mode == TruncationMode::kOff ? s_valid : std::max(s_valid, L - keep));
    SequenceState other(full_->state_layout());
    const auto other_prompt = RandomTokens(rng, 9, V);
    ASSERT_TRUE(full_->Prefill(other_prompt, {}, other).ok());
    std::map<int64_t, std::vector<float>> replayed;
    for (int64_t q = begin; q < L; q += budget) {
      ReplayItem item{.state = h.state.get(),
                      .spec = h.spec,
                      .q_start = q,
                      .rows = std::min(budget, L - q),
                      .boundary = h.boundary.data() + (q - begin) * c.hidden_size,
                      .all_logits = all_logits};
      std::vector<float> piece(ReplayLogitRows(item) * V), other_logits(V);
      item.logits = piece.data();
      const DecodeItem decode{.state = &other, .token = 1, .logits = other_logits.data()};
      ASSERT_TRUE(full_->Step({&decode, 1}, {&item, 1}).ok());
      for (int64_t r = 0; r < ReplayLogitRows(item); ++r) {
        const int64_t pos = all_logits ? q + r : L - 1;
        replayed[pos].assign(piece.begin() + r * V, piece.begin() + (r + 1) * V);
      }
    }
    EXPECT_EQ(h.state->length, L);  // a replay leaves the length to the node

    // The same result rows (the last row; every row from s_valid under off).
    ASSERT_EQ(replayed.size(), all_logits ? static_cast<size_t>(L - s_valid) : 1u);
    std::vector<int32_t> tokens = prompt;
    tokens.insert(tokens.end(), continuation.begin(), continuation.end());
    const auto ref = reference.Run(tokens, L, mode != TruncationMode::kOff, keep, s_valid);
    for (const auto& [pos, row] : replayed) {
      ASSERT_TRUE(expected.contains(pos)) << "pos " << pos;
      EXPECT_LT(RelativeError(row, expected.at(pos)), 1e-5) << "pos " << pos;
      EXPECT_LT(RelativeError(row, ref.logits[pos]), 1e-4) << "pos " << pos;
    }
    // Decode continues from the replayed rings exactly as from prefill-all's.
    for (int32_t token : continuation) {
      std::vector<float> a(V), b(V);
      const int64_t pos = all_state.length;
      const DecodeItem da{.state = &all_state, .token = token, .logits = a.data()};
      const DecodeItem db{.state = h.state.get(), .token = token, .logits = b.data()};
      ASSERT_TRUE(full_->Decode({&da, 1}).ok());
      ASSERT_TRUE(full_->Decode({&db, 1}).ok());
      EXPECT_LT(RelativeError(b, a), 1e-5) << "decode pos " << pos;
      EXPECT_LT(RelativeError(b, ref.logits[pos]), 1e-4) << "decode pos " << pos;
      EXPECT_EQ(Argmax(b), Argmax(a));
    }
  }
}

TEST_P(ReplayOnDecodeTest, TheProducersEngineHoldsLessAndOnlyPrefillsIntoBoundaryRows) {
  EXPECT_EQ(producers_->held_layers(), HeldLayers::kProducers);
  EXPECT_EQ(full_->held_layers(), HeldLayers::kAll);
  EXPECT_GT(producers_->weight_bytes(), 0);
  EXPECT_LT(producers_->weight_bytes(), full_->weight_bytes());
  EXPECT_EQ(producers_->fingerprint(), full_->fingerprint());  // one model on both sides

  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7};
  SequenceState state(producers_->state_layout());
  auto no_rows = producers_->Prefill(prompt, {}, state);
  EXPECT_EQ(no_rows.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_rows.status().message(), HasSubstr("boundary rows"));

  std::vector<float> short_rows(3 * full_->config().hidden_size);
  auto wrong = producers_->Prefill(prompt, {.boundary_rows = short_rows}, state);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("boundary_rows"));
  EXPECT_EQ(state.length, 0);

  std::vector<float> logits(full_->config().vocab_size);
  const DecodeItem item{.state = &state, .token = 1, .logits = logits.data()};
  EXPECT_EQ(producers_->Decode({&item, 1}).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(ReplayOnDecodeTest, ReplayPiecesOutsideTheReplayRangeAreRefusedByItem) {
  const ModelConfig& c = full_->config();
  const std::vector<int32_t> prompt(40, 3);
  const int64_t keep = c.ring_capacity();
  Handover h = PrefillProducers(*producers_, prompt, TruncationMode::kCompact, keep, 0, 0);
  ASSERT_NE(h.state, nullptr);
  const int64_t begin = h.spec.s_valid;
  ASSERT_EQ(begin, 40 - keep);
  std::vector<float> logits(c.vocab_size);
  auto step = [&](int64_t q_start, int64_t rows) {
    const ReplayItem item{.state = h.state.get(),
                          .spec = h.spec,
                          .q_start = q_start,
                          .rows = rows,
                          .boundary = h.boundary.data(),
                          .logits = logits.data()};
    return full_->Step({}, {&item, 1});
  };
  for (auto [q, rows] : {std::pair<int64_t, int64_t>{begin - 1, 2}, {begin, 0}, {39, 2}}) {
    const absl::Status s = step(q, rows);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << q << "+" << rows;
    EXPECT_THAT(s.message(), HasSubstr("replay item 0"));
  }
  // A state that does not hold the prompt yet (nothing staged in) cannot replay.
  h.state->length = 0;
  EXPECT_THAT(step(begin, 1).message(), HasSubstr("staged in"));
}

INSTANTIATE_TEST_SUITE_P(Models, ReplayOnDecodeTest, ::testing::Values(0, 1, 2),
                         [](const auto& info) { return std::string(Variants()[info.param].name); });

}  // namespace
}  // namespace baton::model
