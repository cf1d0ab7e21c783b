// Deterministic generated CED models for tests and benchmarks (`batonctl make-model`).
//
// Weights are drawn from a seeded splitmix64 stream with Box-Muller normals, so a (preset,
// seed) pair gives the same bytes on every machine. Scales keep activations in a sane range
// through every layer: unit-variance projections of normalised inputs, residual branches
// scaled by 1/sqrt(2N), logits of order a few units.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "baton/model/weights.h"

namespace baton::model {

// tiny (tests): V=512, d=128, 4+4 layers, H=4, Hkv=1, hd=32, I=384, W=16, B=16, C=22.
// small (benchmarks): V=4096, d=512, 8+8 layers, H=8, Hkv=1, hd=64, I=1536, W=128, B=64,
// C=134.
// small-shared: small with block_kv_sources [8] (one block-KV group for the 8 consumer layers).
absl::StatusOr<ModelConfig> PresetConfig(const std::string& preset);

CedWeights GenerateWeights(const ModelConfig& config, uint64_t seed);

// Generates and writes config.json + model.safetensors into `model_dir`.
absl::Status MakeModel(const ModelConfig& config, uint64_t seed, const std::string& model_dir,
                       Dtype dtype = Dtype::kF32);

// Copies a tokenizer into a model directory: `from`/tokenizer.model, and tokenizer_config.json
// and generation_config.json where `from` has them (what text/tokenizer.h loads). An error
// names the file.
absl::Status CopyTokenizerFiles(const std::string& from, const std::string& model_dir);

}  // namespace baton::model
