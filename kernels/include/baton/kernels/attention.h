// CED attention: one softmax per (query row, head) over up to two key sources (DESIGN
// section 2, seed 9.2):
//   - SWA keys at positions [lo, pos]: positions >= tail_start come from the tail (this
//     chunk's or this step's own rows), earlier ones from a ring of C slots (slot = pos % C);
//   - optionally, global block-KV keys at positions [0, pos], read through a page table.
// Producer layers pass no global source; consumer layers pass both (a position inside the
// window then contributes two keys). Which keys are visible is the plan's business: the
// kernel reads swa_lo and never decides truncation itself.
//
// Every row's position is at most the tail's last (tail_start + rows - 1), and its swa_lo at
// least tail_start - ring_capacity (earlier positions have left the ring): a chunk's rows are
// the tail, and the ring holds the C positions before it. The CUDA tensor-core prefill path
// sizes its key union from these two bounds alone.
#pragma once

#include <cstdint>
#include <span>

namespace baton::kernels {

struct SwaSource {
  const float* ring_k = nullptr;  // [ring_capacity, kv_dim]: position p at row p % C
  const float* ring_v = nullptr;  // [ring_capacity, kv_dim]
  int64_t ring_capacity = 0;      // C
  const float* tail_k = nullptr;  // position p >= tail_start at tail_k + (p - tail_start) * stride
  const float* tail_v = nullptr;
  int64_t tail_stride = 0;  // floats between tail rows
  int64_t tail_start = 0;
};

struct BlockKvSource {
  const float* const* pages = nullptr;  // page table: position p lives in pages[p / block_size]
  int64_t block_size = 0;               // B
  int64_t k_offset = 0;  // floats from a page's start to this layer's K rows [B, kv_dim]
  int64_t v_offset = 0;  // floats from a page's start to this layer's V rows [B, kv_dim]
};

struct AttentionParams {
  int64_t rows = 0;
  int64_t num_heads = 0;     // H; query head h reads kv head h / (H / Hkv)
  int64_t num_kv_heads = 0;  // Hkv
  int64_t head_dim = 0;
  float scale = 1.0f;        // 1 / sqrt(head_dim)
  const float* q = nullptr;  // [rows, q_stride], head-major within a row
  int64_t q_stride = 0;
  float* out = nullptr;                // [rows, num_heads * head_dim]
  const int32_t* positions = nullptr;  // [rows] absolute positions
  const int32_t* swa_lo = nullptr;     // [rows] first visible SWA position; row sees [lo, pos]
  SwaSource swa;
  const BlockKvSource* global = nullptr;  // consumer layers: block KV at [0, pos]
};

// Entries with many rows (prefill chunks, a hit's replayed rows) run as GEMM tiles: per (tile
// of query rows, kv head), the query heads sharing the kv head folded into one product's rows,
// keys streamed a tile at a time under a running softmax (FlashAttention's scheme); the
// others (decode steps) run every (row, kv head) of every entry in one parallel region, so that
// a decode batch of many one-row requests still uses every core, and each task reads its keys
// and values once for all the query heads that share them. Where there are fewer such pairs
// than threads (a step of one request), each pair's keys are split over several tasks and their
// softmaxes merged.
void Attention(std::span<const AttentionParams> batch);

}  // namespace baton::kernels
