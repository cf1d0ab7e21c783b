// Row movement between the forward pass's buffers and a request's state (DESIGN sections 3
// and 4): gathering compact rows, scattering rows into ring slots (slot -1: no write, as the
// plan says) and writing block-KV rows into their pages. The CPU model does these with
// memcpy loops; the CUDA backend needs them as kernels, and both run the same params.
#pragma once

#include <cstdint>

namespace baton::kernels {

// dst[r] = src[index[r]] for r < rows; a row whose index is -1 is left untouched.
struct GatherRowsParams {
  int64_t rows = 0;
  int64_t width = 0;               // floats per row
  const float* src = nullptr;      // [*, src_stride]
  int64_t src_stride = 0;          // floats between source rows
  const int32_t* index = nullptr;  // [rows] source row of each destination row, or -1
  float* dst = nullptr;            // [rows, dst_stride]
  int64_t dst_stride = 0;
};
void GatherRows(const GatherRowsParams& p);

// dst[index[r]] = src[r] for r < rows; index -1 writes nothing (the plan's ring slot -1).
// Indices other than -1 must be distinct (the plan guarantees it for ring slots).
struct ScatterRowsParams {
  int64_t rows = 0;
  int64_t width = 0;
  const float* src = nullptr;  // [rows, src_stride]
  int64_t src_stride = 0;
  const int32_t* index = nullptr;  // [rows] destination row, or -1
  float* dst = nullptr;            // [*, dst_stride], e.g. one layer's K ring [C, kv_dim]
  int64_t dst_stride = 0;
};
void ScatterRows(const ScatterRowsParams& p);

// Block-KV write: row r, at position positions[r], goes to
// pages[p / block_size] + offset + (p % block_size) * width (StateLayout's page layout).
struct WriteBlockKvParams {
  int64_t rows = 0;
  int64_t width = 0;           // kv_dim
  const float* src = nullptr;  // [rows, src_stride]
  int64_t src_stride = 0;
  const int32_t* positions = nullptr;  // [rows]
  float* const* pages = nullptr;       // page table covering every position written
  int64_t block_size = 0;              // B
  int64_t offset = 0;                  // floats from a page's start to this layer's K or V rows
};
void WriteBlockKv(const WriteBlockKvParams& p);

}  // namespace baton::kernels
