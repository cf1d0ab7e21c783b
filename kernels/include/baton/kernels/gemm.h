// GEMM against PyTorch Linear weights: Y = X W^T + beta * Y, in FP32 (Gemm) or with BF16
// inputs and FP32 accumulation and output (GemmBf16, the usual serving precision on GPUs). The
// CPU backend runs both on OpenBLAS sgemm, which uses every core, except products of up to 32
// rows (64 where the kernels run at AVX-512: decode batches), which run on its own kernel that
// reads each row of W once and gives every row of Y the value it would have alone; the CUDA backend
// runs on cuBLAS. On the CPU, Gemm also takes W in BF16 (X and Y stay FP32), which halves the bytes
// a decode step reads.
#pragma once

#include <cstdint>

namespace baton::kernels {

// A BF16 value as its bit pattern (the upper half of an FP32), so that this header needs no
// CUDA type.
using Bf16 = uint16_t;

struct GemmParams {
  int64_t rows = 0;          // M: rows of X and Y
  int64_t in = 0;            // K: columns of X, of W
  int64_t out = 0;           // N: rows of W, columns of Y
  const float* x = nullptr;  // [rows, in], row stride x_stride
  int64_t x_stride = 0;      // 0 means `in`
  const float* w = nullptr;  // [out, in], contiguous (Linear layout)
  // CPU only: W in BF16 instead of w, same layout. Each weight is widened exactly as it is
  // read by the few-row kernel, which also takes products of more rows, 32 (AVX-512: 64) rows at a
  // time; a row's result equals that of Gemm over the widened W for that row alone.
  const Bf16* w_bf16 = nullptr;
  float* y = nullptr;    // [rows, out], row stride y_stride
  int64_t y_stride = 0;  // 0 means `out`
  float beta = 0.0f;     // 1 adds into Y (residual connections)
};

void Gemm(const GemmParams& p);

// Same shapes as GemmParams with BF16 X and W; products are exact in FP32 and summed in FP32.
struct GemmBf16Params {
  int64_t rows = 0;
  int64_t in = 0;
  int64_t out = 0;
  const Bf16* x = nullptr;  // [rows, in], row stride x_stride
  int64_t x_stride = 0;     // 0 means `in`
  const Bf16* w = nullptr;  // [out, in], contiguous
  float* y = nullptr;       // [rows, out], row stride y_stride
  int64_t y_stride = 0;     // 0 means `out`
  float beta = 0.0f;
};
void GemmBf16(const GemmBf16Params& p);

// out[i] = in[i] rounded to BF16, round to nearest even (NaN stays NaN).
struct ToBf16Params {
  int64_t count = 0;
  const float* in = nullptr;  // [count]
  Bf16* out = nullptr;        // [count]
};
void ToBf16(const ToBf16Params& p);

}  // namespace baton::kernels
