#include "baton/router/node_stubs.h"

#include "baton/common/rpc.h"

namespace baton::router {
namespace {

class GrpcStubs final : public NodeStubs {
 public:
  std::shared_ptr<v1::PrefillNode::StubInterface> Prefill(const RegisteredNode& node) override {
    return v1::PrefillNode::NewStub(node.channel);
  }
  std::shared_ptr<v1::DecodeNode::StubInterface> Decode(const RegisteredNode& node) override {
    return v1::DecodeNode::NewStub(node.channel);
  }
  std::shared_ptr<v1::KvStore::StubInterface> KvStore(const RegisteredNode& node) override {
    return v1::KvStore::NewStub(node.channel);
  }
};

}  // namespace

std::string NodeStubs::FailedNode(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto failed = trailers.find(kFailedNodeKey);
  return failed == trailers.end() ? "" : std::string(failed->second.data(), failed->second.size());
}

std::shared_ptr<NodeStubs> GrpcNodeStubs() {
  return std::make_shared<GrpcStubs>();
}

}  // namespace baton::router
