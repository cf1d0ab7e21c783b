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
  float* logits = nullptr;  // host [vocab_size]
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
  // and sets state.length = L, state.s_valid = options.s_valid.
  virtual absl::StatusOr<PrefillResult> Prefill(std::span<const int32_t> tokens,
                                                const PrefillOptions& options,
                                                SequenceState& state) = 0;

  // One token for each item, appended at its state's length.
  virtual absl::Status Decode(std::span<const DecodeItem> batch) = 0;

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
  absl::Status Decode(std::span<const DecodeItem> batch) override;
  absl::Status StageIn(std::span<const StageCopy> copies) override;
  absl::Status StageOut(std::span<const StageCopy> copies) override;

 private:
  struct Weights;
  struct Workspace;
  CedEngine(CedWeights weights, std::unique_ptr<Backend> backend);
  absl::Status Upload(WeightType weight_type);
  // Runs the layer stack over `step`; logits of its logit rows go to `logits` (host).
  absl::Status RunStep(const StepPlan& step, const ProducerRowsCallback* on_producer_rows,
                       float* logits);
  // Holds serial_ when the backend is not concurrent (unlocked otherwise).
  std::unique_lock<std::mutex> Serialize();
  std::unique_ptr<Workspace> TakeWorkspace();
  void ReturnWorkspace(std::unique_ptr<Workspace> workspace);

  ModelConfig config_;
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
