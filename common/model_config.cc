#include "baton/common/model_config.h"

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "baton/common/checked_math.h"
#include "baton/common/hash.h"
#include "nlohmann/json.hpp"

namespace baton {
namespace {

using Json = nlohmann::json;

absl::Status RequireInRange(absl::string_view field, int64_t value, int64_t minimum,
                            int64_t maximum) {
  if (value < minimum || value > maximum) {
    return absl::InvalidArgumentError(absl::StrCat("config field '", field, "' is ", value,
                                                   "; it must lie in [", minimum, ", ", maximum,
                                                   "]"));
  }
  return absl::OkStatus();
}

// A tensor or StateBlock region whose size is the product of `factors`; `what` spells the
// product in field names for the message.
absl::Status RequireTensorFits(absl::string_view what, std::initializer_list<int64_t> factors) {
  const std::optional<int64_t> elements = CheckedProduct(factors);
  if (!elements || *elements > kMaxTensorElements) {
    return absl::InvalidArgumentError(
        absl::StrCat("config product ", what, " is ",
                     elements ? absl::StrCat(*elements) : std::string("beyond int64"),
                     " elements; it must be <= ", kMaxTensorElements, " (2^36)"));
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

// Reads an optional list of layer indices: absent or null leaves `out` empty; otherwise a
// non-empty array of at most kMaxLayers integers (ValidateModelConfig checks the values).
absl::Status ReadLayerList(const Json& json, const char* key, std::vector<int64_t>* out) {
  auto it = json.find(key);
  if (it == json.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array() || it->empty() || it->size() > static_cast<size_t>(kMaxLayers)) {
    return absl::InvalidArgumentError(absl::StrCat("config field '", key,
                                                   "' must be a non-empty list of at most ",
                                                   kMaxLayers, " layer indices, got ", it->dump()));
  }
  for (const Json& entry : *it) {
    if (!entry.is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config field '", key, "' must hold layer indices (integers), got ", entry.dump()));
    }
    out->push_back(entry.get<int64_t>());
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// block_kv_sources, when given: the boundary layer first, then consumer layers, ascending.
absl::Status CheckBlockKvSources(const ModelConfig& c) {
  const std::vector<int64_t>& sources = c.block_kv_sources;
  if (sources.front() != c.n_prefill_layer) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field 'block_kv_sources' starts at ", sources.front(),
                     "; its first entry must be n_prefill_layer (", c.n_prefill_layer,
                     "), the boundary layer, which projects the first block KV"));
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i] < c.n_prefill_layer || sources[i] >= c.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config field 'block_kv_sources' holds ", sources[i],
          "; each entry must be a consumer layer in [n_prefill_layer, num_hidden_layers) = [",
          c.n_prefill_layer, ", ", c.num_hidden_layers, ")"));
    }
    if (i > 0 && sources[i] <= sources[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config field 'block_kv_sources' is not strictly ascending (", sources[i - 1], " then ",
          sources[i], "); list each source layer once, in order"));
    }
  }
  return absl::OkStatus();
}

// The sizes the weights (DESIGN section 2) and the StateBlock regions (section 4) multiply,
// each within a tensor's bound.
absl::Status CheckSizesFit(const ModelConfig& c) {
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim;
  const int64_t ring = c.ring_capacity();
  for (absl::Status s : {
           RequireTensorFits("vocab_size * hidden_size", {c.vocab_size, c.hidden_size}),
           RequireTensorFits("num_attention_heads * head_dim * hidden_size",
                             {c.num_attention_heads, c.head_dim, c.hidden_size}),
           RequireTensorFits("intermediate_size * hidden_size",
                             {c.intermediate_size, c.hidden_size}),
           RequireTensorFits("n_prefill_layer * 2 * ring_capacity * kv_dim",
                             {c.num_producer_layers(), 2, ring, kv_dim}),
           RequireTensorFits("consumer layers * 2 * ring_capacity * kv_dim",
                             {c.num_consumer_layers(), 2, ring, kv_dim}),
           RequireTensorFits("block-KV groups * 2 * kv_block_size * kv_dim",
                             {c.num_block_kv_groups(), 2, c.kv_block_size, kv_dim}),
           RequireTensorFits("n_prefill_layer * 2 * kv_block_size * kv_dim",
                             {c.num_producer_layers(), 2, c.kv_block_size, kv_dim}),
       }) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateModelConfig(const ModelConfig& c) {
  struct Bound {
    const char* field;
    int64_t value, minimum, maximum;
  };
  const Bound bounds[] = {
      {"vocab_size", c.vocab_size, 1, kMaxVocabSize},
      {"hidden_size", c.hidden_size, 1, kMaxHiddenSize},
      {"intermediate_size", c.intermediate_size, 1, kMaxIntermediateSize},
      {"num_hidden_layers", c.num_hidden_layers, 2, kMaxLayers},
      {"num_attention_heads", c.num_attention_heads, 1, kMaxHeads},
      {"num_key_value_heads", c.num_key_value_heads, 1, kMaxHeads},
      {"head_dim", c.head_dim, 1, kMaxHeadDim},
      {"sliding_window", c.sliding_window, 1, kMaxSlidingWindow},
      {"max_backtrack", c.max_backtrack, 0, kMaxBacktrack},
      {"kv_block_size", c.kv_block_size, 1, kMaxKvBlockSize},
      {"max_position_embeddings", c.max_position_embeddings, 1, kMaxPositionEmbeddings},
  };
  for (const Bound& b : bounds) {
    if (absl::Status s = RequireInRange(b.field, b.value, b.minimum, b.maximum); !s.ok()) {
      return s;
    }
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
  if (!(c.rms_norm_eps > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field 'rms_norm_eps' is ", c.rms_norm_eps, "; it must be > 0"));
  }
  if (!(c.rope_theta > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field 'rope_theta' is ", c.rope_theta, "; it must be > 0"));
  }
  if (!c.block_kv_sources.empty()) {
    if (absl::Status s = CheckBlockKvSources(c); !s.ok()) return s;
  }
  if (absl::Status s = CheckSizesFit(c); !s.ok()) return s;
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
      {"max_position_embeddings", &c.max_position_embeddings, kDefaultMaxPositionEmbeddings},
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
  if (absl::Status s = ReadLayerList(json, "block_kv_sources", &c.block_kv_sources); !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateModelConfig(c); !s.ok()) return s;
  // Every consumer layer listed is the same model as none listed: one form, one fingerprint.
  if (static_cast<int64_t>(c.block_kv_sources.size()) == c.num_consumer_layers()) {
    c.block_kv_sources.clear();
  }
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

std::string ConfigDigest(const ModelConfig& config) {
  Sha256 digest;
  digest.Update(ModelConfigToJson(config));
  return HexDigest(digest.Finish());
}

std::string DefaultServedModelName(const std::string& model_dir) {
  const std::filesystem::path path = std::filesystem::path(model_dir).lexically_normal();
  std::string name = path.filename().string();
  if (name.empty()) name = path.parent_path().filename().string();
  return name;
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
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"yoco_swa_share_hidden", c.yoco_swa_share_hidden},
      {"bos_token_id", c.bos_token_id},
      {"eos_token_id", c.eos_token_id},
      {"model_type", "ced"},
  };
  // Written only when given, so that a model without sharing keeps the text (and the digest
  // and fingerprint) it had before the field existed.
  if (!c.block_kv_sources.empty()) json["block_kv_sources"] = c.block_kv_sources;
  return json.dump(2) + "\n";
}

}  // namespace baton
