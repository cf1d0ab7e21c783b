// The CED model configuration (DESIGN section 2), read from a Hugging Face style config.json.
//
// A ModelConfig that came out of ParseModelConfig or ValidateModelConfig is consistent: every
// size is positive and within the bounds below, the boundary P lies in [1, N), heads divide
// evenly, head_dim is even (RoPE rotates halves), block_kv_sources (when given) ascends strictly
// from P within [P, N), and every weight tensor and StateBlock region
// has at most kMaxTensorElements elements. Code further down may rely on that and does not
// re-check; in particular any product of sizes that names a tensor or region fits int64.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "baton/common/ced_rules.h"

namespace baton {

// Upper bounds on config.json sizes. config.json comes from outside (a model directory, a
// ConfigMap), and these sizes multiply into allocations, so each is bounded: far above any
// real model (today's largest have V ~ 2^18, d ~ 2^14, N ~ 2^7, contexts ~ 2^20) and low
// enough that products of them cannot wrap int64.
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 24;
inline constexpr int64_t kMaxHiddenSize = int64_t{1} << 16;
inline constexpr int64_t kMaxIntermediateSize = int64_t{1} << 18;
inline constexpr int64_t kMaxLayers = 1024;  // num_hidden_layers
inline constexpr int64_t kMaxHeads = 1024;   // query and KV heads
inline constexpr int64_t kMaxHeadDim = 4096;
inline constexpr int64_t kMaxSlidingWindow = int64_t{1} << 20;
inline constexpr int64_t kMaxBacktrack = int64_t{1} << 20;
inline constexpr int64_t kMaxKvBlockSize = int64_t{1} << 16;
inline constexpr int64_t kMaxPositionEmbeddings = int64_t{1} << 24;
// Elements of one weight tensor or one StateBlock region (a page, a ring set): 2^36 floats
// (256 GiB) is beyond any node's memory, so a config past it is a mistake, not a model.
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 36;
// max_position_embeddings when config.json has none (the common 128K context).
inline constexpr int64_t kDefaultMaxPositionEmbeddings = int64_t{1} << 17;

struct ModelConfig {
  int64_t vocab_size = 0;           // V
  int64_t hidden_size = 0;          // d
  int64_t intermediate_size = 0;    // I
  int64_t num_hidden_layers = 0;    // N
  int64_t n_prefill_layer = 0;      // P: first consumer layer, the boundary
  int64_t num_attention_heads = 0;  // H
  int64_t num_key_value_heads = 0;  // Hkv
  int64_t head_dim = 0;             // hd
  int64_t sliding_window = 0;       // W
  int64_t max_backtrack = 5;        // ring capacity C = W + max_backtrack + 1
  int64_t kv_block_size = 0;        // B
  // Longest sequence (prompt + generated tokens) the model serves; every node bounds wire
  // lengths by it (Hugging Face's name; vLLM's max_model_len comes from it too).
  int64_t max_position_embeddings = kDefaultMaxPositionEmbeddings;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  bool yoco_swa_share_hidden = false;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 0;
  // The consumer layers that own a global K/V projection, ascending, the first P (seed 9.2.2's
  // SharedLayerTopology); every consumer layer reads the block KV of the nearest source at or
  // below it. Empty (absent from config.json) means every consumer layer is a source.
  std::vector<int64_t> block_kv_sources;

  // D = N - P consumer layers (the boundary layer is the first of them, seed 9.2.1).
  int64_t num_consumer_layers() const { return num_hidden_layers - n_prefill_layer; }
  // G: the groups of block KV a request holds (one per source layer; D without sharing).
  int64_t num_block_kv_groups() const {
    return block_kv_sources.empty() ? num_consumer_layers()
                                    : static_cast<int64_t>(block_kv_sources.size());
  }
  // The block-KV group consumer layer `layer` (in [P, N)) reads: its nearest source at or
  // below it.
  int64_t block_kv_group(int64_t layer) const {
    if (block_kv_sources.empty()) return layer - n_prefill_layer;
    return std::upper_bound(block_kv_sources.begin(), block_kv_sources.end(), layer) -
           block_kv_sources.begin() - 1;
  }
  // Whether consumer layer `layer` projects block KV (carries global_k_proj, global_v_proj).
  bool is_block_kv_source(int64_t layer) const {
    return block_kv_sources.empty() ||
           std::binary_search(block_kv_sources.begin(), block_kv_sources.end(), layer);
  }
  int64_t num_producer_layers() const { return n_prefill_layer; }
  // C = W + max_backtrack + 1: slots in every SWA ring (134 for W = 128).
  int64_t ring_capacity() const { return RingCapacity(sliding_window, max_backtrack); }
  // R = W + (D - 1)(W - 1): the consumer SWA dependency span (seed equation 9.1).
  int64_t dependency_span() const { return DependencySpan(sliding_window, num_consumer_layers()); }
};

// Checks the invariants stated in the file comment; the message names the field (or the
// product of fields) and what is allowed.
absl::Status ValidateModelConfig(const ModelConfig& config);

// Parses config.json text. Unknown keys are ignored (Hugging Face configs carry many);
// missing required keys and wrong types are errors naming the key.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text);
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

// The canonical config.json text (sorted keys), used for writing models and fingerprints.
std::string ModelConfigToJson(const ModelConfig& config);

// Hex SHA-256 of ModelConfigToJson: two models of one digest have the same shapes and limits
// (the router's checks hold for both), whatever their weights.
std::string ConfigDigest(const ModelConfig& config);

// The name a model directory is served under unless one is given: its last path component
// ("/models/baton/" gives "baton").
std::string DefaultServedModelName(const std::string& model_dir);

}  // namespace baton
