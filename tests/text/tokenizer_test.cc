// The tokenizer (Debian's libsentencepiece, the default model's tokenizer that
// scripts/build_tokenizer.sh trains on the Brown corpus), the incremental detokenizer and
// stop strings.
#include "baton/text/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "baton/text/streaming_text.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_dir.h"

namespace baton::text {
namespace {

namespace fs = std::filesystem;

const Tokenizer& Default() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    auto loaded = Tokenizer::Load(BATON_TOKENIZER_DIR, 4096);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? *std::move(loaded) : nullptr;
  }();
  return *tokenizer;
}

bool ValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

const std::vector<std::string>& Texts() {
  static const std::vector<std::string> texts = {
      "The jury said it did find that many of Georgia's registration laws are outmoded.",
      "你好，世界！这是一个测试。",
      "Здравствуйте, как дела?",
      "مرحبا بالعالم",
      "नमस्ते दुनिया",
      "こんにちは世界、テストです。",
      "Emoji: 🚀🎉👩‍👩‍👧 and ümlauts, façade, naïve.",
      "  two leading spaces,  double  spaces,\ttabs\nand\n\nnewlines ",
      "Mixed: The 東京 market rose 3.5% — «quotes» and “curly” ones."};
  return texts;
}

TEST(TokenizerTest, EncodeThenDecodeGivesBackMultilingualText) {
  const Tokenizer& t = Default();
  ASSERT_EQ(t.size(), 4096);
  for (const std::string& text : Texts()) {
    const std::vector<int32_t> ids = t.Encode(text, /*add_bos=*/false);
    ASSERT_FALSE(ids.empty());
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < t.size());
    EXPECT_EQ(t.Decode(ids), text);
    // bos first when asked; it decodes to nothing.
    const std::vector<int32_t> with_bos = t.Encode(text, /*add_bos=*/true);
    ASSERT_EQ(with_bos.front(), t.bos_id());
    EXPECT_EQ(t.Decode(with_bos), text);
  }
}

TEST(TokenizerTest, SpecialTokenStringsAreTextUnlessATemplateRenderedThem) {
  const Tokenizer& t = Default();
  ASSERT_EQ(t.bos_id(), 1);
  ASSERT_EQ(t.eos_id(), 2);
  ASSERT_EQ(t.bos_token(), "<s>");
  // A client's "<s>" is text: it never becomes the control id.
  for (int32_t id : t.Encode("<s>hi</s>", false)) {
    EXPECT_NE(id, t.bos_id());
    EXPECT_NE(id, t.eos_id());
  }
  const std::vector<int32_t> rendered = t.EncodeWithSpecialTokens("<s>hi</s><s>");
  ASSERT_GE(rendered.size(), 4u);
  EXPECT_EQ(rendered.front(), t.bos_id());
  EXPECT_EQ(rendered[rendered.size() - 2], t.eos_id());
  EXPECT_EQ(rendered.back(), t.bos_id());
  EXPECT_EQ(t.Decode(rendered), "hi");
  // Many control pieces in one rendering (a chat message full of them): each becomes its id.
  std::string many;
  for (int i = 0; i < 20000; ++i) many += "</s>x";
  const std::vector<int32_t> ids = t.EncodeWithSpecialTokens(many);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), t.eos_id()), 20000);
  // ChatML's markers are single user-defined pieces.
  const std::optional<int32_t> start = t.PieceId("<|im_start|>");
  ASSERT_TRUE(start.has_value());
  EXPECT_THAT(t.Encode("<|im_start|>user", false), ::testing::Contains(*start));
  EXPECT_FALSE(t.PieceId("<|no such piece|>").has_value());
  EXPECT_EQ(t.TokenText(*start), "<|im_start|>");
}

// Streams `ids` after `context` and checks, for every prefix, that the pieces concatenate to
// the full detokenization and that no piece splits a UTF-8 character.
void ExpectStreamsLikeTheFullDecode(const Tokenizer& t, const std::vector<int32_t>& context,
                                    const std::vector<int32_t>& ids) {
  const std::string before = t.Decode(context);
  for (size_t n = 0; n <= ids.size(); ++n) {
    IncrementalDetokenizer detokenizer(t, context);
    std::string streamed;
    for (size_t i = 0; i < n; ++i) {
      const std::string piece = detokenizer.Next(ids[i]);
      EXPECT_TRUE(ValidUtf8(piece)) << "token " << i;
      streamed += piece;
    }
    streamed += detokenizer.Flush();
    std::vector<int32_t> all = context;
    all.insert(all.end(), ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n));
    const std::string full = t.Decode(all);
    ASSERT_EQ(full.compare(0, before.size(), before), 0);
    ASSERT_EQ(streamed, full.substr(before.size())) << "after " << n << " tokens";
  }
}

TEST(TokenizerTest, StreamedPiecesConcatenateToTheFullDetokenization) {
  const Tokenizer& t = Default();
  const std::vector<int32_t> prompt = t.Encode("Once upon a time", true);
  for (const std::string& text : Texts()) {
    // A generation that spells out `text`: multi-byte characters come a byte piece at a
    // time for the scripts the Brown corpus never saw, and spaces are leading "▁"s.
    ExpectStreamsLikeTheFullDecode(t, prompt, t.Encode(" " + text, false));
    ExpectStreamsLikeTheFullDecode(t, {}, t.Encode(text, false));
  }
  // Whatever a model samples: any id, byte pieces in any order, control ids, and ids past
  // the tokenizer's pieces (a model's vocabulary may be padded beyond them): those have no
  // text and hold nothing back.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int32_t> ids(40);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % (t.size() + 8));
    ExpectStreamsLikeTheFullDecode(t, prompt, ids);
  }
  IncrementalDetokenizer padded(t, prompt);
  EXPECT_EQ(padded.Next(static_cast<int32_t>(t.size()) + 3), "");
  const std::vector<int32_t> word = t.Encode("jury", false);  // "▁jury"
  std::string after;
  for (int32_t id : word) after += padded.Next(id);
  EXPECT_EQ(after, " jury") << "text after an id past the pieces was lost";
}

TEST(TokenizerTest, ACharacterSplitAcrossBytePiecesIsHeldUntilComplete) {
  const Tokenizer& t = Default();
  // "▁" (the space SentencePiece puts before a word), then the character's three UTF-8 bytes
  // as byte pieces: the Brown corpus never saw it.
  const std::vector<int32_t> ids = t.Encode("走", false);
  ASSERT_EQ(ids.size(), 4u);
  IncrementalDetokenizer detokenizer(t, t.Encode("a", true));
  EXPECT_EQ(detokenizer.Next(ids[0]), " ");
  EXPECT_EQ(detokenizer.Next(ids[1]), "") << "a partial character was emitted";
  EXPECT_EQ(detokenizer.Next(ids[2]), "") << "a partial character was emitted";
  EXPECT_EQ(detokenizer.Next(ids[3]), "走");
  EXPECT_EQ(detokenizer.Flush(), "");
  // Cut short, the incomplete character comes out of Flush as U+FFFD.
  IncrementalDetokenizer cut(t, t.Encode("a", true));
  EXPECT_EQ(cut.Next(ids[0]), " ");
  EXPECT_EQ(cut.Next(ids[1]), "");
  EXPECT_EQ(cut.Flush(), "\xEF\xBF\xBD");
}

// Runs `text`'s tokens through the detokenizer and stop strings as the router does; gives the
// text shown and how many tokens were used.
std::pair<std::string, size_t> Generate(const Tokenizer& t, const std::string& text,
                                        std::vector<std::string> stops, bool* stopped) {
  const std::vector<int32_t> ids = t.Encode(text, false);
  IncrementalDetokenizer detokenizer(t, t.Encode("Prompt:", true));
  StopStrings stop_strings(std::move(stops));
  std::string shown;
  *stopped = false;
  for (size_t i = 0; i < ids.size(); ++i) {
    StopStrings::Step step = stop_strings.Push(detokenizer.Next(ids[i]));
    shown += step.text;
    if (step.stopped) {
      *stopped = true;
      return {shown, i + 1};
    }
  }
  shown += stop_strings.Push(detokenizer.Flush()).text;
  shown += stop_strings.Flush();
  return {shown, ids.size()};
}

TEST(StopStringsTest, AStopStringSpanningTokensEndsTheTextBeforeIt) {
  const Tokenizer& t = Default();
  // The generation spells out `text`; after the prompt its first "▁" shows as a space.
  const std::string text = "The county jury said the election was conducted fairly.";
  const std::string shown_text = " " + text;
  // "jury said" is several pieces; so is "y jur", which starts inside one and ends in another.
  for (const std::string stop : {"jury said", "y jur", "fairly.", " was"}) {
    bool stopped = false;
    auto [shown, used] = Generate(t, text, {stop}, &stopped);
    EXPECT_TRUE(stopped) << stop;
    EXPECT_EQ(shown, shown_text.substr(0, shown_text.find(stop))) << stop;
    // Generation ends at the token that completed the stop string.
    const std::vector<int32_t> ids = t.Encode(text, false);
    std::vector<int32_t> head(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(used));
    std::vector<int32_t> short_head(head.begin(), head.end() - 1);
    const std::string prompt_text = t.Decode(t.Encode("Prompt:", true));
    auto decoded = [&](const std::vector<int32_t>& part) {
      std::vector<int32_t> all = t.Encode("Prompt:", true);
      all.insert(all.end(), part.begin(), part.end());
      return t.Decode(all).substr(prompt_text.size());
    };
    EXPECT_NE(decoded(head).find(stop), std::string::npos) << stop;
    EXPECT_EQ(decoded(short_head).find(stop), std::string::npos) << stop;
  }
  // The earliest of several wins; a stop string never seen holds nothing back at the end.
  bool stopped = false;
  EXPECT_EQ(Generate(t, text, {"fairly", "county"}, &stopped).first, " The ");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(Generate(t, text, {"fairly!"}, &stopped).first, shown_text);
  EXPECT_FALSE(stopped);
  // Multi-byte stop strings match whole characters.
  EXPECT_EQ(Generate(t, "东京 and 大阪", {"大阪"}, &stopped).first, " 东京 and ");
  EXPECT_TRUE(stopped);
}

TEST(StopStringsTest, TextThatMightStartAStopStringIsHeldUntilItCannot) {
  StopStrings stops({"STOP"});
  EXPECT_EQ(stops.Push("abc S").text, "abc ");
  EXPECT_EQ(stops.Push("T").text, "");
  EXPECT_EQ(stops.Push("x").text, "STx");  // not a stop after all: released whole
  StopStrings::Step step = stops.Push("..ST");
  EXPECT_EQ(step.text, "..");
  step = stops.Push("OP and more");
  EXPECT_TRUE(step.stopped);
  EXPECT_EQ(step.text, "");
  EXPECT_EQ(step.matched, "STOP");
}

TEST(TokenizerTest, ADirectoryWithoutATokenizerOrWithABadOneIsRefusedByName) {
  struct {
    std::string value = baton::testing::ProcessTempDir();
    const std::string& path() const { return value; }
  } dir;
  auto missing = Tokenizer::Load(dir.path(), 4096);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  fs::copy_file(fs::path(BATON_TOKENIZER_DIR) / "tokenizer.model",
                fs::path(dir.path()) / "tokenizer.model");
  auto small = Tokenizer::Load(dir.path(), 512);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(small.status().message(), ::testing::HasSubstr("vocab_size 512"));
  std::ofstream(fs::path(dir.path()) / "tokenizer_config.json") << "{\"bos_token\": ";
  auto bad = Tokenizer::Load(dir.path(), 4096);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("tokenizer_config.json"));
  std::ofstream(fs::path(dir.path()) / "tokenizer_config.json")
      << R"({"eos_token": {"content": "<nope>"}})";
  auto unknown = Tokenizer::Load(dir.path(), 4096);
  EXPECT_THAT(unknown.status().message(), ::testing::HasSubstr("eos_token '<nope>'"));
  std::ofstream(fs::path(dir.path()) / "tokenizer_config.json")
      << R"({"add_bos_token": false, "chat_template": "{{ messages[0]['content'] }}"})";
  auto good = Tokenizer::Load(dir.path(), 4096);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_FALSE((*good)->add_bos());
  EXPECT_EQ((*good)->chat_template(), "{{ messages[0]['content'] }}");
  EXPECT_TRUE((*good)->chat().ok()) << (*good)->chat().status();
  // A template the engine cannot take leaves the tokenizer usable and says why chat cannot.
  std::ofstream(fs::path(dir.path()) / "tokenizer_config.json")
      << R"({"chat_template": "{% macro turn(m) %}{{ m }}{% endmacro %}"})";
  auto unsupported = Tokenizer::Load(dir.path(), 4096);
  ASSERT_TRUE(unsupported.ok()) << unsupported.status();
  EXPECT_THAT((*unsupported)->chat().status().message(), ::testing::HasSubstr("macro"));
  std::ofstream(fs::path(dir.path()) / "tokenizer.model") << "not a model";
  auto garbage = Tokenizer::Load(dir.path(), 4096);
  EXPECT_THAT(garbage.status().message(), ::testing::HasSubstr("not a SentencePiece model"));
}

}  // namespace
}  // namespace baton::text
