// The order of the router's admission queue. Within a tenant, first come, first served; across
// tenants, the next turn goes to the waiting tenant admitted least so far, so a tenant that
// floods the queue delays its own requests, not everyone's. A tenant that starts waiting
// begins level with the least-admitted tenant already waiting (start-time fair queuing), so
// being idle banks no credit. Without API keys every request has the tenant "" and the queue
// is plain FIFO. Not thread-safe: the router holds its mutex around every call.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>

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
  size_t size() const { return waiting_.size(); }
  // Requests of `tenant` waiting.
  int64_t waiting(const std::string& tenant) const {
    auto it = queued_.find(tenant);
    return it == queued_.end() ? 0 : it->second;
  }
  bool empty() const { return waiting_.empty(); }

 private:
  struct Waiting {
    uint64_t ticket;
    std::string tenant;
  };
  std::deque<Waiting> waiting_;                // arrival order
  std::map<std::string, int64_t> queued_;      // waiting requests per tenant (no zeros)
  std::map<std::string, uint64_t> admitted_;   // per waiting tenant, levelled on arrival
  uint64_t next_ticket_ = 0;
  mutable std::optional<uint64_t> head_;       // cached Head(), recomputed when dirty
  mutable bool dirty_ = true;
};

}  // namespace baton::router
