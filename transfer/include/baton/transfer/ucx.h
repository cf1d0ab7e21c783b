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
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace baton::transfer {

// Zeros appended to a worker address or packed key from the wire before ucp parses it.
inline constexpr size_t kWirePadBytes = 256;

class UcxWorker;

// Which UCX transports a node may use (docs/deploy.md, "Which UCX transports are safe where").
// UCX 1.13 serves RMA over TCP in software: a get or put names a remote address and the target
// copies from or to it without checking it against the registered region or the key, so a
// worker with a TCP transport lets any peer that reaches its port read and write the whole
// process. A node accepts only transports where each read is bounded by something other than
// the peer's word: the attached segment of a shared-memory key (posix, sysv, xpmem; checked by
// the reader, UcxRemoteKey::Local), the kernel's region under knem, `self`, and RDMA verbs (rc,
// dc, ud and their variants), where the NIC checks the key; those, and their aliases mm and ib,
// with GPU copies (cuda_copy, cuda_ipc, gdr_copy) beside them. CMA is refused: it reads from
// whichever process and address the peer names (its worker address carries the pid), so a
// peer could make a node read its own memory. UCX's aliases sm and shm, which include CMA, are
// taken as mm.
//
// UcxTransports returns the UCX_TLS list a worker is created with, given the environment's
// UCX_TLS (`env`, null when unset): unset or empty gives kDefaultUcxTransports; a list of
// accepted transports is taken with sm and shm read as mm; anything that may include TCP or
// CMA ("tcp", "all", "cma", an exclusion list "^...", a name UCX may add later) is
// INVALID_ARGUMENT naming UCX_TLS and why, unless `allow_unprotected_tcp`
// (--ucx-allow-unprotected-tcp, for a network the operator trusts), which takes `env` as it is
// ("all" when unset).
inline constexpr const char* kDefaultUcxTransports = "sm,self";
inline constexpr const char* kUcxAllowUnprotectedTcpHelp =
    "Accept a UCX_TLS that includes TCP (or leaves the choice to UCX). UCX 1.13 serves RMA over "
    "TCP in software without checking keys or regions: any peer that reaches this node's UCX "
    "port can read and write all of its memory. Only for a network where every host is trusted "
    "(docs/deploy.md); otherwise use shared memory, RDMA or the gRPC transport";
absl::StatusOr<std::string> UcxTransports(const char* env, bool allow_unprotected_tcp);
// A node binary's start-up check of the environment's UCX_TLS: nullopt to go on, or exit status
// 2 after printing "<binary>: error: <why>" (nothing has started yet).
std::optional<int> RefuseUnsafeUcx(const char* binary, bool allow_unprotected_tcp);

// Locked memory for UCX over RDMA. Registering memory with an RDMA NIC pins it, which the kernel
// allows up to RLIMIT_MEMLOCK unless the process holds CAP_IPC_LOCK in its effective set; a
// container's default limit is 8 MiB (containerd), far below a decode pool or the staging
// cache, and the capability given to a non-root container never becomes effective. Without
// this check the registration fails after start and every request fails (the router's ucx
// transport has no fallback).
struct LockedMemory {
  bool rdma = false;         // the transports (UcxTransports' list) include an RDMA one
  uint64_t limit = 0;        // RLIMIT_MEMLOCK's soft limit; UINT64_MAX when unlimited
  bool ipc_lock = false;     // CAP_IPC_LOCK in the effective set
};
// This process's, for `transports` ("all": RDMA when /sys/class/infiniband lists a device).
LockedMemory LockedMemoryOf(const std::string& transports);
// OK unless `memory.rdma` and neither the limit (>= needed_bytes) nor CAP_IPC_LOCK allow
// pinning `needed_bytes` (`what`, e.g. "the decode pool (--slots, --pages)"); the error names the
// limit, the capabilities, what is needed and how to give it.
absl::Status CheckLockedMemory(const LockedMemory& memory, uint64_t needed_bytes,
                               const std::string& what);
// A node binary's start-up check: logs the limit and capability when UCX runs over RDMA, and
// returns exit status 2 after logging "cannot start" when they do not cover `needed_bytes`.
std::optional<int> RefuseUnlockableUcxMemory(bool allow_unprotected_tcp, uint64_t needed_bytes,
                                             const std::string& what);

struct UcxOptions {
  // Endpoints with UCP_ERR_HANDLING_MODE_PEER: a dead peer fails their requests instead of the
  // process, and a forced close (a read past its deadline) is within UCX's contract. UCX 1.13's
  // shared-memory transports do not support it (with it, peers on one host talk TCP at a tenth
  // of the bandwidth), so it is for network transports (RDMA, or TCP where allowed).
  bool peer_error_handling = false;
  // Accept a UCX_TLS that can serve RMA over TCP (UcxTransports).
  bool allow_unprotected_tcp = false;
};

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

  // Where [remote_address, remote_address + length) of the peer lies in this process, for a
  // key whose transport attaches the peer's memory (shared memory: a get is a plain copy from
  // the attached segment, which UCX does not check against the key, so the reader must). A
  // pointer to it when it lies inside one of the segments that unpacking this key attached,
  // up to the end of what backs the segment (a mapping may be longer than its file);
  // INVALID_ARGUMENT naming source.address or source.rkey when it does not, or when the key
  // attached nothing (its transport maps
  // nothing, as `self`). nullptr when the key has
  // no local view: its transport (RDMA, knem, or TCP where allowed) bounds each get itself.
  absl::StatusOr<const char*> Local(uint64_t remote_address, uint64_t length) const;

  // A shared mapping that unpacking the key created: [begin, end) is readable.
  struct Segment {
    uint64_t begin = 0, end = 0;
  };
  const std::vector<Segment>& attached() const { return attached_; }

 private:
  friend class UcxEndpoint;
  UcxRemoteKey() = default;
  void* rkey_ = nullptr;
  std::vector<Segment> attached_;
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

  // Initialises a ucp context with RMA and one worker, on exactly the transports
  // UcxTransports accepts from UCX_TLS (set in the context's config, so that no UCX config file
  // can add others); INVALID_ARGUMENT when it refuses them.
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create(const UcxOptions& options = {});
  ~UcxWorker();

  // This worker's address, for a peer's endpoint.
  const std::string& address() const { return address_; }
  // The UCX_TLS list it was created with.
  const std::string& transports() const { return transports_; }
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
  std::string transports_;
};

}  // namespace baton::transfer
