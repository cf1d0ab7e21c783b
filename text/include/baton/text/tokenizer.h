// A model's tokenizer: the SentencePiece model a model directory ships as tokenizer.model (as
// Llama 2, Gemma and T5 do), with what tokenizer_config.json and generation_config.json add:
// the bos/eos tokens, whether a prompt starts with bos, the chat template and the sampling
// defaults. Immutable after Load; safe to share between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/text/chat_template.h"

namespace baton::text {

namespace internal {
class SentencePieceModel;
}

// generation_config.json's sampling defaults; absent fields stay unset.
struct GenerationDefaults {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
};

class Tokenizer {
 public:
  // Loads <model_dir>/tokenizer.model and, where present, tokenizer_config.json and
  // generation_config.json. NotFound when there is no tokenizer.model (the model is served by
  // token ids only); InvalidArgument naming the file and field when one is malformed, or when
  // the tokenizer has more pieces than `vocab_size` (the model's), so no id it makes can fall
  // outside the model's vocabulary.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& model_dir,
                                                         int64_t vocab_size);
  ~Tokenizer();

  // The ids of plain text, bos first when `add_bos` (and the model has one). Special-token
  // strings in the text ("<s>") are plain text here: a client cannot forge control tokens.
  std::vector<int32_t> Encode(std::string_view text, bool add_bos) const;
  // The ids of text a chat template rendered: bos/eos and the other control pieces written
  // out as text ("<s>", "</s>") become their ids; the segments between them are encoded as by
  // Encode. User-defined pieces ("<|im_start|>") are single ids in both. Only for text the
  // template itself wrote: the router encodes a message's content with EncodeAsText
  // (router/prompt.cc), so a client cannot write control tokens into a prompt.
  std::vector<int32_t> EncodeWithSpecialTokens(std::string_view text) const;
  // The same, except that control texts starting at an offset in `as_text` stay plain text.
  std::vector<int32_t> EncodeWithSpecialTokens(std::string_view text,
                                               const std::set<size_t>& as_text) const;
  bool IsControl(int32_t id) const;
  // The ids of text that must stay text (a chat message's content; Hugging Face's
  // split_special_tokens): the text of a control or user-defined piece in it ("<|im_start|>",
  // "</s>") is encoded character by character, so it never becomes that piece's id.
  std::vector<int32_t> EncodeAsText(std::string_view text) const;
  // `text` spelled out as byte-fallback pieces (character by character where the tokenizer
  // has none): ids that decode to exactly `text` and hold no special id.
  std::vector<int32_t> Spell(std::string_view text) const;
  // The text of a control or user-defined piece; nullopt for any other id.
  std::optional<std::string_view> SpecialText(int32_t id) const;
  // The texts that Encode or EncodeWithSpecialTokens turn into a special id: control pieces
  // and user-defined pieces, longest first.
  const std::vector<std::string>& special_texts() const { return special_texts_; }
  // The text of `ids` (control pieces, and ids past the tokenizer's pieces, give nothing; a
  // leading SentencePiece space is dropped, as the library does; an incomplete UTF-8 sequence
  // gives U+FFFD).
  std::string Decode(std::span<const int32_t> ids) const;
  // One token's own text, for per-token log-probabilities: "▁" as a space, a byte piece as its
  // byte (so possibly part of a UTF-8 character), a control piece as written ("</s>").
  std::string TokenText(int32_t id) const;
  // The id of a piece written as text ("<|im_end|>"), if the vocabulary has it.
  std::optional<int32_t> PieceId(std::string_view piece) const;

  int64_t size() const;                       // pieces
  int32_t bos_id() const { return bos_id_; }  // -1: none
  int32_t eos_id() const { return eos_id_; }
  bool add_bos() const { return add_bos_; }  // tokenizer_config.json's add_bos_token
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  // tokenizer_config.json's chat_template; "" when the model has none.
  const std::string& chat_template() const { return chat_template_; }
  // The chat template parsed once at Load: the model's, or kDefaultChatTemplate (ChatML) when
  // it has none; the parse error when the model's uses what the engine does not take.
  const absl::StatusOr<ChatTemplate>& chat() const { return chat_; }
  const GenerationDefaults& generation_defaults() const { return defaults_; }

 private:
  Tokenizer();
  // Load's parts: tokenizer_config.json (special tokens, add_bos_token, the chat template) and
  // generation_config.json (sampling defaults), each optional; the special pieces' texts.
  absl::Status ReadTokenizerConfig(const std::string& path);
  absl::Status ReadGenerationConfig(const std::string& path);
  void CollectSpecials();

  std::unique_ptr<internal::SentencePieceModel> model_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool add_bos_ = true;
  std::string bos_token_, eos_token_;
  std::string chat_template_;
  absl::StatusOr<ChatTemplate> chat_ = absl::UnknownError("not loaded");
  GenerationDefaults defaults_;
  // Control pieces as text, and their ids, longest first (EncodeWithSpecialTokens).
  std::vector<std::pair<std::string, int32_t>> specials_;
  std::vector<std::string> special_texts_;
};

}  // namespace baton::text
