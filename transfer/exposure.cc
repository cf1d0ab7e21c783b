#include "baton/transfer/exposure.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
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
    source.set_exposed_address(buffer_->ucx_memory->address());
    source.set_exposed_bytes(buffer_->ucx_memory->length());
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

absl::Status ExposureTable::Open(const std::string& caller, const v1::ReadRegionsRequest& request,
                                 RegionRead* read) const {
  std::shared_ptr<Exposure> exposure;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = exposures_.find(request.exposure_id());
    if (it != exposures_.end() && it->second->MayRead(caller)) exposure = it->second;
  }
  // Another reader's exposure looks exactly like a missing one.
  if (exposure == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("exposure_id: no open exposure '", request.exposure_id().substr(0, 64), "'"));
  }
  const uint64_t size = exposure->sizes().bytes(request.region());
  const uint64_t offset = request.offset(), length = request.length();
  // offset + length may wrap 64 bits, so the check never forms that sum.
  if (size == 0 || offset > size || length > size - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("read of ", length, " bytes at offset ", offset, " lies outside region ",
                     v1::Region_Name(request.region()), " of ", size, " bytes"));
  }
  *read = {.exposure = std::move(exposure),
           .region = request.region(),
           .offset = offset,
           .length = length};
  return absl::OkStatus();
}

uint64_t RegionRead::chunks() const {
  return length / kGrpcRegionChunkBytes + (length % kGrpcRegionChunkBytes != 0 ? 1 : 0);
}

grpc::ByteBuffer RegionRead::Chunk(uint64_t index) const {
  const uint64_t done = index * kGrpcRegionChunkBytes;
  const uint64_t bytes = std::min(kGrpcRegionChunkBytes, length - done);
  // Every region lies at its staging offset (Open checked the region and the range).
  const char* data = reinterpret_cast<const char*>(exposure->At(region)) + offset + done;
  // RegionChunk's wire form: region (field 2, varint), offset (3, varint), data (4, bytes).
  uint8_t header[3 + 3 * 10];  // three tags and three varints of at most 10 bytes
  uint8_t* at = header;
  using Coded = google::protobuf::io::CodedOutputStream;
  *at++ = (2 << 3) | 0;
  at = Coded::WriteVarint64ToArray(static_cast<uint64_t>(region), at);
  *at++ = (3 << 3) | 0;
  at = Coded::WriteVarint64ToArray(offset + done, at);
  *at++ = (4 << 3) | 2;
  at = Coded::WriteVarint64ToArray(bytes, at);
  // The payload slice holds a reference to the exposure until gRPC lets go of it.
  auto* keep = new std::shared_ptr<Exposure>(exposure);
  grpc::Slice slices[2] = {
      grpc::Slice(header, static_cast<size_t>(at - header)),
      grpc::Slice(const_cast<char*>(data), bytes,
                  [](void* held) { delete static_cast<std::shared_ptr<Exposure>*>(held); }, keep)};
  return grpc::ByteBuffer(slices, 2);
}

namespace {

// Streams one RegionRead, a chunk at a time.
class RegionStreamer final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  RegionStreamer(RegionRead read, const absl::Status& status) : read_(std::move(read)) {
    if (!status.ok() || read_.length == 0) {
      Finish(ToGrpcStatus(status));
      return;
    }
    Next();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(ToGrpcStatus(absl::CancelledError("the reader went away")));
      return;
    }
    Next();
  }
  void OnDone() override { delete this; }

 private:
  void Next() {
    if (next_ == read_.chunks()) {
      Finish(grpc::Status::OK);
      return;
    }
    if (read_.exposure->closed()) {
      Finish(ToGrpcStatus(absl::NotFoundError("exposure_id: closed during the read")));
      return;
    }
    chunk_ = read_.Chunk(next_++);
    StartWrite(&chunk_);
  }

  RegionRead read_;
  uint64_t next_ = 0;
  grpc::ByteBuffer chunk_;  // the write in flight
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* ExposureTable::Stream(const std::string& caller,
                                                                  const grpc::ByteBuffer& request,
                                                                  absl::Status refused) const {
  RegionRead read;
  if (!refused.ok()) return new RegionStreamer(std::move(read), std::move(refused));
  v1::ReadRegionsRequest parsed;
  // A request is four small fields: anything larger is not one.
  grpc::ByteBuffer copy(request);  // shares the slices; deserializing consumes the copy
  if (request.Length() > 1024 ||
      !grpc::SerializationTraits<v1::ReadRegionsRequest>::Deserialize(&copy, &parsed).ok()) {
    return new RegionStreamer(
        std::move(read),
        absl::InvalidArgumentError("ReadRegionsRequest: not a message of at most 1024 bytes"));
  }
  const absl::Status status = Open(caller, parsed, &read);
  return new RegionStreamer(std::move(read), status);
}

}  // namespace baton::transfer
