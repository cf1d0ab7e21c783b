#include "baton/common/model_config.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace baton {
namespace {

using Json = nlohmann::json;

absl::Status RequireAtLeast(absl::string_view field, int64_t value, int64_t minimum) {
  if (value < minimum) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field '", field, "' is ", value, "; it must be >= ", minimum));
  }
  return absl::OkStatus();
}

// Reads an integer field; `fallback` < 0 marks the field as required.
absl::Status ReadInt(const Json& json, const char* key, int64_t fallback, int64_t* out) {
  auto it = json.find(key);
  if (it == json.end() || it->is_null()) {
    if (fallback < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("config field '", key, "' is missing; it is required"));
    }
    *out = fallback;
    return absl::OkStatus();
  }
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field '", key, "' must be an integer, got ", it->dump()));
  }
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status ReadDouble(const Json& json, const char* key, double* out) {
  auto it = json.find(key);
  if (it == json.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field '", key, "' must be a number, got ", it->dump()));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& json, const char* key, bool* out) {
  auto it = json.find(key);
  if (it == json.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field '", key, "' must be true or false, got ", it->dump()));
  }
  *out = it->get<bool>();
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateModelConfig(const ModelConfig& c) {
  for (auto [field, value] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
                              {"hidden_size", c.hidden_size},
                              {"intermediate_size", c.intermediate_size},
                              {"num_attention_heads", c.num_attention_heads},
                              {"num_key_value_heads", c.num_key_value_heads},
                              {"head_dim", c.head_dim},
                              {"sliding_window", c.sliding_window},
                              {"kv_block_size", c.kv_block_size}}) {
    if (absl::Status s = RequireAtLeast(field, value, 1); !s.ok()) return s;
  }
  if (absl::Status s = RequireAtLeast("num_hidden_layers", c.num_hidden_layers, 2); !s.ok()) {
    return s;
  }
  if (c.n_prefill_layer < 1 || c.n_prefill_layer >= c.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field 'n_prefill_layer' is ", c.n_prefill_layer,
                     "; it must lie in [1, num_hidden_layers) = [1, ", c.num_hidden_layers, ")"));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field 'num_key_value_heads' is ", c.num_key_value_heads,
                     "; it must divide num_attention_heads (", c.num_attention_heads, ")"));
  }
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config field 'head_dim' is ", c.head_dim,
                                                   "; it must be even (RoPE rotates halves)"));
  }
  if (absl::Status s = RequireAtLeast("max_backtrack", c.max_backtrack, 0); !s.ok()) return s;
  if (!(c.rms_norm_eps > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field 'rms_norm_eps' is ", c.rms_norm_eps, "; it must be > 0"));
  }
  if (!(c.rope_theta > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field 'rope_theta' is ", c.rope_theta, "; it must be > 0"));
  }
  for (auto [field, value] : {std::pair<const char*, int64_t>{"bos_token_id", c.bos_token_id},
                              {"eos_token_id", c.eos_token_id}}) {
    if (value < 0 || value >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("config field '", field, "' is ", value,
                                                     "; it must lie in [0, vocab_size) = [0, ",
                                                     c.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text) {
  Json json = Json::parse(json_text.begin(), json_text.end(), /*cb=*/nullptr,
                          /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError("config.json is not a JSON object");
  }
  ModelConfig c;
  struct IntField {
    const char* key;
    int64_t* out;
    int64_t fallback;  // < 0: required
  };
  const IntField required[] = {
      {"vocab_size", &c.vocab_size, -1},
      {"hidden_size", &c.hidden_size, -1},
      {"intermediate_size", &c.intermediate_size, -1},
      {"num_hidden_layers", &c.num_hidden_layers, -1},
      {"n_prefill_layer", &c.n_prefill_layer, -1},
      {"num_attention_heads", &c.num_attention_heads, -1},
      {"sliding_window", &c.sliding_window, -1},
      {"kv_block_size", &c.kv_block_size, -1},
      {"max_backtrack", &c.max_backtrack, 5},
      {"bos_token_id", &c.bos_token_id, 0},
      {"eos_token_id", &c.eos_token_id, 0},
  };
  for (const IntField& f : required) {
    if (absl::Status s = ReadInt(json, f.key, f.fallback, f.out); !s.ok()) return s;
  }
  // Hugging Face defaults: one KV head per query head, head_dim = hidden_size / heads.
  if (absl::Status s = ReadInt(json, "num_key_value_heads",
                               std::max<int64_t>(c.num_attention_heads, 0), &c.num_key_value_heads);
      !s.ok()) {
    return s;
  }
  const int64_t default_head_dim =
      c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0;
  if (absl::Status s =
          ReadInt(json, "head_dim", std::max<int64_t>(default_head_dim, 0), &c.head_dim);
      !s.ok()) {
    return s;
  }
  for (absl::Status s : {ReadDouble(json, "rms_norm_eps", &c.rms_norm_eps),
                         ReadDouble(json, "rope_theta", &c.rope_theta),
                         ReadBool(json, "tie_word_embeddings", &c.tie_word_embeddings),
                         ReadBool(json, "yoco_swa_share_hidden", &c.yoco_swa_share_hidden)}) {
    if (!s.ok()) return s;
  }
  if (absl::Status s = ValidateModelConfig(c); !s.ok()) return s;
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open model config '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<ModelConfig> config = ParseModelConfig(text.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

std::string ModelConfigToJson(const ModelConfig& c) {
  Json json = {
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"n_prefill_layer", c.n_prefill_layer},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"sliding_window", c.sliding_window},
      {"max_backtrack", c.max_backtrack},
      {"kv_block_size", c.kv_block_size},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"yoco_swa_share_hidden", c.yoco_swa_share_hidden},
      {"bos_token_id", c.bos_token_id},
      {"eos_token_id", c.eos_token_id},
      {"model_type", "ced"},
  };
  return json.dump(2) + "\n";
}

}  // namespace baton
