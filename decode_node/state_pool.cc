#include "baton/decode_node/state_pool.h"

#include <sys/mman.h>

#include <cstdlib>

namespace baton::decode_node {

uint64_t StatePool::BytesFor(const model::StateLayout& layout, int64_t slots, int64_t pages) {
  const uint64_t slot_floats = layout.producer_swa_floats() + layout.consumer_swa_floats();
  return sizeof(float) * (slot_floats * slots + layout.page_floats() * pages);
}

StatePool::StatePool(const model::StateLayout& layout, int64_t slots, int64_t pages, void* memory)
    : layout_(layout), total_slots_(slots), total_pages_(pages), page_credit_(pages) {
  const uint64_t slot_floats = layout.producer_swa_floats() + layout.consumer_swa_floats();
  bytes_ = BytesFor(layout, slots, pages);
  if (memory == nullptr) {
    memory = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) std::abort();  // start-up sizing is validated by the caller
    owns_memory_ = true;
  }
  base_ = static_cast<float*>(memory);
  for (int64_t s = slots - 1; s >= 0; --s) free_slot_list_.push_back(s);
  float* pages_base = base_ + slot_floats * slots;
  for (int64_t p = pages - 1; p >= 0; --p) {
    free_page_list_.push_back(pages_base + p * layout.page_floats());
  }
}

StatePool::~StatePool() {
  if (owns_memory_) munmap(base_, bytes_);
}

std::optional<int64_t> StatePool::TryReserve(int64_t pages) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_slot_list_.empty() || page_credit_ < pages) return std::nullopt;
  const int64_t slot = free_slot_list_.back();
  free_slot_list_.pop_back();
  page_credit_ -= pages;
  return slot;
}

void StatePool::Unreserve(int64_t slot, int64_t unused_pages) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_slot_list_.push_back(slot);
  page_credit_ += unused_pages;
}

float* StatePool::producer_ring(int64_t slot) const {
  return base_ + slot * (layout_.producer_swa_floats() + layout_.consumer_swa_floats());
}

float* StatePool::consumer_ring(int64_t slot) const {
  return producer_ring(slot) + layout_.producer_swa_floats();
}

float* StatePool::Allocate() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_page_list_.empty()) return nullptr;
  float* page = free_page_list_.back();
  free_page_list_.pop_back();
  return page;
}

void StatePool::Free(float* page) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_page_list_.push_back(page);
  page_credit_ += 1;
}

int64_t StatePool::free_slots() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(free_slot_list_.size());
}

int64_t StatePool::free_pages() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return page_credit_;
}

}  // namespace baton::decode_node
