// UCX (ucp) RMA for StateBlock regions (DESIGN sections 4 and 6): the decode node maps its
// pools once and hands out the packed remote key; the prefill node puts each region straight
// into the reserved memory and flushes. No intermediate serialisation.
//
// Threading: a UcxWorker is safe to use from several threads (UCS_THREAD_MODE_MULTI); a
// UcxEndpoint's Put/Flush calls must not interleave between threads (the prefill scheduler
// serialises transfers).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace baton::transfer {

class UcxWorker;

// A registered memory range and its packed remote key.
class UcxMemory {
 public:
  ~UcxMemory();
  const std::string& packed_rkey() const { return packed_rkey_; }
  uint64_t address() const { return address_; }
  uint64_t length() const { return length_; }

 private:
  friend class UcxWorker;
  UcxMemory() = default;
  void* context_ = nullptr;
  void* memh_ = nullptr;
  std::string packed_rkey_;
  uint64_t address_ = 0;
  uint64_t length_ = 0;
};

// An endpoint to a remote worker plus the remote key of its pool.
class UcxEndpoint {
 public:
  ~UcxEndpoint();
  // Starts a put of [local, local + length) to remote_address; completes at Flush.
  absl::Status Put(const void* local, uint64_t length, uint64_t remote_address);
  // Puts pages [0, n) of `total_bytes` (the last page may be partial) to their remote
  // addresses, merging runs that are contiguous on both sides into one put: large puts reach
  // the transports' copy bandwidth, page-sized ones do not.
  absl::Status PutPages(const std::vector<const void*>& local, const std::vector<uint64_t>& remote,
                        uint64_t page_bytes, uint64_t total_bytes);
  // Waits until every put issued so far is complete at the remote side.
  absl::Status Flush();

 private:
  friend class UcxWorker;
  UcxEndpoint() = default;
  UcxWorker* worker_ = nullptr;
  void* ep_ = nullptr;
  void* rkey_ = nullptr;
  std::vector<void*> pending_;
};

class UcxWorker {
 public:
  // Initialises a ucp context with RMA and one worker.
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create();
  ~UcxWorker();

  // This worker's address, for a peer's endpoint.
  const std::string& address() const { return address_; }
  absl::StatusOr<std::unique_ptr<UcxMemory>> Map(void* address, uint64_t length);
  // Lets UCX allocate `length` bytes, so that shared-memory transports can reach them from
  // another process (private heap memory would need CMA or TCP).
  absl::StatusOr<std::unique_ptr<UcxMemory>> Allocate(uint64_t length);
  absl::StatusOr<std::unique_ptr<UcxEndpoint>> Connect(const std::string& remote_address,
                                                       const std::string& packed_rkey);
  // Drives communication; a target must call it for transports that emulate RMA (tcp).
  unsigned Progress();
  // Waits for a request returned by ucp *_nbx calls.
  absl::Status Wait(void* request);

 private:
  UcxWorker() = default;
  absl::StatusOr<std::unique_ptr<UcxMemory>> MapParams(void* address, uint64_t length);
  void* context_ = nullptr;
  void* worker_ = nullptr;
  std::string address_;
  std::mutex mutex_;
};

}  // namespace baton::transfer
