#include "baton/kernels/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "vector.h"

namespace baton::kernels {
namespace {

// Up to this many rows (a decode batch), Gemm runs FewRowsGemm instead of sgemm. sgemm packs
// W into panels on every call, which for few rows costs as much memory traffic as the product
// itself; FewRowsGemm reads each row of W once from memory and uses it for every row of X
// (held in cache), so a decode step reads its weights once.
constexpr int64_t kFewRows = 32;

inline float Widen(float w) {
  return w;
}

inline float Widen(Bf16 b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Sixteen weights from memory into FP32 lanes (BF16 widened exactly: its bits become the upper
// half of each lane).
__attribute__((always_inline)) inline void LoadWeights(Vec16& v, const float* w) {
  std::memcpy(&v, w, sizeof v);
}

__attribute__((always_inline)) inline void LoadWeights(Vec16& v, const Bf16* w) {
  typedef uint16_t Half16 __attribute__((vector_size(32)));
  typedef uint32_t Word16 __attribute__((vector_size(64)));
  Half16 h;
  std::memcpy(&h, w, sizeof h);
  const Word16 bits = __builtin_convertvector(h, Word16) << 16;
  std::memcpy(&v, &bits, sizeof v);
}

// Y tile of kRows x 4 outputs at x, w (4 rows of W), y: dots over `in` in vector lanes, the
// tail past the last whole vector in scalar. Each output's sum runs in the same order whatever
// the other rows are, so a row's result does not depend on the batch it is in. Always inlined,
// so that each clone of FewRowsBlock compiles it for its own instruction set. With kPrefetch, the
// tile also asks for the next 4 rows of W (the next tile's, right after these in memory), so that
// their read from memory overlaps this tile's arithmetic.
template <int kRows, bool kPrefetch, typename W>
__attribute__((always_inline)) inline void FewRowsTile(const float* x, int64_t x_stride, const W* w,
                                                       int64_t in, float* y, int64_t y_stride,
                                                       float beta) {
  Vec16 acc[kRows * 4] = {};  // [row][output]
  int64_t k = 0;
  for (; k + 16 <= in; k += 16) {
    if constexpr (kPrefetch) {
      for (int o = 0; o < 4; ++o) __builtin_prefetch(w + (4 + o) * in + k);
    }
    Vec16 wv[4];
    for (int o = 0; o < 4; ++o) LoadWeights(wv[o], w + o * in + k);
    for (int r = 0; r < kRows; ++r) {
      Vec16 xv;
      std::memcpy(&xv, x + r * x_stride + k, sizeof(Vec16));
      for (int o = 0; o < 4; ++o) acc[r * 4 + o] += xv * wv[o];
    }
  }
  // The lane sums of all kRows x 4 accumulators, 16, 8 and 4 at a time.
  constexpr int kSums = kRows * 4;
  float sums[kSums];
  Vec16* v = acc;
  int i = 0;
  for (; i + 16 <= kSums; i += 16) SumLanesOf<16>(v + i, sums + i);
  if (i + 8 <= kSums) {
    SumLanesOf<8>(v + i, sums + i);
    i += 8;
  }
  if (i + 4 <= kSums) SumLanesOf<4>(v + i, sums + i);
  for (int r = 0; r < kRows; ++r) {
    for (int o = 0; o < 4; ++o) {
      float sum = sums[r * 4 + o];
      // Explicit fused multiply-adds: whether the compiler would fuse `sum += x * w` differs
      // between the FP32 and BF16 instantiations, and the two must agree bit for bit.
      for (int64_t t = k; t < in; ++t)
        sum = std::fma(x[r * x_stride + t], Widen(w[o * in + t]), sum);
      float& out = y[r * y_stride + o];
      out = beta == 0.0f ? sum : sum + beta * out;  // beta 0 never reads Y (BLAS semantics)
    }
  }
}

// Outputs [o_begin, o_end) of every row: 4 outputs at a time (their W rows stay in L1 while
// every row of X passes them), rows 6, then 3, then 1 at a time; the last outputs one at a
// time.
template <typename W>
BATON_VECTOR_CLONES void FewRowsBlock(const GemmParams& p, const W* weights, int64_t x_stride,
                                      int64_t y_stride, int64_t o_begin, int64_t o_end) {
  int64_t o = o_begin;
  for (; o + 4 <= o_end; o += 4) {
    const W* w = weights + o * p.in;
    // The first tile of rows prefetches the next outputs' W rows (none past the block).
    int64_t r = 0;
    if (o + 8 <= o_end) {
      if (p.rows >= 6) {
        FewRowsTile<6, true>(p.x, x_stride, w, p.in, p.y + o, y_stride, p.beta);
        r = 6;
      } else if (p.rows >= 3) {
        FewRowsTile<3, true>(p.x, x_stride, w, p.in, p.y + o, y_stride, p.beta);
        r = 3;
      } else {
        FewRowsTile<1, true>(p.x, x_stride, w, p.in, p.y + o, y_stride, p.beta);
        r = 1;
      }
    }
    for (; r + 6 <= p.rows; r += 6) {
      FewRowsTile<6, false>(p.x + r * x_stride, x_stride, w, p.in, p.y + r * y_stride + o, y_stride,
                            p.beta);
    }
    for (; r + 3 <= p.rows; r += 3) {
      FewRowsTile<3, false>(p.x + r * x_stride, x_stride, w, p.in, p.y + r * y_stride + o, y_stride,
                            p.beta);
    }
    for (; r < p.rows; ++r) {
      FewRowsTile<1, false>(p.x + r * x_stride, x_stride, w, p.in, p.y + r * y_stride + o, y_stride,
                            p.beta);
    }
  }
  for (; o < o_end; ++o) {
    const W* w = weights + o * p.in;
    for (int64_t r = 0; r < p.rows; ++r) {
      const float* x = p.x + r * x_stride;
      float sum = 0.0f;
      for (int64_t t = 0; t < p.in; ++t) sum = std::fma(x[t], Widen(w[t]), sum);
      float& out = p.y[r * y_stride + o];
      out = p.beta == 0.0f ? sum : sum + p.beta * out;
    }
  }
}

// The outputs split evenly (in blocks of 4) over the OpenMP team. (Pieces taken dynamically
// measured slower: each piece loses its last tile's prefetch and pays the scheduling.)
void FewRowsGemm(const GemmParams& p) {
  const int64_t x_stride = p.x_stride ? p.x_stride : p.in;
  const int64_t y_stride = p.y_stride ? p.y_stride : p.out;
  const int64_t blocks = (p.out + 3) / 4;
#pragma omp parallel
  {
    const int64_t team = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = std::min(p.out, 4 * (blocks * t / team));
    const int64_t end = std::min(p.out, 4 * (blocks * (t + 1) / team));
    if (begin < end) {
      if (p.w_bf16 != nullptr) {
        FewRowsBlock(p, p.w_bf16, x_stride, y_stride, begin, end);
      } else {
        FewRowsBlock(p, p.w, x_stride, y_stride, begin, end);
      }
    }
  }
}

}  // namespace

void Gemm(const GemmParams& p) {
  if (p.rows == 0 || p.out == 0) return;
  if (p.rows <= kFewRows) return FewRowsGemm(p);
  if (p.w_bf16 != nullptr) {
    // BF16 weights, many rows: the few-row kernel over slices of kFewRows rows, which widens W
    // as it reads it (sgemm would need all of W widened into FP32 first: three times the bytes,
    // on one thread). Each row's result is then the one it has alone.
    const int64_t x_stride = p.x_stride ? p.x_stride : p.in;
    const int64_t y_stride = p.y_stride ? p.y_stride : p.out;
    for (int64_t first = 0; first < p.rows; first += kFewRows) {
      GemmParams slice = p;
      slice.rows = std::min(kFewRows, p.rows - first);
      slice.x = p.x + first * x_stride;
      slice.x_stride = x_stride;
      slice.y = p.y + first * y_stride;
      slice.y_stride = y_stride;
      FewRowsGemm(slice);
    }
    return;
  }
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
    for (int64_t i = 0; i < p.in; ++i) x[r * p.in + i] = Widen(p.x[r * x_stride + i]);
  }
  for (int64_t i = 0; i < p.out * p.in; ++i) w[i] = Widen(p.w[i]);
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
