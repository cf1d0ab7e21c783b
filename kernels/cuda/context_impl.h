// Private to kernels/cuda: the Context's CUDA objects and the launchers' shared helpers.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "baton/kernels/cuda/context.h"

namespace baton::kernels::cuda {

struct Context::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudaEvent_t timer_start = nullptr;
  cudaEvent_t timer_stop = nullptr;
  void* scratch = nullptr;  // device memory for per-launch metadata, grown on demand
  size_t scratch_bytes = 0;
  std::string first_error;  // empty while every launch succeeded

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
};

inline int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace baton::kernels::cuda
