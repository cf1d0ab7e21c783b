#include "baton/router/fair_queue.h"

#include <algorithm>
#include <limits>

namespace baton::router {

uint64_t FairQueue::Push(const std::string& tenant) {
  if (!queued_.contains(tenant)) {
    // Level with the least-admitted tenant already waiting (0 when none is).
    uint64_t level = queued_.empty() ? 0 : std::numeric_limits<uint64_t>::max();
    for (const auto& [t, n] : queued_) level = std::min(level, admitted_[t]);
    admitted_[tenant] = level;
  }
  ++queued_[tenant];
  const uint64_t ticket = next_ticket_++;
  waiting_.push_back({ticket, tenant});
  dirty_ = true;
  return ticket;
}

std::optional<uint64_t> FairQueue::Head() const {
  if (!dirty_) return head_;
  dirty_ = false;
  head_.reset();
  if (waiting_.empty()) return head_;
  // The least-admitted waiting tenant's earliest request; between tenants level, the one
  // that has waited longest.
  uint64_t least = std::numeric_limits<uint64_t>::max();
  for (const auto& [t, n] : queued_) least = std::min(least, admitted_.at(t));
  for (const Waiting& w : waiting_) {
    if (admitted_.at(w.tenant) == least) {
      head_ = w.ticket;
      break;
    }
  }
  return head_;
}

std::optional<uint64_t> FairQueue::Head(const std::set<std::string>& skip) const {
  if (skip.empty()) return Head();
  uint64_t least = std::numeric_limits<uint64_t>::max();
  for (const auto& [t, n] : queued_) {
    if (!skip.contains(t)) least = std::min(least, admitted_.at(t));
  }
  for (const Waiting& w : waiting_) {
    if (!skip.contains(w.tenant) && admitted_.at(w.tenant) == least) return w.ticket;
  }
  return std::nullopt;
}

void FairQueue::Remove(uint64_t ticket, bool admitted) {
  auto it = std::find_if(waiting_.begin(), waiting_.end(),
                         [&](const Waiting& w) { return w.ticket == ticket; });
  if (it == waiting_.end()) return;
  const std::string tenant = it->tenant;
  waiting_.erase(it);
  if (admitted) ++admitted_[tenant];
  if (--queued_[tenant] == 0) {
    // An idle tenant keeps no share; it is levelled again when it next waits.
    queued_.erase(tenant);
    admitted_.erase(tenant);
  }
  dirty_ = true;
}

}  // namespace baton::router
