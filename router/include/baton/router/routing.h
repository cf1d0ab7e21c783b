// The router's routing decisions as pure functions (DESIGN section 6), so that they are tested
// on their own and RouterService only gathers their inputs: which node takes a request, and
// what a failed prefill call means for the retry.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "baton/v1/node.pb.h"
#include "grpcpp/grpcpp.h"

namespace baton::router {

// A registered node as selection sees it.
struct NodeLoad {
  std::string id;
  v1::NodeRole role = v1::NODE_ROLE_UNSPECIFIED;
  std::chrono::steady_clock::time_point last_seen;
  int64_t inflight = 0;     // requests this router sent there and has not finished
  uint32_t queued = 0;      // what the node last reported waiting
  uint64_t free_pages = 0;  // what the node last reported free
  bool draining = false;    // the node said it is draining: it gets nothing new
  std::string fingerprint;  // the model weights it serves
};

// The node of `role` to use: heard from within `ttl` of `now`, not draining, not in `exclude`,
// serving `fingerprint` (when not empty), with the least
// load (inflight + queued), more free pages breaking ties, then the earlier in `nodes`. The
// index in `nodes`, or -1 when none qualifies.
int64_t SelectNode(std::span<const NodeLoad> nodes, v1::NodeRole role,
                   const std::vector<std::string>& exclude,
                   std::chrono::steady_clock::time_point now, std::chrono::milliseconds ttl,
                   const std::string& fingerprint = "");

// A node that did not answer (UNAVAILABLE) is taken for lost; every other code is the
// request's own outcome.
bool NodeLost(const grpc::Status& status);

// What the router does after a failed PrefillNode.Prefill call.
enum class PrefillFailure {
  kRetryTransfer,  // the decode node's read of the StateBlock failed: the same nodes again
  kDecodeLost,     // the prefill node could not reach the decode node: another decode node
  kPrefillLost,    // the prefill node itself is gone: another prefill node
  kFinal,          // the request's own error: returned to the client
};

// `failed_node` is the call's baton-failed-node trailer ("" when absent); `transfer_retries`
// how many transfer retries the request has had (at most 2 are made).
PrefillFailure ClassifyPrefillFailure(const grpc::Status& status, const std::string& failed_node,
                                      int transfer_retries);

}  // namespace baton::router
