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
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/model/forward_schedule.h"
#include "baton/model/plan.h"
#include "baton/model/state.h"
#include "baton/model/weights.h"

namespace baton::model {

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

  CedWeights weights_;
};

}  // namespace baton::model

namespace baton::model {

// Greedy choice: the index of the largest logit, the lowest index on ties.
int32_t Argmax(std::span<const float> logits);

}  // namespace baton::model
