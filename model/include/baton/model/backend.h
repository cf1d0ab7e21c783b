// A backend of the CED forward pass: the ops of baton/kernels over their params structs, plus
// the memory they run on (allocation, copies in and out, synchronisation). The layer stack
// (engine.h) is written once against this interface; a backend only executes, it never
// decides which row runs or which key a row sees (the step plan says so, step_plan.h).
//
// Memory rules: pointers inside params structs, and every pointer Allocate returns, are
// "backend memory": host memory on the CPU backend, device memory on the CUDA one. The params
// structs themselves, spans of them and BlockKvSource live in host memory. Ops are queued in
// order; Synchronize waits for all of them and returns the first error. CopyOut's host
// destination is valid once Synchronize returns.
//
// Threading: the CPU backend is stateless and may be used from several threads at once
// (concurrent() is true); the CUDA backend holds one stream and is used by one thread at a
// time.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "baton/kernels/attention.h"
#include "baton/kernels/elementwise.h"
#include "baton/kernels/gemm.h"
#include "baton/kernels/rows.h"

namespace baton::model {

enum class Device { kCpu, kCuda };

// One copy between host memory and a backend's memory (which way is the caller's).
struct StageCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

// "cpu" or "cuda".
absl::string_view DeviceName(Device device);
// Parses "cpu" or "cuda"; the error names `field` and the allowed values.
absl::StatusOr<Device> ParseDevice(absl::string_view text, absl::string_view field);

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  // True when backend memory is host memory, so that host code may read and write it directly.
  virtual bool host_memory() const = 0;
  // True when several threads may run ops at once (each on its own buffers).
  virtual bool concurrent() const = 0;

  // Zeroed backend memory of `bytes` bytes, or nullptr when none is left.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* memory) = 0;
  virtual void CopyIn(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void CopyOut(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void Copy(void* dst, const void* src, size_t bytes) = 0;
  virtual absl::Status Synchronize() = 0;
  // Page-locks host memory that copies in and out use again and again (a node's transfer
  // staging), so that they run at full bandwidth; nothing to do where memory is host memory.
  virtual absl::Status PinHost(void* host, size_t bytes) { return absl::OkStatus(); }
  virtual void UnpinHost(void* host) {}

  virtual void Gemm(const kernels::GemmParams& p) = 0;
  virtual void RmsNorm(const kernels::RmsNormParams& p) = 0;
  virtual void Rope(const kernels::RopeParams& p) = 0;
  virtual void SwiGlu(const kernels::SwiGluParams& p) = 0;
  virtual void Embedding(const kernels::EmbeddingParams& p) = 0;
  virtual void GatherRows(const kernels::GatherRowsParams& p) = 0;
  virtual void ScatterRows(const kernels::ScatterRowsParams& p) = 0;
  virtual void WriteBlockKv(const kernels::WriteBlockKvParams& p) = 0;
  virtual void Attention(std::span<const kernels::AttentionParams> batch) = 0;
};

// The CPU backend (OpenBLAS GEMM, OpenMP row ops and attention).
std::unique_ptr<Backend> MakeCpuBackend();

// Backend memory of `count` T, freed on destruction.
template <typename T>
class BackendArray {
 public:
  BackendArray() = default;
  BackendArray(Backend& backend, size_t count)
      : backend_(&backend),
        data_(static_cast<T*>(backend.Allocate(count * sizeof(T)))),
        count_(data_ != nullptr ? count : 0) {}
  ~BackendArray() { Reset(); }
  BackendArray(BackendArray&& o) noexcept { *this = std::move(o); }
  BackendArray& operator=(BackendArray&& o) noexcept {
    std::swap(backend_, o.backend_);
    std::swap(data_, o.data_);
    std::swap(count_, o.count_);
    return *this;
  }
  void Reset() {
    if (backend_ != nullptr && data_ != nullptr) backend_->Free(data_);
    data_ = nullptr;
    count_ = 0;
  }
  T* data() const { return data_; }
  size_t size() const { return count_; }

 private:
  Backend* backend_ = nullptr;
  T* data_ = nullptr;
  size_t count_ = 0;
};

}  // namespace baton::model
