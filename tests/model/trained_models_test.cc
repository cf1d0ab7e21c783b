// The trained models that ship in models/ (tools/train/train.py): they load, their forward
// pass matches the double-precision reference in every truncation mode as the generated
// models' does, K >= R is exact, and greedy generation from a fixed prompt is deterministic
// and decodes to valid UTF-8 English-like text.
#include <cctype>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "baton/model/engine.h"
#include "baton/model/engine_factory.h"
#include "baton/text/tokenizer.h"
#include "ced_reference.h"
#include "gtest/gtest.h"

namespace baton::model {
namespace {

const std::string kModels = BATON_MODELS_DIR;

// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or values past U+10FFFF).
bool ValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (n < 0 || (n > 0 && i + n >= s.size())) return false;
    uint32_t cp = n == 0 ? c : c & (0x3F >> n);
    for (int k = 1; k <= n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b >> 6) != 2) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    const uint32_t min[] = {0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

class TrainedModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string Dir() const { return kModels + "/" + GetParam(); }
};

TEST_P(TrainedModelTest, MatchesTheReferenceInEveryModeAndIsExactFromSpanR) {
  absl::StatusOr<std::unique_ptr<Engine>> loaded = LoadEngine(Dir());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Engine& model = **loaded;
  const ModelConfig& c = model.config();
  const testing::CedReference reference(Dir(), c);
  const int64_t C = c.ring_capacity(), R = c.dependency_span(), V = c.vocab_size;
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t L = 120 + static_cast<int64_t>(rng() % 200);
    const auto mode = static_cast<TruncationMode>(trial % 3);
    const int64_t keep = mode == TruncationMode::kOff ? 0 : C + static_cast<int64_t>(rng() % 60);
    const int64_t s_valid = trial == 4 ? static_cast<int64_t>(rng() % L) : 0;
    const int64_t chunk = static_cast<int64_t>(rng() % (L + 1));
    std::vector<int32_t> tokens(L + 3);
    for (int32_t& t : tokens) t = static_cast<int32_t>(3 + rng() % (V - 3));
    SCOPED_TRACE(::testing::Message() << "L=" << L << " mode=" << TruncationModeName(mode) << " K="
                                      << keep << " s_valid=" << s_valid << " chunk=" << chunk);
    SequenceState state(model.state_layout());
    const std::span<const int32_t> prompt(tokens.data(), L);
    auto result = model.Prefill(
        prompt, {.mode = mode, .keep = keep, .s_valid = s_valid, .chunk_size = chunk}, state);
    ASSERT_TRUE(result.ok()) << result.status();
    std::vector<std::vector<float>> rows = {
        std::vector<float>(result->logits.end() - V, result->logits.end())};
    for (int64_t p = L; p < L + 2; ++p) {
      std::vector<float> row(V);
      const DecodeItem item{.state = &state, .token = tokens[p], .logits = row.data()};
      ASSERT_TRUE(model.Decode({&item, 1}).ok());
      rows.push_back(std::move(row));
    }
    const auto expected =
        reference.Run(tokens, L, mode != TruncationMode::kOff, keep, s_valid).logits;
    for (size_t r = 0; r < rows.size(); ++r) {
      const std::vector<double>& want = expected[L - 1 + r];
      double diff = 0, scale = 1e-12;
      for (int64_t v = 0; v < V; ++v) {
        diff = std::max(diff, std::abs(rows[r][v] - want[v]));
        scale = std::max(scale, std::abs(want[v]));
      }
      EXPECT_LT(diff / scale, 1e-4) << "row " << L - 1 + r;
    }
  }
  // K = R: the retained rows are those off computes; K = C moves a trained model's output.
  std::vector<int32_t> prompt(R + 120);
  for (int32_t& t : prompt) t = static_cast<int32_t>(3 + rng() % (V - 3));
  auto last = [&](TruncationMode mode, int64_t keep) {
    SequenceState state(model.state_layout());
    auto result = model.Prefill(prompt, {.mode = mode, .keep = keep}, state);
    EXPECT_TRUE(result.ok()) << result.status();
    return std::vector<float>(result->logits.end() - V, result->logits.end());
  };
  const std::vector<float> off = last(TruncationMode::kOff, 0);
  auto max_diff = [&](const std::vector<float>& other) {
    double m = 0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, double{std::abs(off[v] - other[v])});
    return m;
  };
  EXPECT_LT(max_diff(last(TruncationMode::kCompact, R)), 1e-3);
  EXPECT_GT(max_diff(last(TruncationMode::kCompact, C)), 1e-3);
}

TEST_P(TrainedModelTest, GreedyTextIsDeterministicValidUtf8AndMostlyWords) {
  absl::StatusOr<std::unique_ptr<Engine>> loaded = LoadEngine(Dir());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Engine& model = **loaded;
  const int64_t V = model.config().vocab_size;
  auto tokenizer = text::Tokenizer::Load(Dir(), V);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<int32_t> prompt = (*tokenizer)->Encode("The jury said", true);
  // Greedy decoding of 48 tokens; `beside` decodes another sequence in the same batch.
  auto generate = [&](bool beside) {
    SequenceState state(model.state_layout()), other(model.state_layout());
    auto result = model.Prefill(prompt, {}, state);
    EXPECT_TRUE(result.ok()) << result.status();
    const std::vector<int32_t> other_prompt = (*tokenizer)->Encode("In the morning", true);
    EXPECT_TRUE(model.Prefill(other_prompt, {}, other).ok());
    std::vector<float> logits(result->logits.end() - V, result->logits.end()), junk(V);
    std::vector<int32_t> out;
    for (int i = 0; i < 48; ++i) {
      out.push_back(Argmax(logits));
      std::vector<DecodeItem> items = {
          {.state = &state, .token = out.back(), .logits = logits.data()}};
      if (beside) items.push_back({.state = &other, .token = 17, .logits = junk.data()});
      EXPECT_TRUE(model.Decode(items).ok());
    }
    return out;
  };
  const std::vector<int32_t> first = generate(false);
  EXPECT_EQ(generate(false), first);
  EXPECT_EQ(generate(true), first);
  const std::string text = (*tokenizer)->Decode(first);
  EXPECT_TRUE(ValidUtf8(text)) << text;
  // English-like: letters, spaces and punctuation, at least a few words of letters.
  int letters = 0, spaces = 0;
  for (unsigned char ch : text) {
    letters += std::isalpha(ch) != 0;
    spaces += ch == ' ';
  }
  EXPECT_GT(letters, static_cast<int>(text.size()) / 2) << text;
  EXPECT_GE(spaces, 5) << text;
  std::cout << GetParam() << ": The jury said" << text << "\n";
}

INSTANTIATE_TEST_SUITE_P(Models, TrainedModelTest,
                         ::testing::Values("ced-brown-plain", "ced-brown-replay"));

}  // namespace
}  // namespace baton::model
