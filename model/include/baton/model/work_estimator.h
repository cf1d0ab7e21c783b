// The prefill work estimator (seed 9.5.1): rows and visible SWA pairs per chunk by the
// prefix-sum formula, without enumerating rows, so it is cheap enough for trace simulation.
// With a model config it also turns those counts into FLOPs.
//
// Counts are per layer of a group; every consumer layer shares one plan, so the consumer
// counts of a chunk hold for each of the D consumer layers and the producer counts for each
// of the P producer layers.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "baton/common/model_config.h"
#include "baton/model/truncation.h"

namespace baton::model {

// S(n) = m(m + 1)/2 + (n - m)W with m = min(n, W): visible (query, key) pairs of the first n
// positions of a window-W causal SWA whose source starts at position 0.
int64_t SwaPrefixPairs(int64_t n, int64_t window);

struct ChunkWork {
  int64_t q_start = 0;
  int64_t q_len = 0;               // full rows: producers, boundary norm and block KV
  int64_t consumer_begin = 0;      // first consumer row (clamp(L - K, k - q, k - 1) in compact)
  int64_t consumer_rows = 0;       // rows each consumer layer computes
  int64_t consumer_swa_pairs = 0;  // visible (query, SWA key) pairs per consumer layer
  int64_t global_pairs = 0;        // visible (query, block-KV key) pairs per consumer layer
  int64_t producer_swa_pairs = 0;  // visible pairs per producer layer (never truncated)
};

// One chunk [q_start, q_start + q_len) of the prompt described by `spec`.
ChunkWork EstimateChunkWork(const TruncationSpec& spec, int64_t q_start, int64_t q_len);

// FLOPs of matrix products and attention (2 per multiply-add); norms, RoPE and activations are
// omitted as they are lower order.
struct FlopCount {
  double producer = 0;  // all producer layers
  double consumer = 0;  // all consumer layers, block-KV projection (once per source) included
  double lm_head = 0;   // logits of the last prompt row (the sampled one)
  double total() const { return producer + consumer + lm_head; }
};

struct WorkEstimate {
  std::vector<ChunkWork> chunks;
  int64_t full_rows = 0;           // sum of q_len
  int64_t consumer_rows = 0;       // per consumer layer, summed over chunks
  int64_t consumer_swa_pairs = 0;  // per consumer layer, summed over chunks
  // Layer-rows over both groups: P * full_rows + D * consumer_rows (seed 9.5.2); set with a
  // config.
  std::optional<int64_t> layer_rows;
  std::optional<FlopCount> flops;
};

// Chunk lengths must tile [s_valid, L) (the plan builder checks that); `config` adds the
// layer-group totals and FLOPs.
WorkEstimate EstimateWork(const TruncationSpec& spec, std::span<const int64_t> chunk_lens,
                          const ModelConfig* config = nullptr);

}  // namespace baton::model
