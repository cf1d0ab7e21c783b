#include "baton/model/plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "baton/common/ced_rules.h"

namespace baton::model {
namespace {

absl::Status ValidateChunks(const TruncationSpec& spec, const std::vector<int64_t>& lens) {
  int64_t sum = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    if (lens[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("chunks: chunk ", i, " has length ", lens[i],
                                                     "; every chunk length must be >= 1"));
    }
    if (lens[i] > spec.prompt_len - sum) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunks: lengths sum past L - s_valid = ", spec.prompt_len - spec.s_valid,
          "; they must tile [s_valid, L) = [", spec.s_valid, ", ", spec.prompt_len, ")"));
    }
    sum += lens[i];
  }
  if (sum != spec.prompt_len - spec.s_valid) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunks: lengths sum to ", sum, "; they must tile [s_valid, L) = [", spec.s_valid, ", ",
        spec.prompt_len, "), i.e. sum to L - s_valid = ", spec.prompt_len - spec.s_valid));
  }
  return absl::OkStatus();
}

}  // namespace

ChunkPlan PlanChunk(const TruncationSpec& spec, int64_t q_start, int64_t q_len) {
  const int64_t capacity = spec.ring_capacity();
  const int64_t k = q_start + q_len;
  ChunkPlan chunk;
  chunk.q_start = static_cast<int32_t>(q_start);
  chunk.q_len = static_cast<int32_t>(q_len);
  if (spec.mode == TruncationMode::kCompact) {
    chunk.clip_prefix = static_cast<int32_t>(
        std::clamp<int64_t>(spec.prompt_len - spec.keep - q_start, 0, q_len - 1));
  }
  const int64_t retained_begin = spec.retained_begin();
  for (int64_t pos = q_start + chunk.clip_prefix; pos < k; ++pos) {
    // Only retained rows among the chunk's last C rows write the ring (seed listing 9.10): a
    // placeholder must not overwrite live state, and earlier rows would be overwritten anyway.
    chunk.consumer_positions.push_back(static_cast<int32_t>(pos));
    chunk.swa_lo.push_back(static_cast<int32_t>(spec.swa_lower_bound(pos)));
    chunk.consumer_slots.push_back(pos >= retained_begin ? RingSlotOfRunRow(pos, k, capacity) : -1);
  }
  for (int64_t pos = q_start; pos < k; ++pos) {
    chunk.producer_slots.push_back(RingSlotOfRunRow(pos, k, capacity));
  }
  chunk.work = EstimateChunkWork(spec, q_start, q_len);
  return chunk;
}

absl::StatusOr<std::vector<int64_t>> EvenChunks(int64_t rows, int64_t chunk_size) {
  if (chunk_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk size is ", chunk_size, "; it must be >= 1"));
  }
  std::vector<int64_t> lens;
  for (int64_t start = 0; start < rows; start += chunk_size) {
    lens.push_back(std::min(chunk_size, rows - start));
  }
  return lens;
}

absl::StatusOr<TruncationPlan> BuildTruncationPlan(const PlanRequest& request) {
  const TruncationSpec& spec = request.spec;
  if (absl::Status s = ValidateTruncationSpec(spec); !s.ok()) return s;
  std::vector<int64_t> lens = request.chunk_lens;
  if (lens.empty()) lens.push_back(spec.prompt_len - spec.s_valid);
  if (absl::Status s = ValidateChunks(spec, lens); !s.ok()) return s;

  TruncationPlan plan;
  plan.spec = spec;
  plan.ring_capacity = static_cast<int32_t>(spec.ring_capacity());
  plan.estimate = EstimateWork(spec, lens);
  int64_t q_start = spec.s_valid;
  int64_t consumer_offset = 0;
  for (int64_t q_len : lens) {
    ChunkPlan chunk = PlanChunk(spec, q_start, q_len);
    chunk.consumer_offset = static_cast<int32_t>(consumer_offset);
    consumer_offset += static_cast<int64_t>(chunk.consumer_positions.size());
    plan.chunks.push_back(std::move(chunk));
    q_start += q_len;
  }
  return plan;
}

std::string DescribePlan(const TruncationPlan& plan) {
  const TruncationSpec& spec = plan.spec;
  std::string out =
      absl::StrCat("prompt_len L=", spec.prompt_len, " keep K=", spec.keep,
                   " mode=", TruncationModeName(spec.mode), " window W=", spec.window,
                   " max_backtrack=", spec.max_backtrack, " ring_capacity C=", plan.ring_capacity,
                   " s_keep=", spec.s_keep(), " s_valid=", spec.s_valid, "\n");
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ChunkPlan& c = plan.chunks[i];
    absl::StrAppend(&out, "chunk ", i, ": rows [", c.q_start, ", ", c.q_start + c.q_len,
                    ") clip_prefix=", c.clip_prefix, " consumer_rows=", c.work.consumer_rows,
                    " swa_pairs=", c.work.consumer_swa_pairs, "\n");
    absl::StrAppend(&out, "  positions: ", absl::StrJoin(c.consumer_positions, ","), "\n");
    absl::StrAppend(&out, "  swa_lo:    ", absl::StrJoin(c.swa_lo, ","), "\n");
    absl::StrAppend(&out, "  slots:     ", absl::StrJoin(c.consumer_slots, ","), "\n");
  }
  absl::StrAppend(&out, "total: consumer_rows=", plan.total_consumer_rows(),
                  " swa_pairs=", plan.total_swa_pairs(), "\n");
  return out;
}

}  // namespace baton::model
