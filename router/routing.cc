#include "baton/router/routing.h"

#include <algorithm>
#include <cstdlib>

namespace baton::router {

int64_t SelectNode(std::span<const NodeLoad> nodes, v1::NodeRole role,
                   const std::vector<std::string>& exclude,
                   std::chrono::steady_clock::time_point now, std::chrono::milliseconds ttl,
                   const std::string& fingerprint) {
  int64_t best = -1;
  int64_t best_load = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const NodeLoad& node = nodes[i];
    if (node.role != role || node.draining || now - node.last_seen > ttl) continue;
    if (!fingerprint.empty() && node.fingerprint != fingerprint) continue;
    if (std::find(exclude.begin(), exclude.end(), node.id) != exclude.end()) continue;
    const int64_t load = node.inflight + node.queued;
    if (best < 0 || load < best_load ||
        (load == best_load && node.free_pages > nodes[best].free_pages)) {
      best = static_cast<int64_t>(i);
      best_load = load;
    }
  }
  return best;
}

bool NodeLost(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE;
}

const RetryRule& RetryRuleFor(AttemptFailure failure) {
  for (const RetryRule& rule : kRetryPolicy) {
    if (rule.failure == failure) return rule;
  }
  std::abort();  // kRetryPolicy has a rule for every AttemptFailure (routing_test checks)
}

std::optional<AttemptFailure> ClassifyPrefillFailure(const grpc::Status& status,
                                                     const std::string& failed_node,
                                                     bool decode_answered) {
  const bool decode_failed = failed_node == "decode";
  if (decode_failed && status.error_code() == grpc::StatusCode::ABORTED) {
    return AttemptFailure::kTransferFailed;
  }
  if (decode_failed && NodeLost(status)) {
    return decode_answered ? AttemptFailure::kDecodeReportedLost
                           : AttemptFailure::kDecodeLostBeforeCommit;
  }
  if (NodeLost(status)) return AttemptFailure::kPrefillLost;
  return std::nullopt;
}

}  // namespace baton::router
