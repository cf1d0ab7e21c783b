#include "prompt.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "baton/text/chat_template.h"
#include "nlohmann/json.hpp"

namespace baton::router {
namespace {

// A message's content is text: a special token's text in it ("<|im_start|>", "</s>") must not
// become that token, as it would if the rendered prompt were encoded whole (Hugging Face's
// split_special_tokens for user text). Before rendering, each such text in a content, and each
// code point of the escape range itself, is replaced by one escape code point
// (kEscapeBase + k, from Unicode's supplementary private use area); after rendering, the text
// between escapes is encoded with the template's special tokens and each escape as the plain
// text it stands for. Templates transform content only by trimming, case and concatenation,
// which leave the escapes whole.
class ContentEscapes {
 public:
  static constexpr uint32_t kEscapeBase = 0x100000;
  static constexpr uint32_t kEscapeEnd = 0x10FFFE;
  explicit ContentEscapes(const text::Tokenizer& tokenizer) : tokenizer_(tokenizer) {
    for (const std::string& s : tokenizer.special_texts()) {
      if (!s.empty()) starts_[static_cast<unsigned char>(s[0])] = true;
    }
  }

  std::string Escape(const std::string& content) {
    std::string out;
    out.reserve(content.size());
    for (size_t at = 0; at < content.size();) {
      const std::string* special = SpecialAt(content, at);
      if (special != nullptr) {
        AppendEscape(*special, out);
        at += special->size();
        continue;
      }
      if (const uint32_t cp = CodePointAt(content, at); cp >= kEscapeBase && cp <= kEscapeEnd) {
        AppendEscape(content.substr(at, 4), out);
        at += 4;
        continue;
      }
      out += content[at++];
    }
    return out;
  }

  // The ids of a rendered prompt: the template's special texts as their ids, the contents'
  // as text. The escapes are put back as the texts they stand for and the whole is encoded in
  // one piece (so that tokens meet across them as they would in plain text); then every
  // special id that stands for a content's text, counted in order of the texts, is spelled out.
  std::vector<int32_t> Encode(const std::string& rendered) const {
    std::string text;
    std::set<size_t> content_at;  // where a content's special text starts in `text`
    for (size_t at = 0; at < rendered.size();) {
      const uint32_t cp = CodePointAt(rendered, at);
      if (cp < kEscapeBase || cp - kEscapeBase >= literals_.size()) {
        text += rendered[at++];
        continue;
      }
      content_at.insert(text.size());
      text += literals_[cp - kEscapeBase];
      at += 4;
    }
    // The special texts in order, as the encoder finds them (leftmost, longest first).
    std::vector<bool> from_content;
    for (size_t at = 0; at < text.size();) {
      const std::string* special = SpecialAt(text, at);
      if (special == nullptr) {
        ++at;
        continue;
      }
      const bool content = content_at.contains(at);
      // A content's control text ("</s>") is left as text by the encoder and makes no id.
      if (!(content && tokenizer_.IsControl(tokenizer_.PieceId(*special).value_or(-1)))) {
        from_content.push_back(content);
      }
      at += special->size();
    }
    std::vector<int32_t> ids;
    size_t next = 0;
    for (const int32_t id : tokenizer_.EncodeWithSpecialTokens(text, content_at)) {
      const std::optional<std::string_view> special = tokenizer_.SpecialText(id);
      if (!special.has_value()) {
        ids.push_back(id);
        continue;
      }
      const bool content = next < from_content.size() && from_content[next];
      ++next;
      if (content) {
        for (const int32_t spelled : tokenizer_.Spell(*special)) ids.push_back(spelled);
      } else {
        ids.push_back(id);
      }
    }
    // Should the encoder have found the special texts otherwise than counted, encode the
    // pieces apart instead: never a content's special text as its id.
    return next == from_content.size() ? ids : EncodeApart(rendered);
  }

 private:
  // The longest special text starting at `at`, if any.
  const std::string* SpecialAt(const std::string& s, size_t at) const {
    if (!starts_[static_cast<unsigned char>(s[at])]) return nullptr;
    for (const std::string& special : tokenizer_.special_texts()) {
      if (s.compare(at, special.size(), special) == 0) return &special;
    }
    return nullptr;
  }
  // The code point of a 4-byte UTF-8 sequence at `at` (0 for anything else).
  static uint32_t CodePointAt(const std::string& s, size_t at) {
    const auto b = [&](size_t i) { return static_cast<unsigned char>(s[at + i]); };
    if (at + 4 > s.size() || (b(0) & 0xF8) != 0xF0) return 0;
    for (size_t i = 1; i < 4; ++i) {
      if ((b(i) & 0xC0) != 0x80) return 0;
    }
    return (uint32_t{b(0)} & 0x07) << 18 | (uint32_t{b(1)} & 0x3F) << 12 |
           (uint32_t{b(2)} & 0x3F) << 6 | (uint32_t{b(3)} & 0x3F);
  }
  // The text between escapes and each escape encoded on their own (each piece may then start
  // with the tokenizer's dummy prefix).
  std::vector<int32_t> EncodeApart(const std::string& rendered) const {
    std::vector<int32_t> ids;
    size_t segment = 0;
    auto flush = [&](size_t end) {
      if (end > segment) {
        const std::vector<int32_t> part = tokenizer_.EncodeWithSpecialTokens(
            std::string_view(rendered).substr(segment, end - segment));
        ids.insert(ids.end(), part.begin(), part.end());
      }
    };
    for (size_t at = 0; at < rendered.size();) {
      const uint32_t cp = CodePointAt(rendered, at);
      if (cp < kEscapeBase || cp - kEscapeBase >= literals_.size()) {
        ++at;
        continue;
      }
      flush(at);
      const std::vector<int32_t> part = tokenizer_.Spell(literals_[cp - kEscapeBase]);
      ids.insert(ids.end(), part.begin(), part.end());
      at += 4;
      segment = at;
    }
    flush(rendered.size());
    return ids;
  }
  void AppendEscape(const std::string& literal, std::string& out) {
    auto [it, added] = index_.emplace(literal, literals_.size());
    if (added) literals_.push_back(literal);
    const uint32_t cp =
        kEscapeBase + static_cast<uint32_t>(std::min<size_t>(it->second, kEscapeEnd - kEscapeBase));
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }

  const text::Tokenizer& tokenizer_;
  bool starts_[256] = {};  // the first bytes of special texts
  std::vector<std::string> literals_;
  std::map<std::string, size_t> index_;
};

}  // namespace

absl::Status CheckPromptBytes(absl::string_view field, uint64_t bytes, uint32_t max_model_len) {
  const uint64_t max_bytes = uint64_t{kPromptTextBytesPerToken} * max_model_len;
  if (bytes <= max_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", bytes, " bytes; at most ", max_bytes, " bytes (", kPromptTextBytesPerToken,
      " a token of the router's --max-model-len ", max_model_len, "), refused before tokenizing"));
}

absl::StatusOr<std::vector<int32_t>> EncodeTextPrompt(const text::Tokenizer& tokenizer,
                                                      const std::string& text,
                                                      uint32_t max_model_len) {
  if (absl::Status s = CheckPromptBytes("prompt_text", text.size(), max_model_len); !s.ok()) {
    return s;
  }
  std::vector<int32_t> ids = tokenizer.Encode(text, tokenizer.add_bos());
  if (ids.empty()) {
    return absl::InvalidArgumentError("prompt_text: the text encodes to no tokens; send some text");
  }
  return ids;
}

absl::StatusOr<ChatPrompt> EncodeChatPrompt(const text::Tokenizer& tokenizer,
                                            std::span<const ChatMessage> messages,
                                            bool add_generation_prompt, uint32_t max_model_len) {
  uint64_t bytes = 0;
  for (const ChatMessage& m : messages) bytes += m.role.size() + m.content.size();
  if (absl::Status s = CheckPromptBytes("messages", bytes, max_model_len); !s.ok()) return s;
  nlohmann::json rendered_messages = nlohmann::json::array();
  ContentEscapes escapes(tokenizer);
  for (const ChatMessage& m : messages) {
    // Roles are the client's text too ("<|im_start|>system" would open a system turn).
    rendered_messages.push_back(
        {{"role", escapes.Escape(m.role)}, {"content", escapes.Escape(m.content)}});
  }
  const bool fallback = tokenizer.chat_template().empty();
  const absl::StatusOr<text::ChatTemplate>& chat_template = tokenizer.chat();
  if (!chat_template.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("messages: this model's chat template cannot be rendered (",
                     chat_template.status().message(), "); use /v1/completions"));
  }
  const nlohmann::json variables = {{"messages", rendered_messages},
                                    {"add_generation_prompt", add_generation_prompt},
                                    {"bos_token", tokenizer.bos_token()},
                                    {"eos_token", tokenizer.eos_token()}};
  absl::StatusOr<std::string> rendered = chat_template->Render(variables);
  if (!rendered.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("messages: ", rendered.status().message()));
  }
  ChatPrompt prompt;
  // A model's own template writes its bos where it wants one; ChatML has none, so the
  // tokenizer's add_bos_token decides.
  if (fallback && tokenizer.add_bos() && tokenizer.bos_id() >= 0) {
    prompt.ids.push_back(tokenizer.bos_id());
  }
  const std::vector<int32_t> body_ids = escapes.Encode(*rendered);
  prompt.ids.insert(prompt.ids.end(), body_ids.begin(), body_ids.end());
  // ChatML's turn ends with <|im_end|>: the assistant's turn too.
  if (fallback) {
    if (std::optional<int32_t> end = tokenizer.PieceId("<|im_end|>"); end.has_value()) {
      prompt.stop_ids.push_back(*end);
    }
  }
  return prompt;
}

}  // namespace baton::router
