// baton-kvstore's gRPC service over a PrefixStore: chain lookup in one call, per-key probes
// (a fleet's lookup: each node answers for the keys it owns), block reads as a
// stream (one block per message, so large blocks never meet a message-size limit), block
// writes as a client stream, and counters (also exposed as Prometheus metrics, read from the
// store at scrape time). A Lookup, Probe or ReadBlocks naming more than `max_keys` keys (longer
// than any chain of the model) is refused with INVALID_ARGUMENT; writes are checked by the store.
#pragma once

#include <atomic>
#include <memory>

#include "baton/kvstore/prefix_store.h"
#include "prometheus/collectable.h"
#include "baton/v1/kvstore.grpc.pb.h"

namespace baton::kvstore {

class KvStoreService final : public v1::KvStore::Service {
 public:
  KvStoreService(PrefixStore& store, uint64_t max_keys);

  grpc::Status Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                      v1::LookupResponse* reply) override;
  grpc::Status Probe(grpc::ServerContext* context, const v1::ProbeRequest* request,
                     v1::ProbeResponse* reply) override;
  grpc::Status ReadBlocks(grpc::ServerContext* context, const v1::ReadBlocksRequest* request,
                          grpc::ServerWriter<v1::StoredBlock>* writer) override;
  grpc::Status WriteBlocks(grpc::ServerContext* context, grpc::ServerReader<v1::BlockWrite>* reader,
                           v1::WriteBlocksResponse* reply) override;
  grpc::Status Stats(grpc::ServerContext* context, const v1::KvStoreStatsRequest* request,
                     v1::KvStoreStats* reply) override;

  // One write of WriteBlocks: the key, parent and region checked as wire values, then stored
  // (the store checks the payload and the chain).
  absl::Status Write(const v1::BlockWrite& write);

 private:
  // The handlers' work; each handler converts its absl::Status to gRPC's once.
  absl::Status LookupChain(const grpc::ServerContext& context, const v1::LookupRequest& request,
                           v1::LookupResponse& reply);
  absl::Status ProbeKeys(const grpc::ServerContext& context, const v1::ProbeRequest& request,
                         v1::ProbeResponse& reply);
  absl::Status SendBlocks(const grpc::ServerContext& context, const v1::ReadBlocksRequest& request,
                          grpc::ServerWriter<v1::StoredBlock>& writer);
  absl::Status TakeBlocks(const grpc::ServerContext& context,
                          grpc::ServerReader<v1::BlockWrite>& reader,
                          v1::WriteBlocksResponse& reply);

  PrefixStore& store_;
  uint64_t max_keys_;
  std::atomic<uint64_t> lookups_{0};
  std::atomic<uint64_t> lookup_blocks_{0};
  std::atomic<uint64_t> probe_keys_{0};
  std::atomic<uint64_t> probe_found_{0};
  std::shared_ptr<prometheus::Collectable> collector_;
};

}  // namespace baton::kvstore
