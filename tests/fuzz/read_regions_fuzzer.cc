// The prefill node's side of the gRPC transport: PrefillNode.ReadRegions with any request,
// against a table holding one open exposure (aimed at it when the first byte is odd). Whatever
// the bytes, the answer is a status, and every chunk it streams lies inside the asked region,
// in order, and inside the range asked for.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "baton/transfer/exposure.h"

namespace {

baton::transfer::StagingPool* pool = nullptr;
baton::transfer::ExposureTable* table = nullptr;
std::string live_id;

// Checks each chunk as baton's gRPC transport would before writing it anywhere.
class CheckingWriter final : public grpc::ServerWriterInterface<baton::v1::RegionChunk> {
 public:
  CheckingWriter(const baton::v1::ReadRegionsRequest& request, uint64_t region_bytes)
      : request_(request), region_bytes_(region_bytes), next_(request.offset()) {}
  bool Write(const baton::v1::RegionChunk& chunk, grpc::WriteOptions) override {
    const uint64_t n = chunk.data().size();
    if (chunk.region() != request_.region() || chunk.offset() != next_ || n > region_bytes_ ||
        chunk.offset() > region_bytes_ - n || next_ + n > request_.offset() + request_.length()) {
      std::abort();
    }
    next_ += n;
    return true;
  }
  void SendInitialMetadata() override {}

 private:
  const baton::v1::ReadRegionsRequest& request_;
  uint64_t region_bytes_;
  uint64_t next_;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  pool = new baton::transfer::StagingPool(nullptr, 0);
  table = new baton::transfer::ExposureTable();
  baton::transfer::RegionSizes sizes{.producer_swa = 3000, .consumer_swa = 5000, .page = 4096,
                                     .pages = 3, .block_kv = 3 * 4096};
  auto exposure = baton::transfer::Exposure::Create(*pool, sizes, "", "decode");
  if (!exposure.ok()) std::abort();
  live_id = (*exposure)->id();
  table->Add(*exposure);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  baton::v1::ReadRegionsRequest request;
  if (!request.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  if (data[0] % 2 == 1) request.set_exposure_id(live_id);
  // Bound what one input may ask to stream (the real region is at most 12 KiB).
  const baton::transfer::RegionSizes sizes{.producer_swa = 3000, .consumer_swa = 5000,
                                           .page = 4096, .pages = 3, .block_kv = 3 * 4096};
  CheckingWriter writer(request, sizes.bytes(request.region()));
  (void)table->Serve("", request, writer);
  return 0;
}
