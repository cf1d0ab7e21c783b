// The router's request metrics (docs/operators.md, "Metrics"), shared by the client service
// and the per-request pipeline. Families live in the process's registry (common/metrics.h).
#pragma once

#include "baton/common/metrics.h"

namespace baton::router {

struct RouterMetrics {
  prometheus::Family<prometheus::Counter>& requests = metrics::Counter(
      "baton_requests_total", "Generate requests finished, by outcome (a gRPC status code name)");
  prometheus::Gauge& running =
      metrics::Gauge("baton_requests_running", "Generate requests in flight").Add({});
  prometheus::Counter& prompt_tokens =
      metrics::Counter("baton_prompt_tokens_total", "Prompt tokens of admitted requests").Add({});
  prometheus::Counter& generation_tokens =
      metrics::Counter("baton_generation_tokens_total", "Tokens streamed to clients").Add({});
  prometheus::Histogram& ttft =
      metrics::Histogram("baton_time_to_first_token_seconds",
                         "From a request's arrival to its first token leaving the router")
          .Add({}, metrics::LatencyBuckets());
  prometheus::Histogram& itl =
      metrics::Histogram("baton_inter_token_latency_seconds",
                         "Time between consecutive tokens of a request, at the router")
          .Add({}, metrics::TokenLatencyBuckets());
  prometheus::Histogram& e2e = metrics::Histogram("baton_e2e_request_latency_seconds",
                                                  "From a request's arrival to its last message")
                                   .Add({}, metrics::LatencyBuckets());
  prometheus::Counter& prefix_queries =
      metrics::Counter("baton_prefix_queries_total",
                       "Prefix-store lookups (requests whose truncation allows a hit)")
          .Add({});
  prometheus::Counter& prefix_hits =
      metrics::Counter("baton_prefix_hits_total", "Lookups that gave a hit (H > 0)").Add({});
  prometheus::Counter& cached_tokens =
      metrics::Counter("baton_prefix_cached_tokens_total",
                       "Prompt tokens served from the prefix store (H per request)")
          .Add({});
  prometheus::Counter& replayed_rows =
      metrics::Counter("baton_prefix_replayed_rows_total",
                       "Consumer rows the prefill nodes computed (replayed) per request")
          .Add({});
  prometheus::Family<prometheus::Counter>& retries = metrics::Counter(
      "baton_retries_total", "Attempts started again on another node, by the reason");
  prometheus::Family<prometheus::Counter>& tier_cached_tokens = metrics::Counter(
      "baton_prefix_tier_cached_tokens_total",
      "Prompt tokens of prefix hits by the tier they were loaded from: local (the prefill "
      "node's block cache) or store (the shared prefix store)");
  prometheus::Family<prometheus::Counter>& prefill_choices = metrics::Counter(
      "baton_router_prefill_choices_total",
      "Prefill nodes chosen, by the policy and whether the choice differed from the least "
      "loaded node (reason: least_loaded, prefix, predicted_ttft)");
  prometheus::Histogram& predicted_ttft =
      metrics::Histogram("baton_router_predicted_ttft_seconds",
                         "The predicted time to first token of the chosen prefill node")
          .Add({}, metrics::LatencyBuckets());
  prometheus::Histogram& ttft_prediction_ratio =
      metrics::Histogram("baton_router_ttft_prediction_ratio",
                         "Measured over predicted time to first token, per request")
          .Add({}, prometheus::Histogram::BucketBoundaries{0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1,
                                                           1.25, 1.5, 2.0, 4.0});
  prometheus::Counter& prefix_query_failures =
      metrics::Counter("baton_prefix_query_failures_total",
                       "Prefix-store lookups that failed or timed out (the request ran cold)")
          .Add({});
};

}  // namespace baton::router
