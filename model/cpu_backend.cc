#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "baton/model/backend.h"

namespace baton::model {

absl::string_view DeviceName(Device device) {
  return device == Device::kCuda ? "cuda" : "cpu";
}

absl::StatusOr<Device> ParseDevice(absl::string_view text, absl::string_view field) {
  if (text == "cpu") return Device::kCpu;
  if (text == "cuda") return Device::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": '", text, "' is unknown; allowed: cpu, cuda"));
}

namespace {

// Host memory and the kernels' CPU implementations; every op runs to completion before it
// returns, so Synchronize has nothing to wait for.
class CpuBackend : public Backend {
 public:
  Device device() const override { return Device::kCpu; }
  bool host_memory() const override { return true; }
  bool concurrent() const override { return true; }

  void* Allocate(size_t bytes) override { return std::calloc(bytes == 0 ? 1 : bytes, 1); }
  void Free(void* memory) override { std::free(memory); }
  void CopyIn(void* dst, const void* host_src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, host_src, bytes);
  }
  void CopyOut(void* host_dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(host_dst, src, bytes);
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  void Gemm(const kernels::GemmParams& p) override { kernels::Gemm(p); }
  void RmsNorm(const kernels::RmsNormParams& p) override { kernels::RmsNorm(p); }
  void Rope(const kernels::RopeParams& p) override { kernels::Rope(p); }
  void SwiGlu(const kernels::SwiGluParams& p) override { kernels::SwiGlu(p); }
  void Embedding(const kernels::EmbeddingParams& p) override { kernels::Embedding(p); }
  void GatherRows(const kernels::GatherRowsParams& p) override { kernels::GatherRows(p); }
  void ScatterRows(const kernels::ScatterRowsParams& p) override { kernels::ScatterRows(p); }
  void WriteBlockKv(const kernels::WriteBlockKvParams& p) override { kernels::WriteBlockKv(p); }
  void Attention(std::span<const kernels::AttentionParams> batch) override {
    kernels::Attention(batch);
  }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace baton::model
