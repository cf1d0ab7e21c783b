#include "baton/transfer/grpc_regions.h"

#include <algorithm>

namespace baton::transfer {

bool WriteRegionChunks(grpc::ClientWriterInterface<v1::RegionChunk>& writer,
                       const std::string& reservation_id, v1::Region region, const void* data,
                       uint64_t bytes, uint64_t offset) {
  for (uint64_t done = 0; done < bytes; done += kGrpcRegionChunkBytes) {
    v1::RegionChunk chunk;
    chunk.set_reservation_id(reservation_id);
    chunk.set_region(region);
    chunk.set_offset(offset + done);
    chunk.set_data(static_cast<const char*>(data) + done,
                   std::min(kGrpcRegionChunkBytes, bytes - done));
    if (!writer.Write(chunk)) return false;
  }
  return true;
}

}  // namespace baton::transfer
