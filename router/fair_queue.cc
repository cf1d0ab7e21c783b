#include "baton/router/fair_queue.h"

namespace baton::router {

uint64_t FairQueue::Push(const std::string& tenant) {
  const uint64_t ticket = next_ticket_++;
  tenant_of_.emplace(ticket, tenant);
  auto [it, arrived] = tenants_.try_emplace(tenant);
  it->second.tickets.insert(ticket);
  if (arrived) {
    // Level with the least-admitted tenant already waiting (0 when none is).
    it->second.admitted = turns_.empty() ? 0 : turns_.begin()->first;
    turns_.insert(TurnOf(it->second));
  }
  return ticket;
}

std::optional<uint64_t> FairQueue::Head() const {
  if (turns_.empty()) return std::nullopt;
  return turns_.begin()->second;
}

std::optional<uint64_t> FairQueue::Head(const std::set<std::string>& skip) const {
  for (const Turn& turn : turns_) {
    if (!skip.contains(tenant_of_.at(turn.second))) return turn.second;
  }
  return std::nullopt;
}

void FairQueue::Remove(uint64_t ticket, bool admitted) {
  auto found = tenant_of_.find(ticket);
  if (found == tenant_of_.end()) return;
  auto it = tenants_.find(found->second);
  tenant_of_.erase(found);
  Tenant& tenant = it->second;
  turns_.erase(TurnOf(tenant));
  tenant.tickets.erase(ticket);
  if (admitted) ++tenant.admitted;
  if (tenant.tickets.empty()) {
    // An idle tenant keeps no share; it is levelled again when it next waits.
    tenants_.erase(it);
    return;
  }
  turns_.insert(TurnOf(tenant));
}

}  // namespace baton::router
