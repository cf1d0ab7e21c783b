// The decode node's metrics (docs/deploy.md lists them), shared by the service's files.
#pragma once

#include <array>

#include "baton/common/metrics.h"
#include "baton/decode_node/decode_service.h"

namespace baton::decode_node {

struct DecodeService::Metrics {
  prometheus::Family<prometheus::Counter>& requests = metrics::Counter(
      "baton_decode_requests_total",
      "Decode streams finished, by outcome (gRPC status name, or expired reservations)");
  prometheus::Counter& tokens =
      metrics::Counter("baton_decode_tokens_total", "Tokens sampled by decode steps").Add({});
  prometheus::Histogram& step_seconds =
      metrics::Histogram("baton_decode_step_seconds", "Time of one batched decode step")
          .Add({}, metrics::TokenLatencyBuckets());
  // A decode step's cost by its rows, fitted over the node's last steps (StepLog), for capacity
  // plans (`batonctl simulate --decode-rates step_fixed_ms=..,step_per_row_ms=..`).
  prometheus::Family<prometheus::Gauge>& step_cost = metrics::Gauge(
      "baton_decode_step_cost_ms",
      "The node's fit of a decode step's time over its last steps: a fixed part and a part per "
      "row (0 until fitted)");
  prometheus::Gauge& step_fixed_ms = step_cost.Add({{"term", "fixed"}});
  prometheus::Gauge& step_per_row_ms = step_cost.Add({{"term", "per_row"}});
  // What a replay piece adds to a step at 1,024 prompt positions, fitted over the node's last
  // steps (StepLog), for capacity plans (`batonctl simulate --decode-rates
  // replay_piece_fixed_ms=..,..`).
  prometheus::Family<prometheus::Gauge>& replay_piece_cost = metrics::Gauge(
      "baton_decode_replay_piece_cost_ms",
      "Replay-on-decode: the node's fit of what a replay piece adds to a step at a prompt of "
      "1,024 positions, a fixed part and a part per row, both in proportion to the prompt's "
      "length (0 until fitted)");
  prometheus::Gauge& replay_piece_fixed_ms = replay_piece_cost.Add({{"term", "fixed"}});
  prometheus::Gauge& replay_piece_row_ms = replay_piece_cost.Add({{"term", "per_row"}});
  // The steps' time over what the reported costs price them at, over the node's last steps
  // (StepLog), for capacity plans (`batonctl simulate --decode-rates step_stretch=..`): the
  // ratio of the sums, and quantiles of each step's ratio (step_stretch_p10..p99).
  prometheus::Gauge& step_stretch =
      metrics::Gauge("baton_decode_step_stretch",
                     "The decode steps' time over what the node's reported costs "
                     "(baton_decode_step_cost_ms, baton_decode_replay_piece_cost_ms) price them "
                     "at, over its last steps (0 until priced)")
          .Add({});
  prometheus::Family<prometheus::Gauge>& step_stretch_quantile =
      metrics::Gauge("baton_decode_step_stretch_quantile",
                     "Quantiles of each decode step's time over what the node's reported costs "
                     "price it at, over its last steps (0 until priced)");
  std::array<prometheus::Gauge*, 4> step_stretch_quantiles = {
      &step_stretch_quantile.Add({{"quantile", "0.1"}}),
      &step_stretch_quantile.Add({{"quantile", "0.5"}}),
      &step_stretch_quantile.Add({{"quantile", "0.9"}}),
      &step_stretch_quantile.Add({{"quantile", "0.99"}})};
  // Replay-on-decode's measured rate, which the router prices replay with (LoadReport).
  prometheus::Gauge& replay_ms_per_gflop =
      metrics::Gauge("baton_decode_replay_ms_per_gflop",
                     "Replay-on-decode: time from a StateBlock's commit to its first token per "
                     "GFLOP of its replay (0 until a replay is measured)")
          .Add({});
  prometheus::Histogram& batch_size =
      metrics::Histogram("baton_decode_batch_size", "Requests in one decode step")
          .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256});
  prometheus::Counter& draft_tokens =
      metrics::Counter("baton_decode_draft_tokens_total",
                       "Tokens drafted for speculative decoding and verified by decode steps")
          .Add({});
  prometheus::Counter& accepted_draft_tokens =
      metrics::Counter("baton_decode_accepted_draft_tokens_total",
                       "Drafted tokens the target accepted (each saved one decode step)")
          .Add({});
  prometheus::Histogram& tokens_per_step =
      metrics::Histogram("baton_decode_tokens_per_step",
                         "Tokens a request gained in one decode step (1 without speculation; up "
                         "to the drafted tokens plus one with it)")
          .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 3, 4, 5, 6, 8, 12, 16});
  prometheus::Histogram& acceptance_rate =
      metrics::Histogram("baton_decode_acceptance_rate",
                         "Share of a finished request's drafted tokens that the target accepted")
          .Add({}, prometheus::Histogram::BucketBoundaries{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8,
                                                           0.9, 1.0});
  prometheus::Counter& replay_rows =
      metrics::Counter("baton_decode_replay_rows_total",
                       "Boundary rows replayed through the consumer layers (replay-on-decode)")
          .Add({});
  prometheus::Family<prometheus::Counter>& pulled_bytes =
      metrics::Counter("baton_transfer_pulled_bytes_total",
                       "StateBlock bytes read from prefill nodes into reservations, by transport");
  prometheus::Family<prometheus::Histogram>& pull_seconds = metrics::Histogram(
      "baton_transfer_pull_seconds", "Time to read one StateBlock's regions, by transport");
  // Shadow verification (fidelity_shadow.h), labelled by truncation mode, keep bucket, prefix
  // hit and model fingerprint (never a tenant or prompt): each compared position's KL and
  // largest logit difference, the positions and their top-1 disagreements, the shadows by
  // outcome and their CPU time.
  prometheus::Family<prometheus::Histogram>& fidelity_kl =
      metrics::Histogram("baton_fidelity_kl",
                         "KL(untruncated || served) of each compared completion position, in nats");
  prometheus::Family<prometheus::Histogram>& fidelity_max_logit_diff = metrics::Histogram(
      "baton_fidelity_max_logit_diff",
      "Largest |logit difference| between the served and the untruncated model at each compared "
      "completion position");
  prometheus::Family<prometheus::Counter>& fidelity_positions = metrics::Counter(
      "baton_fidelity_positions_total", "Completion positions compared by shadow verification");
  prometheus::Family<prometheus::Counter>& fidelity_top1_disagreements =
      metrics::Counter("baton_fidelity_top1_disagreements_total",
                       "Compared positions whose served argmax differs from the untruncated one");
  prometheus::Family<prometheus::Counter>& fidelity_shadows = metrics::Counter(
      "baton_fidelity_shadows_total",
      "Shadow verifications by outcome: run, dropped (no spare capacity) or failed");
  prometheus::Counter& fidelity_cpu_seconds =
      metrics::Counter("baton_fidelity_shadow_cpu_seconds_total",
                       "CPU time of the shadow verifications run (their idle-priority thread)")
          .Add({});
};

}  // namespace baton::decode_node
