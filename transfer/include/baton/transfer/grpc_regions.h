// The gRPC transport of StateBlock regions (for machines without UCX, and the baseline of the
// transfer benchmark): regions travel as RegionChunk messages on DecodeNode.PushRegions.
#pragma once

#include <cstdint>
#include <string>

#include "baton/v1/node.grpc.pb.h"

namespace baton::transfer {

inline constexpr uint64_t kGrpcRegionChunkBytes = uint64_t{1} << 20;

// Streams [data, data + bytes) of `region`, starting `offset` bytes into the region, as chunks
// of at most kGrpcRegionChunkBytes. Returns false when the stream broke.
bool WriteRegionChunks(grpc::ClientWriterInterface<v1::RegionChunk>& writer,
                       const std::string& reservation_id, v1::Region region, const void* data,
                       uint64_t bytes, uint64_t offset);

}  // namespace baton::transfer
