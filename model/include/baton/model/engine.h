// The CED forward pass as the nodes and tools use it (DESIGN sections 2 and 3): model::Engine,
// and CedEngine, its one implementation, which runs one layer stack over any Backend.
//
// Prefill runs one request's prompt chunk by chunk as its truncation plan says: producers and
// the boundary's shared rows (and so the block KV) over every row, consumers over the plan's
// rows with the plan's SWA lower bounds and ring slots. Decode runs a batch of requests, one
// token each, at their own positions. Both are planned on the host as StepPlans
// (forward_schedule.h) and executed by the same layer stack, so prefill and decode, CPU and
// CUDA, share every line of layer code.
//
// States come from NewState() (rings and pages in the engine's backend memory) or from a
// node's pool over that memory. Logits and the producer-rows callback are always host memory.
//
// Threading: on a backend that is concurrent() (the CPU), calls may run on several threads at
// once as long as they use different SequenceStates; otherwise the engine serialises Prefill,
// Decode, StageIn and StageOut, and the caller serialises what allocates or frees backend
// memory outside them (NewState, EnsurePages, destroying a state).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "baton/model/backend.h"
#include "baton/model/forward_schedule.h"
#include "baton/model/state.h"
#include "baton/model/weights.h"

namespace baton::model {

struct DecodeItem {
  SequenceState* state = nullptr;  // decodes position state->length
  int32_t token = 0;
  float* logits = nullptr;  // host [1 + draft.size(), vocab_size]
  // Speculative decoding: tokens drafted after `token`, verified in the same step as rows at
  // the positions after it (at most max_backtrack). The step appends them all; the caller then
  // takes back the rejected ones by lowering state->length (their ring slots and block-KV rows
  // are written again before anything reads them: docs/architecture.md, "Speculative decoding").
  std::span<const int32_t> draft;
};

class Engine {
 public:
  virtual ~Engine() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const std::string& fingerprint() const = 0;
  StateLayout state_layout() const { return StateLayout::For(config()); }
  // The memory and ops the engine runs on; a node lays its state pool out in this memory.
  virtual Backend& backend() = 0;

  // A fresh state in the backend's memory; RESOURCE_EXHAUSTED when its rings do not fit.
  absl::StatusOr<std::unique_ptr<SequenceState>> NewState();

  // Computes tokens[state.length, L) into `state` (state.length must be <= options.s_valid)
  // and sets state.length = L, state.s_valid = options.s_valid. With options.boundary_rows
  // (the replay-on-decode split; required when the engine holds the producers only), runs the
  // producers and the block KV, hands over the boundary rows and computes no logits.
  virtual absl::StatusOr<PrefillResult> Prefill(std::span<const int32_t> tokens,
                                                const PrefillOptions& options,
                                                SequenceState& state) = 0;

  // One token for each item (and its drafted tokens), appended at its state's length.
  absl::Status Decode(std::span<const DecodeItem> batch) { return Step(batch, {}); }

  // One step of a decode node's continuous batch: a token for each decode item, and each
  // replay piece, in one run of the layer stack (the replay rows join the consumer layers'
  // batch). A replay does not change the state's length or s_valid: the node sets them when it
  // stages the StateBlock in. A failed step leaves its states to be discarded.
  virtual absl::Status Step(std::span<const DecodeItem> decode,
                            std::span<const ReplayItem> replay) = 0;

  // The layers this engine holds (kProducers: a prefill node under replay-on-decode, which
  // can prefill with PrefillOptions::boundary_rows only, and cannot decode).
  virtual HeldLayers held_layers() const = 0;
  // Bytes of weights the engine keeps resident (packed panels, uploads and host copies).
  virtual int64_t weight_bytes() const = 0;

  // Copies host memory into the backend's memory (StageIn) or out of it (StageOut), in turn
  // with the engine's steps, and returns once they are done: how a node moves a state between
  // the host memory its transfers and prefix loads use and the engine's memory.
  virtual absl::Status StageIn(std::span<const StageCopy> copies) = 0;
  virtual absl::Status StageOut(std::span<const StageCopy> copies) = 0;
};

// How the engine holds its weight matrices (the norms and the embedding table stay FP32).
// BF16 (CPU backend only) halves the bytes a decode step reads; each weight is rounded to
// nearest even once at load, and activations and sums stay FP32.
enum class WeightType { kFp32, kBf16 };

absl::string_view WeightTypeName(WeightType type);

// "fp32" or "bf16"; anything else is INVALID_ARGUMENT naming `flag` and the allowed names.
absl::StatusOr<WeightType> ParseWeightType(absl::string_view name, absl::string_view flag);

class CedEngine : public Engine {
 public:
  // Uploads the weights into the backend's memory (a host-memory backend uses them in place);
  // RESOURCE_EXHAUSTED when they do not fit, INVALID_ARGUMENT for BF16 on a device backend.
  static absl::StatusOr<std::unique_ptr<CedEngine>> Create(
      CedWeights weights, std::unique_ptr<Backend> backend,
      WeightType weight_type = WeightType::kFp32);
  ~CedEngine() override;

  const ModelConfig& config() const override { return config_; }
  const std::string& fingerprint() const override { return fingerprint_; }
  Backend& backend() override { return *backend_; }

  absl::StatusOr<PrefillResult> Prefill(std::span<const int32_t> tokens,
                                        const PrefillOptions& options,
                                        SequenceState& state) override;
  absl::Status Step(std::span<const DecodeItem> decode,
                    std::span<const ReplayItem> replay) override;
  HeldLayers held_layers() const override { return held_; }
  int64_t weight_bytes() const override { return weight_bytes_; }
  absl::Status StageIn(std::span<const StageCopy> copies) override;
  absl::Status StageOut(std::span<const StageCopy> copies) override;

 private:
  struct Weights;
  struct Workspace;
  CedEngine(CedWeights weights, std::unique_ptr<Backend> backend);
  absl::Status Upload(WeightType weight_type);
  // Runs the layer stack over `step`; logits of its logit rows go to `logits` (host). With
  // `boundary_out` (host), the boundary rows of full rows [boundary_first, +boundary_rows) go
  // there once the block KV is written.
  absl::Status RunStep(const StepPlan& step, const ProducerRowsCallback* on_producer_rows,
                       float* logits, float* boundary_out = nullptr, int64_t boundary_first = 0,
                       int64_t boundary_rows = 0);
  // Prefill on the producers' side of replay-on-decode (PrefillOptions::boundary_rows).
  absl::StatusOr<PrefillResult> PrefillProducers(std::span<const int32_t> tokens,
                                                 const PrefillOptions& options,
                                                 const PrefillSchedule& schedule,
                                                 SequenceState& state);
  // Holds serial_ when the backend is not concurrent (unlocked otherwise).
  std::unique_lock<std::mutex> Serialize();
  std::unique_ptr<Workspace> TakeWorkspace();
  void ReturnWorkspace(std::unique_ptr<Workspace> workspace);

  ModelConfig config_;
  HeldLayers held_;
  int64_t weight_bytes_ = 0;
  std::string fingerprint_;
  CedWeights host_weights_;  // kept only when the backend reads host memory (less the
                             // matrices held in BF16)
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Weights> weights_;
  std::mutex serial_;  // held for a whole call when the backend is not concurrent
  std::mutex workspaces_mutex_;
  std::vector<std::unique_ptr<Workspace>> workspaces_;  // idle, grown to the largest step
};

// Greedy choice: the index of the largest logit, the lowest index on ties.
int32_t Argmax(std::span<const float> logits);

}  // namespace baton::model
