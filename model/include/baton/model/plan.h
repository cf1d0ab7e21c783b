// The truncation plan: host-side metadata, built once per prefill, that tells the kernels
// which consumer rows to compute, which SWA keys each row may see and which ring slot it
// writes (DESIGN section 3, seed 9.3). Kernels only execute a plan; they never re-derive it.
//
// Invariants of a plan that BuildTruncationPlan returned:
//   - chunks tile [s_valid, L) in order;
//   - each chunk's consumer positions are the contiguous range [q_start + clip_prefix, k),
//     at least one row, in increasing order; compact index = index in that vector;
//   - swa_lo[r] = spec.swa_lower_bound(position[r]) and lies in [0, position[r] + 1];
//   - consumer and producer slots are pos % C or -1, and no two rows of a chunk share a slot.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/model/truncation.h"
#include "baton/model/work_estimator.h"

namespace baton::model {

struct PlanRequest {
  TruncationSpec spec;
  // Chunk lengths tiling [s_valid, L); empty means one chunk.
  std::vector<int64_t> chunk_lens;
};

struct ChunkPlan {
  int32_t q_start = 0;
  int32_t q_len = 0;
  // Leading rows of the chunk that compact mode skips (seed listing 9.7); 0 in off and mask.
  int32_t clip_prefix = 0;
  // Index of this chunk's first consumer row among all the plan's consumer rows (cu_seqlens).
  int32_t consumer_offset = 0;
  std::vector<int32_t> consumer_positions;  // original positions; RoPE and slots follow these
  std::vector<int32_t> swa_lo;              // [consumer rows] first visible SWA key position
  std::vector<int32_t> consumer_slots;      // [consumer rows] pos % C, or -1: no ring write
  std::vector<int32_t> producer_slots;      // [q_len] pos % C for the last C rows, else -1
  ChunkWork work;                           // the estimator's counts for this chunk
};

struct TruncationPlan {
  TruncationSpec spec;
  int32_t ring_capacity = 0;  // C
  std::vector<ChunkPlan> chunks;
  WorkEstimate estimate;  // rows and pairs; no layer totals or FLOPs (no config here)

  int64_t total_consumer_rows() const { return estimate.consumer_rows; }
  int64_t total_swa_pairs() const { return estimate.consumer_swa_pairs; }
};

// Splits [s_valid, L) into chunks of `chunk_size` rows, the last one shorter.
absl::StatusOr<std::vector<int64_t>> EvenChunks(int64_t rows, int64_t chunk_size);

// Validates the request (see ValidateTruncationSpec; chunk lengths >= 1 summing to
// L - s_valid) and builds the plan.
absl::StatusOr<TruncationPlan> BuildTruncationPlan(const PlanRequest& request);

// The plan of one chunk [q_start, q_start + q_len) of `spec`'s prompt (spec valid, the chunk
// inside [s_valid, L)); consumer_offset is 0. The decode node plans each piece of a replay with
// it, the pieces' lengths being chosen step by step.
ChunkPlan PlanChunk(const TruncationSpec& spec, int64_t q_start, int64_t q_len);

// A human-readable rendering, one block per chunk, for batonctl and debugging.
std::string DescribePlan(const TruncationPlan& plan);

}  // namespace baton::model
