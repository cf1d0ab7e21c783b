#include "baton/model/model_factory.h"

#include <cmath>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace baton::model {
namespace {

class NormalStream {
 public:
  explicit NormalStream(uint64_t seed) : state_(seed) {}
  double Next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // Box-Muller on two uniforms in (0, 1].
    const double u1 = (static_cast<double>(NextBits() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(NextBits() >> 11) * 0x1.0p-53;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = radius * std::sin(2.0 * M_PI * u2);
    has_spare_ = true;
    return radius * std::cos(2.0 * M_PI * u2);
  }

 private:
  uint64_t NextBits() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace

absl::StatusOr<ModelConfig> PresetConfig(const std::string& preset) {
  ModelConfig c;
  c.max_backtrack = 5;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  if (preset == "tiny") {
    c.vocab_size = 512;
    c.hidden_size = 128;
    c.intermediate_size = 384;
    c.num_hidden_layers = 8;
    c.n_prefill_layer = 4;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 1;
    c.head_dim = 32;
    c.sliding_window = 16;
    c.kv_block_size = 16;
    c.tie_word_embeddings = true;
  } else if (preset == "small" || preset == "small-shared") {
    c.vocab_size = 4096;
    c.hidden_size = 512;
    c.intermediate_size = 1536;
    c.num_hidden_layers = 16;
    c.n_prefill_layer = 8;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 1;
    c.head_dim = 64;
    c.sliding_window = 128;
    c.kv_block_size = 64;
    c.tie_word_embeddings = false;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("preset '", preset, "' is unknown; allowed: tiny, small, small-shared"));
  }
  // YOCO's one shared cache: the boundary layer's block KV serves all eight consumer layers.
  if (preset == "small-shared") c.block_kv_sources = {c.n_prefill_layer};
  return c;
}

CedWeights GenerateWeights(const ModelConfig& config, uint64_t seed) {
  CedWeights w;
  w.config = config;
  AllocateWeights(w);
  NormalStream normal(seed);
  const double residual_scale = 1.0 / std::sqrt(2.0 * config.num_hidden_layers);
  for (const TensorSlot& slot : WeightTensorSlots(w)) {
    int64_t numel = 1;
    for (int64_t dim : slot.shape) numel *= dim;
    if (absl::EndsWith(slot.name, "norm.weight")) {
      for (int64_t i = 0; i < numel; ++i)
        slot.data[i] = static_cast<float>(1.0 + 0.1 * normal.Next());
      continue;
    }
    const double fan_in = static_cast<double>(slot.shape.back());
    double std = 1.0 / std::sqrt(fan_in);
    if (absl::StrContains(slot.name, "o_proj") || absl::StrContains(slot.name, "down_proj")) {
      std *= residual_scale;
    }
    // A separate lm_head gets a wider spread; a tied one stays at 1/sqrt(d), since the current
    // token's own embedding in the residual stream already raises its logit.
    if (slot.name == "lm_head.weight") std *= 2.0;
    for (int64_t i = 0; i < numel; ++i) slot.data[i] = static_cast<float>(std * normal.Next());
  }
  return w;
}

absl::Status MakeModel(const ModelConfig& config, uint64_t seed, const std::string& model_dir,
                       Dtype dtype) {
  if (absl::Status s = ValidateModelConfig(config); !s.ok()) return s;
  CedWeights weights = GenerateWeights(config, seed);
  return SaveCedWeights(weights, model_dir, dtype);
}

absl::Status CopyTokenizerFiles(const std::string& from, const std::string& model_dir) {
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(from) / "tokenizer.model")) {
    return absl::NotFoundError(absl::StrCat(from, "/tokenizer.model does not exist"));
  }
  for (const char* file : {"tokenizer.model", "tokenizer_config.json", "generation_config.json"}) {
    const fs::path source = fs::path(from) / file;
    if (!fs::exists(source)) continue;
    std::error_code error;
    fs::copy_file(source, fs::path(model_dir) / file, fs::copy_options::overwrite_existing, error);
    if (error) {
      return absl::InternalError(
          absl::StrCat("cannot copy ", source.string(), ": ", error.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace baton::model
