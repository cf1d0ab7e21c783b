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

void* Context::Impl::Scratch(size_t bytes) {
  if (bytes <= scratch_bytes) return scratch;
  const size_t grown = std::max<size_t>(bytes, 2 * scratch_bytes + 4096);
  if (scratch != nullptr) cudaFree(scratch);
  scratch = nullptr;
  scratch_bytes = 0;
  if (!Check(cudaMalloc(&scratch, grown), "cudaMalloc (scratch)")) return nullptr;
  scratch_bytes = grown;
  return scratch;
}

absl::StatusOr<std::unique_ptr<Context>> Context::Create(int device) {
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  auto fail = [&](const std::string& what) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA context on device ", device, ": ", what));
  };
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return fail(absl::StrCat("cudaSetDevice: ", cudaGetErrorString(e)));
  }
  if (cudaError_t e = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return fail(absl::StrCat("cudaStreamCreate: ", cudaGetErrorString(e)));
  }
  if (cudaEventCreate(&impl->timer_start) != cudaSuccess ||
      cudaEventCreate(&impl->timer_stop) != cudaSuccess) {
    return fail("cudaEventCreate failed");
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
  if (impl_->timer_start != nullptr) cudaEventDestroy(impl_->timer_start);
  if (impl_->timer_stop != nullptr) cudaEventDestroy(impl_->timer_stop);
  if (impl_->stream != nullptr) cudaStreamDestroy(impl_->stream);
}

int Context::device() const {
  return impl_->device;
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
  if (!impl_->Check(cudaMalloc(&ptr, bytes), "cudaMalloc")) return nullptr;
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

void Context::Memset(void* device_dst, int value, size_t bytes) {
  if (bytes == 0) return;
  impl_->Check(cudaMemsetAsync(device_dst, value, bytes, impl_->stream), "cudaMemsetAsync");
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
