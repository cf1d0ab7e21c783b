// The CED forward pass on the CUDA kernels (DESIGN sections 2 and 3): the device twin of
// CedModel, built only when the CUDA backend is (BATON_CUDA_ENABLED; targets that link
// baton_model_cuda get BATON_HAS_CUDA=1). It includes no CUDA header (DESIGN section 1).
//
// The weights are uploaded once, in FP32 (the GEMMs run on cuBLAS FP32, so the logits track
// the CPU pass up to summation order). A request's state (producer and consumer SWA rings,
// block-KV pages) lives in device memory in StateLayout's layout: CudaSequenceState. Prefill
// executes the same host schedule as CedModel (SchedulePrefill: the truncation plan, its
// per-row SWA lower bounds and ring slots, uploaded per run); Decode runs a batch of requests,
// one token each. Logits come back to the host.
//
// Threading: the model owns one kernels::cuda::Context (one stream), so a CudaCedModel and the
// states it made are used by one thread at a time.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "baton/kernels/cuda/context.h"
#include "baton/kernels/cuda/memory_pool.h"
#include "baton/model/forward_schedule.h"
#include "baton/model/state.h"
#include "baton/model/weights.h"

namespace baton::model::cuda {

// A request's StateBlock regions in device memory (the layout of model::SequenceState).
class CudaSequenceState {
 public:
  // Rings and pages come from `pool` when given (it must outlive the state and be sized with
  // this layout's slot_floats and page_floats), else from cudaMalloc. Rings start zeroed.
  static absl::StatusOr<std::unique_ptr<CudaSequenceState>> Create(
      kernels::cuda::Context& ctx, const StateLayout& layout,
      kernels::cuda::DeviceStatePool* pool = nullptr);
  ~CudaSequenceState();
  CudaSequenceState(const CudaSequenceState&) = delete;
  CudaSequenceState& operator=(const CudaSequenceState&) = delete;

  const StateLayout& layout() const { return layout_; }
  float* producer_swa() const { return producer_swa_; }        // device
  float* consumer_swa() const { return consumer_swa_; }        // device
  const std::vector<float*>& pages() const { return pages_; }  // device pointers
  // The page table in device memory (what the attention and block-KV kernels read).
  float* const* device_page_table() const { return page_table_.data(); }

  // Makes sure pages cover positions [0, positions); RESOURCE_EXHAUSTED when no device
  // memory (or no pool page) is left.
  absl::Status EnsurePages(int64_t positions);

  int64_t length = 0;   // as SequenceState::length
  int64_t s_valid = 0;  // as SequenceState::s_valid

 private:
  CudaSequenceState(kernels::cuda::Context& ctx, const StateLayout& layout,
                    kernels::cuda::DeviceStatePool* pool);
  kernels::cuda::Context& ctx_;
  StateLayout layout_;
  kernels::cuda::DeviceStatePool* pool_;
  int64_t pool_slot_ = -1;
  kernels::cuda::DeviceArray<float> owned_rings_;
  float* producer_swa_ = nullptr;
  float* consumer_swa_ = nullptr;
  std::vector<float*> pages_;
  kernels::cuda::DeviceArray<float*> page_table_;
};

struct CudaDecodeItem {
  CudaSequenceState* state = nullptr;  // decodes position state->length
  int32_t token = 0;
  float* logits = nullptr;  // host [vocab_size]
};

class CudaCedModel {
 public:
  // FAILED_PRECONDITION when the device cannot be used, RESOURCE_EXHAUSTED when the weights
  // do not fit.
  static absl::StatusOr<std::unique_ptr<CudaCedModel>> Create(const CedWeights& weights,
                                                              int device = 0);
  static absl::StatusOr<std::unique_ptr<CudaCedModel>> Load(const std::string& model_dir,
                                                            int device = 0);
  ~CudaCedModel();
  CudaCedModel(const CudaCedModel&) = delete;
  CudaCedModel& operator=(const CudaCedModel&) = delete;

  const ModelConfig& config() const { return config_; }
  const std::string& fingerprint() const { return fingerprint_; }
  StateLayout state_layout() const { return StateLayout::For(config_); }
  kernels::cuda::Context& context() { return *ctx_; }

  // A fresh state on this model's device (see CudaSequenceState::Create).
  absl::StatusOr<std::unique_ptr<CudaSequenceState>> NewState(
      kernels::cuda::DeviceStatePool* pool = nullptr);

  // As CedModel::Prefill; on_producer_rows receives host copies of the rows.
  absl::StatusOr<PrefillResult> Prefill(std::span<const int32_t> tokens,
                                        const PrefillOptions& options, CudaSequenceState& state);

  // As CedModel::Decode: one token for each item, appended at its state's length.
  absl::Status Decode(std::span<const CudaDecodeItem> batch);

 private:
  struct DeviceWeights;
  struct Segment;
  CudaCedModel(std::unique_ptr<kernels::cuda::Context> ctx, const CedWeights& weights);
  absl::Status Upload(const CedWeights& weights);
  // Grow-only device scratch buffer `which`, at least `count` floats; nullptr when out of
  // memory.
  float* Scratch(size_t which, size_t count);
  absl::Status RunLayers(std::span<const Segment> segments, const int32_t* tokens, int64_t rows,
                         const ProducerRowsCallback* on_producer_rows,
                         std::span<const int64_t> logit_rows, float* logits);

  std::unique_ptr<kernels::cuda::Context> ctx_;
  ModelConfig config_;
  std::string fingerprint_;
  std::unique_ptr<DeviceWeights> weights_;
  std::array<kernels::cuda::DeviceArray<float>, 13> scratch_;
  kernels::cuda::DeviceArray<int32_t> metadata_;
};

}  // namespace baton::model::cuda
