// The OpenAI-compatible API's requests and responses, as the router's HTTP front (http_front.h)
// speaks them: a /v1/completions or /v1/chat/completions body becomes a GenerateRequest, and
// the router's GenerateResponse messages become a completion object or server-sent-event
// chunks. Pure functions of their inputs (no I/O), so every field's rule is tested alone.
//
// What is taken: model, prompt (a string, one string in a list, or token ids) or messages
// (text content), max_tokens (max_completion_tokens for chat), temperature, top_p, seed, stop,
// n = 1, stream and stream_options.include_usage, logprobs (completions: 0, the chosen token's;
// chat: true with top_logprobs 0), user. baton's own options ride as extra body fields, as
// vLLM takes extra parameters: truncation_mode ("off", "mask", "compact"), truncation_keep,
// cache_salt, top_k, ignore_eos, stop_token_ids, add_generation_prompt (chat). Fields OpenAI
// defines that baton cannot honour (n > 1, echo, suffix, best_of > 1, penalties, logit_bias,
// top alternatives, tools, response formats other than text) are refused by name; unknown
// fields are ignored, as OpenAI's own clients add new ones.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/text/tokenizer.h"
#include "baton/v1/generation.pb.h"
#include "nlohmann/json.hpp"

namespace baton::router::openai {

enum class Endpoint { kCompletions, kChatCompletions };

// What the front serves.
struct ServedModel {
  std::string name;                  // GET /v1/models and the "model" field
  uint32_t max_tokens_limit = 4096;  // the router's --max-tokens-limit
  uint32_t max_model_len = 32768;    // the router's --max-model-len
  // The model's positions (config.json max_position_embeddings), which bound the context
  // whatever max_model_len says; 0: no bound beyond max_model_len.
  int64_t max_positions = 0;
};

// A served model with its tokenizer (never null).
struct ModelEntry {
  ServedModel model;
  std::shared_ptr<const text::Tokenizer> tokenizer;
};

struct Request {
  Endpoint endpoint = Endpoint::kCompletions;
  size_t model = 0;  // the ModelEntry it asked for (its "model" field; absent: the first)
  v1::GenerateRequest generate;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // per-token log-probabilities in the response
};

// Parses a request body. InvalidArgument "<field>: <what is allowed>" for a bad field (the
// field as the client wrote it: "max_tokens", "messages[1].content"); NotFound for a model
// this front does not serve. The chat template renders with the tokenizer's template, or
// text::kDefaultChatTemplate (ChatML) when the model has none.
absl::StatusOr<Request> ParseRequest(Endpoint endpoint, std::string_view body,
                                     const text::Tokenizer& tokenizer, const ServedModel& model);
// The same for a front of several models: the "model" field picks one of `models` (absent: the
// first) and names it in the GenerateRequest; NotFound lists the names served.
absl::StatusOr<Request> ParseRequest(Endpoint endpoint, std::string_view body,
                                     std::span<const ModelEntry> models);

// An error as OpenAI's clients read it, with its HTTP status.
struct Error {
  int http_status = 500;
  nlohmann::json body;  // {"error": {"message", "type", "param", "code"}}
};
// The error for a parse failure or a router status: 400 naming the field (param) for
// INVALID_ARGUMENT, 401, 404 (model), 429 (the router's queue is full), 503 (no node), 504.
// The bounds a body meets before any tree is built from it (checked while parsing it, SAX):
// every array at most `max_elements` long, at most JsonValueBound(max_elements) values in all,
// nested at most kMaxJsonNesting deep. INVALID_ARGUMENT names the field past a bound, or the
// body when it is not JSON. ParseRequest applies it with max_elements the largest
// max_model_len served (a prompt's token ids), and at least 1024.
inline constexpr size_t kMaxJsonNesting = 32;
inline constexpr size_t JsonValueBound(size_t max_elements) { return 2 * max_elements + 4096; }
absl::Status CheckJsonBounds(std::string_view body, size_t max_elements);

Error ErrorFor(const absl::Status& status);
Error ErrorFor(int grpc_code, const std::string& message);

// Turns a request's stream of GenerateResponse messages into the OpenAI objects. One per
// request; not thread-safe.
class ResponseWriter {
 public:
  ResponseWriter(const Request& request, const text::Tokenizer& tokenizer, std::string model,
                 int64_t created);
  // The server-sent-event chunks for one message ("data: {...}\n\n" each; "" when the message
  // adds nothing a client sees). The final message's chunk carries finish_reason; with
  // include_usage a usage chunk (no choices) follows it.
  std::string Chunks(const v1::GenerateResponse& message);
  // "data: [DONE]\n\n".
  static std::string Done();
  // Accumulates a message for the non-streamed response.
  void Add(const v1::GenerateResponse& message);
  // The completion object once every message is in.
  nlohmann::json Completion() const;

 private:
  nlohmann::json Logprobs(const v1::GenerateResponse& message);
  nlohmann::json Usage() const;
  nlohmann::json ChunkBase() const;

  const Request& request_;
  const text::Tokenizer& tokenizer_;
  std::string model_;
  int64_t created_;
  std::string id_;
  bool chat_ = false;
  bool sent_role_ = false;
  std::string text_;
  nlohmann::json logprobs_;  // accumulated (non-streamed)
  size_t text_offset_ = 0;   // completions' logprobs.text_offset
  std::string finish_reason_;
  v1::Usage usage_;
};

}  // namespace baton::router::openai
