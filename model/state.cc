#include "baton/model/state.h"

#include "absl/strings/str_cat.h"

namespace baton::model {

StateLayout StateLayout::For(const ModelConfig& c) {
  return {.producer_layers = c.num_producer_layers(),
          .consumer_layers = c.num_consumer_layers(),
          .ring_capacity = c.ring_capacity(),
          .block_size = c.kv_block_size,
          .kv_dim = c.num_key_value_heads * c.head_dim};
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

SequenceState::SequenceState(const StateLayout& layout, PageAllocator* allocator,
                             float* producer_swa, float* consumer_swa)
    : layout_(layout),
      allocator_(allocator),
      producer_swa_(producer_swa),
      consumer_swa_(consumer_swa) {
  if (producer_swa_ == nullptr || consumer_swa_ == nullptr) {
    owned_rings_.assign(layout.producer_swa_floats() + layout.consumer_swa_floats(), 0.0f);
    producer_swa_ = owned_rings_.data();
    consumer_swa_ = owned_rings_.data() + layout.producer_swa_floats();
  }
}

SequenceState::~SequenceState() {
  for (float* page : pages_) {
    if (allocator_ != nullptr) {
      allocator_->Free(page);
    } else {
      delete[] page;
    }
  }
}

absl::Status SequenceState::EnsurePages(int64_t positions) {
  const int64_t needed = (positions + layout_.block_size - 1) / layout_.block_size;
  while (static_cast<int64_t>(pages_.size()) < needed) {
    float* page =
        allocator_ != nullptr ? allocator_->Allocate() : new float[layout_.page_floats()]();
    if (page == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("no free block-KV page for position ", pages_.size() * layout_.block_size));
    }
    pages_.push_back(page);
  }
  return absl::OkStatus();
}

}  // namespace baton::model
