#include "baton/kernels/cuda/memory_pool.h"

#include "absl/strings/str_cat.h"
#include "context_impl.h"

namespace baton::kernels::cuda {

absl::StatusOr<std::unique_ptr<DeviceStatePool>> DeviceStatePool::Create(
    const DeviceStatePoolOptions& options) {
  if (options.slots < 0 || options.pages < 0 || options.slot_floats < 0 ||
      options.page_floats <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device state pool: slots ", options.slots, ", pages ", options.pages,
                     ", slot_floats ", options.slot_floats, ", page_floats ", options.page_floats,
                     "; counts must be >= 0 and page_floats > 0"));
  }
  const uint64_t bytes =
      sizeof(float) * (static_cast<uint64_t>(options.slots) * options.slot_floats +
                       static_cast<uint64_t>(options.pages) * options.page_floats);
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device state pool: cudaSetDevice(", options.device, "): ", cudaGetErrorString(e)));
  }
  void* base = nullptr;
  if (cudaError_t e = cudaMalloc(&base, bytes); e != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat("device state pool: cudaMalloc of ", bytes,
                                                     " bytes: ", cudaGetErrorString(e)));
  }
  // Rings start zeroed, as SequenceState's host rings do; pages need no clearing (every
  // position is written before it is read).
  cudaMemset(base, 0, sizeof(float) * options.slots * options.slot_floats);
  return std::unique_ptr<DeviceStatePool>(
      new DeviceStatePool(options, static_cast<float*>(base), bytes));
}

DeviceStatePool::DeviceStatePool(const DeviceStatePoolOptions& options, float* base, uint64_t bytes)
    : options_(options), base_(base), bytes_(bytes) {
  for (int64_t s = options.slots - 1; s >= 0; --s) free_slots_.push_back(s);
  float* pages_base = base_ + options.slots * options.slot_floats;
  for (int64_t p = options.pages - 1; p >= 0; --p) {
    free_pages_.push_back(pages_base + p * options.page_floats);
  }
}

DeviceStatePool::~DeviceStatePool() {
  cudaSetDevice(options_.device);
  cudaFree(base_);
}

std::optional<int64_t> DeviceStatePool::AllocateSlot() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_slots_.empty()) return std::nullopt;
  const int64_t slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

void DeviceStatePool::FreeSlot(int64_t slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_slots_.push_back(slot);
}

float* DeviceStatePool::AllocatePage() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_pages_.empty()) return nullptr;
  float* page = free_pages_.back();
  free_pages_.pop_back();
  return page;
}

void DeviceStatePool::FreePage(float* page) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_pages_.push_back(page);
}

int64_t DeviceStatePool::free_slots() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(free_slots_.size());
}

int64_t DeviceStatePool::free_pages() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(free_pages_.size());
}

absl::StatusOr<std::unique_ptr<PinnedStaging>> PinnedStaging::Create(size_t bytes) {
  void* data = nullptr;
  if (cudaError_t e = cudaHostAlloc(&data, bytes, cudaHostAllocPortable); e != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat("pinned staging: cudaHostAlloc of ", bytes,
                                                     " bytes: ", cudaGetErrorString(e)));
  }
  return std::unique_ptr<PinnedStaging>(new PinnedStaging(data, bytes));
}

PinnedStaging::~PinnedStaging() {
  cudaFreeHost(data_);
}

void PinnedStaging::StageOut(Context& ctx, size_t offset, const void* device_src, size_t bytes) {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    ctx.impl().Fail(absl::StrCat("StageOut: [", offset, ", +", bytes, ") exceeds ", bytes_));
    return;
  }
  ctx.impl().Check(cudaMemcpyAsync(static_cast<char*>(data_) + offset, device_src, bytes,
                                   cudaMemcpyDeviceToHost, ctx.impl().stream),
                   "StageOut");
}

void PinnedStaging::StageIn(Context& ctx, size_t offset, void* device_dst, size_t bytes) {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    ctx.impl().Fail(absl::StrCat("StageIn: [", offset, ", +", bytes, ") exceeds ", bytes_));
    return;
  }
  ctx.impl().Check(cudaMemcpyAsync(device_dst, static_cast<char*>(data_) + offset, bytes,
                                   cudaMemcpyHostToDevice, ctx.impl().stream),
                   "StageIn");
}

}  // namespace baton::kernels::cuda
