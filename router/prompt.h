// A prompt's token ids: the one place where the router turns text into the ids that the rest
// of a request (validation, prefix keys, the nodes) sees. A completion's text (the gRPC API's
// prompt_text, the OpenAI front's "prompt" string) is encoded as plain text, bos first where the
// tokenizer's add_bos_token says; a chat's messages are rendered with the model's chat template
// (ChatML without one) and encoded so that the template's special texts become their ids and
// the client's never do (a content's "<|im_start|>" or "</s>" stays text).
//
// Pure functions of their inputs; private to router/ (generate_call.cc, openai.cc).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "baton/text/tokenizer.h"

namespace baton::router {

// A prompt's text may hold at most this many bytes per token of --max-model-len: room for any
// real text, and a bound on what one request can make the tokenizer read. The client API's
// receive limit is derived from it (router_main.h ClientLimits).
inline constexpr uint32_t kPromptTextBytesPerToken = 64;

// OK when `bytes` of prompt text are within kPromptTextBytesPerToken * `max_model_len`; else
// INVALID_ARGUMENT naming `field`, the bound and --max-model-len. Called before any tokenizing.
absl::Status CheckPromptBytes(absl::string_view field, uint64_t bytes, uint32_t max_model_len);

// The ids of a text prompt. INVALID_ARGUMENT naming prompt_text for a text past
// CheckPromptBytes (checked before the tokenizer reads it), or one that encodes to no tokens.
absl::StatusOr<std::vector<int32_t>> EncodeTextPrompt(const text::Tokenizer& tokenizer,
                                                      const std::string& text,
                                                      uint32_t max_model_len);

// One chat message; both fields are the client's text.
struct ChatMessage {
  std::string role;
  std::string content;
};

struct ChatPrompt {
  std::vector<int32_t> ids;
  // Ids that end the assistant's turn besides the model's eos: ChatML's <|im_end|> (where the
  // vocabulary has it) when the model has no template of its own.
  std::vector<int32_t> stop_ids;
};

// The ids of `messages` rendered with the model's template, with the assistant's turn opened
// when `add_generation_prompt`. Errors name "messages": INVALID_ARGUMENT when the messages'
// roles and contents together are past CheckPromptBytes (checked before rendering) or the
// template refuses them, FAILED_PRECONDITION when the model's template cannot be rendered.
absl::StatusOr<ChatPrompt> EncodeChatPrompt(const text::Tokenizer& tokenizer,
                                            std::span<const ChatMessage> messages,
                                            bool add_generation_prompt, uint32_t max_model_len);

}  // namespace baton::router
