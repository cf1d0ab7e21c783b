// The CUDA backend's execution context: one device, one stream, one cuBLAS handle, and the
// first error any launch on it hit. Every op of baton::kernels::cuda takes a Context and runs
// asynchronously on its stream; Synchronize() waits and reports the first error (CUDA's
// errors are sticky per stream anyway, so one check per step is what a caller can act on).
//
// This header and the others under baton/kernels/cuda/ include no CUDA header (DESIGN
// section 1): streams and handles stay inside kernels/cuda. Device memory is plain pointers.
//
// Threading: a Context is used by one thread at a time; use one Context per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "baton/kernels/backend_options.h"

namespace baton::kernels::cuda {

// Devices the CUDA runtime sees; 0 when there is no device or no usable driver.
int DeviceCount();
// A one-line reason why DeviceCount() is 0 (the runtime's error string), or "" when it is not.
std::string NoDeviceReason();

// How Attention runs entries of at least kGemmAttentionMinRows rows (backend_options.h).
using PrefillAttention = kernels::PrefillAttention;
using kernels::ParsePrefillAttention;
using kernels::PrefillAttentionName;
inline constexpr int64_t kGemmAttentionMinRows = 16;

class Context {
 public:
  // Selects `device`, creates a non-blocking stream and a cuBLAS handle bound to it; the
  // prefill attention kernel starts as `options` says (a program's flag or variable, settled
  // before: backend_options.h).
  static absl::StatusOr<std::unique_ptr<Context>> Create(int device = 0,
                                                         const CudaOptions& options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const;
  PrefillAttention prefill_attention() const;
  void set_prefill_attention(PrefillAttention mode);
  // Waits for every op queued so far; returns the first error of any of them (and clears it).
  absl::Status Synchronize();

  // Memory helpers for callers that have no CUDA headers (tests, benches, the model).
  // Allocation failures return nullptr; copies are queued on the stream (host memory must
  // stay valid until Synchronize unless it is pageable, which the runtime stages at once).
  void* Malloc(size_t bytes);
  // Malloc for callers that handle a failure themselves (a full pool): nullptr, and nothing
  // recorded, so that the next Synchronize reports only real faults.
  void* TryMalloc(size_t bytes);
  void Free(void* device_ptr);
  void CopyToDevice(void* device_dst, const void* host_src, size_t bytes);
  void CopyToHost(void* host_dst, const void* device_src, size_t bytes);
  void CopyOnDevice(void* device_dst, const void* device_src, size_t bytes);
  // Queued on the context's stream, so that it is ordered with every op before and after it
  // (the stream is non-blocking: legacy-stream work would not be). False when it could not be
  // queued (the error is recorded too).
  bool Memset(void* device_dst, int value, size_t bytes);
  // Page-locks (cudaHostRegister) or releases host memory that copies use again and again.
  absl::Status RegisterHost(void* host, size_t bytes);
  void UnregisterHost(void* host);

  // A CUDA graph of a fixed sequence of ops, such as a decode step of fixed shapes: Capture
  // runs `record` with the stream capturing (nothing executes; every buffer the ops use must
  // already be large enough, so run the sequence once first), and Replay queues the whole
  // sequence at once, without a launch per op. Attention entries captured with it live in
  // page-locked buffers that the graph owns, since a replay copies them again. A Graph must
  // not outlive its Context.
  class Graph {
   public:
    ~Graph();
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
    // Queues one replay on the context's stream; errors surface in Synchronize.
    void Replay();

   private:
    friend class Context;
    struct State;
    explicit Graph(std::unique_ptr<State> state);
    std::unique_ptr<State> state_;
  };
  // The graph of what `record` queues; the capture's first error (a CUDA call that capture
  // refuses, or a buffer that would have grown) when it failed, with the context usable.
  absl::StatusOr<std::unique_ptr<Graph>> Capture(const std::function<void()>& record);

  // Elapsed milliseconds of `run` on the stream, measured with CUDA events (benchmarks).
  template <typename F>
  float TimeMs(F&& run) {
    StartTimer();
    run();
    return StopTimer();
  }

  // For the kernels' launchers (kernels/cuda only): the cudaStream_t and cublasHandle_t as
  // opaque pointers, scratch device memory that grows on demand, and error recording.
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit Context(std::unique_ptr<Impl> impl);
  void StartTimer();
  float StopTimer();
  std::unique_ptr<Impl> impl_;
};

// A device buffer owned by a Context's device, freed on destruction. Typed for convenience.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(Context& ctx, size_t count)
      : ctx_(&ctx), data_(static_cast<T*>(ctx.Malloc(count * sizeof(T)))), count_(count) {}
  ~DeviceArray() {
    if (ctx_ != nullptr && data_ != nullptr) ctx_->Free(data_);
  }
  DeviceArray(DeviceArray&& o) noexcept { *this = std::move(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(ctx_, o.ctx_);
    std::swap(data_, o.data_);
    std::swap(count_, o.count_);
    return *this;
  }
  T* data() const { return data_; }
  size_t size() const { return count_; }
  bool ok() const { return data_ != nullptr || count_ == 0; }

 private:
  Context* ctx_ = nullptr;
  T* data_ = nullptr;
  size_t count_ = 0;
};

}  // namespace baton::kernels::cuda
