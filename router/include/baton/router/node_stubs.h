// Where the router's calls to its nodes go: one factory for the stubs of the prefill, decode
// and kvstore services, so that a test can put fakes (gRPC's generated mocks,
// node_mock.grpc.pb.h) in place of the nodes and drive a request through every stage in one
// process.
//
// Threading: a factory is called from many requests at once and must be safe for that; each
// stub it returns is used by one request at a time.
#pragma once

#include <memory>
#include <string>

#include "baton/router/node_registry.h"
#include "baton/v1/kvstore.grpc.pb.h"
#include "baton/v1/node.grpc.pb.h"

namespace baton::router {

class NodeStubs {
 public:
  virtual ~NodeStubs() = default;
  virtual std::shared_ptr<v1::PrefillNode::StubInterface> Prefill(const RegisteredNode& node) = 0;
  virtual std::shared_ptr<v1::DecodeNode::StubInterface> Decode(const RegisteredNode& node) = 0;
  virtual std::shared_ptr<v1::KvStore::StubInterface> KvStore(const RegisteredNode& node) = 0;
  // The node a failed call's server says is at fault: its baton-failed-node trailer
  // (common/rpc.h kFailedNodeKey), "" when none. A fake names it itself, since gRPC's test
  // peer cannot set a ClientContext's trailers.
  virtual std::string FailedNode(const grpc::ClientContext& context);
};

// Stubs over each node's registered channel (mutual TLS with the registered role).
std::shared_ptr<NodeStubs> GrpcNodeStubs();

}  // namespace baton::router
