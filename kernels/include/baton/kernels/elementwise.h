// Row-wise ops of the CED layers (DESIGN section 2): RMSNorm, RoPE, SwiGLU, embedding lookup.
#pragma once

#include <cstdint>

namespace baton::kernels {

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight. out may equal x.
struct RmsNormParams {
  int64_t rows = 0;
  int64_t dim = 0;
  const float* x = nullptr;       // [rows, dim]
  const float* weight = nullptr;  // [dim]
  float* out = nullptr;           // [rows, dim]
  float eps = 1e-6f;
};
void RmsNorm(const RmsNormParams& p);

// Hugging Face rotate_half RoPE, in place, on `heads` heads of every row:
// x' = x cos + rotate_half(x) sin, angle = position * theta^(-2k/head_dim).
struct RopeParams {
  int64_t rows = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  float* x = nullptr;                  // [rows, stride]; head h at x + r * stride + h * head_dim
  int64_t stride = 0;                  // floats between rows
  const int32_t* positions = nullptr;  // [rows]
  double theta = 10000.0;
};
void Rope(const RopeParams& p);

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i].
struct SwiGluParams {
  int64_t rows = 0;
  int64_t inter = 0;
  const float* gate_up = nullptr;  // [rows, 2 * inter]: gate columns, then up columns
  float* out = nullptr;            // [rows, inter]
};
void SwiGlu(const SwiGluParams& p);

// out[r] = table[ids[r]].
struct EmbeddingParams {
  int64_t rows = 0;
  int64_t dim = 0;
  const float* table = nullptr;  // [vocab, dim]
  const int32_t* ids = nullptr;  // [rows], each in [0, vocab)
  float* out = nullptr;          // [rows, dim]
};
void Embedding(const EmbeddingParams& p);

}  // namespace baton::kernels
