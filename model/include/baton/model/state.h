// A request's StateBlock regions in memory (DESIGN section 4), each a separate allocation so
// that a transport can move it without copying:
//   - producer SWA (stored region): per producer layer, K and V rings of C slots;
//   - consumer SWA (dropped region): per consumer layer, K and V rings of C slots;
//   - block KV (stored region): pages of B positions, each holding every block-KV group's
//     global K and V rows for those positions (G groups: one per source layer of
//     block_kv_sources, or one per consumer layer without sharing).
// Ring slot of position p is p % C. The regions are backend memory (backend.h): host memory
// for the CPU backend, device memory for the CUDA one; a SequenceState only holds the
// pointers, so the same class serves both. Threading: a SequenceState belongs to one request
// and is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "baton/common/model_config.h"
#include "baton/model/backend.h"

namespace baton::model {

struct StateLayout {
  int64_t producer_layers = 0;  // P
  int64_t consumer_layers = 0;  // D
  int64_t ring_capacity = 0;    // C
  int64_t block_size = 0;       // B
  int64_t kv_dim = 0;           // Hkv * hd
  int64_t block_kv_groups = 0;  // G: block KV held once per group, read by D layers
  int64_t hidden_size = 0;      // d: one boundary row (replay-on-decode) is d floats

  static StateLayout For(const ModelConfig& config);

  // Producer ring of layer l: K at l * 2 * C * kv_dim, V right after, each [C, kv_dim].
  int64_t producer_swa_floats() const { return producer_layers * 2 * ring_capacity * kv_dim; }
  // Consumer ring of consumer layer l: same layout as the producer rings.
  int64_t consumer_swa_floats() const { return consumer_layers * 2 * ring_capacity * kv_dim; }
  // Page: for block-KV group g, K rows [B, kv_dim] at g * 2 * B * kv_dim, V rows after them.
  int64_t page_floats() const { return block_kv_groups * 2 * block_size * kv_dim; }
  // Producer SWA rows of one block as the prefix store keeps them (DESIGN section 5):
  // [P][2][B][kv_dim], K rows then V rows per producer layer.
  int64_t stored_swa_block_floats() const { return producer_layers * 2 * block_size * kv_dim; }
  int64_t ring_k_offset(int64_t layer) const { return layer * 2 * ring_capacity * kv_dim; }
  int64_t ring_v_offset(int64_t layer) const {
    return ring_k_offset(layer) + ring_capacity * kv_dim;
  }
  int64_t page_k_offset(int64_t group) const { return group * 2 * block_size * kv_dim; }
  int64_t page_v_offset(int64_t group) const { return page_k_offset(group) + block_size * kv_dim; }
};

// Where block-KV pages come from: a backend's memory by default; a node's pool in serving
// (decode_node::StatePool, over host or device memory).
class PageAllocator {
 public:
  virtual ~PageAllocator() = default;
  // Returns a page of layout.page_floats() floats, or nullptr when none is left.
  virtual float* Allocate() = 0;
  virtual void Free(float* page) = 0;
};

// Hands out pages from one contiguous buffer of `pages` pages, in address order, so that a
// request's block KV is one contiguous range (a transfer can then move it in one get).
class ContiguousPageAllocator : public PageAllocator {
 public:
  // A zeroed buffer of its own.
  ContiguousPageAllocator(const StateLayout& layout, int64_t pages);
  // `memory` (at least pages x page_floats floats, not owned): a node's staging memory.
  ContiguousPageAllocator(const StateLayout& layout, int64_t pages, float* memory);
  float* Allocate() override;
  void Free(float*) override {}  // the buffer goes with the allocator

 private:
  std::vector<float> buffer_;
  float* base_;
  int64_t pages_;
  int64_t page_floats_;
  int64_t next_ = 0;
};

// Pages of one backend's memory, allocated one at a time and freed with the state.
class BackendPageAllocator : public PageAllocator {
 public:
  BackendPageAllocator(Backend& backend, const StateLayout& layout)
      : backend_(backend), page_bytes_(layout.page_floats() * sizeof(float)) {}
  float* Allocate() override { return static_cast<float*>(backend_.Allocate(page_bytes_)); }
  void Free(float* page) override { backend_.Free(page); }

 private:
  Backend& backend_;
  size_t page_bytes_;
};

class SequenceState {
 public:
  // Rings and pages in host memory (the CPU backend's).
  explicit SequenceState(const StateLayout& layout);
  // Rings and pages in `backend`'s memory (it must outlive the state); rings start zeroed.
  // producer_swa() is null when the backend had no memory for the rings.
  SequenceState(const StateLayout& layout, Backend& backend);
  // Pages from `allocator` (it must outlive the state); rings in the given buffers (a node's
  // pool slot; not owned).
  SequenceState(const StateLayout& layout, PageAllocator* allocator, float* producer_swa,
                float* consumer_swa);
  ~SequenceState();
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;

  const StateLayout& layout() const { return layout_; }
  float* producer_swa() { return producer_swa_; }
  const float* producer_swa() const { return producer_swa_; }
  float* consumer_swa() { return consumer_swa_; }
  const float* consumer_swa() const { return consumer_swa_; }
  const std::vector<float*>& pages() const { return pages_; }

  // Makes sure pages cover positions [0, positions); RESOURCE_EXHAUSTED when the allocator
  // has none left (pages already held stay held).
  absl::Status EnsurePages(int64_t positions);

  // Positions whose state is present: block KV for [0, length), rings up to length - 1.
  int64_t length = 0;
  // Earliest valid consumer SWA position (H after a prefix hit; DESIGN section 3).
  int64_t s_valid = 0;

 private:
  StateLayout layout_;
  std::unique_ptr<BackendPageAllocator> owned_allocator_;  // when the state owns its memory
  PageAllocator* allocator_;
  BackendArray<float> owned_rings_;  // both rings, when the state owns its memory
  float* producer_swa_;
  float* consumer_swa_;
  std::vector<float*> pages_;
};

// The copies that put `from`'s rings (the consumer rings only where both have them) and the
// pages covering positions [0, positions) onto `to`'s (same layout; `to`'s pages must cover those
// positions). A node stages a state between host memory (what transfers and the prefix store read
// and write) and the engine's memory with them (Engine::StageIn, StageOut).
std::vector<StageCopy> StateCopies(const SequenceState& from, SequenceState& to, int64_t positions);

}  // namespace baton::model
