// CED weights in memory (DESIGN section 2), loaded from a model directory holding config.json
// and model.safetensors.
//
// At load, matrices that always run on the same input are stacked so that one GEMM computes
// them: a producer's q, k, v; a consumer's q, swa_k, swa_v; every block-KV source layer's global
// k and v (all projected from the boundary's shared rows); gate and up. Loading refuses any
// missing or unexpected tensor, wrong shape, unknown dtype, truncated file or inconsistent
// config with a message naming the tensor or field, and leaves nothing half-loaded.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "baton/common/model_config.h"
#include "baton/model/safetensors.h"

namespace baton::model {

struct ProducerLayerWeights {
  std::vector<float> attn_norm;  // [d]
  std::vector<float> qkv;        // [H*hd + 2*Hkv*hd, d]: q_proj, k_proj, v_proj rows
  std::vector<float> o;          // [d, H*hd]
  std::vector<float> mlp_norm;   // [d]
  std::vector<float> gate_up;    // [2*I, d]: gate_proj rows, then up_proj rows
  std::vector<float> down;       // [d, I]
};

struct ConsumerLayerWeights {
  std::vector<float> attn_norm;  // [d]
  std::vector<float> q_swa_kv;   // [H*hd + 2*Hkv*hd, d]: q_proj, swa_k_proj, swa_v_proj rows
  std::vector<float> o;          // [d, H*hd]
  std::vector<float> mlp_norm;   // [d]
  std::vector<float> gate_up;    // [2*I, d]
  std::vector<float> down;       // [d, I]
};

// Which layers a node holds and runs (DESIGN section 6). kAll: the whole model. kProducers: a
// prefill node under the replay-on-decode split, which holds only what it runs there: the
// embedding, the producer layers, the boundary's attention norm (the first consumer layer's
// attn_norm) and the block-KV projections; the consumer layers, the final norm and an untied
// lm_head stay on disk.
enum class HeldLayers { kAll, kProducers };

absl::string_view HeldLayersName(HeldLayers held);

struct CedWeights {
  ModelConfig config;
  HeldLayers held = HeldLayers::kAll;  // kProducers: the buffers below that are not held are empty
  std::vector<float> embed;                     // [V, d]
  std::vector<ProducerLayerWeights> producers;  // layers [0, P)
  std::vector<ConsumerLayerWeights> consumers;  // layers [P, N)
  // [G * 2 * Hkv*hd, d]: for block-KV group g (source layer block_kv_sources[g], or consumer
  // layer P + g without sharing), global_k_proj rows then global_v_proj rows.
  std::vector<float> global_kv;
  std::vector<float> final_norm;  // [d]
  std::vector<float> lm_head;     // [V, d]; empty when tie_word_embeddings
  // Hex SHA-256 of the canonical config and of the weight file's bytes (DESIGN section 4).
  std::string fingerprint;

  const float* lm_head_data() const {
    return config.tie_word_embeddings ? embed.data() : lm_head.data();
  }
};

// One tensor of the file format and where its values live in CedWeights.
struct TensorSlot {
  std::string name;
  std::vector<int64_t> shape;
  float* data = nullptr;
};

// Sizes every buffer of `weights` that weights.held holds, for weights.config (zero-filled).
void AllocateWeights(CedWeights& weights);
// Every tensor the file must hold for weights.config, in a fixed order; buffers must be
// allocated. A tensor that weights.held does not hold has data == nullptr.
std::vector<TensorSlot> WeightTensorSlots(CedWeights& weights);

// Checks every tensor of the file (a model missing a consumer tensor is refused even where
// `held` leaves it on disk) and copies in those `held` holds. The fingerprint is the whole
// file's either way, so both sides of a split name the same model.
absl::StatusOr<CedWeights> LoadCedWeights(const std::string& model_dir,
                                          HeldLayers held = HeldLayers::kAll);

// The fingerprint of a model directory without loading its tensors (for the prefix store).
// With `weights_sha256` (64 hex digits, the SHA-256 of model.safetensors as a verified download
// recorded it) the weights are not read and need not be there: only config.json is.
absl::StatusOr<std::string> ModelFingerprint(const std::string& model_dir,
                                             const std::string& weights_sha256 = "");

// Writes config.json and model.safetensors for `weights` (which holds every layer) into
// `model_dir` (created if absent).
absl::Status SaveCedWeights(CedWeights& weights, const std::string& model_dir, Dtype dtype);

}  // namespace baton::model
