// baton-prefill's service (DESIGN sections 4 and 6): runs a prompt through the model in
// chunks of at most `token_budget` rows, samples the first token, moves the StateBlock's
// regions into the decode node's reservation (UCX put + flush, or the gRPC stream), and
// commits them with the header and checksums.
//
// Prefills run one at a time, in arrival order: the model already uses every core, so running
// two at once would only make both slower.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "baton/model/ced_model.h"
#include "baton/transfer/ucx.h"
#include "baton/v1/node.grpc.pb.h"

namespace baton::prefill_node {

struct PrefillOptions {
  int64_t token_budget = 512;  // rows per prefill chunk
  bool use_ucx = true;
};

class PrefillService final : public v1::PrefillNode::Service {
 public:
  PrefillService(const model::CedModel& model, const PrefillOptions& options);

  grpc::Status Prefill(grpc::ServerContext* context, const v1::PrefillRequest* request,
                       v1::PrefillResponse* reply) override;

  v1::LoadReport Load() const;

 private:
  absl::Status SendUcx(const v1::Reservation& reservation, const model::SequenceState& state,
                       uint64_t block_kv_bytes);
  absl::Status SendGrpc(grpc::ServerContext* context, v1::DecodeNode::Stub& decode,
                        const std::string& request_id, const model::SequenceState& state,
                        uint64_t block_kv_bytes);
  v1::DecodeNode::Stub& DecodeStub(const std::string& address);

  const model::CedModel& model_;
  PrefillOptions options_;
  std::mutex model_mutex_;  // one prefill at a time (see file comment)
  mutable std::mutex mutex_;
  int64_t active_ = 0;
  std::unique_ptr<transfer::UcxWorker> ucx_;
  std::map<std::string, std::unique_ptr<transfer::UcxEndpoint>> endpoints_;
  std::map<std::string, std::unique_ptr<v1::DecodeNode::Stub>> decode_stubs_;
};

}  // namespace baton::prefill_node
