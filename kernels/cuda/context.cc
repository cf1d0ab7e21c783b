#include "baton/kernels/cuda/context.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "context_impl.h"

namespace baton::kernels::cuda {

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it so that later calls start clean
    return 0;
  }
  return count;
}

std::string NoDeviceReason() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::StrCat("cudaGetDeviceCount failed: ", cudaGetErrorName(error), " (",
                        cudaGetErrorString(error), ")");
  }
  return count == 0 ? "cudaGetDeviceCount reports 0 devices" : "";
}

void Context::Impl::Fail(const std::string& what) {
  if (first_error.empty()) first_error = what;
}

bool Context::Impl::Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return true;
  Fail(absl::StrCat(what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")"));
  return false;
}

bool Context::Impl::Check(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return true;
  Fail(absl::StrCat(what, ": cuBLAS status ", static_cast<int>(status)));
  return false;
}

bool Context::Impl::CheckLaunch(const char* what) {
  return Check(cudaGetLastError(), what);
}

namespace {

enum class Memory { kDevice, kPinnedHost };

// Memory of at least `bytes` in (buffer, size), grown by doubling: device memory, or
// page-locked host memory. cudaFree and cudaFreeHost synchronise the device, so launches and
// copies that still read the old buffer have finished before it goes.
void* Grow(Context::Impl& impl, void*& buffer, size_t& size, size_t bytes, Memory memory,
           const char* what) {
  if (bytes <= size) return buffer;
  if (impl.capturing) {  // freeing would wait for the device, which capture forbids
    impl.Fail(absl::StrCat(what, ": a buffer would grow while capturing a graph; run the ",
                           "sequence once before capturing it"));
    return nullptr;
  }
  const size_t grown = std::max<size_t>(bytes, 2 * size + 4096);
  const bool host = memory == Memory::kPinnedHost;
  if (buffer != nullptr) host ? cudaFreeHost(buffer) : cudaFree(buffer);
  buffer = nullptr;
  size = 0;
  if (!impl.Check(
          host ? cudaHostAlloc(&buffer, grown, cudaHostAllocDefault) : cudaMalloc(&buffer, grown),
          what)) {
    return nullptr;
  }
  size = grown;
  return buffer;
}

}  // namespace

void* Context::Impl::Scratch(size_t bytes) {
  return Grow(*this, scratch, scratch_bytes, bytes, Memory::kDevice, "cudaMalloc (scratch)");
}

void* Context::Impl::AttentionWorkspace(size_t bytes) {
  return Grow(*this, attention_workspace, attention_workspace_bytes, bytes, Memory::kDevice,
              "cudaMalloc (attention workspace)");
}

Context::Impl::Staging* Context::Impl::AcquireStaging(size_t bytes) {
  if (capturing) {
    capture_slot = {};
    if (!Check(cudaHostAlloc(&capture_slot.host, bytes, cudaHostAllocDefault),
               "cudaHostAlloc (captured staging)")) {
      return nullptr;
    }
    capture_buffers.push_back(capture_slot.host);
    capture_slot.bytes = bytes;
    return &capture_slot;
  }
  Staging* slot = &staging[next_staging];
  next_staging = (next_staging + 1) % kStagingSlots;
  if (slot->pending) {
    slot->pending = false;
    if (!Check(cudaEventSynchronize(slot->read), "cudaEventSynchronize (staging)")) return nullptr;
  }
  if (Grow(*this, slot->host, slot->bytes, bytes, Memory::kPinnedHost, "cudaHostAlloc (staging)") ==
      nullptr) {
    return nullptr;
  }
  return slot;
}

void Context::Impl::Staged(Staging* slot) {
  if (slot == &capture_slot) return;  // the graph owns the buffer: nothing to wait for
  slot->pending = Check(cudaEventRecord(slot->read, stream), "cudaEventRecord (staging)");
}

struct Context::Graph::State {
  Context::Impl* impl = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<void*> host_buffers;
};

Context::Graph::Graph(std::unique_ptr<State> state) : state_(std::move(state)) {}

Context::Graph::~Graph() {
  // A replay still queued reads the buffers: wait for the stream first.
  cudaStreamSynchronize(state_->impl->stream);
  if (state_->exec != nullptr) cudaGraphExecDestroy(state_->exec);
  if (state_->graph != nullptr) cudaGraphDestroy(state_->graph);
  for (void* host : state_->host_buffers) cudaFreeHost(host);
}

void Context::Graph::Replay() {
  state_->impl->Check(cudaGraphLaunch(state_->exec, state_->impl->stream), "cudaGraphLaunch");
}

absl::StatusOr<std::unique_ptr<Context::Graph>> Context::Capture(
    const std::function<void()>& record) {
  Impl& impl = *impl_;
  if (absl::Status earlier = Synchronize(); !earlier.ok()) return earlier;
  auto state = std::make_unique<Graph::State>();
  state->impl = &impl;
  // Relaxed: the launchers may page-lock a buffer for each launch's entries while capturing.
  if (!impl.Check(cudaStreamBeginCapture(impl.stream, cudaStreamCaptureModeRelaxed),
                  "cudaStreamBeginCapture")) {
    return Synchronize();
  }
  impl.capturing = true;
  record();
  impl.capturing = false;
  state->host_buffers = std::move(impl.capture_buffers);
  impl.capture_buffers.clear();
  const bool ended =
      impl.Check(cudaStreamEndCapture(impl.stream, &state->graph), "cudaStreamEndCapture");
  if (ended && impl.first_error.empty()) {
    impl.Check(cudaGraphInstantiate(&state->exec, state->graph, 0), "cudaGraphInstantiate");
  }
  if (!impl.first_error.empty()) {
    (void)cudaGetLastError();
    Graph discarded(std::move(state));  // frees what was captured
    std::string error = std::move(impl.first_error);
    impl.first_error.clear();
    return absl::FailedPreconditionError(absl::StrCat("CUDA graph capture: ", error));
  }
  return std::unique_ptr<Graph>(new Graph(std::move(state)));
}

absl::StatusOr<std::unique_ptr<Context>> Context::Create(int device, const CudaOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  impl->prefill_attention = options.prefill_attention;
  auto fail = [&](const std::string& what) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA context on device ", device, ": ", what));
  };
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return fail(absl::StrCat("cudaSetDevice: ", cudaGetErrorString(e)));
  }
  if (cudaError_t e =
          cudaDeviceGetAttribute(&impl->multiprocessors, cudaDevAttrMultiProcessorCount, device);
      e != cudaSuccess) {
    return fail(absl::StrCat("cudaDeviceGetAttribute: ", cudaGetErrorString(e)));
  }
  if (cudaError_t e = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return fail(absl::StrCat("cudaStreamCreate: ", cudaGetErrorString(e)));
  }
  if (cudaEventCreate(&impl->timer_start) != cudaSuccess ||
      cudaEventCreate(&impl->timer_stop) != cudaSuccess) {
    return fail("cudaEventCreate failed");
  }
  for (Impl::Staging& slot : impl->staging) {
    if (cudaEventCreateWithFlags(&slot.read, cudaEventDisableTiming) != cudaSuccess) {
      return fail("cudaEventCreate (staging) failed");
    }
  }
  if (cublasStatus_t s = cublasCreate(&impl->cublas); s != CUBLAS_STATUS_SUCCESS) {
    return fail(absl::StrCat("cublasCreate: status ", static_cast<int>(s)));
  }
  cublasSetStream(impl->cublas, impl->stream);
  // Pure FP32 for Gemm (no TF32), so that the CUDA backend tracks the CPU's arithmetic.
  cublasSetMathMode(impl->cublas, CUBLAS_DEFAULT_MATH);
  return std::unique_ptr<Context>(new Context(std::move(impl)));
}

Context::Context(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Context::~Context() {
  cudaSetDevice(impl_->device);
  if (impl_->stream != nullptr) cudaStreamSynchronize(impl_->stream);
  if (impl_->cublas != nullptr) cublasDestroy(impl_->cublas);
  if (impl_->scratch != nullptr) cudaFree(impl_->scratch);
  if (impl_->attention_workspace != nullptr) cudaFree(impl_->attention_workspace);
  for (Impl::Staging& slot : impl_->staging) {
    if (slot.host != nullptr) cudaFreeHost(slot.host);
    if (slot.read != nullptr) cudaEventDestroy(slot.read);
  }
  if (impl_->timer_start != nullptr) cudaEventDestroy(impl_->timer_start);
  if (impl_->timer_stop != nullptr) cudaEventDestroy(impl_->timer_stop);
  if (impl_->stream != nullptr) cudaStreamDestroy(impl_->stream);
}

int Context::device() const {
  return impl_->device;
}

PrefillAttention Context::prefill_attention() const {
  return impl_->prefill_attention;
}

void Context::set_prefill_attention(PrefillAttention mode) {
  impl_->prefill_attention = mode;
}

absl::Status Context::Synchronize() {
  impl_->Check(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize");
  if (impl_->first_error.empty()) return absl::OkStatus();
  std::string error = std::move(impl_->first_error);
  impl_->first_error.clear();
  return absl::InternalError(absl::StrCat("CUDA backend: ", error));
}

void* Context::Malloc(size_t bytes) {
  void* ptr = nullptr;
  if (bytes == 0) return nullptr;
  if (!impl_->Check(cudaMalloc(&ptr, bytes), "cudaMalloc")) {
    (void)cudaGetLastError();  // not sticky: later launches' checks must not see it
    return nullptr;
  }
  return ptr;
}

void* Context::TryMalloc(size_t bytes) {
  void* ptr = nullptr;
  if (bytes == 0) return nullptr;
  if (cudaMalloc(&ptr, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return ptr;
}

void Context::Free(void* device_ptr) {
  if (device_ptr != nullptr) impl_->Check(cudaFree(device_ptr), "cudaFree");
}

void Context::CopyToDevice(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  impl_->Check(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, impl_->stream),
               "cudaMemcpyAsync (to device)");
}

void Context::CopyToHost(void* host_dst, const void* device_src, size_t bytes) {
  if (bytes == 0) return;
  impl_->Check(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, impl_->stream),
               "cudaMemcpyAsync (to host)");
}

void Context::CopyOnDevice(void* device_dst, const void* device_src, size_t bytes) {
  if (bytes == 0) return;
  impl_->Check(
      cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, impl_->stream),
      "cudaMemcpyAsync (on device)");
}

bool Context::Memset(void* device_dst, int value, size_t bytes) {
  if (bytes == 0) return true;
  return impl_->Check(cudaMemsetAsync(device_dst, value, bytes, impl_->stream), "cudaMemsetAsync");
}

absl::Status Context::RegisterHost(void* host, size_t bytes) {
  const cudaError_t error = cudaHostRegister(host, bytes, cudaHostRegisterDefault);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: the memory stays usable, only slower to copy
    return absl::InternalError(
        absl::StrCat("cudaHostRegister of ", bytes, " bytes: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

void Context::UnregisterHost(void* host) {
  if (host != nullptr && cudaHostUnregister(host) != cudaSuccess) (void)cudaGetLastError();
}

void Context::StartTimer() {
  impl_->Check(cudaEventRecord(impl_->timer_start, impl_->stream), "cudaEventRecord");
}

float Context::StopTimer() {
  float ms = 0.0f;
  impl_->Check(cudaEventRecord(impl_->timer_stop, impl_->stream), "cudaEventRecord");
  impl_->Check(cudaEventSynchronize(impl_->timer_stop), "cudaEventSynchronize");
  impl_->Check(cudaEventElapsedTime(&ms, impl_->timer_start, impl_->timer_stop),
               "cudaEventElapsedTime");
  return ms;
}

}  // namespace baton::kernels::cuda
