// The CED forward pass against the double-precision reference, and the model-level exactness
// facts of DESIGN section 3 (compact = mask on retained rows; K >= R exact; K = R - 1 not).
#include <iostream>
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

struct Variant {
  const char* name;
  ModelConfig config;
  Dtype dtype;
};

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ModelConfig tiny = *PresetConfig("tiny");
    // GQA with two query heads per KV head, untied lm_head, SWA from the shared rows, BF16.
    ModelConfig variant = tiny;
    variant.num_key_value_heads = 2;
    variant.tie_word_embeddings = false;
    variant.yoco_swa_share_hidden = true;
    // Block KV in two groups (block_kv_sources): layers 4 and 5 read layer 4's, 6 and 7 layer 6's.
    ModelConfig shared = tiny;
    shared.block_kv_sources = {4, 6};
    variants_ = new std::vector<Variant>{{"tiny", tiny, Dtype::kF32},
                                         {"variant", variant, Dtype::kBF16},
                                         {"shared", shared, Dtype::kF32}};
    models_ = new std::vector<std::unique_ptr<Engine>>();
    for (const Variant& v : *variants_) {
      const std::string dir = baton::testing::ProcessTempDir() + "/ced_" + v.name;
      ASSERT_TRUE(MakeModel(v.config, 7, dir, v.dtype).ok());
      auto model = LoadEngine(dir);
      ASSERT_TRUE(model.ok()) << model.status();
      models_->push_back(*std::move(model));
    }
  }
  static void TearDownTestSuite() {
    delete models_;
    delete variants_;
  }
  static Engine& tiny() { return *(*models_)[0]; }
  static std::string ModelDir(size_t i) {
    return baton::testing::ProcessTempDir() + "/ced_" + (*variants_)[i].name;
  }

  static std::vector<int32_t> RandomTokens(std::mt19937_64& rng, int64_t n, int64_t vocab) {
    std::vector<int32_t> tokens(n);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % vocab);
    return tokens;
  }

  // Prefill, then decode `continuation` teacher-forced; returns logits by position.
  static std::map<int64_t, std::vector<float>> Run(Engine& model,
                                                   const std::vector<int32_t>& prompt,
                                                   const PrefillOptions& options,
                                                   const std::vector<int32_t>& continuation = {}) {
    SequenceState state(model.state_layout());
    auto result = model.Prefill(prompt, options, state);
    EXPECT_TRUE(result.ok()) << result.status();
    std::map<int64_t, std::vector<float>> logits;
    if (!result.ok()) return logits;
    const int64_t V = model.config().vocab_size;
    for (size_t r = 0; r < result->positions.size(); ++r) {
      logits[result->positions[r]].assign(result->logits.begin() + r * V,
                                          result->logits.begin() + (r + 1) * V);
    }
    for (int32_t token : continuation) {
      std::vector<float> row(V);
      const int64_t pos = state.length;
      const DecodeItem item{.state = &state, .token = token, .logits = row.data()};
      EXPECT_TRUE(model.Decode({&item, 1}).ok());
      logits[pos] = std::move(row);
    }
    return logits;
  }

  static std::vector<Variant>* variants_;
  static std::vector<std::unique_ptr<Engine>>* models_;
};

std::vector<Variant>* EngineTest::variants_ = nullptr;
std::vector<std::unique_ptr<Engine>>* EngineTest::models_ = nullptr;

TEST_F(EngineTest, MatchesReferenceInEveryMode) {
  std::mt19937_64 rng(3);
  for (size_t v = 0; v < models_->size(); ++v) {
    Engine& model = *(*models_)[v];
    const ModelConfig& c = model.config();
    const testing::CedReference reference(ModelDir(v), c);
    const int64_t C = c.ring_capacity();
    for (int trial = 0; trial < 12; ++trial) {
      // Short prompts, and long ones whose chunks take the tiled attention path (>= 64 rows).
      const int64_t L = trial % 4 == 1 ? 150 + static_cast<int64_t>(rng() % 100)
                                       : 3 + static_cast<int64_t>(rng() % 70);
      const auto mode = static_cast<TruncationMode>(trial % 3);
      const int64_t keep = mode == TruncationMode::kOff ? 0 : C + static_cast<int64_t>(rng() % 30);
      const int64_t s_valid = trial % 4 == 3 ? static_cast<int64_t>(rng() % L) : 0;
      const int64_t chunk = static_cast<int64_t>(rng() % (L + 1));
      const std::vector<int32_t> prompt = RandomTokens(rng, L, c.vocab_size);
      const std::vector<int32_t> continuation = RandomTokens(rng, 3, c.vocab_size);
      SCOPED_TRACE(::testing::Message()
                   << (*variants_)[v].name << " L=" << L << " mode=" << TruncationModeName(mode)
                   << " K=" << keep << " s_valid=" << s_valid << " chunk=" << chunk);
      const auto logits = Run(model, prompt,
                              {.mode = mode,
                               .keep = keep,
                               .s_valid = s_valid,
                               .chunk_size = chunk,
                               .result_logits = true},
                              continuation);
      std::vector<int32_t> all = prompt;
      all.insert(all.end(), continuation.begin(), continuation.end());
      const auto expected = reference.Run(all, L, mode != TruncationMode::kOff, keep, s_valid);
      // Result rows: every row >= s_valid, but only retained ones in compact.
      const int64_t first = std::max(s_valid, mode == TruncationMode::kCompact ? L - keep : 0);
      int64_t rows = 0;
      for (int64_t pos = std::max<int64_t>(first, 0); pos < L + 3; ++pos) {
        ASSERT_TRUE(logits.contains(pos)) << "pos " << pos;
        EXPECT_LT(RelativeError(logits.at(pos), expected.logits[pos]), 1e-4) << "pos " << pos;
        ++rows;
      }
      EXPECT_EQ(static_cast<int64_t>(logits.size()), rows);
    }
  }
}

TEST_F(EngineTest, CompactEqualsMaskOnRetainedRows) {
  std::mt19937_64 rng(5);
  const int64_t C = tiny().config().ring_capacity();
  for (int trial = 0; trial < 10; ++trial) {
    const int64_t L = 30 + static_cast<int64_t>(rng() % 60);
    const int64_t keep = C + static_cast<int64_t>(rng() % 10);
    const int64_t chunk = static_cast<int64_t>(rng() % L);
    const auto prompt = RandomTokens(rng, L, tiny().config().vocab_size);
    const auto next = RandomTokens(rng, 2, tiny().config().vocab_size);
    const auto mask = Run(
        tiny(), prompt,
        {.mode = TruncationMode::kMask, .keep = keep, .chunk_size = chunk, .result_logits = true},
        next);
    const auto compact = Run(tiny(), prompt,
                             {.mode = TruncationMode::kCompact,
                              .keep = keep,
                              .chunk_size = chunk,
                              .result_logits = true},
                             next);
    ASSERT_EQ(compact.size(), static_cast<size_t>(std::min(L, keep) + 2));
    for (const auto& [pos, row] : compact) {
      // Rounding apart: a chunk of 64 rows or more takes the tiled GEMM path, whose running
      // softmax sums in another order than the row path a shorter (compact) chunk takes.
      EXPECT_LT(RelativeError(row, mask.at(pos)), 2e-6) << "L=" << L << " pos=" << pos;
    }
  }
}

// Largest relative error, over the last prompt row and one decode step, of compact with
// `keep` against off.
double CompactVersusOff(Engine& model, const std::vector<int32_t>& prompt, int64_t keep,
                        int32_t next) {
  auto run = [&](TruncationMode mode, int64_t k) {
    SequenceState state(model.state_layout());
    auto result = model.Prefill(prompt, {.mode = mode, .keep = k}, state);
    EXPECT_TRUE(result.ok()) << result.status();
    std::vector<float> step(model.config().vocab_size);
    const DecodeItem item{.state = &state, .token = next, .logits = step.data()};
    EXPECT_TRUE(model.Decode({&item, 1}).ok());
    return std::make_pair(result->logits, step);
  };
  const auto off = run(TruncationMode::kOff, 0);
  const auto compact = run(TruncationMode::kCompact, keep);
  return std::max(RelativeError(compact.first, off.first),
                  RelativeError(compact.second, off.second));
}

TEST_F(EngineTest, KeepOfSpanRIsExactAndOneLessIsNot) {
  // A short window keeps R short, so a truncation error is not diluted below float noise by
  // a long context: W = 4, D = 4, max_backtrack 0 gives C = 5 and R = 4 + 3 * 3 = 13, and
  // R - 1 = 12 >= C is a legal keep.
  ModelConfig config = *PresetConfig("tiny");
  config.sliding_window = 4;
  config.max_backtrack = 0;
  // Sharper consumer attention and undamped residual branches let a truncation error carry
  // through the D layers well above float noise.
  CedWeights weights = GenerateWeights(config, 23);
  const int64_t q_floats = config.num_attention_heads * config.head_dim * config.hidden_size;
  for (ConsumerLayerWeights& layer : weights.consumers) {
    for (int64_t i = 0; i < q_floats; ++i) layer.q_swa_kv[i] *= 3.0f;
    for (float& w : layer.o) w *= 4.0f;
  }
  const std::string dir = baton::testing::ProcessTempDir() + "/ced_span";
  ASSERT_TRUE(SaveCedWeights(weights, dir, Dtype::kF32).ok());
  auto model = LoadEngine(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  const int64_t R = c.dependency_span();
  ASSERT_EQ(R, 13);
  ASSERT_GE(R - 1, c.ring_capacity());
  std::mt19937_64 rng(11);
  double worst_exact = 0, best_inexact = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const int64_t L = R + 1 + static_cast<int64_t>(rng() % 12);
    const auto prompt = RandomTokens(rng, L, c.vocab_size);
    const int32_t next = static_cast<int32_t>(rng() % c.vocab_size);
    worst_exact = std::max(worst_exact, CompactVersusOff(**model, prompt, R, next));
    worst_exact = std::max(worst_exact, CompactVersusOff(**model, prompt, R + 3, next));
    best_inexact = std::max(best_inexact, CompactVersusOff(**model, prompt, R - 1, next));
  }
  std::cout << "K >= R: worst relative error " << worst_exact << "; K = R - 1: largest "
            << best_inexact << "\n";
  // K >= R differs only by float rounding (other GEMM shapes); K = R - 1 by far more.
  EXPECT_LT(worst_exact, 2e-5) << "compact with K >= R changed the result";
  EXPECT_GT(best_inexact, 1e-3) << "K = R - 1 never changed the result";
  EXPECT_GT(best_inexact, 100 * worst_exact);
}

TEST_F(EngineTest, OffModeChunkingAndDecodeEqualOnePrefill) {
  std::mt19937_64 rng(13);
  const int64_t V = tiny().config().vocab_size;
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t L = 20 + static_cast<int64_t>(rng() % 60);
    const auto tokens = RandomTokens(rng, L, V);
    const auto whole = Run(tiny(), tokens, {.result_logits = true});
    for (int64_t chunk : {1, 5, 17, 22, 23}) {
      const auto chunked = Run(tiny(), tokens, {.chunk_size = chunk, .result_logits = true});
      for (const auto& [pos, row] : whole) {
        EXPECT_LT(RelativeError(chunked.at(pos), row), 1e-5) << "chunk " << chunk << " pos " << pos;
      }
    }
    // Prefill of n tokens then decode of the rest equals the prefill of all, step by step.
    const int64_t n = 1 + static_cast<int64_t>(rng() % (L - 1));
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + n);
    const std::vector<int32_t> rest(tokens.begin() + n, tokens.end());
    const auto stepped = Run(tiny(), prompt, {.result_logits = true}, rest);
    for (int64_t pos = n; pos < L; ++pos) {
      // Decode row pos consumed token pos: it predicts what the prefill's row pos predicts.
      EXPECT_LT(RelativeError(stepped.at(pos), whole.at(pos)), 1e-5) << "n=" << n << " pos " << pos;
    }
  }
}

std::vector<int32_t> Greedy(Engine& model, const std::vector<int32_t>& prompt, int steps) {
  SequenceState state(model.state_layout());
  auto result = model.Prefill(
      prompt, {.mode = TruncationMode::kCompact, .keep = model.config().ring_capacity()}, state);
  std::vector<float> logits(result->logits);
  std::vector<int32_t> out = {Argmax(logits)};
  for (int i = 1; i < steps; ++i) {
    const DecodeItem item{.state = &state, .token = out.back(), .logits = logits.data()};
    EXPECT_TRUE(model.Decode({&item, 1}).ok());
    out.push_back(Argmax(logits));
  }
  return out;
}

// Streamed result logits (prompt logprobs) are the same rows, in position order, and the
// result keeps only the last one: memory is one chunk's rows, not L x V.
TEST_F(EngineTest, StreamedResultLogitsEqualTheWholeResultAndKeepOnlyTheLastRow) {
  std::mt19937_64 rng(17);
  const int64_t V = tiny().config().vocab_size;
  const auto tokens = RandomTokens(rng, 70, V);
  const auto whole = Run(tiny(), tokens, {.chunk_size = 16, .result_logits = true});
  std::vector<int64_t> seen;
  PrefillOptions options{.chunk_size = 16, .result_logits = true};
  options.on_result_logits = [&](int64_t position, std::span<const float> logits) {
    seen.push_back(position);
    EXPECT_LT(RelativeError(logits, std::span<const float>(whole.at(position))), 1e-6) << position;
  };
  SequenceState state(tiny().state_layout());
  auto result = tiny().Prefill(tokens, options, state);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(seen.size(), whole.size());
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], static_cast<int64_t>(i));
  EXPECT_EQ(result->positions, std::vector<int32_t>{69});
  ASSERT_EQ(result->logits.size(), static_cast<size_t>(V));
  EXPECT_LT(
      RelativeError(std::span<const float>(result->logits), std::span<const float>(whole.at(69))),
      1e-6);
}

TEST_F(EngineTest, CancelledPrefillStopsAtTheNextChunk) {
  std::mt19937_64 rng(19);
  const auto tokens = RandomTokens(rng, 70, tiny().config().vocab_size);
  int asked = 0;
  PrefillOptions options{.chunk_size = 16};
  // Cancelled once two chunks have started: the third never runs.
  options.cancelled = [&] { return ++asked > 2; };
  SequenceState state(tiny().state_layout());
  auto result = tiny().Prefill(tokens, options, state);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
  EXPECT_THAT(std::string(result.status().message()),
              ::testing::HasSubstr("after 32 of 70 prompt rows"));
  EXPECT_EQ(asked, 3);
  EXPECT_EQ(state.length, 0);  // the state was never completed
}

// BF16 weight matrices are the FP32 ones rounded once, with FP32 arithmetic. On a model stored
// in BF16 (whose weights round to themselves) they give the FP32 engine's logits bit for bit
// while every step has at most 32 rows (both engines run the few-row kernel), and up to
// summation order on a longer prompt (the FP32 engine's prefill runs sgemm). On an FP32 model
// they differ from the FP32 engine, by about BF16's rounding.
TEST_F(EngineTest, Bf16WeightsAreTheFp32WeightsRoundedOnce) {
  std::mt19937_64 rng(41);
  for (size_t i = 0; i < variants_->size(); ++i) {
    auto narrow = LoadEngine(ModelDir(i), Device::kCpu, WeightType::kBf16);
    ASSERT_TRUE(narrow.ok()) << narrow.status();
    Engine& wide = *(*models_)[i];
    const int64_t V = wide.config().vocab_size;
    const bool stored_bf16 = (*variants_)[i].dtype == Dtype::kBF16;
    double worst = 0;
    for (int64_t length : {20, 150}) {
      const auto prompt = RandomTokens(rng, length, V);
      const auto continuation = RandomTokens(rng, 4, V);
      const auto expected = Run(wide, prompt, {}, continuation);
      const auto got = Run(**narrow, prompt, {}, continuation);
      ASSERT_EQ(got.size(), expected.size());
      for (const auto& [position, logits] : expected) {
        const std::vector<float>& row = got.at(position);
        const double error = RelativeError(row, logits);
        worst = std::max(worst, error);
        if (stored_bf16 && length <= 32) {
          EXPECT_EQ(row, logits) << (*variants_)[i].name << " position " << position;
        } else if (stored_bf16) {
          EXPECT_LT(error, 1e-5) << (*variants_)[i].name << " position " << position;
        }
      }
    }
    if (!stored_bf16) {
      EXPECT_GT(worst, 0.0) << "BF16 weights left an FP32 model's logits unchanged";
      EXPECT_LT(worst, 2e-2) << "BF16 weights moved the logits by more than their rounding";
    }
  }
}

TEST_F(EngineTest, WeightTypeNamesAreParsedAndUnknownOnesRefusedByName) {
  EXPECT_EQ(*ParseWeightType("fp32", "--weights"), WeightType::kFp32);
  EXPECT_EQ(*ParseWeightType("bf16", "--weights"), WeightType::kBf16);
  const auto bad = ParseWeightType("half", "--weights");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "--weights: 'half' is unknown; allowed: fp32, bf16");
}

TEST_F(EngineTest, GreedyIsDeterministicAndBatchEqualsAlone) {
  std::mt19937_64 rng(17);
  const int64_t V = tiny().config().vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(RandomTokens(rng, 10 + 9 * i, V));
  EXPECT_EQ(Greedy(tiny(), prompts[0], 12), Greedy(tiny(), prompts[0], 12));

  // Decode all five together, teacher-forced with the same tokens as alone.
  std::vector<std::unique_ptr<SequenceState>> states;
  std::vector<std::vector<float>> batch_logits(prompts.size(), std::vector<float>(V));
  for (const auto& prompt : prompts) {
    states.push_back(std::make_unique<SequenceState>(tiny().state_layout()));
    ASSERT_TRUE(tiny().Prefill(prompt, {}, *states.back()).ok());
  }
  const auto next = RandomTokens(rng, 6 * prompts.size(), V);
  for (int step = 0; step < 6; ++step) {
    std::vector<DecodeItem> items;
    for (size_t i = 0; i < prompts.size(); ++i) {
      items.push_back({states[i].get(), next[step * prompts.size() + i], batch_logits[i].data()});
    }
    ASSERT_TRUE(tiny().Decode(items).ok());
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::vector<int32_t> forced;
      for (int s = 0; s <= step; ++s) forced.push_back(next[s * prompts.size() + i]);
      const auto alone = Run(tiny(), prompts[i], {}, forced);
      EXPECT_LT(RelativeError(batch_logits[i], alone.rbegin()->second), 1e-5)
          << "request " << i << " step " << step;
    }
  }
}

TEST_F(EngineTest, ProducerRowsAreCapturedForEveryPositionAndMatchTheRing) {
  const ModelConfig& c = tiny().config();
  const StateLayout layout = tiny().state_layout();
  std::mt19937_64 rng(19);
  const auto prompt = RandomTokens(rng, 75, c.vocab_size);
  // captured[layer][pos] = K row
  std::vector<std::map<int64_t, std::vector<float>>> captured(c.num_producer_layers());
  PrefillOptions options{
      .mode = TruncationMode::kCompact, .keep = 30, .s_valid = 20, .chunk_size = 16};
  options.on_producer_rows = [&](int64_t layer, int64_t q_start, int64_t rows, const float* k,
                                 const float*, int64_t stride) {
    for (int64_t j = 0; j < rows; ++j) {
      EXPECT_FALSE(captured[layer].contains(q_start + j)) << "position delivered twice";
      captured[layer][q_start + j].assign(k + j * stride, k + j * stride + layout.kv_dim);
    }
  };
  SequenceState state(layout);
  ASSERT_TRUE(tiny().Prefill(prompt, options, state).ok());
  for (int64_t l = 0; l < c.num_producer_layers(); ++l) {
    ASSERT_EQ(captured[l].size(), prompt.size());
    for (int64_t pos = 75 - layout.ring_capacity; pos < 75; ++pos) {
      const float* ring = state.producer_swa() + layout.ring_k_offset(l) +
                          (pos % layout.ring_capacity) * layout.kv_dim;
      EXPECT_EQ(std::vector<float>(ring, ring + layout.kv_dim), captured[l][pos]);
    }
  }
}

TEST_F(EngineTest, BadRequestsAreRefused) {
  SequenceState state(tiny().state_layout());
  auto empty = tiny().Prefill({}, {}, state);
  EXPECT_THAT(empty.status().message(), HasSubstr("prompt is empty"));
  const std::vector<int32_t> bad_token = {1, 2, 512};
  auto vocab = tiny().Prefill(bad_token, {}, state);
  EXPECT_THAT(vocab.status().message(), HasSubstr("token 2 is 512; token ids must lie in [0, "
                                                  "vocab_size) = [0, 512)"));
  const std::vector<int32_t> prompt = {1, 2, 3};
  auto keep = tiny().Prefill(prompt, {.mode = TruncationMode::kMask, .keep = 21}, state);
  EXPECT_THAT(keep.status().message(), HasSubstr("keep K is 21"));
  EXPECT_EQ(state.length, 0);
  std::vector<float> logits(512);
  const DecodeItem item{.state = &state, .token = 1, .logits = logits.data()};
  EXPECT_EQ(tiny().Decode({&item, 1}).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace baton::model
