#include "baton/model/work_estimator.h"

#include <algorithm>

namespace baton::model {

int64_t SwaPrefixPairs(int64_t n, int64_t window) {
  const int64_t m = std::min(n, window);
  return m * (m + 1) / 2 + (n - m) * window;
}

ChunkWork EstimateChunkWork(const TruncationSpec& spec, int64_t q_start, int64_t q_len) {
  ChunkWork work;
  const int64_t k = q_start + q_len;
  work.q_start = q_start;
  work.q_len = q_len;
  work.consumer_begin = q_start;
  int64_t swa_start = spec.s_valid;
  if (spec.truncated()) {
    const int64_t cutoff = spec.prompt_len - spec.keep;
    // A chunk wholly before the retained suffix still runs its last row as a placeholder.
    if (spec.mode == TruncationMode::kCompact) {
      work.consumer_begin = std::clamp(cutoff, q_start, k - 1);
    }
    swa_start = std::max(spec.s_valid, cutoff);
  }
  work.consumer_rows = k - work.consumer_begin;
  work.consumer_swa_pairs =
      SwaPrefixPairs(std::max<int64_t>(0, k - swa_start), spec.window) -
      SwaPrefixPairs(std::max<int64_t>(0, work.consumer_begin - swa_start), spec.window);
  // Row i sees block-KV keys 0..i: sum of (i + 1) over [begin, k).
  work.global_pairs = (k * (k + 1) - work.consumer_begin * (work.consumer_begin + 1)) / 2;
  work.producer_swa_pairs = SwaPrefixPairs(k, spec.window) - SwaPrefixPairs(q_start, spec.window);
  return work;
}

WorkEstimate EstimateWork(const TruncationSpec& spec, std::span<const int64_t> chunk_lens,
                          const ModelConfig* config) {
  WorkEstimate estimate;
  int64_t q_start = spec.s_valid;
  int64_t producer_pairs = 0;
  int64_t global_pairs = 0;
  for (int64_t q_len : chunk_lens) {
    ChunkWork work = EstimateChunkWork(spec, q_start, q_len);
    estimate.full_rows += work.q_len;
    estimate.consumer_rows += work.consumer_rows;
    estimate.consumer_swa_pairs += work.consumer_swa_pairs;
    producer_pairs += work.producer_swa_pairs;
    global_pairs += work.global_pairs;
    estimate.chunks.push_back(work);
    q_start += q_len;
  }
  if (config == nullptr) return estimate;

  const double P = static_cast<double>(config->num_producer_layers());
  const double D = static_cast<double>(config->num_consumer_layers());
  const double G = static_cast<double>(config->num_block_kv_groups());
  const double d = static_cast<double>(config->hidden_size);
  const double inter = static_cast<double>(config->intermediate_size);
  const double q_dim = static_cast<double>(config->num_attention_heads * config->head_dim);
  const double kv_dim = static_cast<double>(config->num_key_value_heads * config->head_dim);
  // q, k, v and o projections plus the SwiGLU MLP of one row.
  const double row_flops = 2 * d * (q_dim + 2 * kv_dim) + 2 * q_dim * d + 6 * d * inter;
  // q.k and p.v over every query head for one visible pair.
  const double pair_flops = 4 * q_dim;
  const double block_kv_flops = 2 * d * 2 * kv_dim;

  estimate.layer_rows = config->num_producer_layers() * estimate.full_rows +
                        config->num_consumer_layers() * estimate.consumer_rows;
  FlopCount flops;
  flops.producer = P * (row_flops * static_cast<double>(estimate.full_rows) +
                        pair_flops * static_cast<double>(producer_pairs));
  // Block KV is projected once per source (G of them) and read by every consumer layer.
  flops.consumer =
      G * block_kv_flops * static_cast<double>(estimate.full_rows) +
      D * (row_flops * static_cast<double>(estimate.consumer_rows) +
           pair_flops * static_cast<double>(estimate.consumer_swa_pairs + global_pairs));
  flops.lm_head = 2 * d * static_cast<double>(config->vocab_size);
  estimate.flops = flops;
  return estimate;
}

}  // namespace baton::model
