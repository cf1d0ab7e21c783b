#include "baton/decode_node/state_pool.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "baton/common/log.h"

namespace baton::decode_node {
namespace {

constexpr unsigned char kPoison = 0xA5;

}  // namespace

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

void StatePool::EnablePoison() {
  std::lock_guard<std::mutex> lock(mutex_);
  poison_ = true;
  const uint64_t ring_bytes =
      sizeof(float) * (layout_.producer_swa_floats() + layout_.consumer_swa_floats());
  for (int64_t slot : free_slot_list_) std::memset(producer_ring(slot), kPoison, ring_bytes);
  for (float* page : free_page_list_) {
    std::memset(page, kPoison, sizeof(float) * layout_.page_floats());
  }
}

int64_t StatePool::poison_violations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return poison_violations_;
}

void StatePool::Poison(void* memory, uint64_t bytes) {
  if (poison_) std::memset(memory, kPoison, bytes);
}

void StatePool::CheckPoison(const void* memory, uint64_t bytes) {
  if (!poison_) return;
  const auto* p = static_cast<const unsigned char*>(memory);
  for (uint64_t i = 0; i < bytes; ++i) {
    if (p[i] != kPoison) {
      ++poison_violations_;
      log::Error("freed pool memory was written while no request owned it",
                 {{"offset", static_cast<int64_t>(p + i - reinterpret_cast<const unsigned char*>(
                                                                 base_))}});
      return;
    }
  }
}

std::optional<int64_t> StatePool::TryReserve(int64_t pages) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_slot_list_.empty() || page_credit_ < pages) return std::nullopt;
  const int64_t slot = free_slot_list_.back();
  free_slot_list_.pop_back();
  page_credit_ -= pages;
  CheckPoison(producer_ring(slot),
              sizeof(float) * (layout_.producer_swa_floats() + layout_.consumer_swa_floats()));
  return slot;
}

void StatePool::Unreserve(int64_t slot, int64_t unused_pages) {
  std::lock_guard<std::mutex> lock(mutex_);
  Poison(producer_ring(slot),
         sizeof(float) * (layout_.producer_swa_floats() + layout_.consumer_swa_floats()));
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
  CheckPoison(page, sizeof(float) * layout_.page_floats());
  return page;
}

void StatePool::Free(float* page) {
  std::lock_guard<std::mutex> lock(mutex_);
  Poison(page, sizeof(float) * layout_.page_floats());
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
