// The CED forward pass on the CPU kernels (DESIGN sections 2 and 3).
//
// Prefill runs one request's prompt chunk by chunk as its truncation plan says: producers and
// the boundary's shared rows (and so the block KV) over every row, consumers over the plan's
// rows with the plan's SWA lower bounds and ring slots. Decode runs a batch of requests, one
// token each, at their own positions. Both go through one layer stack that works on
// "segments" (a run of consecutive positions of one request), so prefill and decode share
// every line of layer code.
//
// Threading: a CedModel is immutable after construction; concurrent calls are safe as long as
// they use different SequenceStates.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/model/plan.h"
#include "baton/model/state.h"
#include "baton/model/weights.h"

namespace baton::model {

// Receives each producer layer's RoPE'd K and V rows as a chunk computes them, so that the
// prefix store can keep every full block's producer SWA rows (the ring keeps only the last C).
// k and v point at row 0 (position q_start); rows are `stride` floats apart, kv_dim wide.
using ProducerRowsCallback = std::function<void(int64_t layer, int64_t q_start, int64_t rows,
                                                const float* k, const float* v, int64_t stride)>;

struct PrefillOptions {
  TruncationMode mode = TruncationMode::kOff;
  int64_t keep = 0;
  // Consumer rows start here; positions [state.length, s_valid) run producers and the
  // boundary only (what a prefix hit of s_valid tokens would have loaded).
  int64_t s_valid = 0;
  int64_t chunk_size = 0;  // 0: one chunk
  // false: logits of the last prompt row only (serving); true: every row of the prompt's
  // result (rows >= s_valid; in compact only the retained rows, never a placeholder).
  bool result_logits = false;
  ProducerRowsCallback on_producer_rows;
};

struct PrefillResult {
  std::vector<int32_t> positions;  // rows whose logits follow, increasing
  std::vector<float> logits;       // [positions.size(), vocab_size]
  int64_t consumer_rows = 0;       // rows each consumer layer computed (plan total)
};

struct DecodeItem {
  SequenceState* state = nullptr;  // decodes position state->length
  int32_t token = 0;
  float* logits = nullptr;  // [vocab_size]
};

class CedModel {
 public:
  explicit CedModel(CedWeights weights);
  static absl::StatusOr<std::unique_ptr<CedModel>> Load(const std::string& model_dir);

  const ModelConfig& config() const { return weights_.config; }
  const std::string& fingerprint() const { return weights_.fingerprint; }
  StateLayout state_layout() const { return StateLayout::For(weights_.config); }

  // Computes tokens[state.length, L) into `state` (state.length must be <= options.s_valid)
  // and sets state.length = L, state.s_valid = options.s_valid.
  absl::StatusOr<PrefillResult> Prefill(std::span<const int32_t> tokens,
                                        const PrefillOptions& options, SequenceState& state) const;

  // One token for each item, appended at its state's length.
  absl::Status Decode(std::span<const DecodeItem> batch) const;

 private:
  struct Segment;
  void RunLayers(std::span<const Segment> segments, const int32_t* tokens, int64_t rows,
                 const ProducerRowsCallback* on_producer_rows, std::span<const int64_t> logit_rows,
                 float* logits) const;
  absl::Status CheckTokens(std::span<const int32_t> tokens) const;

  CedWeights weights_;
};

}  // namespace baton::model

namespace baton::model {

// Greedy choice: the index of the largest logit, the lowest index on ties.
int32_t Argmax(std::span<const float> logits);

}  // namespace baton::model
