// GEMM against PyTorch Linear weights: Y = alpha * X W^T + beta * Y. Runs on OpenBLAS, which
// uses every core.
#pragma once

#include <cstdint>

namespace baton::kernels {

struct GemmParams {
  int64_t rows = 0;          // M: rows of X and Y
  int64_t in = 0;            // K: columns of X, of W
  int64_t out = 0;           // N: rows of W, columns of Y
  const float* x = nullptr;  // [rows, in], row stride x_stride
  int64_t x_stride = 0;      // 0 means `in`
  const float* w = nullptr;  // [out, in], contiguous (Linear layout)
  float* y = nullptr;        // [rows, out], row stride y_stride
  int64_t y_stride = 0;      // 0 means `out`
  float beta = 0.0f;         // 1 adds into Y (residual connections)
};

void Gemm(const GemmParams& p);

}  // namespace baton::kernels
