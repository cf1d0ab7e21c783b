#include "baton/model/state.h"

#include "absl/strings/str_cat.h"

namespace baton::model {

StateLayout StateLayout::For(const ModelConfig& c) {
  return {.producer_layers = c.num_producer_layers(),
          .consumer_layers = c.num_consumer_layers(),
          .ring_capacity = c.ring_capacity(),
          .block_size = c.kv_block_size,
          .kv_dim = c.num_key_value_heads * c.head_dim,
          .block_kv_groups = c.num_block_kv_groups(),
          .hidden_size = c.hidden_size};
}

ContiguousPageAllocator::ContiguousPageAllocator(const StateLayout& layout, int64_t pages)
    : buffer_(layout.page_floats() * pages, 0.0f),
      base_(buffer_.data()),
      pages_(pages),
      page_floats_(layout.page_floats()) {}

ContiguousPageAllocator::ContiguousPageAllocator(const StateLayout& layout, int64_t pages,
                                                 float* memory)
    : base_(memory), pages_(pages), page_floats_(layout.page_floats()) {}

float* ContiguousPageAllocator::Allocate() {
  if (next_ >= pages_) return nullptr;
  return base_ + page_floats_ * next_++;
}

namespace {

// The host memory of states made without a backend: the CPU backend is stateless, so one
// instance serves every such state.
Backend& HostBackend() {
  static Backend* const backend = MakeCpuBackend().release();
  return *backend;
}

}  // namespace

SequenceState::SequenceState(const StateLayout& layout) : SequenceState(layout, HostBackend()) {}

SequenceState::SequenceState(const StateLayout& layout, Backend& backend)
    : layout_(layout),
      owned_allocator_(std::make_unique<BackendPageAllocator>(backend, layout)),
      allocator_(owned_allocator_.get()),
      owned_rings_(backend, layout.producer_swa_floats() + layout.consumer_swa_floats()),
      producer_swa_(owned_rings_.data()),
      consumer_swa_(producer_swa_ != nullptr ? producer_swa_ + layout.producer_swa_floats()
                                             : nullptr) {}

SequenceState::SequenceState(const StateLayout& layout, PageAllocator* allocator,
                             float* producer_swa, float* consumer_swa)
    : layout_(layout),
      allocator_(allocator),
      producer_swa_(producer_swa),
      consumer_swa_(consumer_swa) {}

SequenceState::~SequenceState() {
  for (float* page : pages_) allocator_->Free(page);
}

absl::Status SequenceState::EnsurePages(int64_t positions) {
  const int64_t needed = (positions + layout_.block_size - 1) / layout_.block_size;
  while (static_cast<int64_t>(pages_.size()) < needed) {
    float* page = allocator_->Allocate();
    if (page == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("no free block-KV page for position ", pages_.size() * layout_.block_size));
    }
    pages_.push_back(page);
  }
  return absl::OkStatus();
}

std::vector<StageCopy> StateCopies(const SequenceState& from, SequenceState& to,
                                   int64_t positions) {
  const StateLayout& layout = from.layout();
  std::vector<StageCopy> copies{
      {to.producer_swa(), from.producer_swa(), layout.producer_swa_floats() * sizeof(float)}};
  // A state without consumer rings (a replay-on-decode prefill's) has none to copy.
  if (from.consumer_swa() != nullptr && to.consumer_swa() != nullptr) {
    copies.push_back(
        {to.consumer_swa(), from.consumer_swa(), layout.consumer_swa_floats() * sizeof(float)});
  }
  const int64_t pages = (positions + layout.block_size - 1) / layout.block_size;
  for (int64_t p = 0; p < pages; ++p) {
    copies.push_back({to.pages()[p], from.pages()[p], layout.page_floats() * sizeof(float)});
  }
  return copies;
}

}  // namespace baton::model
