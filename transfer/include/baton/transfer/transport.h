// How a StateBlock's regions move (DESIGN sections 4 and 6): by pull. The prefill node stages
// one request's regions in memory it exposes for that request only (transfer/exposure.h); the
// decode node reads them into a reservation it owns through a Transport: UCX RMA get, or
// PrefillNode.ReadRegions over gRPC. A fault-injecting Transport wraps either for tests.
//
// The contract every Transport keeps: when Read returns, nothing more is written into the
// destination, so a reservation freed after a failed or timed-out read never receives a byte.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/model/state.h"
#include "baton/transfer/state_block.h"
#include "baton/transfer/ucx.h"
#include "baton/v1/node.pb.h"

namespace baton::transfer {

using Clock = std::chrono::steady_clock;

// Bounds on the UCX fields of a RegionSource (a worker address and a packed key are a few
// hundred bytes in practice).
inline constexpr uint64_t kMaxUcxWorkerAddressBytes = 64 << 10;
inline constexpr uint64_t kMaxRkeyBytes = 64 << 10;
// The gRPC transport moves regions in chunks (messages) of at most kGrpcRegionChunkBytes, over
// streams (ReadRegions calls) of at most kGrpcReadBytes each, kGrpcReadsInFlight at once.
inline constexpr uint64_t kGrpcRegionChunkBytes = uint64_t{1} << 20;
inline constexpr uint64_t kGrpcReadBytes = uint64_t{4} << 20;
inline constexpr size_t kGrpcReadsInFlight = 4;

// One request's regions in local memory: the producer and consumer rings, the block-KV pages
// (each `sizes.page` bytes; block KV counts them back to back, the last one partial), and
// under replay-on-decode the pages that take the boundary rows (counted the same way).
struct RegionSpans {
  RegionSizes sizes;
  char* producer_swa = nullptr;
  char* consumer_swa = nullptr;
  std::vector<char*> pages;
  std::vector<char*> boundary_pages;
};

// The regions of `state`'s first `prompt_len` positions (prefill-all).
RegionSpans SpansOf(model::SequenceState& state, uint64_t prompt_len);
// The regions `sizes` gives, in `state` and (boundary rows) in `boundary_pages`.
RegionSpans SpansOf(model::SequenceState& state, const RegionSizes& sizes,
                    std::span<float* const> boundary_pages);

// Calls fn(local, bytes, offset) for the local memory of [offset, offset + length) of
// `region`, split where pages end. The caller checked that the range lies in the region.
void ForEachPiece(const RegionSpans& spans, v1::Region region, uint64_t offset, uint64_t length,
                  const std::function<void(char*, uint64_t, uint64_t)>& fn);

// Where `region` starts in a staging buffer that holds producer SWA, consumer SWA, boundary
// rows and block KV back to back (the layout of an Exposure and of a RegionSource's address).
uint64_t StagingOffset(const RegionSizes& sizes, v1::Region region);
uint64_t StagingBytes(const RegionSizes& sizes);

// The UCX fields of `source` checked before anything is read: the worker address and packed
// key within their bounds, and the staging memory it names (StagingBytes(sizes) bytes from
// source.address, sizes being the reader's own) inside what the key covers, [exposed_address,
// exposed_address + exposed_bytes), all in 64 bits without wrapping. INVALID_ARGUMENT naming
// the field otherwise. This keeps a Commit from naming anything but what it says the key
// covers; the peer's word is then checked against the key itself: under shared memory a get
// would be a plain copy from the attached segment that UCX does not bound, so the reader
// copies from the segments that unpacking the key attached, and refuses an address outside
// them by name (UcxRemoteKey::Local); under RDMA and knem the NIC or kernel checks each get
// against the key's region.
absl::Status CheckUcxSource(const v1::RegionSource& source, const RegionSizes& sizes);

// A transport's name in metrics labels and logs: "grpc" or "ucx".
const char* TransportLabel(v1::Transport transport);

class Transport {
 public:
  virtual ~Transport() = default;
  // Reads the regions `source` names (served by the prefill node at `prefill_address`) into
  // `into`, by `deadline`, giving up (CANCELLED) as soon as `stop` says so. DEADLINE_EXCEEDED
  // when they did not all arrive in time, INVALID_ARGUMENT for a source or chunk outside its
  // bounds, DATA_LOSS for a short read, UNAVAILABLE when the peer or transport failed.
  virtual absl::Status Read(const v1::RegionSource& source, const std::string& prefill_address,
                            const RegionSpans& into, Clock::time_point deadline,
                            const std::function<bool()>& stop = nullptr) = 0;
};

// UCX RMA through `worker` (which must outlive the transport): one endpoint per prefill worker,
// the request's key unpacked per read (and kept a while); a copy from the key's attached
// segment under shared memory, gets elsewhere. A read past its deadline force-closes its
// endpoint and waits for the cancelled gets before it returns.
std::unique_ptr<Transport> MakeUcxTransport(UcxWorker& worker);

// PrefillNode.ReadRegions over mutual TLS to the prefill node (its certificate's role checked).
std::unique_ptr<Transport> MakeGrpcTransport();

// Faults for a transport, each drawn per read: `drop` (probability) loses the transfer, so the
// read waits out its deadline; `delay_ms` holds every read that long first (past the deadline,
// nothing is read); `corrupt` flips one byte after a good read; `truncate` reads only the
// first half of the last non-empty region. Seeded, so a test run repeats.
struct FaultSpec {
  double drop = 0;
  double corrupt = 0;
  double truncate = 0;
  int64_t delay_ms = 0;
  uint64_t seed = 1;
};
// "drop=0.5,corrupt=1,truncate=0,delay_ms=200,seed=7"; unknown keys and out-of-range values
// are INVALID_ARGUMENT naming them.
absl::StatusOr<FaultSpec> ParseFaultSpec(const std::string& text);
std::unique_ptr<Transport> MakeFaultInjectingTransport(std::unique_ptr<Transport> inner,
                                                       const FaultSpec& spec);

}  // namespace baton::transfer
