#include "baton/model/weights.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "baton/common/hash.h"

namespace baton::model {
namespace {

std::string Layer(int64_t layer, const char* suffix) {
  return absl::StrCat("model.layers.", layer, ".", suffix);
}

// SHA-256 of the canonical config JSON and of the weight file's digest (DESIGN section 4).
std::string Fingerprint(const ModelConfig& config, const Sha256Digest& weights_digest) {
  Sha256 fingerprint;
  fingerprint.Update(ModelConfigToJson(config));
  fingerprint.Update(weights_digest.data(), weights_digest.size());
  return HexDigest(fingerprint.Finish());
}

// `buffer` + offset, or nullptr for a buffer the held layers leave empty.
float* At(std::vector<float>& buffer, int64_t offset = 0) {
  return buffer.empty() ? nullptr : buffer.data() + offset;
}

// SHA-256 of a file's bytes, read 1 MiB at a time (hashing a mapped file would make every
// page of it resident, the layers a node does not hold included).
absl::StatusOr<Sha256Digest> FileDigest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open weights file '", path, "'"));
  Sha256 digest;
  std::vector<char> buffer(1 << 20);
  while (in.read(buffer.data(), buffer.size()) || in.gcount() > 0) {
    digest.Update(buffer.data(), static_cast<size_t>(in.gcount()));
  }
  return digest.Finish();
}

}  // namespace

absl::string_view HeldLayersName(HeldLayers held) {
  return held == HeldLayers::kProducers ? "producers" : "all";
}

void AllocateWeights(CedWeights& w) {
  const ModelConfig& c = w.config;
  const int64_t d = c.hidden_size, q = c.num_attention_heads * c.head_dim;
  const int64_t kv = c.num_key_value_heads * c.head_dim, inter = c.intermediate_size;
  const bool all = w.held == HeldLayers::kAll;
  w.embed.assign(c.vocab_size * d, 0.0f);
  // Both layer groups hold a norm, a stacked q/k/v-like projection, o_proj, a norm and an MLP.
  auto allocate = [&](auto& layer, std::vector<float>& stacked_qkv) {
    layer.attn_norm.assign(d, 0.0f);
    stacked_qkv.assign((q + 2 * kv) * d, 0.0f);
    layer.o.assign(d * q, 0.0f);
    layer.mlp_norm.assign(d, 0.0f);
    layer.gate_up.assign(2 * inter * d, 0.0f);
    layer.down.assign(d * inter, 0.0f);
  };
  w.producers.assign(c.num_producer_layers(), {});
  for (ProducerLayerWeights& p : w.producers) allocate(p, p.qkv);
  w.consumers.assign(c.num_consumer_layers(), {});
  if (all) {
    for (ConsumerLayerWeights& l : w.consumers) allocate(l, l.q_swa_kv);
  } else {
    w.consumers[0].attn_norm.assign(d, 0.0f);  // the boundary's norm, whose rows feed block KV
  }
  w.global_kv.assign(c.num_block_kv_groups() * 2 * kv * d, 0.0f);
  w.final_norm.assign(all ? d : 0, 0.0f);
  w.lm_head.assign(all && !c.tie_word_embeddings ? c.vocab_size * d : 0, 0.0f);
}

std::vector<TensorSlot> WeightTensorSlots(CedWeights& w) {
  const ModelConfig& c = w.config;
  const int64_t d = c.hidden_size, q = c.num_attention_heads * c.head_dim;
  const int64_t kv = c.num_key_value_heads * c.head_dim, inter = c.intermediate_size;
  std::vector<TensorSlot> slots;
  slots.push_back({"model.embed_tokens.weight", {c.vocab_size, d}, w.embed.data()});
  // Norms, o_proj and the MLP have the same names and shapes in both layer groups.
  auto common = [&](int64_t layer, std::vector<float>& attn_norm, std::vector<float>& o,
                    std::vector<float>& mlp_norm, std::vector<float>& gate_up,
                    std::vector<float>& down) {
    slots.push_back({Layer(layer, "attn_norm.weight"), {d}, At(attn_norm)});
    slots.push_back({Layer(layer, "self_attn.o_proj.weight"), {d, q}, At(o)});
    slots.push_back({Layer(layer, "mlp_norm.weight"), {d}, At(mlp_norm)});
    slots.push_back({Layer(layer, "mlp.gate_proj.weight"), {inter, d}, At(gate_up)});
    slots.push_back({Layer(layer, "mlp.up_proj.weight"), {inter, d}, At(gate_up, inter * d)});
    slots.push_back({Layer(layer, "mlp.down_proj.weight"), {d, inter}, At(down)});
  };
  for (int64_t l = 0; l < c.num_producer_layers(); ++l) {
    ProducerLayerWeights& p = w.producers[l];
    slots.push_back({Layer(l, "self_attn.q_proj.weight"), {q, d}, p.qkv.data()});
    slots.push_back({Layer(l, "self_attn.k_proj.weight"), {kv, d}, p.qkv.data() + q * d});
    slots.push_back({Layer(l, "self_attn.v_proj.weight"), {kv, d}, p.qkv.data() + (q + kv) * d});
    common(l, p.attn_norm, p.o, p.mlp_norm, p.gate_up, p.down);
  }
  for (int64_t i = 0; i < c.num_consumer_layers(); ++i) {
    const int64_t l = c.n_prefill_layer + i;
    ConsumerLayerWeights& layer = w.consumers[i];
    slots.push_back({Layer(l, "self_attn.q_proj.weight"), {q, d}, At(layer.q_swa_kv)});
    slots.push_back({Layer(l, "self_attn.swa_k_proj.weight"), {kv, d}, At(layer.q_swa_kv, q * d)});
    slots.push_back(
        {Layer(l, "self_attn.swa_v_proj.weight"), {kv, d}, At(layer.q_swa_kv, (q + kv) * d)});
    // Only block-KV sources project block KV (into their group's rows); the others read it.
    if (c.is_block_kv_source(l)) {
      float* global = w.global_kv.data() + c.block_kv_group(l) * 2 * kv * d;
      slots.push_back({Layer(l, "self_attn.global_k_proj.weight"), {kv, d}, global});
      slots.push_back({Layer(l, "self_attn.global_v_proj.weight"), {kv, d}, global + kv * d});
    }
    common(l, layer.attn_norm, layer.o, layer.mlp_norm, layer.gate_up, layer.down);
  }
  slots.push_back({"model.norm.weight", {d}, At(w.final_norm)});
  if (!c.tie_word_embeddings) {
    slots.push_back({"lm_head.weight", {c.vocab_size, d}, At(w.lm_head)});
  }
  return slots;
}

absl::StatusOr<CedWeights> LoadCedWeights(const std::string& model_dir, HeldLayers held) {
  const std::string config_path = model_dir + "/config.json";
  const std::string weights_path = model_dir + "/model.safetensors";
  CedWeights w;
  w.held = held;
  absl::StatusOr<ModelConfig> config = LoadModelConfig(config_path);
  if (!config.ok()) return config.status();
  w.config = *config;
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Read(weights_path);
  if (!file.ok()) return file.status();

  AllocateWeights(w);
  const bool shared = !w.config.block_kv_sources.empty();
  std::set<std::string> expected;
  for (const TensorSlot& slot : WeightTensorSlots(w)) {
    expected.insert(slot.name);
    auto it = file->tensors().find(slot.name);
    if (it == file->tensors().end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(weights_path, ": tensor '", slot.name, "' is missing",
                       slot.name == "lm_head.weight" ? " (tie_word_embeddings is false)"
                       : shared && absl::StrContains(slot.name, ".global_")
                           ? " (its layer is one of block_kv_sources)"
                           : ""));
    }
    if (it->second.shape != slot.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(weights_path, ": tensor '", slot.name, "' has shape [",
                       absl::StrJoin(it->second.shape, ", "), "]; config.json requires [",
                       absl::StrJoin(slot.shape, ", "), "]"));
    }
    if (slot.data != nullptr) file->CopyAsF32(it->second, slot.data);
  }
  for (const auto& [name, info] : file->tensors()) {
    if (!expected.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          weights_path, ": unexpected tensor '", name, "'",
          name == "lm_head.weight" ? " (tie_word_embeddings is true: lm_head must be absent)"
          : shared && absl::StrContains(name, ".global_")
              ? " (only the layers of block_kv_sources project block KV; this layer reads its "
                "source's)"
              : " (not part of a CED model with this config)"));
    }
  }
  absl::StatusOr<Sha256Digest> digest = FileDigest(weights_path);
  if (!digest.ok()) return digest.status();
  w.fingerprint = Fingerprint(w.config, *digest);
  return w;
}

absl::StatusOr<std::string> ModelFingerprint(const std::string& model_dir,
                                             const std::string& weights_sha256) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(model_dir + "/config.json");
  if (!config.ok()) return config.status();
  if (!weights_sha256.empty()) {
    if (weights_sha256.size() != 2 * sizeof(Sha256Digest) ||
        !std::all_of(weights_sha256.begin(), weights_sha256.end(),
                     [](char c) { return absl::ascii_isxdigit(static_cast<unsigned char>(c)); })) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--weights-sha256: '", weights_sha256,
          "' is not a SHA-256 (64 hex digits, as sha256sum model.safetensors prints it)"));
    }
    const std::string bytes = absl::HexStringToBytes(weights_sha256);
    Sha256Digest digest;
    std::memcpy(digest.data(), bytes.data(), digest.size());
    return Fingerprint(*config, digest);
  }
  absl::StatusOr<Sha256Digest> digest = FileDigest(model_dir + "/model.safetensors");
  if (!digest.ok()) return digest.status();
  return Fingerprint(*config, *digest);
}

absl::Status SaveCedWeights(CedWeights& weights, const std::string& model_dir, Dtype dtype) {
  if (weights.held != HeldLayers::kAll) {
    return absl::InvalidArgumentError("only weights that hold every layer can be saved");
  }
  std::error_code error;
  std::filesystem::create_directories(model_dir, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create model directory '", model_dir, "': ", error.message()));
  }
  std::ofstream config(model_dir + "/config.json", std::ios::trunc);
  config << ModelConfigToJson(weights.config);
  config.close();
  if (!config)
    return absl::DataLossError(absl::StrCat("writing ", model_dir, "/config.json failed"));
  std::vector<TensorToWrite> tensors;
  for (const TensorSlot& slot : WeightTensorSlots(weights)) {
    tensors.push_back({slot.name, slot.shape, slot.data});
  }
  return WriteSafetensors(model_dir + "/model.safetensors", tensors, dtype);
}

}  // namespace baton::model
