// The order of the router's admission queue. Within a tenant, first come, first served; across
// tenants, the next turn goes to the waiting tenant admitted least so far, so a tenant that
// floods the queue delays its own requests, not everyone's. A tenant that starts waiting
// begins level with the least-admitted tenant already waiting (start-time fair queuing), so
// being idle banks no credit. Without API keys every request has the tenant "" and the queue
// is plain FIFO. Head, Push and Remove cost O(log n) in the requests waiting (Head with `skip`
// adds a step per tenant skipped): no call scans the queue. Not
// thread-safe: the router holds its mutex around every call.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

namespace baton::router {

class FairQueue {
 public:
  // Enqueues a request of `tenant`; its ticket.
  uint64_t Push(const std::string& tenant);
  // Whose turn it is (nullopt when empty).
  std::optional<uint64_t> Head() const;
  // Whose turn it is among the tenants not in `skip` (those that may not be admitted now: they
  // hold their share of the decode slots); nullopt when none of them waits.
  std::optional<uint64_t> Head(const std::set<std::string>& skip) const;
  // Takes `ticket` out: admitted (counted for its tenant's share) or not (it left the queue:
  // cancelled, expired, refused).
  void Remove(uint64_t ticket, bool admitted);
  size_t size() const { return tenant_of_.size(); }
  // Requests of `tenant` waiting.
  int64_t waiting(const std::string& tenant) const {
    auto it = tenants_.find(tenant);
    return it == tenants_.end() ? 0 : static_cast<int64_t>(it->second.tickets.size());
  }
  bool empty() const { return tenant_of_.empty(); }
  // `tenant`'s request that has waited least (nullopt when it has none waiting).
  std::optional<uint64_t> Newest(const std::string& tenant) const {
    auto it = tenants_.find(tenant);
    if (it == tenants_.end()) return std::nullopt;
    return *it->second.tickets.rbegin();
  }
  // Calls `visit(tenant)` for each tenant with a request waiting.
  template <typename Visit>
  void ForEachTenant(Visit visit) const {
    for (const auto& [tenant, waiting] : tenants_) visit(tenant);
  }

 private:
  struct Tenant {
    std::set<uint64_t> tickets;  // waiting, in arrival order (tickets only grow)
    uint64_t admitted = 0;       // levelled on arrival
  };
  // A tenant's place in the turn order: (admitted, its oldest ticket). The least admitted goes
  // first, and between tenants level the one whose oldest request has waited longest.
  using Turn = std::pair<uint64_t, uint64_t>;
  static Turn TurnOf(const Tenant& tenant) { return {tenant.admitted, *tenant.tickets.begin()}; }

  std::map<std::string, Tenant> tenants_;      // tenants with requests waiting
  std::map<uint64_t, std::string> tenant_of_;  // every waiting ticket's tenant
  std::set<Turn> turns_;                       // one per waiting tenant
  uint64_t next_ticket_ = 0;
};

}  // namespace baton::router
