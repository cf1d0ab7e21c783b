// Token sampling on the device, one row of logits per request, with the semantics of
// model/sampling.cc's SampleToken (which the consistency test compares against):
//   - temperature <= 0: greedy, the largest logit, lowest id on ties;
//   - otherwise: order tokens by logit (descending, ties by lower id), keep the first top_k
//     (top_k <= 0: all), weight them by exp(logit / T - max / T) in double, cut to the
//     shortest prefix whose normalised mass reaches top_p (when 0 < top_p < 1), and pick the
//     first token whose cumulative weight exceeds u * total, u = the 53-bit uniform drawn from
//     SplitMix(seed ^ SplitMix(step + 1)).
// The logprob is log-softmax of the raw logits at the chosen token.
//
// The kernel never sorts: every "prefix of the order" is found by radix selection over a
// 64-bit key (orderable logit bits, then ~id), so a row costs a few passes over the vocab.
// Sums run in a different order than the CPU's sequential ones, so a draw whose u lands within
// rounding of a boundary between two tokens may pick the neighbour; otherwise the draw is the
// CPU's.
#pragma once

#include <cstdint>

#include "baton/kernels/cuda/context.h"

namespace baton::kernels::cuda {

struct SampleRowSettings {
  float temperature = 0.0f;  // <= 0: greedy
  int32_t top_k = 0;         // <= 0: no cut
  float top_p = 1.0f;        // >= 1 or <= 0: no cut
  uint64_t seed = 0;
  uint64_t step = 0;  // completion token index (0: the prefill node's first token)
};

struct SampleRowsParams {
  int64_t rows = 0;
  int64_t vocab = 0;
  const float* logits = nullptr;                // device [rows, logits_stride]
  int64_t logits_stride = 0;                    // 0 means vocab
  const SampleRowSettings* settings = nullptr;  // device [rows]
  int32_t* tokens = nullptr;                    // device [rows]
  float* logprobs = nullptr;                    // device [rows]
};

void SampleRows(Context& ctx, const SampleRowsParams& p);

}  // namespace baton::kernels::cuda
