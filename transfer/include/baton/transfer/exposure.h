// The prefill side of a pull transfer (DESIGN sections 4 and 6): one request's staging memory,
// exposed for reading by the one decode node that holds the request's reservation, and only
// until the prefill node's commit to it returns.
//
// The memory holds producer SWA, consumer SWA and block KV back to back, in a staging buffer
// of a StagingPool. With a UCX worker the buffers are allocated and registered through UCX;
// without one they come from the heap and only the gRPC transport can read them. The prefill
// computes straight into the buffer, so nothing is copied.
//
// A buffer, and so its remote key, serves only one reader (the decode node's identity and
// address): registering memory per request and attaching it on the reader costs about ten
// times the transfer itself (bench/run_transfer_bench.sh), so buffers are kept and reused, but
// only for requests to the same decode node, which can then never read through a key anything
// but state it was sent. With `cache_bytes` 0 every buffer is registered for one request and
// unregistered after it.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/transfer/transport.h"
#include "baton/transfer/ucx.h"
#include "baton/v1/node.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace baton::transfer {

class StagingPool;

// One buffer of a StagingPool.
struct StagingBuffer {
  std::unique_ptr<UcxMemory> ucx_memory;  // when the pool has a UCX worker
  std::unique_ptr<float[]> heap;          // otherwise
  char* base = nullptr;
  uint64_t capacity = 0;
  std::string reader;  // the only reader it ever serves
  std::chrono::steady_clock::time_point released;
};

class StagingPool {
 public:
  // Buffers through `worker` (nullable: heap buffers); idle buffers kept up to `cache_bytes`.
  StagingPool(UcxWorker* worker, uint64_t cache_bytes) : worker_(worker), cache_bytes_(cache_bytes) {}
  UcxWorker* worker() const { return worker_; }
  // A zeroed buffer of at least `bytes` bytes for `reader`: an idle one of that reader, or a
  // new one (power-of-two capacity from 1 MiB, so that sizes that differ a little share).
  absl::StatusOr<std::unique_ptr<StagingBuffer>> Acquire(const std::string& reader, uint64_t bytes);
  // Keeps it for its reader's next request, evicting the least recently released idle buffers
  // past cache_bytes, or frees it.
  void Release(std::unique_ptr<StagingBuffer> buffer);
  // Releases it only after `hold` (buffers of failed commits, which a reader may still be
  // reading from for a moment).
  void ReleaseAfter(std::unique_ptr<StagingBuffer> buffer, std::chrono::milliseconds hold);
  size_t held() const;
  uint64_t idle_bytes() const;

 private:
  UcxWorker* worker_;
  uint64_t cache_bytes_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<StagingBuffer>> idle_;
  uint64_t idle_bytes_ = 0;
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::unique_ptr<StagingBuffer>>>
      held_;
  // Moves buffers whose hold has passed into `due`. Caller holds mutex_.
  void TakeDue(std::vector<std::unique_ptr<StagingBuffer>>& due);
};

// How long the buffer of a failed commit is held back: the reader stops within its poll
// interval of the commit's end, and at the latest half a second before the commit's deadline.
inline constexpr std::chrono::milliseconds kFailedCommitHold{10000};

class Exposure {
 public:
  // Staging memory for `sizes` from `pool`, for the decode node at `reader_address` whose
  // certificate identity is `reader_identity`: the only peer that may read it over gRPC (any
  // decode identity when empty, as without mutual TLS).
  static absl::StatusOr<std::shared_ptr<Exposure>> Create(StagingPool& pool,
                                                          const RegionSizes& sizes,
                                                          std::string reader_identity,
                                                          const std::string& reader_address);
  // Returns the buffer to its pool.
  ~Exposure();

  const std::string& id() const { return id_; }
  const RegionSizes& sizes() const { return sizes_; }
  float* producer_swa() const { return At(v1::REGION_PRODUCER_SWA); }
  float* consumer_swa() const { return At(v1::REGION_CONSUMER_SWA); }
  float* block_kv() const { return At(v1::REGION_BLOCK_KV); }
  float* boundary_rows() const { return At(v1::REGION_BOUNDARY_ROWS); }
  // Where `region` starts in the staging memory.
  float* At(v1::Region region) const;
  // What the decode node needs to read it by `transport`.
  v1::RegionSource Source(v1::Transport transport) const;
  // Ends gRPC reads (in flight and later); the UCX registration goes with the object.
  void Close() { closed_ = true; }
  // The commit failed: on destruction the buffer is held back for kFailedCommitHold before
  // its pool reuses or frees it.
  void HoldBack() { hold_back_ = true; }
  bool closed() const { return closed_; }
  bool MayRead(const std::string& identity) const;

 private:
  Exposure() = default;
  std::string id_;
  RegionSizes sizes_;
  std::string reader_identity_;
  StagingPool* pool_ = nullptr;
  std::unique_ptr<StagingBuffer> buffer_;
  char* base_ = nullptr;
  std::atomic<bool> closed_{false};
  bool hold_back_ = false;
};

// One checked read of an exposed region: what a ReadRegions call streams.
struct RegionRead {
  std::shared_ptr<Exposure> exposure;
  v1::Region region = v1::REGION_UNSPECIFIED;
  uint64_t offset = 0;  // into the region
  uint64_t length = 0;
  // Chunks of the read: ceil(length / kGrpcRegionChunkBytes).
  uint64_t chunks() const;
  // Chunk `index` as the wire bytes of a RegionChunk message: a few bytes of header, then a
  // slice over the staging memory itself (no copy of the payload; the slice keeps the exposure,
  // and so its memory, alive until gRPC has sent it).
  grpc::ByteBuffer Chunk(uint64_t index) const;
};

// The open exposures of a prefill node, and the server side of the gRPC transport.
class ExposureTable {
 public:
  void Add(std::shared_ptr<Exposure> exposure);
  // Closes and forgets it: from now on a read of it is NOT_FOUND.
  void Remove(const std::string& id);
  size_t size() const;

  // Checks a ReadRegions request from the peer `caller` into `read`: NOT_FOUND for an unknown,
  // closed or another reader's exposure (alike, so that ids cannot be probed); INVALID_ARGUMENT
  // for a range outside its region.
  absl::Status Open(const std::string& caller, const v1::ReadRegionsRequest& request,
                    RegionRead* read) const;
  // PrefillNode.ReadRegions (a raw callback method): parses `request`, checks it with Open and
  // streams the chunks in order, each written once the previous one is handed to the
  // transport; ends NOT_FOUND when the exposure closes meanwhile, CANCELLED when the reader
  // goes away. `refused` (when not OK) is the caller's authorization result, sent as it is.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Stream(const std::string& caller,
                                                     const grpc::ByteBuffer& request,
                                                     absl::Status refused = absl::OkStatus()) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Exposure>> exposures_;
};

}  // namespace baton::transfer
