#include "baton/router/openai.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "baton/common/ced_rules.h"
#include "baton/common/wire_bounds.h"
#include "grpcpp/support/status.h"
#include "prompt.h"

namespace baton::router::openai {
namespace {

using nlohmann::json;

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// `object[key]` when it is a string, else "" (nlohmann's value() throws on another type).
std::string StringAt(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// A field that, when present and not null, must be of the given kind.
const json* Field(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

absl::StatusOr<std::optional<int64_t>> Integer(const json& body, const char* key, int64_t min,
                                               int64_t max) {
  const json* v = Field(body, key);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_number_integer()) return Invalid(key, "must be an integer");
  // Unsigned values past INT64_MAX are out of every range here.
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(max)) {
    return Invalid(key, absl::StrCat("must lie in [", min, ", ", max, "]"));
  }
  const int64_t n = v->get<int64_t>();
  if (n < min || n > max) return Invalid(key, absl::StrCat("must lie in [", min, ", ", max, "]"));
  return std::optional<int64_t>(n);
}

absl::StatusOr<std::optional<double>> Number(const json& body, const char* key, double min,
                                             double max) {
  const json* v = Field(body, key);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return Invalid(key, "must be a number");
  const double x = v->get<double>();
  if (!(x >= min && x <= max)) {
    return Invalid(key, absl::StrCat("must lie in [", min, ", ", max, "]"));
  }
  return std::optional<double>(x);
}

absl::StatusOr<bool> Bool(const json& body, const char* key, bool fallback) {
  const json* v = Field(body, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return Invalid(key, "must be true or false");
  return v->get<bool>();
}

absl::StatusOr<std::optional<std::string>> String(const json& body, const char* key) {
  const json* v = Field(body, key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return Invalid(key, "must be a string");
  return std::optional<std::string>(v->get<std::string>());
}

// OpenAI fields baton cannot honour: refused unless absent or at their neutral value.
absl::Status RefuseUnsupported(const json& body, Endpoint endpoint) {
  if (absl::StatusOr<std::optional<int64_t>> n = Integer(body, "n", 1, 1); !n.ok()) {
    return Invalid("n", "only 1 is supported (one choice per request)");
  }
  if (absl::StatusOr<std::optional<int64_t>> best = Integer(body, "best_of", 1, 1); !best.ok()) {
    return Invalid("best_of", "only 1 is supported");
  }
  for (const char* penalty : {"presence_penalty", "frequency_penalty"}) {
    absl::StatusOr<std::optional<double>> p = Number(body, penalty, 0, 0);
    if (!p.ok()) return Invalid(penalty, "only 0 is supported (no penalties)");
  }
  if (const json* bias = Field(body, "logit_bias"); bias != nullptr && !bias->empty()) {
    return Invalid("logit_bias", "is not supported; send none");
  }
  if (absl::StatusOr<bool> echo = Bool(body, "echo", false); !echo.ok() || *echo) {
    return Invalid("echo", "only false is supported");
  }
  if (const json* suffix = Field(body, "suffix");
      suffix != nullptr && !(suffix->is_string() && suffix->get<std::string>().empty())) {
    return Invalid("suffix", "is not supported; send none");
  }
  for (const char* field : {"tools", "functions", "tool_choice", "function_call"}) {
    if (Field(body, field) != nullptr) return Invalid(field, "tool calls are not supported");
  }
  if (const json* format = Field(body, "response_format"); format != nullptr) {
    if (!format->is_object() || StringAt(*format, "type") != "text") {
      return Invalid("response_format", "only {\"type\": \"text\"} is supported");
    }
  }
  if (endpoint == Endpoint::kChatCompletions) {
    if (absl::StatusOr<std::optional<int64_t>> top = Integer(body, "top_logprobs", 0, 0);
        !top.ok()) {
      return Invalid("top_logprobs",
                     "only 0 is supported (the chosen token's log-probability; alternatives "
                     "are not computed)");
    }
  }
  return absl::OkStatus();
}

// A chat message's content: a string, or a list of text parts.
absl::StatusOr<std::string> MessageContent(const json& message, size_t i) {
  const std::string field = absl::StrCat("messages[", i, "].content");
  auto it = message.find("content");
  if (it == message.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) return Invalid(field, "must be a string or a list of text parts");
  std::string text;
  for (size_t k = 0; k < it->size(); ++k) {
    const json& part = (*it)[k];
    if (!part.is_object() || StringAt(part, "type") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return Invalid(absl::StrCat(field, "[", k, "]"),
                     "only {\"type\": \"text\", \"text\": ...} parts are supported");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

// The chat "messages": each a {role, content} object with a non-empty role and text content.
absl::StatusOr<std::vector<ChatMessage>> Messages(const json& body) {
  const json* messages = Field(body, "messages");
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    return Invalid("messages", "must be a non-empty list of {role, content}");
  }
  std::vector<ChatMessage> out;
  out.reserve(messages->size());
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
        m["role"].get<std::string>().empty()) {
      return Invalid(absl::StrCat("messages[", i, "].role"), "must be a non-empty string");
    }
    absl::StatusOr<std::string> content = MessageContent(m, i);
    if (!content.ok()) return content.status();
    out.push_back({.role = m["role"].get<std::string>(), .content = *std::move(content)});
  }
  return out;
}

// A token's text as a JSON string: a byte piece alone may be part of a UTF-8 character, and
// shows as U+FFFD (its "bytes" say what it is).
json SafeText(const std::string& text) {
  return json::parse(json(text).dump(-1, ' ', false, json::error_handler_t::replace));
}

std::string FinishReason(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_STOP:
    case v1::FINISH_REASON_EOS:
      return "stop";
    default:
      return "";
  }
}

// The OpenAI name of a router field ("sampling.max_tokens" -> "max_tokens").
std::string OpenAiParam(std::string field) {
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"sampling.stop_token_ids", "stop_token_ids"},
           {"sampling.", ""},
           {"prompt_token_ids", "prompt"},
           {"prompt_text", "prompt"},
           {"truncation.mode", "truncation_mode"},
           {"truncation.keep", "truncation_keep"}}) {
    if (field.rfind(from, 0) == 0) return to + field.substr(from.size());
  }
  return field;
}

// A first pass over a body, before anything is built from it: every array (a prompt of token
// ids, messages, stop lists) holds at most `max_elements`, the body at most `max_values`
// values in all and nests at most kMaxJsonDepth deep, so that the tree json::parse then builds,
// and the request made from it, cost a small multiple of the body's bytes. The SAX parser keeps
// only the path to the current value.
class BoundedJson final : public nlohmann::json_sax<json> {
 public:
  static constexpr size_t kMaxJsonDepth = kMaxJsonNesting;
  BoundedJson(size_t max_elements, size_t max_values)
      : max_elements_(max_elements), max_values_(max_values) {}
  const absl::Status& status() const { return status_; }

  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override { return Open(false); }
  bool key(string_t& name) override {
    frames_.back().key = name.substr(0, 64);
    return true;
  }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(true); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    status_ = Invalid("body", "is not valid JSON");
    return false;
  }

 private:
  struct Frame {
    bool array = false;
    size_t elements = 0;
    std::string key;
  };
  // Where the value being read sits, as the errors name fields: prompt, messages[3].content.
  std::string Path() const {
    std::string path;
    for (size_t i = 0; i < frames_.size(); ++i) {
      const Frame& f = frames_[i];
      if (f.array) {
        absl::StrAppend(&path, "[", f.elements == 0 ? 0 : f.elements - 1, "]");
      } else if (!f.key.empty()) {
        absl::StrAppend(&path, path.empty() ? "" : ".", f.key);
      }
    }
    return path.empty() ? "body" : path;
  }
  bool Value() {
    if (++values_ > max_values_) {
      status_ = Invalid("body", absl::StrCat("holds more than ", max_values_, " JSON values"));
      return false;
    }
    if (!frames_.empty() && frames_.back().array && ++frames_.back().elements > max_elements_) {
      frames_.back().elements = 1;  // name the array, not its element
      std::string array = Path();
      array.resize(array.size() - 3);
      if (array.empty()) array = "body";
      status_ = Invalid(array, absl::StrCat("more than ", max_elements_, " elements"));
      return false;
    }
    return true;
  }
  bool Open(bool array) {
    if (!Value()) return false;
    if (frames_.size() >= kMaxJsonDepth) {
      status_ = Invalid(Path(), absl::StrCat("nests deeper than ", kMaxJsonDepth, " levels"));
      return false;
    }
    frames_.push_back({.array = array});
    return true;
  }
  bool Close() {
    frames_.pop_back();
    return true;
  }

  const size_t max_elements_, max_values_;
  size_t values_ = 0;
  std::vector<Frame> frames_;
  absl::Status status_;
};

}  // namespace

absl::Status CheckJsonBounds(std::string_view body, size_t max_elements) {
  BoundedJson bounds(max_elements, JsonValueBound(max_elements));
  if (!json::sax_parse(body, &bounds)) {
    return bounds.status().ok() ? Invalid("body", "is not valid JSON") : bounds.status();
  }
  return absl::OkStatus();
}

namespace {

// The body as a JSON object, bounded before any tree is built: a prompt holds at most
// max_model_len token ids.
absl::StatusOr<json> ParseBody(std::string_view body_text, std::span<const ModelEntry> models) {
  size_t max_elements = 1024;
  for (const ModelEntry& entry : models) {
    max_elements = std::max<size_t>(max_elements, entry.model.max_model_len);
  }
  if (absl::Status s = CheckJsonBounds(body_text, max_elements); !s.ok()) return s;
  json body = json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return Invalid("body", "is not valid JSON");
  if (!body.is_object()) return Invalid("body", "must be a JSON object");
  return body;
}

// The entry of `models` that "model" names (absent: the first); NotFound lists those served.
absl::StatusOr<size_t> RequestedModel(const json& body, std::span<const ModelEntry> models) {
  absl::StatusOr<std::optional<std::string>> name = String(body, "model");
  if (!name.ok()) return name.status();
  if (!name->has_value()) return 0;
  size_t found = models.size();
  std::string served;
  for (size_t i = 0; i < models.size(); ++i) {
    if (models[i].model.name == **name) found = i;
    absl::StrAppend(&served, i == 0 ? "'" : ", '", models[i].model.name, "'");
  }
  if (found == models.size()) {
    return absl::NotFoundError(absl::StrCat("model: '", **name,
                                            "' is not served here; this server serves ", served,
                                            " (GET /v1/models)"));
  }
  return found;
}

// A completion's prompt: a string, or token ids, either alone or as the one entry of a list.
absl::Status CompletionPrompt(const json& body, v1::GenerateRequest& g) {
  const json* p = Field(body, "prompt");
  if (p != nullptr && p->is_array() && p->size() == 1 &&
      ((*p)[0].is_string() || (*p)[0].is_array())) {
    p = &(*p)[0];  // one prompt in a list
  }
  if (p == nullptr) return Invalid("prompt", "is required");
  if (p->is_string()) {
    if (p->get<std::string>().empty()) return Invalid("prompt", "must not be empty");
    g.set_prompt_text(p->get<std::string>());
    return absl::OkStatus();
  }
  if (!p->is_array() || p->empty()) {
    return Invalid("prompt", "must be a non-empty string or list of token ids");
  }
  for (size_t i = 0; i < p->size(); ++i) {
    const json& id = (*p)[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return Invalid("prompt", absl::StrCat("must be a string, or a list of token ids; entry ", i,
                                            " is not a token id (one prompt per request: n = 1)"));
    }
    g.add_prompt_token_ids(static_cast<int32_t>(id.get<int64_t>()));
  }
  return absl::OkStatus();
}

// The prompt: a completion's "prompt" (its text encoded here, as GenerateCall would), or the
// chat "messages" encoded here (router/prompt.h), whose template may end each turn with a
// stop id, added to `stop_ids`. A text past CheckPromptBytes is refused before tokenizing (and
// before the client server's receive limit, derived from the same bound, would refuse it).
absl::Status Prompt(const json& body, Endpoint endpoint, const text::Tokenizer& tokenizer,
                    uint32_t max_model_len, v1::GenerateRequest& g,
                    std::vector<int32_t>& stop_ids) {
  if (endpoint == Endpoint::kCompletions) {
    if (absl::Status s = CompletionPrompt(body, g); !s.ok()) return s;
    if (g.prompt_text().empty()) return absl::OkStatus();
    if (absl::Status s = CheckPromptBytes("prompt", g.prompt_text().size(), max_model_len);
        !s.ok()) {
      return s;
    }
    // Encoded here rather than by the router, so that max_tokens' default knows the room the
    // prompt leaves (MaxTokens); the same encoding GenerateCall would make.
    absl::StatusOr<std::vector<int32_t>> ids =
        EncodeTextPrompt(tokenizer, g.prompt_text(), max_model_len);
    if (!ids.ok()) return ids.status();
    g.clear_prompt_text();
    for (int32_t id : *ids) g.add_prompt_token_ids(id);
    return absl::OkStatus();
  }
  absl::StatusOr<bool> add_generation_prompt = Bool(body, "add_generation_prompt", true);
  if (!add_generation_prompt.ok()) return add_generation_prompt.status();
  absl::StatusOr<std::vector<ChatMessage>> messages = Messages(body);
  if (!messages.ok()) return messages.status();
  absl::StatusOr<ChatPrompt> prompt =
      EncodeChatPrompt(tokenizer, *messages, *add_generation_prompt, max_model_len);
  if (!prompt.ok()) return prompt.status();
  for (int32_t id : prompt->ids) g.add_prompt_token_ids(id);
  stop_ids.insert(stop_ids.end(), prompt->stop_ids.begin(), prompt->stop_ids.end());
  return absl::OkStatus();
}

// max_tokens (max_completion_tokens for chat, when max_tokens is absent). Absent, it comes from
// the room the prompt leaves in the context (max_model_len, bounded by the model's positions),
// so that the default is never refused: OpenAI's 16 for completions when that fits, and for
// chat the whole room (as vLLM does), capped by the router's max_tokens_limit. A prompt that
// leaves no room gets 1, and the router's refusal names the context limit.
absl::Status MaxTokens(const json& body, Endpoint endpoint, const ServedModel& model,
                       int prompt_tokens, v1::SamplingParams& s) {
  const char* max_key =
      endpoint == Endpoint::kChatCompletions && Field(body, "max_tokens") == nullptr
          ? "max_completion_tokens"
          : "max_tokens";
  absl::StatusOr<std::optional<int64_t>> max_tokens =
      Integer(body, max_key, 1, std::numeric_limits<uint32_t>::max());
  if (!max_tokens.ok()) return max_tokens.status();
  if (max_tokens->has_value()) {
    s.set_max_tokens(static_cast<uint32_t>(**max_tokens));
    return absl::OkStatus();
  }
  const int64_t context = model.max_positions > 0
                              ? std::min<int64_t>(model.max_model_len, model.max_positions)
                              : int64_t{model.max_model_len};
  const int64_t room = context - prompt_tokens;
  const int64_t cap = endpoint == Endpoint::kCompletions ? 16 : int64_t{model.max_tokens_limit};
  s.set_max_tokens(static_cast<uint32_t>(std::clamp<int64_t>(room, 1, std::max<int64_t>(1, cap))));
  return absl::OkStatus();
}

// temperature, top_p and top_k; each absent one is the model's generation_config.json value,
// else neutral.
absl::Status Sampling(const json& body, const text::GenerationDefaults& defaults,
                      v1::SamplingParams& s) {
  absl::StatusOr<std::optional<double>> temperature = Number(body, "temperature", 0, 100);
  if (!temperature.ok()) return temperature.status();
  s.set_temperature(static_cast<float>(temperature->value_or(defaults.temperature.value_or(1.0f))));
  absl::StatusOr<std::optional<double>> top_p = Number(body, "top_p", 0, 1);
  if (!top_p.ok()) return top_p.status();
  if (top_p->has_value() && **top_p == 0) return Invalid("top_p", "must lie in (0, 1]");
  s.set_top_p(static_cast<float>(top_p->value_or(defaults.top_p.value_or(1.0f))));
  absl::StatusOr<std::optional<int64_t>> top_k = Integer(body, "top_k", -1, 1 << 20);
  if (!top_k.ok()) return top_k.status();
  s.set_top_k(
      static_cast<uint32_t>(std::max<int64_t>(0, top_k->value_or(defaults.top_k.value_or(0)))));
  return absl::OkStatus();
}

// "seed"; without one each request samples differently, as OpenAI's do.
absl::Status Seed(const json& body, v1::SamplingParams& s) {
  absl::StatusOr<std::optional<int64_t>> seed = Integer(
      body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  if (!seed.ok()) return seed.status();
  if (seed->has_value()) {
    s.set_seed(static_cast<uint64_t>(**seed));
  } else {
    static thread_local std::mt19937_64 rng(std::random_device{}());
    s.set_seed(rng());
  }
  return absl::OkStatus();
}

// "stop": a string or a list of strings, within the stop strings' rule (common/wire_bounds.h),
// which the router checks again naming sampling.stop[i]; here the error names "stop" alone, the
// field as the client wrote it.
absl::Status StopStrings(const json& body, v1::SamplingParams& s) {
  const json* stop = Field(body, "stop");
  if (stop == nullptr) return absl::OkStatus();
  if (stop->is_string()) {
    s.add_stop(stop->get<std::string>());
  } else if (stop->is_array()) {
    for (const json& one : *stop) {
      if (!one.is_string()) return Invalid("stop", "must be a string or a list of strings");
      s.add_stop(one.get<std::string>());
    }
  } else {
    return Invalid("stop", "must be a string or a list of strings");
  }
  return CheckStopStrings("stop", s.stop(), /*name_index=*/false);
}

// The stop ids: the template's (`stop_ids`), then "stop_token_ids"; and "ignore_eos".
absl::Status StopTokens(const json& body, const text::Tokenizer& tokenizer,
                        std::vector<int32_t> stop_ids, v1::SamplingParams& s) {
  if (const json* ids = Field(body, "stop_token_ids"); ids != nullptr) {
    if (!ids->is_array()) return Invalid("stop_token_ids", "must be a list of token ids");
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= tokenizer.size()) {
        return Invalid("stop_token_ids",
                       absl::StrCat("each must be a token id in [0, ", tokenizer.size(), ")"));
      }
      stop_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  for (int32_t id : stop_ids) s.add_stop_token_ids(id);
  absl::StatusOr<bool> ignore_eos = Bool(body, "ignore_eos", false);
  if (!ignore_eos.ok()) return ignore_eos.status();
  s.set_ignore_eos(*ignore_eos);
  return absl::OkStatus();
}

// Whether the response carries the chosen tokens' log-probabilities: completions take
// logprobs 0 (a count of alternatives), chat takes logprobs true.
absl::StatusOr<bool> WantsLogprobs(const json& body, Endpoint endpoint) {
  if (endpoint == Endpoint::kChatCompletions) return Bool(body, "logprobs", false);
  absl::StatusOr<std::optional<int64_t>> logprobs = Integer(body, "logprobs", 0, 0);
  if (!logprobs.ok()) {
    return Invalid("logprobs",
                   "only 0 is supported (the chosen token's log-probability; alternatives "
                   "are not computed)");
  }
  return logprobs->has_value();
}

// "stream" and "stream_options".
absl::Status Streaming(const json& body, Request& request) {
  absl::StatusOr<bool> stream = Bool(body, "stream", false);
  if (!stream.ok()) return stream.status();
  request.stream = *stream;
  const json* options = Field(body, "stream_options");
  if (options == nullptr) return absl::OkStatus();
  if (!options->is_object()) return Invalid("stream_options", "must be an object");
  absl::StatusOr<bool> usage = Bool(*options, "include_usage", false);
  if (!usage.ok()) return Invalid("stream_options.include_usage", "must be true or false");
  request.include_usage = *usage;
  return absl::OkStatus();
}

// baton's truncation options: "truncation_mode" by its name (common/ced_rules.h), and
// "truncation_keep", which needs a mode.
absl::Status Truncation(const json& body, v1::GenerateRequest& g) {
  absl::StatusOr<std::optional<std::string>> mode = String(body, "truncation_mode");
  if (!mode.ok()) return mode.status();
  absl::StatusOr<std::optional<int64_t>> keep =
      Integer(body, "truncation_keep", 0, std::numeric_limits<uint32_t>::max());
  if (!keep.ok()) return keep.status();
  if (!mode->has_value()) {
    return keep->has_value() ? Invalid("truncation_keep", "needs truncation_mode")
                             : absl::OkStatus();
  }
  absl::StatusOr<v1::TruncationMode> parsed = ParseTruncationModeName(**mode, "truncation_mode");
  if (!parsed.ok()) return parsed.status();
  g.mutable_truncation()->set_mode(*parsed);
  g.mutable_truncation()->set_keep(keep->value_or(0));
  return absl::OkStatus();
}

// "cache_salt" (baton's: prefix-cache isolation), "fidelity_tokens" (baton's: the request's
// own shadow verification, usage.fidelity) and "user" (OpenAI's, checked and unused).
absl::Status CacheSaltAndUser(const json& body, v1::GenerateRequest& g) {
  absl::StatusOr<std::optional<std::string>> salt = String(body, "cache_salt");
  if (!salt.ok()) return salt.status();
  if (salt->has_value()) g.set_cache_salt(**salt);
  absl::StatusOr<std::optional<int64_t>> fidelity =
      Integer(body, "fidelity_tokens", 0, kMaxFidelityTokens);
  if (!fidelity.ok()) return fidelity.status();
  g.set_fidelity_tokens(static_cast<uint32_t>(fidelity->value_or(0)));
  absl::StatusOr<std::optional<std::string>> user = String(body, "user");
  return user.ok() ? absl::OkStatus() : user.status();
}

// baton's speculative decoding override: "speculative" ("off", "ngram" or "draft"; absent: the
// decode nodes' default) and "speculative_tokens" (0: the decode nodes' default).
absl::Status Speculative(const json& body, v1::SamplingParams& s) {
  absl::StatusOr<std::optional<std::string>> method = String(body, "speculative");
  if (!method.ok()) return method.status();
  if (method->has_value()) {
    const std::string& name = **method;
    if (name == "off") {
      s.set_speculative(v1::SPECULATIVE_OFF);
    } else if (name == "ngram") {
      s.set_speculative(v1::SPECULATIVE_NGRAM);
    } else if (name == "draft") {
      s.set_speculative(v1::SPECULATIVE_DRAFT);
    } else {
      return Invalid("speculative", "must be \"off\", \"ngram\" or \"draft\"");
    }
  }
  absl::StatusOr<std::optional<int64_t>> tokens = Integer(body, "speculative_tokens", 0, 1 << 20);
  if (!tokens.ok()) return tokens.status();
  s.set_speculative_tokens(static_cast<uint32_t>(tokens->value_or(0)));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Request> ParseRequest(Endpoint endpoint, std::string_view body_text,
                                     const text::Tokenizer& tokenizer, const ServedModel& model) {
  // The caller keeps the tokenizer alive; the entry only borrows it.
  const ModelEntry entry{model, std::shared_ptr<const text::Tokenizer>(
                                    std::shared_ptr<const text::Tokenizer>(), &tokenizer)};
  return ParseRequest(endpoint, body_text, std::span<const ModelEntry>(&entry, 1));
}

// The fields are read in this order, so that of several bad fields the first is named.
absl::StatusOr<Request> ParseRequest(Endpoint endpoint, std::string_view body_text,
                                     std::span<const ModelEntry> models) {
  absl::StatusOr<json> body = ParseBody(body_text, models);
  if (!body.ok()) return body.status();
  Request request;
  request.endpoint = endpoint;
  absl::StatusOr<size_t> index = RequestedModel(*body, models);
  if (!index.ok()) return index.status();
  request.model = *index;
  const ServedModel& model = models[request.model].model;
  const text::Tokenizer& tokenizer = *models[request.model].tokenizer;
  v1::GenerateRequest& g = request.generate;
  v1::SamplingParams& s = *g.mutable_sampling();
  g.set_model(model.name);
  if (absl::Status status = RefuseUnsupported(*body, endpoint); !status.ok()) return status;
  std::vector<int32_t> stop_ids;  // the chat template's
  if (absl::Status status = Prompt(*body, endpoint, tokenizer, model.max_model_len, g, stop_ids);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = MaxTokens(*body, endpoint, model, g.prompt_token_ids_size(), s);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = Sampling(*body, tokenizer.generation_defaults(), s); !status.ok()) {
    return status;
  }
  if (absl::Status status = Seed(*body, s); !status.ok()) return status;
  if (absl::Status status = StopStrings(*body, s); !status.ok()) return status;
  if (absl::Status status = StopTokens(*body, tokenizer, std::move(stop_ids), s); !status.ok()) {
    return status;
  }
  absl::StatusOr<bool> logprobs = WantsLogprobs(*body, endpoint);
  if (!logprobs.ok()) return logprobs.status();
  request.logprobs = *logprobs;
  g.set_logprobs(request.logprobs);
  if (absl::Status status = Streaming(*body, request); !status.ok()) return status;
  if (absl::Status status = Truncation(*body, g); !status.ok()) return status;
  if (absl::Status status = CacheSaltAndUser(*body, g); !status.ok()) return status;
  if (absl::Status status = Speculative(*body, s); !status.ok()) return status;
  return request;
}

Error ErrorFor(int grpc_code, const std::string& router_message) {
  Error error;
  std::string message = router_message;
  std::string type = "server_error", code, param;
  switch (static_cast<grpc::StatusCode>(grpc_code)) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::FAILED_PRECONDITION:
      error.http_status = 400;
      type = "invalid_request_error";
      if (size_t colon = message.find(':');
          colon != std::string::npos && message.find(' ') > colon) {
        // The field as the client wrote it, in `param` and in the message.
        param = OpenAiParam(message.substr(0, colon));
        message = param + message.substr(colon);
      }
      break;
    case grpc::StatusCode::UNAUTHENTICATED:
      error.http_status = 401;
      type = "authentication_error";
      code = "invalid_api_key";
      break;
    case grpc::StatusCode::PERMISSION_DENIED:
      error.http_status = 403;
      type = "permission_error";
      break;
    case grpc::StatusCode::NOT_FOUND:
      error.http_status = 404;
      type = "invalid_request_error";
      param = "model";
      code = "model_not_found";
      break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      error.http_status = 429;
      type = "rate_limit_error";
      code = "rate_limit_exceeded";
      break;
    case grpc::StatusCode::UNAVAILABLE:
      error.http_status = 503;
      type = "service_unavailable_error";
      code = "service_unavailable";
      break;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      error.http_status = 504;
      type = "timeout_error";
      break;
    case grpc::StatusCode::CANCELLED:
      error.http_status = 499;
      type = "cancelled";
      break;
    default:
      error.http_status = 500;
      break;
  }
  error.body = {{"error",
                 {{"message", message},
                  {"type", type},
                  {"param", param.empty() ? json(nullptr) : json(param)},
                  {"code", code.empty() ? json(nullptr) : json(code)}}}};
  return error;
}

Error ErrorFor(const absl::Status& status) {
  return ErrorFor(static_cast<int>(status.code()), std::string(status.message()));
}

ResponseWriter::ResponseWriter(const Request& request, const text::Tokenizer& tokenizer,
                               std::string model, int64_t created)
    : request_(request),
      tokenizer_(tokenizer),
      model_(std::move(model)),
      created_(created),
      chat_(request.endpoint == Endpoint::kChatCompletions) {
  logprobs_ = chat_ ? json{{"content", json::array()}}
                    : json{{"tokens", json::array()},
                           {"token_logprobs", json::array()},
                           {"top_logprobs", nullptr},
                           {"text_offset", json::array()}};
}

json ResponseWriter::Logprobs(const v1::GenerateResponse& message) {
  json out = chat_ ? json{{"content", json::array()}}
                   : json{{"tokens", json::array()},
                          {"token_logprobs", json::array()},
                          {"top_logprobs", nullptr},
                          {"text_offset", json::array()}};
  for (int i = 0; i < message.token_ids_size() && i < message.logprobs_size(); ++i) {
    const std::string token = tokenizer_.TokenText(message.token_ids(i));
    if (chat_) {
      json bytes = json::array();
      for (unsigned char c : token) bytes.push_back(static_cast<int>(c));
      out["content"].push_back({{"token", SafeText(token)},
                                {"logprob", message.logprobs(i)},
                                {"bytes", bytes},
                                {"top_logprobs", json::array()}});
    } else {
      out["tokens"].push_back(SafeText(token));
      out["token_logprobs"].push_back(message.logprobs(i));
      out["text_offset"].push_back(text_offset_);
      text_offset_ += token.size();
    }
  }
  return out;
}

json ResponseWriter::Usage() const {
  json usage = {{"prompt_tokens", usage_.prompt_tokens()},
                {"completion_tokens", usage_.completion_tokens()},
                {"total_tokens", usage_.prompt_tokens() + usage_.completion_tokens()},
                {"prompt_tokens_details", {{"cached_tokens", usage_.cached_tokens()}}},
                // Speculative decoding, under baton's name and OpenAI's predicted-output names.
                {"accepted_draft_tokens", usage_.accepted_draft_tokens()},
                {"completion_tokens_details",
                 {{"accepted_prediction_tokens", usage_.accepted_draft_tokens()},
                  {"rejected_prediction_tokens",
                   usage_.draft_tokens() -
                       std::min(usage_.draft_tokens(), usage_.accepted_draft_tokens())}}}};
  if (usage_.has_fidelity()) {
    // baton's shadow verification of this request ("fidelity_tokens" in the body).
    const v1::Fidelity& f = usage_.fidelity();
    usage["fidelity"] = {{"positions", f.positions()},
                         {"top1_agreements", f.top1_agreements()},
                         {"mean_kl", f.mean_kl()},
                         {"max_kl", f.max_kl()},
                         {"max_logit_diff", f.max_logit_diff()},
                         {"first_disagreement", f.first_disagreement()},
                         {"dropped", f.dropped()},
                         {"not_truncated", f.not_truncated()}};
  }
  return usage;
}

json ResponseWriter::ChunkBase() const {
  json chunk = {{"id", id_},
                {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
                {"created", created_},
                {"model", model_}};
  if (request_.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

std::string ResponseWriter::Chunks(const v1::GenerateResponse& message) {
  if (id_.empty()) id_ = (chat_ ? "chatcmpl-" : "cmpl-") + message.request_id();
  const std::string reason = FinishReason(message.finish_reason());
  if (message.has_usage()) usage_ = message.usage();
  auto event = [](const json& chunk) {
    return "data: " + chunk.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
  };
  std::string out;
  if (chat_ && !sent_role_) {
    sent_role_ = true;
    json chunk = ChunkBase();
    chunk["choices"] = json::array({{{"index", 0},
                                     {"delta", {{"role", "assistant"}, {"content", ""}}},
                                     {"logprobs", nullptr},
                                     {"finish_reason", nullptr}}});
    out += event(chunk);
  }
  if (message.text().empty() && reason.empty() && !request_.logprobs) return out;
  json choice = {{"index", 0},
                 {"logprobs", request_.logprobs ? Logprobs(message) : json(nullptr)},
                 {"finish_reason", reason.empty() ? json(nullptr) : json(reason)}};
  if (chat_) {
    choice["delta"] = message.text().empty() ? json::object() : json{{"content", message.text()}};
  } else {
    choice["text"] = message.text();
  }
  json chunk = ChunkBase();
  chunk["choices"] = json::array({choice});
  out += event(chunk);
  if (!reason.empty() && request_.include_usage) {
    json last = ChunkBase();
    last["choices"] = json::array();
    last["usage"] = Usage();
    out += event(last);
  }
  return out;
}

std::string ResponseWriter::Done() {
  return "data: [DONE]\n\n";
}

void ResponseWriter::Add(const v1::GenerateResponse& message) {
  if (id_.empty()) id_ = (chat_ ? "chatcmpl-" : "cmpl-") + message.request_id();
  text_ += message.text();
  if (request_.logprobs) {
    const json part = Logprobs(message);
    for (const auto& [key, value] : part.items()) {
      if (value.is_array()) {
        for (const json& entry : value) logprobs_[key].push_back(entry);
      }
    }
  }
  if (message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    finish_reason_ = FinishReason(message.finish_reason());
  }
  if (message.has_usage()) usage_ = message.usage();
}

json ResponseWriter::Completion() const {
  json choice = {{"index", 0},
                 {"logprobs", request_.logprobs ? logprobs_ : json(nullptr)},
                 {"finish_reason", finish_reason_}};
  if (chat_) {
    choice["message"] = {{"role", "assistant"}, {"content", text_}};
  } else {
    choice["text"] = text_;
  }
  return {{"id", id_},
          {"object", chat_ ? "chat.completion" : "text_completion"},
          {"created", created_},
          {"model", model_},
          {"choices", json::array({choice})},
          {"usage", Usage()}};
}

}  // namespace baton::router::openai
