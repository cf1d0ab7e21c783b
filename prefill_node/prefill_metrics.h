// The prefill node's Prometheus metrics, shared by the service (prefill_service.cc) and the
// calls it serves (prefill_call.cc), and the clock their times are measured with. Private to
// prefill_node/.
#pragma once

#include <chrono>

#include "baton/common/metrics.h"
#include "baton/prefill_node/prefill_service.h"

namespace baton::prefill_node {

using Clock = std::chrono::steady_clock;

inline double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

struct PrefillService::Metrics {
  prometheus::Family<prometheus::Counter>& requests = metrics::Counter(
      "baton_prefill_requests_total", "Prefill requests finished, by outcome (gRPC status name)");
  prometheus::Counter& tokens =
      metrics::Counter("baton_prefill_tokens_total", "Prompt tokens of finished prefills").Add({});
  prometheus::Histogram& seconds =
      metrics::Histogram(
          "baton_prefill_seconds",
          "Time a prefill request spent on this node, queueing and transfer included")
          .Add({}, metrics::LatencyBuckets());
  prometheus::Gauge& queue_depth =
      metrics::Gauge("baton_prefill_queue_depth", "Prefill requests waiting for the model").Add({});
  prometheus::Family<prometheus::Counter>& transfer_bytes = metrics::Counter(
      "baton_transfer_bytes_total", "StateBlock bytes moved to decode nodes, by transport");
  prometheus::Family<prometheus::Histogram>& transfer_seconds = metrics::Histogram(
      "baton_transfer_seconds", "Time to move one StateBlock and commit it, by transport");
  prometheus::Counter& loaded_blocks =
      metrics::Counter("baton_prefix_loaded_blocks_total",
                       "Blocks loaded from the prefix store instead of computed")
          .Add({});
  prometheus::Counter& written_blocks =
      metrics::Counter("baton_prefix_written_blocks_total",
                       "Blocks queued for writing back to the prefix store")
          .Add({});
  prometheus::Counter& load_failures =
      metrics::Counter("baton_prefix_load_failures_total",
                       "Prefix hits whose blocks could not be read from the store (an error, or "
                       "a block evicted since the lookup); they were computed instead")
          .Add({});
  prometheus::Counter& write_failures =
      metrics::Counter("baton_prefix_write_failures_total",
                       "Write-backs of blocks to the prefix store that failed")
          .Add({});
};

}  // namespace baton::prefill_node
