// Device memory for request state (DESIGN section 4) on a GPU decode or prefill node.
//
// DeviceStatePool allocates, once, with cudaMalloc, one device range laid out exactly as
// decode_node::StatePool lays out its host range: `slots` state slots (each a request's
// producer SWA rings then consumer SWA rings, slot_floats floats) followed by `pages` block-KV
// pages of page_floats floats (B positions of every consumer layer). Pages and slots are
// handed out from free lists. Because the layout is StatePool's, a decode node may also
// construct its StatePool over base() and keep its own reservation logic.
//
// UCX without CUDA support cannot read or write device memory: PinnedStaging is page-locked
// host memory (cudaHostAlloc) that such a UCX registers instead; regions are staged through
// it with StageOut (device -> pinned, before a put) and StageIn (pinned -> device, after the
// data landed). With CUDA-aware UCX, register base() directly and skip the staging.
//
// Threading: Allocate/Free and the slot calls are thread-safe; staging copies run on the
// Context given, under that Context's threading rule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/kernels/cuda/context.h"

namespace baton::kernels::cuda {

struct DeviceStatePoolOptions {
  int device = 0;
  int64_t slots = 0;        // requests whose rings fit at once
  int64_t slot_floats = 0;  // producer_swa_floats() + consumer_swa_floats()
  int64_t pages = 0;        // block-KV pages
  int64_t page_floats = 0;  // StateLayout::page_floats()
};

class DeviceStatePool {
 public:
  // RESOURCE_EXHAUSTED when the device lacks the memory, INVALID_ARGUMENT for bad sizes.
  static absl::StatusOr<std::unique_ptr<DeviceStatePool>> Create(
      const DeviceStatePoolOptions& options);
  ~DeviceStatePool();
  DeviceStatePool(const DeviceStatePool&) = delete;
  DeviceStatePool& operator=(const DeviceStatePool&) = delete;

  float* base() const { return base_; }  // device pointer to the whole range
  uint64_t bytes() const { return bytes_; }
  const DeviceStatePoolOptions& options() const { return options_; }

  // A free slot index, or nullopt; its rings are at producer_rings(slot) (device pointer).
  std::optional<int64_t> AllocateSlot();
  void FreeSlot(int64_t slot);
  float* producer_rings(int64_t slot) const { return base_ + slot * options_.slot_floats; }
  // consumer_rings needs the producer part's size; callers pass StateLayout's figure.
  float* consumer_rings(int64_t slot, int64_t producer_swa_floats) const {
    return producer_rings(slot) + producer_swa_floats;
  }

  // A free page (device pointer), or nullptr when none is left.
  float* AllocatePage();
  void FreePage(float* page);
  int64_t free_slots() const;
  int64_t free_pages() const;

 private:
  DeviceStatePool(const DeviceStatePoolOptions& options, float* base, uint64_t bytes);
  DeviceStatePoolOptions options_;
  float* base_;
  uint64_t bytes_;
  mutable std::mutex mutex_;
  std::vector<int64_t> free_slots_;
  std::vector<float*> free_pages_;
};

// Page-locked host memory for UCX builds without CUDA support (see above).
class PinnedStaging {
 public:
  static absl::StatusOr<std::unique_ptr<PinnedStaging>> Create(size_t bytes);
  ~PinnedStaging();
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

  // Queue device -> staging (offset bytes in) and staging -> device copies on ctx's stream;
  // ctx.Synchronize() before UCX reads the staged bytes or the device reads what came in.
  // Out-of-range requests are recorded as the Context's error.
  void StageOut(Context& ctx, size_t offset, const void* device_src, size_t bytes);
  void StageIn(Context& ctx, size_t offset, void* device_dst, size_t bytes);

 private:
  PinnedStaging(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  void* data_;
  size_t bytes_;
};

}  // namespace baton::kernels::cuda
