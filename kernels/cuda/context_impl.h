// Private to kernels/cuda: the Context's CUDA objects and the launchers' shared helpers.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "baton/kernels/cuda/context.h"

namespace baton::kernels::cuda {

struct Context::Impl {
  int device = 0;
  int multiprocessors = 1;  // of `device`, for sizing grids
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudaEvent_t timer_start = nullptr;
  cudaEvent_t timer_stop = nullptr;
  void* scratch = nullptr;  // device memory for per-launch metadata, grown on demand
  size_t scratch_bytes = 0;
  void* attention_workspace = nullptr;  // the GEMM attention path's K, V, Q, scores, weights
  size_t attention_workspace_bytes = 0;
  PrefillAttention prefill_attention = PrefillAttention::kSimple;
  std::string first_error;  // empty while every launch succeeded

  // Page-locked host memory for per-launch metadata (attention entries), so that its copy to
  // the device is a real asynchronous DMA: a copy from pageable memory makes the runtime stage
  // it while the host waits. kStagingSlots slots, used in turn; each slot's event marks when
  // the copy that last read it has run, and the slot is rewritten only after that, so the host
  // runs up to kStagingSlots attention launches (layers) ahead of the device.
  static constexpr int kStagingSlots = 8;
  struct Staging {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t read = nullptr;
    bool pending = false;  // a copy out of this slot is queued and `read` recorded after it
  };
  Staging staging[kStagingSlots];
  int next_staging = 0;
  // While Capture records: each launch's entries get a page-locked buffer of their own (a
  // replay copies from it again), which the graph takes over; nothing may grow or wait.
  bool capturing = false;
  Staging capture_slot;
  std::vector<void*> capture_buffers;

  // Records `what` failing with `error` unless an earlier error is already recorded.
  void Fail(const std::string& what);
  // Records a failed CUDA call; returns whether it succeeded.
  bool Check(cudaError_t error, const char* what);
  bool Check(cublasStatus_t status, const char* what);
  // Checks the last launch (cudaGetLastError).
  bool CheckLaunch(const char* what);
  // Device scratch of at least `bytes`, or nullptr (error recorded). Growing frees the old
  // buffer, which synchronises the device, so earlier launches that read it have finished.
  void* Scratch(size_t bytes);
  // The same for the GEMM attention path's workspace (attention_gemm.cu).
  void* AttentionWorkspace(size_t bytes);
  // The next staging slot, at least `bytes` large and free to write, or nullptr (error
  // recorded). After queuing the copy that reads it, call Staged(slot).
  Staging* AcquireStaging(size_t bytes);
  void Staged(Staging* slot);
};

inline int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace baton::kernels::cuda
