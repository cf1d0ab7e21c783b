// The trained models' greedy text: from a fixed prompt it is deterministic (alone and beside
// another sequence in the batch) and decodes to valid UTF-8 that is mostly words. Labelled
// `text`, not `model`: the tokenizer's SentencePiece module carries its own protobuf, which the
// sanitizer build cannot keep apart from gRPC's in one process (see text/sentencepiece_loader.cc).
#include <cctype>
#include <iostream>
#include <string>
#include <vector>

#include "baton/model/engine.h"
#include "baton/model/engine_factory.h"
#include "baton/text/tokenizer.h"
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

class TrainedTextTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string Dir() const { return kModels + "/" + GetParam(); }
};

TEST_P(TrainedTextTest, GreedyTextIsDeterministicValidUtf8AndMostlyWords) {
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

INSTANTIATE_TEST_SUITE_P(Models, TrainedTextTest,
                         ::testing::Values("ced-brown-plain", "ced-brown-replay",
                                           "ced-brown-shared"));

}  // namespace
}  // namespace baton::model
