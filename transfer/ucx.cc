#include "baton/transfer/ucx.h"

#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "baton/common/log.h"

namespace baton::transfer {
namespace {

absl::Status UcxError(const char* what, ucs_status_t status) {
  return absl::UnavailableError(absl::StrCat("UCX ", what, ": ", ucs_status_string(status)));
}

// UCX_TLS names whose reads are bounded by more than the peer's word (see UcxTransports), UCX
// 1.13's aliases among them: mm is the shared-memory transports that attach segments, ib the
// verbs ones.
constexpr absl::string_view kKeyedTransports[] = {
    "mm",       "posix",    "sysv",     "xpmem",   "knem",      "self",     "ib",
    "rc",       "rc_v",     "rc_x",     "rc_verbs", "rc_mlx5",  "dc",       "dc_x",
    "dc_mlx5",  "ud",       "ud_v",     "ud_x",    "ud_verbs",  "ud_mlx5",  "cuda_copy",
    "cuda_ipc", "gdr_copy", "cuda",
};
// Aliases that include CMA, read as the shared-memory transports without it.
constexpr absl::string_view kSharedMemoryAliases[] = {"sm", "shm"};

// Shared mappings ('s' in /proc/self/maps) attach and detach only under this lock in this
// file (key unpacks, allocations, endpoints), so that the mappings that appear across an
// unpack are that key's.
std::mutex& AttachMutex() {
  static std::mutex mutex;
  return mutex;
}

struct Mapping {
  uint64_t begin = 0, end = 0, offset = 0, inode = 0;
  bool operator==(const Mapping&) const = default;
};

std::vector<Mapping> SharedMappings() {
  std::vector<Mapping> mappings;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    Mapping m;
    char perms[8] = {};
    unsigned major = 0, minor = 0;
    if (std::sscanf(line.c_str(), "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %x:%x %" SCNu64,
                    &m.begin, &m.end, perms, &m.offset, &major, &minor, &m.inode) != 7) {
      continue;
    }
    if (perms[0] == 'r' && perms[3] == 's') mappings.push_back(m);
  }
  return mappings;
}

// The readable part of a fresh mapping: a mapping may run past the end of the file or segment
// behind it (its length came from the peer's key), and touching that part faults.
UcxRemoteKey::Segment Readable(const Mapping& m) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/map_files/%" PRIx64 "-%" PRIx64, m.begin, m.end);
  struct stat st {};
  uint64_t end = m.end;
  if (stat(path, &st) == 0) {
    const uint64_t size = static_cast<uint64_t>(std::max<off_t>(st.st_size, 0));
    const uint64_t backed = size > m.offset ? size - m.offset : 0;
    end = m.begin + std::min(m.end - m.begin, backed);
  }
  return {m.begin, end};
}

}  // namespace

absl::StatusOr<std::string> UcxTransports(const char* env, bool allow_unprotected_tcp) {
  const std::string value = env == nullptr ? "" : env;
  if (allow_unprotected_tcp) return value.empty() ? std::string("all") : value;
  if (value.empty()) return UcxTransports(kDefaultUcxTransports, false);
  const std::string allowed = absl::StrJoin(kKeyedTransports, ", ");
  if (value[0] == '^') {
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX_TLS=", value, ": an exclusion list lets UCX pick transports that serve RMA over TCP "
        "in software, where any peer that reaches the port reads and writes this process's "
        "memory; list the transports to use (", allowed,
        "), or pass --ucx-allow-unprotected-tcp for a network you trust"));
  }
  std::vector<std::string> names;
  for (absl::string_view name : absl::StrSplit(value, ',', absl::SkipEmpty())) {
    const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(name));
    if (absl::c_linear_search(kSharedMemoryAliases, lower)) {
      names.push_back("mm");
      continue;
    }
    if (absl::c_linear_search(kKeyedTransports, lower)) {
      names.push_back(lower);
      continue;
    }
    const bool tcp = lower == "tcp" || lower == "all";
    const bool cma = lower == "cma";
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX_TLS=", value, ": '", name, "' ",
        tcp ? "serves RMA over TCP in software, checking neither the registered region nor the "
              "key, so any peer that reaches the port reads and writes this process's memory"
        : cma ? "reads from whichever process and address the peer names (its worker address "
                "carries the pid), so a peer could make this node read its own memory; "
                "shared memory without it is mm (what sm and shm are taken as)"
              : "is not a transport whose memory keys baton knows to be enforced",
        "; allowed: sm, shm, ", allowed,
        " (across hosts without RDMA, use the gRPC transport: --transport grpc on the router), "
        "or pass --ucx-allow-unprotected-tcp for a network you trust"));
  }
  return absl::StrJoin(names, ",");
}

std::optional<int> RefuseUnsafeUcx(const char* binary, bool allow_unprotected_tcp) {
  absl::StatusOr<std::string> transports =
      UcxTransports(std::getenv("UCX_TLS"), allow_unprotected_tcp);
  if (transports.ok()) return std::nullopt;
  std::fprintf(stderr, "%s: error: %s\n", binary, std::string(transports.status().message()).c_str());
  return 2;
}

LockedMemory LockedMemoryOf(const std::string& transports) {
  LockedMemory memory;
  for (absl::string_view name : absl::StrSplit(transports, ',', absl::SkipEmpty())) {
    memory.rdma |= name == "ib" || absl::StartsWith(name, "rc") || absl::StartsWith(name, "ud") ||
                   absl::StartsWith(name, "dc");
    if (name == "all") {
      std::error_code ec;
      const std::filesystem::path devices = "/sys/class/infiniband";
      memory.rdma |= std::filesystem::is_directory(devices, ec) &&
                     std::filesystem::directory_iterator(devices, ec) !=
                         std::filesystem::directory_iterator();
    }
  }
  rlimit limit{};
  memory.limit = getrlimit(RLIMIT_MEMLOCK, &limit) != 0 ? 0
                 : limit.rlim_cur == RLIM_INFINITY      ? UINT64_MAX
                                                        : static_cast<uint64_t>(limit.rlim_cur);
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    uint64_t effective = 0;
    if (absl::StartsWith(line, "CapEff:") &&
        absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line.substr(7)), &effective)) {
      memory.ipc_lock = (effective >> CAP_IPC_LOCK) & 1;
    }
  }
  return memory;
}

absl::Status CheckLockedMemory(const LockedMemory& memory, uint64_t needed_bytes,
                               const std::string& what) {
  if (!memory.rdma || memory.ipc_lock || memory.limit >= needed_bytes) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "UCX over RDMA pins ", what, ": ", needed_bytes, " bytes, but RLIMIT_MEMLOCK is ",
      memory.limit, " bytes and CAP_IPC_LOCK is not in the effective set; raise the limit ",
      "(ulimit -l unlimited, or the container runtime's default memlock) or run with "
      "CAP_IPC_LOCK effective (in a container: uid 0 with only IPC_LOCK added, the chart's "
      "rdma.runAsRoot; a non-root uid never gets an added capability), or use UCX over shared "
      "memory or the gRPC transport"));
}

std::optional<int> RefuseUnlockableUcxMemory(bool allow_unprotected_tcp, uint64_t needed_bytes,
                                             const std::string& what) {
  absl::StatusOr<std::string> transports =
      UcxTransports(std::getenv("UCX_TLS"), allow_unprotected_tcp);
  if (!transports.ok()) return std::nullopt;  // RefuseUnsafeUcx names it
  const LockedMemory memory = LockedMemoryOf(*transports);
  if (!memory.rdma) return std::nullopt;
  log::Info("locked memory", {{"transports", *transports},
                              {"memlock_limit", memory.limit == UINT64_MAX
                                                    ? std::string("unlimited")
                                                    : std::to_string(memory.limit)},
                              {"cap_ipc_lock", memory.ipc_lock},
                              {"needed_bytes", needed_bytes}});
  if (absl::Status s = CheckLockedMemory(memory, needed_bytes, what); !s.ok()) {
    log::Error("cannot start", {{"error", std::string(s.message())}});
    return 2;
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create(const UcxOptions& options) {
  absl::StatusOr<std::string> transports =
      UcxTransports(std::getenv("UCX_TLS"), options.allow_unprotected_tcp);
  if (!transports.ok()) return transports.status();
  std::unique_ptr<UcxWorker> w(new UcxWorker());
  w->peer_error_handling_ = options.peer_error_handling;
  w->transports_ = *transports;
  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) {
    return UcxError("config", s);
  }
  // The list checked above replaces whatever a UCX config file says.
  if (ucs_status_t s = ucp_config_modify(config, "TLS", w->transports_.c_str()); s != UCS_OK) {
    ucp_config_release(config);
    return UcxError("config TLS", s);
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA;
  params.mt_workers_shared = 1;
  ucp_context_h context = nullptr;
  ucs_status_t status = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (status != UCS_OK) return UcxError("init", status);
  w->context_ = context;
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_MULTI;
  ucp_worker_h worker = nullptr;
  if (status = ucp_worker_create(context, &worker_params, &worker); status != UCS_OK) {
    return UcxError("worker", status);
  }
  w->worker_ = worker;
  ucp_address_t* address = nullptr;
  size_t length = 0;
  if (status = ucp_worker_get_address(worker, &address, &length); status != UCS_OK) {
    return UcxError("worker address", status);
  }
  w->address_.assign(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(worker, address);
  return w;
}

UcxWorker::~UcxWorker() {
  if (worker_ != nullptr) ucp_worker_destroy(static_cast<ucp_worker_h>(worker_));
  if (context_ != nullptr) ucp_cleanup(static_cast<ucp_context_h>(context_));
}

absl::StatusOr<std::unique_ptr<UcxMemory>> UcxWorker::Allocate(uint64_t length) {
  std::unique_ptr<UcxMemory> memory(new UcxMemory());
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.address = nullptr;
  params.length = length;
  params.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h memh = nullptr;
  std::unique_lock<std::mutex> attaching(AttachMutex());
  if (ucs_status_t s = ucp_mem_map(static_cast<ucp_context_h>(context_), &params, &memh);
      s != UCS_OK) {
    return UcxError("mem_map", s);
  }
  attaching.unlock();
  memory->context_ = context_;
  memory->memh_ = memh;
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  if (ucs_status_t s = ucp_mem_query(memh, &attr); s != UCS_OK) return UcxError("mem_query", s);
  memory->address_ = reinterpret_cast<uint64_t>(attr.address);
  memory->length_ = attr.length;
  void* rkey = nullptr;
  size_t rkey_size = 0;
  if (ucs_status_t s = ucp_rkey_pack(static_cast<ucp_context_h>(context_), memh, &rkey, &rkey_size);
      s != UCS_OK) {
    return UcxError("rkey_pack", s);
  }
  memory->packed_rkey_.assign(static_cast<const char*>(rkey), rkey_size);
  ucp_rkey_buffer_release(rkey);
  return memory;
}

UcxMemory::~UcxMemory() {
  if (memh_ != nullptr) {
    ucp_mem_unmap(static_cast<ucp_context_h>(context_), static_cast<ucp_mem_h>(memh_));
  }
}

absl::StatusOr<std::unique_ptr<UcxEndpoint>> UcxWorker::Connect(
    const std::string& remote_address) {
  std::unique_ptr<UcxEndpoint> endpoint(new UcxEndpoint());
  endpoint->worker_ = this;
  // The address came off the wire and ucp reads it without a length: copy it into a
  // zero-padded buffer, so that a truncated one is read into zeros, never past its end.
  std::string padded = remote_address;
  padded.resize(remote_address.size() + kWirePadBytes, '\0');
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  params.address = reinterpret_cast<const ucp_address_t*>(padded.data());
  if (peer_error_handling_) {
    // A dead peer fails this endpoint's requests (they complete with an error, which the
    // reader reports), and a forced close is defined behaviour.
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = [](void*, ucp_ep_h, ucs_status_t) {};
    params.err_handler.arg = nullptr;
  }
  ucp_ep_h ep = nullptr;
  std::lock_guard<std::mutex> attaching(AttachMutex());
  if (ucs_status_t s = ucp_ep_create(static_cast<ucp_worker_h>(worker_), &params, &ep);
      s != UCS_OK) {
    return UcxError("ep_create", s);
  }
  endpoint->ep_ = ep;
  return endpoint;
}

unsigned UcxWorker::Progress() {
  return ucp_worker_progress(static_cast<ucp_worker_h>(worker_));
}

absl::Status UcxWorker::Wait(void* request) {
  if (request == nullptr) return absl::OkStatus();
  if (UCS_PTR_IS_ERR(request)) return UcxError("request", UCS_PTR_STATUS(request));
  ucs_status_t status;
  while ((status = ucp_request_check_status(request)) == UCS_INPROGRESS) Progress();
  ucp_request_free(request);
  return status == UCS_OK ? absl::OkStatus() : UcxError("request", status);
}

absl::Status UcxWorker::WaitAll(std::vector<void*>& pending, Clock::time_point deadline,
                                const std::function<bool()>& stop) {
  absl::Status failed;
  const Clock::time_point spin_until = Clock::now() + std::chrono::milliseconds(10);
  while (!pending.empty()) {
    // Spin while transfers are young (shared-memory gets finish in microseconds), then back
    // off so that a stalled peer does not hold a core.
    if (Progress() == 0 && Clock::now() > spin_until) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    for (size_t i = 0; i < pending.size();) {
      const ucs_status_t status = ucp_request_check_status(pending[i]);
      if (status == UCS_INPROGRESS) {
        ++i;
        continue;
      }
      ucp_request_free(pending[i]);
      pending[i] = pending.back();
      pending.pop_back();
      if (status != UCS_OK && failed.ok()) failed = UcxError("get", status);
    }
    if (!pending.empty() && Clock::now() >= deadline) {
      return absl::DeadlineExceededError("UCX get: not complete by the transfer deadline");
    }
    if (!pending.empty() && stop && stop()) {
      return absl::CancelledError("UCX get: the transfer was abandoned");
    }
  }
  return failed;
}

UcxRemoteKey::~UcxRemoteKey() {
  if (rkey_ != nullptr) ucp_rkey_destroy(static_cast<ucp_rkey_h>(rkey_));
}

UcxEndpoint::~UcxEndpoint() { Close(); }

void UcxEndpoint::Close() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ep_ == nullptr) return;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  (void)worker_->Wait(ucp_ep_close_nbx(static_cast<ucp_ep_h>(ep_), &param));
  ep_ = nullptr;
}

absl::StatusOr<std::unique_ptr<UcxRemoteKey>> UcxEndpoint::Unpack(const std::string& packed_rkey) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ep_ == nullptr) return absl::UnavailableError("UCX endpoint: closed");
  std::unique_ptr<UcxRemoteKey> key(new UcxRemoteKey());
  std::string padded = packed_rkey;  // as for the worker address in Connect
  padded.resize(packed_rkey.size() + kWirePadBytes, '\0');
  ucp_rkey_h rkey = nullptr;
  // A shared-memory key attaches the peer's segment (a fresh mapping on every unpack); what
  // appears across the unpack is what the key may be read through (UcxRemoteKey::Local).
  std::lock_guard<std::mutex> attaching(AttachMutex());
  const std::vector<Mapping> before = SharedMappings();
  if (ucs_status_t s = ucp_ep_rkey_unpack(static_cast<ucp_ep_h>(ep_), padded.data(), &rkey);
      s != UCS_OK) {
    return UcxError("rkey_unpack", s);
  }
  key->rkey_ = rkey;
  for (const Mapping& m : SharedMappings()) {
    if (!absl::c_linear_search(before, m)) key->attached_.push_back(Readable(m));
  }
  return key;
}

absl::StatusOr<const char*> UcxRemoteKey::Local(uint64_t remote_address, uint64_t length) const {
  void* local = nullptr;
  const ucs_status_t status =
      ucp_rkey_ptr(static_cast<ucp_rkey_h>(rkey_), remote_address, &local);
  if (status == UCS_ERR_UNREACHABLE) return nullptr;  // no local view: the transport bounds gets
  if (status != UCS_OK) {
    return absl::InvalidArgumentError(absl::StrCat("source.address: ", remote_address,
                                                   " is not in the key's memory (UCX rkey_ptr: ",
                                                   ucs_status_string(status), ")"));
  }
  if (attached_.empty()) {
    return absl::InvalidArgumentError(
        "source.rkey: attaches no memory of the peer's (a transport that maps nothing, as self)");
  }
  const uint64_t begin = reinterpret_cast<uint64_t>(local);
  for (const Segment& segment : attached_) {
    // Inside [segment.begin, segment.end), compared without forming a sum that could wrap.
    if (begin >= segment.begin && begin <= segment.end && length <= segment.end - begin) {
      return static_cast<const char*>(local);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "source.address: ", length, " bytes at ", remote_address,
      " lie outside the memory the key attached (", attached_.size(), " segment(s))"));
}

absl::Status UcxEndpoint::Get(void* local, uint64_t length, uint64_t remote_address,
                              const UcxRemoteKey& rkey, std::vector<void*>& pending) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ep_ == nullptr) return absl::UnavailableError("UCX endpoint: closed");
  ucp_request_param_t param{};
  void* request = ucp_get_nbx(static_cast<ucp_ep_h>(ep_), local, length, remote_address,
                              static_cast<ucp_rkey_h>(rkey.rkey_), &param);
  if (UCS_PTR_IS_ERR(request)) return UcxError("get", UCS_PTR_STATUS(request));
  if (request != nullptr) pending.push_back(request);
  return absl::OkStatus();
}

}  // namespace baton::transfer
