// UCX (ucp) RMA for StateBlock regions (DESIGN sections 4 and 6), read by pull: the prefill
// node allocates one request's staging memory through UCX and hands out its packed remote key;
// the decode node unpacks that key on an endpoint to the prefill node's worker and gets the
// regions straight into its own pool. No intermediate serialisation, and no node registers
// memory that a peer may write.
//
// Threading: a UcxWorker and its endpoints are safe to use from several threads
// (UCS_THREAD_MODE_MULTI); each caller keeps its own list of outstanding requests.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace baton::transfer {

// Zeros appended to a worker address or packed key from the wire before ucp parses it.
inline constexpr size_t kWirePadBytes = 256;

class UcxWorker;

// A registered memory range and its packed remote key; unregistered (and, when UCX allocated
// it, freed) on destruction, after which the key reads nothing.
class UcxMemory {
 public:
  ~UcxMemory();
  const std::string& packed_rkey() const { return packed_rkey_; }
  uint64_t address() const { return address_; }
  uint64_t length() const { return length_; }
  void* data() const { return reinterpret_cast<void*>(address_); }

 private:
  friend class UcxWorker;
  UcxMemory() = default;
  void* context_ = nullptr;
  void* memh_ = nullptr;
  std::string packed_rkey_;
  uint64_t address_ = 0;
  uint64_t length_ = 0;
};

class UcxEndpoint;

// A peer's packed remote key, unpacked for one endpoint. Destroy it only once no get that
// names it is outstanding.
class UcxRemoteKey {
 public:
  ~UcxRemoteKey();

 private:
  friend class UcxEndpoint;
  UcxRemoteKey() = default;
  void* rkey_ = nullptr;
};

// An endpoint to a remote worker.
class UcxEndpoint {
 public:
  // Force-closes the endpoint (outstanding requests complete as cancelled).
  ~UcxEndpoint();

  absl::StatusOr<std::unique_ptr<UcxRemoteKey>> Unpack(const std::string& packed_rkey);
  // Starts a get of [remote_address, remote_address + length) under `rkey` into `local`; the
  // request, if one is outstanding, is appended to `pending` for UcxWorker::WaitAll.
  absl::Status Get(void* local, uint64_t length, uint64_t remote_address,
                   const UcxRemoteKey& rkey, std::vector<void*>& pending);
  // Closes the endpoint at once: every outstanding request on it completes (cancelled) at the
  // worker's next progress. Later gets fail.
  void Close();

 private:
  friend class UcxWorker;
  UcxEndpoint() = default;
  UcxWorker* worker_ = nullptr;
  std::mutex mutex_;  // Close against Unpack and Get from other threads
  void* ep_ = nullptr;
};

class UcxWorker {
 public:
  using Clock = std::chrono::steady_clock;

  // Initialises a ucp context with RMA and one worker. With `peer_error_handling` its
  // endpoints use UCP_ERR_HANDLING_MODE_PEER: a dead peer fails their requests instead of the
  // process, and a forced close (a read past its deadline) is within UCX's contract. UCX 1.13's
  // shared-memory transports do not support it (with it, peers on one host talk TCP at a tenth
  // of the bandwidth), so it is for network transports (UCX_TLS=tcp and the like).
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create(bool peer_error_handling = false);
  ~UcxWorker();

  // This worker's address, for a peer's endpoint.
  const std::string& address() const { return address_; }
  // Lets UCX allocate and register `length` bytes, so that shared-memory transports can reach
  // them from another process (private heap memory would need CMA or TCP).
  absl::StatusOr<std::unique_ptr<UcxMemory>> Allocate(uint64_t length);
  absl::StatusOr<std::unique_ptr<UcxEndpoint>> Connect(const std::string& remote_address);
  // Drives communication; a target must call it for transports that emulate RMA (tcp).
  unsigned Progress();
  // Waits for a request returned by ucp *_nbx calls.
  absl::Status Wait(void* request);
  // Waits for every request in `pending` until `deadline`, or until `stop` (when given) says
  // so. Completed requests are freed and removed; DEADLINE_EXCEEDED and CANCELLED leave the
  // rest in `pending` (close their endpoint, then wait again), any other error means every
  // request completed and one failed.
  absl::Status WaitAll(std::vector<void*>& pending, Clock::time_point deadline,
                       const std::function<bool()>& stop = nullptr);

 private:
  UcxWorker() = default;
  void* context_ = nullptr;
  void* worker_ = nullptr;
  std::string address_;
  bool peer_error_handling_ = false;
};

}  // namespace baton::transfer
