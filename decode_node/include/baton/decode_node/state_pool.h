// The decode node's memory for request state: one mapped range holding every state slot's
// rings (producer SWA, consumer SWA) and every block-KV page. When UCX is up the range is
// allocated through UCX, so that gets from a prefill node's staging memory land in it
// directly; its remote key is never handed out (DESIGN section 4: no peer writes it).
//
// With poisoning on (a test and debugging aid), freed slots and pages are filled with a poison
// pattern, and a slot or page whose poison is disturbed when it is handed out again counts as
// a violation: something wrote memory that no live request owned.
//
// Reservations are accounted up front (TryReserve takes a slot and a page count under one
// lock), so Allocate() never fails for a reserved request. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "baton/model/state.h"

namespace baton::decode_node {

class StatePool : public model::PageAllocator {
 public:
  // Lays the pool out in `memory` (at least BytesFor(...) bytes, owned by the caller) or, when
  // null, in an anonymous mapping of its own.
  StatePool(const model::StateLayout& layout, int64_t slots, int64_t pages, void* memory = nullptr);
  static uint64_t BytesFor(const model::StateLayout& layout, int64_t slots, int64_t pages);
  ~StatePool() override;
  StatePool(const StatePool&) = delete;
  StatePool& operator=(const StatePool&) = delete;

  void* base() const { return base_; }
  // Fills every free slot and page with the poison pattern from now on (see file comment).
  void EnablePoison();
  int64_t poison_violations() const;
  uint64_t bytes() const { return bytes_; }
  const model::StateLayout& layout() const { return layout_; }

  // A slot plus `pages` pages' worth of credit, or nullopt when either is short.
  std::optional<int64_t> TryReserve(int64_t pages);
  // Returns the slot and whatever credit the request did not turn into pages.
  void Unreserve(int64_t slot, int64_t unused_pages);

  float* producer_ring(int64_t slot) const;
  float* consumer_ring(int64_t slot) const;

  float* Allocate() override;
  void Free(float* page) override;

  int64_t free_slots() const;
  int64_t free_pages() const;  // pages neither in use nor promised to a reservation
  int64_t total_slots() const { return total_slots_; }
  int64_t total_pages() const { return total_pages_; }

 private:
  model::StateLayout layout_;
  int64_t total_slots_;
  int64_t total_pages_;
  float* base_ = nullptr;
  uint64_t bytes_ = 0;
  bool owns_memory_ = false;
  mutable std::mutex mutex_;
  std::vector<int64_t> free_slot_list_;
  std::vector<float*> free_page_list_;
  int64_t page_credit_;  // pages not yet promised
  bool poison_ = false;
  int64_t poison_violations_ = 0;
  void Poison(void* memory, uint64_t bytes);
  void CheckPoison(const void* memory, uint64_t bytes);  // caller holds mutex_
};

}  // namespace baton::decode_node
