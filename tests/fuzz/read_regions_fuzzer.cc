// The prefill node's side of the gRPC transport: PrefillNode.ReadRegions with any request,
// against a table holding one open exposure (aimed at it when the first byte is odd). Whatever
// the bytes, the answer is a status, and every chunk it would stream is a RegionChunk message
// (its payload a slice of the staging memory) lying inside the asked region, in order, and
// inside the range asked for.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "baton/transfer/exposure.h"

namespace {

baton::transfer::StagingPool* pool = nullptr;
baton::transfer::ExposureTable* table = nullptr;
std::string live_id;

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
  baton::transfer::RegionRead read;
  if (!table->Open("", request, &read).ok()) return 0;
  // Every chunk, parsed back as the RegionChunk message it claims to be, lies inside the asked
  // region, in order, and inside the range asked for, and carries the exposed bytes.
  const uint64_t region_bytes = sizes.bytes(request.region());
  uint64_t next = request.offset();
  for (uint64_t i = 0; i < read.chunks(); ++i) {
    grpc::ByteBuffer wire = read.Chunk(i);
    baton::v1::RegionChunk chunk;
    if (!grpc::SerializationTraits<baton::v1::RegionChunk>::Deserialize(&wire, &chunk).ok()) {
      std::abort();
    }
    const uint64_t n = chunk.data().size();
    if (chunk.region() != request.region() || chunk.offset() != next || n > region_bytes ||
        chunk.offset() > region_bytes - n || next + n > request.offset() + request.length()) {
      std::abort();
    }
    next += n;
  }
  if (next != request.offset() + request.length()) std::abort();
  return 0;
}
