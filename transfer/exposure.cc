#include "baton/transfer/exposure.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "baton/common/rpc.h"
#include "baton/common/security.h"

namespace baton::transfer {

absl::StatusOr<std::unique_ptr<StagingBuffer>> StagingPool::Acquire(const std::string& reader,
                                                                     uint64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if ((*it)->reader == reader && (*it)->capacity >= bytes &&
          (best == idle_.end() || (*it)->capacity < (*best)->capacity)) {
        best = it;
      }
    }
    if (best != idle_.end()) {
      std::unique_ptr<StagingBuffer> buffer = std::move(*best);
      idle_.erase(best);
      idle_bytes_ -= buffer->capacity;
      std::memset(buffer->base, 0, bytes);  // a request's state starts from zeros
      return buffer;
    }
  }
  auto buffer = std::make_unique<StagingBuffer>();
  buffer->reader = reader;
  buffer->capacity = std::max<uint64_t>(std::bit_ceil(std::max<uint64_t>(bytes, 1)), 1 << 20);
  if (worker_ != nullptr) {
    auto memory = worker_->Allocate(buffer->capacity);
    if (!memory.ok()) return memory.status();
    buffer->ucx_memory = *std::move(memory);
    buffer->base = static_cast<char*>(buffer->ucx_memory->data());
    std::memset(buffer->base, 0, bytes);  // UCX may hand back recycled memory
  } else {
    buffer->heap.reset(new float[buffer->capacity / sizeof(float)]());
    buffer->base = reinterpret_cast<char*>(buffer->heap.get());
  }
  return buffer;
}

void StagingPool::TakeDue(std::vector<std::unique_ptr<StagingBuffer>>& due) {
  const auto now = std::chrono::steady_clock::now();
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->first <= now) {
      due.push_back(std::move(it->second));
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
}

void StagingPool::ReleaseAfter(std::unique_ptr<StagingBuffer> buffer,
                               std::chrono::milliseconds hold) {
  std::vector<std::unique_ptr<StagingBuffer>> due;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    held_.emplace_back(std::chrono::steady_clock::now() + hold, std::move(buffer));
    TakeDue(due);
  }
  for (auto& b : due) Release(std::move(b));
}

size_t StagingPool::held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_.size();
}

void StagingPool::Release(std::unique_ptr<StagingBuffer> buffer) {
  std::vector<std::unique_ptr<StagingBuffer>> evicted;  // freed outside the lock
  std::vector<std::unique_ptr<StagingBuffer>> due;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TakeDue(due);
  }
  for (auto& b : due) Release(std::move(b));
  std::lock_guard<std::mutex> lock(mutex_);
  if (buffer->capacity > cache_bytes_) return;
  buffer->released = std::chrono::steady_clock::now();
  idle_bytes_ += buffer->capacity;
  idle_.push_back(std::move(buffer));
  while (idle_bytes_ > cache_bytes_) {
    auto oldest = std::min_element(idle_.begin(), idle_.end(), [](const auto& a, const auto& b) {
      return a->released < b->released;
    });
    idle_bytes_ -= (*oldest)->capacity;
    evicted.push_back(std::move(*oldest));
    idle_.erase(oldest);
  }
}

uint64_t StagingPool::idle_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_bytes_;
}

absl::StatusOr<std::shared_ptr<Exposure>> Exposure::Create(StagingPool& pool,
                                                           const RegionSizes& sizes,
                                                           std::string reader_identity,
                                                           const std::string& reader_address) {
  std::shared_ptr<Exposure> exposure(new Exposure());
  exposure->id_ = security::RandomId();
  exposure->sizes_ = sizes;
  auto buffer = pool.Acquire(reader_identity + "@" + reader_address, StagingBytes(sizes));
  if (!buffer.ok()) return buffer.status();
  exposure->reader_identity_ = std::move(reader_identity);
  exposure->pool_ = &pool;
  exposure->buffer_ = *std::move(buffer);
  exposure->base_ = exposure->buffer_->base;
  return exposure;
}

Exposure::~Exposure() {
  if (buffer_ == nullptr) return;
  if (hold_back_) {
    pool_->ReleaseAfter(std::move(buffer_), kFailedCommitHold);
  } else {
    pool_->Release(std::move(buffer_));
  }
}

float* Exposure::At(v1::Region region) const {
  return reinterpret_cast<float*>(base_ + StagingOffset(sizes_, region));
}

v1::RegionSource Exposure::Source(v1::Transport transport) const {
  v1::RegionSource source;
  source.set_transport(transport);
  source.set_exposure_id(id_);
  if (transport == v1::TRANSPORT_UCX && buffer_->ucx_memory != nullptr) {
    source.set_ucx_worker_address(pool_->worker()->address());
    source.set_rkey(buffer_->ucx_memory->packed_rkey());
    source.set_address(buffer_->ucx_memory->address());
  }
  return source;
}

bool Exposure::MayRead(const std::string& identity) const {
  return !security::Enabled() || reader_identity_.empty() || identity == reader_identity_;
}

void ExposureTable::Add(std::shared_ptr<Exposure> exposure) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string id = exposure->id();
  exposures_[id] = std::move(exposure);
}

void ExposureTable::Remove(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = exposures_.find(id);
  if (it == exposures_.end()) return;
  it->second->Close();
  exposures_.erase(it);
}

size_t ExposureTable::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exposures_.size();
}

grpc::Status ExposureTable::Serve(const std::string& caller, const v1::ReadRegionsRequest& request,
                                  grpc::ServerWriterInterface<v1::RegionChunk>& writer) const {
  std::shared_ptr<Exposure> exposure;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = exposures_.find(request.exposure_id());
    if (it != exposures_.end() && it->second->MayRead(caller)) exposure = it->second;
  }
  // Another reader's exposure looks exactly like a missing one.
  if (exposure == nullptr) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("exposure_id: no open exposure '",
                                     request.exposure_id().substr(0, 64), "'"));
  }
  const uint64_t size = exposure->sizes().bytes(request.region());
  const uint64_t offset = request.offset(), length = request.length();
  // offset + length may wrap 64 bits, so the check never forms that sum.
  if (size == 0 || offset > size || length > size - offset) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("read of ", length, " bytes at offset ", offset,
                                     " lies outside region ", v1::Region_Name(request.region()),
                                     " of ", size, " bytes"));
  }
  const char* base = reinterpret_cast<const char*>(
      request.region() == v1::REGION_PRODUCER_SWA   ? exposure->producer_swa()
      : request.region() == v1::REGION_CONSUMER_SWA ? exposure->consumer_swa()
                                                    : exposure->block_kv());
  for (uint64_t done = 0; done < length; done += kGrpcRegionChunkBytes) {
    if (exposure->closed()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "exposure_id: closed during the read");
    }
    v1::RegionChunk chunk;
    chunk.set_region(request.region());
    chunk.set_offset(offset + done);
    chunk.set_data(base + offset + done, std::min(kGrpcRegionChunkBytes, length - done));
    if (!writer.Write(chunk)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away");
    }
  }
  return grpc::Status::OK;
}

}  // namespace baton::transfer
