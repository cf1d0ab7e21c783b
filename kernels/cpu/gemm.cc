#include "baton/kernels/gemm.h"

#include <cblas.h>

#include <cstring>
#include <vector>

namespace baton::kernels {
namespace {

float FromBf16(Bf16 b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace

void Gemm(const GemmParams& p) {
  if (p.rows == 0 || p.out == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(p.rows),
              static_cast<int>(p.out), static_cast<int>(p.in), 1.0f, p.x,
              static_cast<int>(p.x_stride ? p.x_stride : p.in), p.w, static_cast<int>(p.in), p.beta,
              p.y, static_cast<int>(p.y_stride ? p.y_stride : p.out));
}

// Widens both operands to FP32 (exact) and runs sgemm: the reference for the CUDA backend's
// BF16 tensor-core GEMM, which differs from it only in summation order.
void GemmBf16(const GemmBf16Params& p) {
  if (p.rows == 0 || p.out == 0) return;
  const int64_t x_stride = p.x_stride ? p.x_stride : p.in;
  std::vector<float> x(p.rows * p.in), w(p.out * p.in);
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t i = 0; i < p.in; ++i) x[r * p.in + i] = FromBf16(p.x[r * x_stride + i]);
  }
  for (int64_t i = 0; i < p.out * p.in; ++i) w[i] = FromBf16(p.w[i]);
  Gemm({.rows = p.rows,
        .in = p.in,
        .out = p.out,
        .x = x.data(),
        .w = w.data(),
        .y = p.y,
        .y_stride = p.y_stride,
        .beta = p.beta});
}

void ToBf16(const ToBf16Params& p) {
  for (int64_t i = 0; i < p.count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &p.in[i], sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
      p.out[i] = static_cast<Bf16>((bits >> 16) | 0x0040u);  // quiet NaN, sign kept
    } else {
      p.out[i] = static_cast<Bf16>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    }
  }
}

}  // namespace baton::kernels
