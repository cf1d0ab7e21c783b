// Text for a stream of generated tokens: the incremental detokenizer (each token's new text,
// never half a UTF-8 character and never losing a SentencePiece space) and the stop-string
// matcher (generation ends at the first stop string, which is left out of the text, also
// when it spans tokens). One of each per request; not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "baton/text/tokenizer.h"

namespace baton::text {

// Decodes a growing id sequence a token at a time. It decodes a short window of ids twice
// (the window so far, and the window with the new ids) and emits the difference, so a
// piece's leading "▁" becomes a space whatever came before, and holds text back while the
// decoded tail is U+FFFD (a byte-fallback character still incomplete). The concatenation of
// everything Next and Flush return is Decode(context + ids) less Decode(context).
class IncrementalDetokenizer {
 public:
  // `context`: the prompt; its last few ids seed the window so that the first generated
  // token's leading space is kept. The tokenizer must outlive this.
  IncrementalDetokenizer(const Tokenizer& tokenizer, std::span<const int32_t> context);

  // Adds one generated token; returns the text it completes ("" while it completes none).
  std::string Next(int32_t id);
  // The text still held at the end of generation (an incomplete character, as U+FFFD).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;  // the window's start
  size_t read_offset_ = 0;    // ids before this have had their text emitted
};

// Holds back the tail of the text that could still become a stop string, and cuts the text
// at the first stop string found.
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);

  struct Step {
    std::string text;      // what may be shown now
    bool stopped = false;  // a stop string was found: `text` ends just before it
    std::string matched;   // which
  };
  // Adds newly decoded text.
  Step Push(std::string_view text);
  // The held-back text, at the end of generation.
  std::string Flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

}  // namespace baton::text
