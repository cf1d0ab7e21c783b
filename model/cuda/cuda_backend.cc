#include "baton/model/cuda/cuda_backend.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "baton/kernels/cuda/context.h"
#include "baton/kernels/cuda/ops.h"

namespace baton::model::cuda {
namespace {

namespace kc = kernels::cuda;

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(std::unique_ptr<kc::Context> ctx) : ctx_(std::move(ctx)) {}
  ~CudaBackend() override { (void)ctx_->Synchronize(); }

  Device device() const override { return Device::kCuda; }
  bool host_memory() const override { return false; }
  bool concurrent() const override { return false; }

  void* Allocate(size_t bytes) override {
    // A full device is the caller's to handle (nullptr), not an error of the stream.
    void* memory = ctx_->TryMalloc(bytes == 0 ? 1 : bytes);
    if (memory == nullptr) return nullptr;
    // Zeroed on the context's stream, before any op that the caller queues on the memory. A
    // zeroing that cannot be queued means the context is broken: the memory goes back, and
    // the recorded error stays for the caller's next Synchronize.
    if (!ctx_->Memset(memory, 0, bytes)) {
      ctx_->Free(memory);
      return nullptr;
    }
    return memory;
  }
  // cudaFree waits for the device, so kernels still queued never read freed memory.
  void Free(void* memory) override { ctx_->Free(memory); }
  void CopyIn(void* dst, const void* host_src, size_t bytes) override {
    ctx_->CopyToDevice(dst, host_src, bytes);
  }
  void CopyOut(void* host_dst, const void* src, size_t bytes) override {
    ctx_->CopyToHost(host_dst, src, bytes);
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    ctx_->CopyOnDevice(dst, src, bytes);
  }
  absl::Status Synchronize() override { return ctx_->Synchronize(); }
  absl::Status PinHost(void* host, size_t bytes) override {
    return ctx_->RegisterHost(host, bytes);
  }
  void UnpinHost(void* host) override { ctx_->UnregisterHost(host); }

  void Gemm(const kernels::GemmParams& p) override { kc::Gemm(*ctx_, p); }
  void RmsNorm(const kernels::RmsNormParams& p) override { kc::RmsNorm(*ctx_, p); }
  void Rope(const kernels::RopeParams& p) override { kc::Rope(*ctx_, p); }
  void SwiGlu(const kernels::SwiGluParams& p) override { kc::SwiGlu(*ctx_, p); }
  void Embedding(const kernels::EmbeddingParams& p) override { kc::Embedding(*ctx_, p); }
  void GatherRows(const kernels::GatherRowsParams& p) override { kc::GatherRows(*ctx_, p); }
  void ScatterRows(const kernels::ScatterRowsParams& p) override { kc::ScatterRows(*ctx_, p); }
  void WriteBlockKv(const kernels::WriteBlockKvParams& p) override { kc::WriteBlockKv(*ctx_, p); }
  void Attention(std::span<const kernels::AttentionParams> batch) override {
    kc::Attention(*ctx_, batch);
  }

 private:
  std::unique_ptr<kc::Context> ctx_;
};

}  // namespace
}  // namespace baton::model::cuda

extern "C" baton::model::Backend* BatonMakeCudaBackend(int ordinal,
                                                       const baton::kernels::CudaOptions* options,
                                                       char* error, size_t error_bytes) {
  namespace kc = baton::kernels::cuda;
  auto fail = [&](const std::string& reason) -> baton::model::Backend* {
    if (error_bytes > 0) {
      const size_t n = std::min(reason.size(), error_bytes - 1);
      std::memcpy(error, reason.data(), n);
      error[n] = '\0';
    }
    return nullptr;
  };
  if (kc::DeviceCount() == 0) return fail(absl::StrCat("no CUDA device: ", kc::NoDeviceReason()));
  absl::StatusOr<std::unique_ptr<kc::Context>> ctx = kc::Context::Create(ordinal, *options);
  if (!ctx.ok()) return fail(std::string(ctx.status().message()));
  return new baton::model::cuda::CudaBackend(*std::move(ctx));
}
