// The router's routing decisions as pure functions (DESIGN section 6), so that they are tested
// on their own and RouterService only gathers their inputs: which node takes a request, and
// what a failed prefill call means for the retry.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
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
  std::string fingerprint;  // what it pairs on: its weights and format (NodeRegistry::PairingKey)
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

// Why an attempt failed in a way that another attempt may cure (DESIGN section 6). Every
// other failure is the request's own outcome, returned to the client.
enum class AttemptFailure {
  kDecodeUnreachable,       // Reserve: the decode node did not answer
  kNoDecodeForWeights,      // the admitted prefill node's weights lost their last decode node
  kTransferFailed,          // the decode node's read of the StateBlock failed
  kDecodeLostBeforeCommit,  // the prefill node could not reach the decode node, nor could the
                            // router
  kDecodeReportedLost,      // the prefill node says so, but the decode node answers the router
  kPrefillLost,             // the prefill node did not answer
  kDecodeLostMidStream,     // the decode node's stream broke: prompt + streamed tokens again
};

// The node the next attempt does without.
enum class Avoid { kNone, kDecodeNode, kPrefillNode };

// What the router does after one kind of failure.
struct RetryRule {
  AttemptFailure failure;
  Avoid avoid;
  bool mark_down;      // the avoided node is taken for down until it registers again
  int budget;          // retries of this kind per request; past it the error is the client's
  const char* reason;  // baton_retries_total{reason}; nullptr: not counted
  const char* log;     // the router's log line; nullptr: none
};

// A request makes at most this many attempts in all, whatever the budgets.
inline constexpr int kMaxAttempts = 6;

// The retry policy: one rule per AttemptFailure, consumed by the request's one retry loop
// (GenerateCall::Run).
inline constexpr RetryRule kRetryPolicy[] = {
    {AttemptFailure::kDecodeUnreachable, Avoid::kDecodeNode, true, kMaxAttempts, nullptr, nullptr},
    // A rollout drained the weights the admitted prefill node serves: another prefill node may
    // still have a partner (it is not down).
    {AttemptFailure::kNoDecodeForWeights, Avoid::kPrefillNode, false, kMaxAttempts, nullptr,
     nullptr},
    // The peer or the transport failed, not a node: the transfer again, twice at most.
    {AttemptFailure::kTransferFailed, Avoid::kNone, false, 2, "transfer_failed",
     "StateBlock transfer failed; retrying"},
    {AttemptFailure::kDecodeLostBeforeCommit, Avoid::kDecodeNode, true, kMaxAttempts, "decode_lost",
     "decode node lost before its commit; retrying on another"},
    // One prefill node's word (its baton-failed-node trailer) does not take a decode node down
    // for every request: this request does without it, the others keep it.
    {AttemptFailure::kDecodeReportedLost, Avoid::kDecodeNode, false, kMaxAttempts,
     "decode_reported_lost",
     "a prefill node reports the decode node lost, but it answers the router; retrying on "
     "another, the node stays up"},
    {AttemptFailure::kPrefillLost, Avoid::kPrefillNode, true, kMaxAttempts, "prefill_lost",
     "prefill node lost; retrying on another"},
    // Re-prefill prompt + the tokens streamed so far on another decode node, keeping s_keep
    // and the sampling step, so the client sees every token once.
    {AttemptFailure::kDecodeLostMidStream, Avoid::kDecodeNode, true, kMaxAttempts, "decode_lost",
     "decode node lost; re-prefilling prompt + tokens so far on another"},
};

const RetryRule& RetryRuleFor(AttemptFailure failure);

// What a failed PrefillNode.Prefill call means: `failed_node` is the call's baton-failed-node
// trailer ("" when absent), `decode_answered` whether the decode node answered the router's
// own call after it (the reservation's release): a prefill node's claim that the decode node
// is lost counts only when the router cannot reach it either. nullopt: the request's own
// error.
std::optional<AttemptFailure> ClassifyPrefillFailure(const grpc::Status& status,
                                                     const std::string& failed_node,
                                                     bool decode_answered);

}  // namespace baton::router
