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

// Up to FewRows() rows (a decode batch), Gemm runs FewRowsGemm instead of sgemm. sgemm packs
// W into panels on every call, which for few rows costs as much memory traffic as the product
// itself; FewRowsGemm reads each row of W once from memory and uses it for every row of X
// (held in cache), so a decode step reads its weights once. The limit is the level's: on
// 64 rows x 512 x 1536 with W in cache, the AVX-512 kernel did 267 GFLOP/s against sgemm's 187,
// so it takes batches up to 64; the AVX2 one did 149, below sgemm, so it stops at 32.
int64_t FewRows() {
  return ActiveCpuIsa() == CpuIsa::kAvx512 ? 64 : 32;
}

inline float Widen(float w) {
  return w;
}

inline float Widen(Bf16 b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// kWidth weights from memory into FP32 lanes (BF16 widened exactly: its bits become the upper
// half of each lane).
template <int kWidth>
__attribute__((always_inline)) inline void LoadWeights(NativeVec<kWidth>& v, const float* w) {
  std::memcpy(&v, w, sizeof v);
}

// The BF16 bits of kWidth weights, and the FP32 words they widen to.
template <int kWidth>
struct Bf16Lanes;
template <>
struct Bf16Lanes<16> {
  typedef uint16_t Halves __attribute__((vector_size(32)));
  typedef uint32_t Words __attribute__((vector_size(64)));
};
template <>
struct Bf16Lanes<8> {
  typedef uint16_t Halves __attribute__((vector_size(16)));
  typedef uint32_t Words __attribute__((vector_size(32)));
};
template <>
struct Bf16Lanes<4> {
  typedef uint16_t Halves __attribute__((vector_size(8)));
  typedef uint32_t Words __attribute__((vector_size(16)));
};

template <int kWidth>
__attribute__((always_inline)) inline void LoadWeights(NativeVec<kWidth>& v, const Bf16* w) {
  typename Bf16Lanes<kWidth>::Halves h;
  std::memcpy(&h, w, sizeof h);
  const typename Bf16Lanes<kWidth>::Words bits =
      __builtin_convertvector(h, typename Bf16Lanes<kWidth>::Words) << 16;
  std::memcpy(&v, &bits, sizeof v);
}

// acc[(r * kOuts + o) * stride] += x[r][at, at + kWidth) * w[o][at, at + kWidth), lane by lane.
template <int kRows, int kOuts, int kWidth, typename W>
__attribute__((always_inline)) inline void MultiplyAdd(NativeVec<kWidth>* acc, int stride,
                                                       const float* x, int64_t x_stride, const W* w,
                                                       int64_t in, int64_t at) {
  using V = NativeVec<kWidth>;
  V wv[kOuts];
#pragma GCC unroll 4
  for (int o = 0; o < kOuts; ++o) LoadWeights<kWidth>(wv[o], w + o * in + at);
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    V xv;
    std::memcpy(&xv, x + r * x_stride + at, sizeof xv);
#pragma GCC unroll 4
    for (int o = 0; o < kOuts; ++o) acc[(r * kOuts + o) * stride] += xv * wv[o];
  }
}

// Y tile of kRows x kOuts outputs at x, w (kOuts rows of W), y: dots over `in` in sixteen lane
// sums, the tail past the last whole sixteen in scalar. The sixteen lanes are held as 16 / kWidth
// native vectors of the level (kWidth floats each: 16 on AVX-512, 8 on AVX2, 4 on SSE2), since
// GCC keeps a 16-float vector that is wider than the registers in memory. Each output's sum runs
// in the same order whatever the tile's shape and width and whatever the other rows are (each
// lane in k order, then SumLanes's order, then the tail), so a row's result depends neither on
// the batch it is in nor, between levels with FMA, on the level. Always inlined, so that each
// level's variant of FewRowsBlock compiles it for its own instruction set. With kPrefetch, the
// tile also asks for the next kOuts rows of W (the next tile's, right after these in memory), so
// that their read from memory overlaps this tile's arithmetic.
template <int kRows, int kOuts, int kWidth, bool kPrefetch, typename W>
__attribute__((always_inline)) inline void FewRowsTile(const float* x, int64_t x_stride, const W* w,
                                                       int64_t in, float* y, int64_t y_stride,
                                                       float beta) {
  using V = NativeVec<kWidth>;
  constexpr int kParts = 16 / kWidth;
  V acc[kRows * kOuts * kParts] = {};  // [row][output][part]
  const int64_t whole = in / 16 * 16;
  if constexpr (kParts > 1 && kRows > 1) {
    // A part at a time over all of `in`: only kRows x kOuts accumulators live at once, so the
    // tile can be as wide as the registers allow. The W rows (kOuts x in) stay in L1 for the
    // second part; each lane still sums in k order.
#pragma GCC unroll 1
    for (int part = 0; part < kParts; ++part) {
      V live[kRows * kOuts] = {};
      for (int64_t k = 0; k < whole; k += 16) {
        if constexpr (kPrefetch) {
          if (part == 0) {
#pragma GCC unroll 4
            for (int o = 0; o < kOuts; ++o) __builtin_prefetch(w + (kOuts + o) * in + k);
          }
        }
        MultiplyAdd<kRows, kOuts, kWidth>(live, 1, x, x_stride, w, in, k + part * kWidth);
      }
#pragma GCC unroll 16
      for (int i = 0; i < kRows * kOuts; ++i) acc[i * kParts + part] = live[i];
    }
  } else {
    for (int64_t k = 0; k < whole; k += 16) {
      if constexpr (kPrefetch) {
#pragma GCC unroll 4
        for (int o = 0; o < kOuts; ++o) __builtin_prefetch(w + (kOuts + o) * in + k);
      }
#pragma GCC unroll 4
      for (int part = 0; part < kParts; ++part) {
        MultiplyAdd<kRows, kOuts, kWidth>(acc + part, kParts, x, x_stride, w, in,
                                          k + part * kWidth);
      }
    }
  }
  const int64_t k = whole;
  // The lane sums of all kRows x kOuts accumulators in SumLanes's order. Sixteen-float vectors
  // are summed 16, 8 and 4 at a time, the rest one by one (each bit-equal to SumLanes); narrower
  // ones add their parts into SumLanes's halves in registers, never through a sixteen-float
  // value.
  constexpr int kSums = kRows * kOuts;
  float sums[kSums];
  if constexpr (kWidth == 16) {
    Vec16* v = acc;
    int i = 0;
    for (; i + 16 <= kSums; i += 16) SumLanesOf<16>(v + i, sums + i);
    if (i + 8 <= kSums) {
      SumLanesOf<8>(v + i, sums + i);
      i += 8;
    }
    if (i + 4 <= kSums) {
      SumLanesOf<4>(v + i, sums + i);
      i += 4;
    }
    for (; i < kSums; ++i) sums[i] = SumLanes(v[i]);
  } else {
    typedef float Vec4 __attribute__((vector_size(16)));
#pragma GCC unroll 16
    for (int i = 0; i < kSums; ++i) {
      const V* parts = acc + i * kParts;
      Vec4 h4;
      if constexpr (kWidth == 8) {
        const V h8 = parts[0] + parts[1];  // lanes 0-7 plus lanes 8-15
        h4 = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) +
             __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
      } else {
        // h8 is (lanes 0-3 + lanes 8-11, lanes 4-7 + lanes 12-15).
        h4 = (parts[0] + parts[2]) + (parts[1] + parts[3]);
      }
      sums[i] = (h4[0] + h4[2]) + (h4[1] + h4[3]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int o = 0; o < kOuts; ++o) {
      float sum = sums[r * kOuts + o];
      // Explicit fused multiply-adds: whether the compiler would fuse `sum += x * w` differs
      // between the FP32 and BF16 instantiations, and the two must agree bit for bit.
      for (int64_t t = k; t < in; ++t)
        sum = std::fma(x[r * x_stride + t], Widen(w[o * in + t]), sum);
      float& out = y[r * y_stride + o];
      out = beta == 0.0f ? sum : sum + beta * out;  // beta 0 never reads Y (BLAS semantics)
    }
  }
}

// The tile shapes of each level: kOuts outputs at a time (their W rows stay in L1 while every
// row of X passes them), rows kBig, then kMid, then 1 at a time, in native vectors of kWidth
// floats. AVX-512 (32 registers of 16 floats) holds 6 x 4 accumulators, the 4 weight vectors and
// a row of X (29 registers). AVX2 (16 registers of 8 floats) runs its tiles of several rows one
// half of the sixteen lanes at a time: 3 x 4 accumulators and the 4 weight vectors (16, X read
// as memory operands); of the shapes that fit, this one did the most GFLOP/s on 32 rows x 1024
// x 4096 on an AMD EPYC (Zen 4): 172 against 152 for 3 x 3 and 100 for 4 x 2. SSE2 (16
// registers of 4 floats) holds 1 x 2 x 4 accumulators, 2 weight vectors and one of X (11).
template <CpuIsa kIsa>
struct FewRowsShape;
template <>
struct FewRowsShape<CpuIsa::kAvx512> {
  static constexpr int kOuts = 4, kBig = 6, kMid = 3, kWidth = 16;
};
template <>
struct FewRowsShape<CpuIsa::kAvx2> {
  static constexpr int kOuts = 4, kBig = 3, kMid = 2, kWidth = 8;
};
template <>
struct FewRowsShape<CpuIsa::kBaseline> {
  static constexpr int kOuts = 2, kBig = 1, kMid = 1, kWidth = 4;
};

// Outputs [o_begin, o_end) of every row, in the level's tiles; the last outputs one at a time.
struct FewRowsBlock {
  template <CpuIsa kIsa, typename W>
  __attribute__((always_inline)) static void Run(const GemmParams& p, const W* weights,
                                                 int64_t x_stride, int64_t y_stride,
                                                 int64_t o_begin, int64_t o_end) {
    using Shape = FewRowsShape<kIsa>;
    constexpr int kOuts = Shape::kOuts, kBig = Shape::kBig, kMid = Shape::kMid;
    constexpr int kWidth = Shape::kWidth;
    int64_t o = o_begin;
    for (; o + kOuts <= o_end; o += kOuts) {
      const W* w = weights + o * p.in;
      // The first tile of rows prefetches the next outputs' W rows (none past the block).
      int64_t r = 0;
      if (o + 2 * kOuts <= o_end) {
        if (p.rows >= kBig) {
          FewRowsTile<kBig, kOuts, kWidth, true>(p.x, x_stride, w, p.in, p.y + o, y_stride, p.beta);
          r = kBig;
        } else if (p.rows >= kMid) {
          FewRowsTile<kMid, kOuts, kWidth, true>(p.x, x_stride, w, p.in, p.y + o, y_stride, p.beta);
          r = kMid;
        } else {
          FewRowsTile<1, kOuts, kWidth, true>(p.x, x_stride, w, p.in, p.y + o, y_stride, p.beta);
          r = 1;
        }
      }
      for (; r + kBig <= p.rows; r += kBig) {
        FewRowsTile<kBig, kOuts, kWidth, false>(p.x + r * x_stride, x_stride, w, p.in,
                                                p.y + r * y_stride + o, y_stride, p.beta);
      }
      for (; r + kMid <= p.rows; r += kMid) {
        FewRowsTile<kMid, kOuts, kWidth, false>(p.x + r * x_stride, x_stride, w, p.in,
                                                p.y + r * y_stride + o, y_stride, p.beta);
      }
      for (; r < p.rows; ++r) {
        FewRowsTile<1, kOuts, kWidth, false>(p.x + r * x_stride, x_stride, w, p.in,
                                             p.y + r * y_stride + o, y_stride, p.beta);
      }
    }
    // One output at a time, in the tiles' order of summation.
    for (; o < o_end; ++o) {
      const W* w = weights + o * p.in;
      for (int64_t r = 0; r < p.rows; ++r) {
        FewRowsTile<1, 1, kWidth, false>(p.x + r * x_stride, x_stride, w, p.in,
                                         p.y + r * y_stride + o, y_stride, p.beta);
      }
    }
  }
};

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
        RunAtActiveIsa<FewRowsBlock>(p, p.w_bf16, x_stride, y_stride, begin, end);
      } else {
        RunAtActiveIsa<FewRowsBlock>(p, p.w, x_stride, y_stride, begin, end);
      }
    }
  }
}

}  // namespace

void Gemm(const GemmParams& p) {
  if (p.rows == 0 || p.out == 0) return;
  const int64_t few_rows = FewRows();
  if (p.rows <= few_rows) return FewRowsGemm(p);
  if (p.w_bf16 != nullptr) {
    // BF16 weights, many rows: the few-row kernel over slices of FewRows() rows, which widens W
    // as it reads it (sgemm would need all of W widened into FP32 first: three times the bytes,
    // on one thread). Each row's result is then the one it has alone.
    const int64_t x_stride = p.x_stride ? p.x_stride : p.in;
    const int64_t y_stride = p.y_stride ? p.y_stride : p.out;
    for (int64_t first = 0; first < p.rows; first += few_rows) {
      GemmParams slice = p;
      slice.rows = std::min(few_rows, p.rows - first);
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
