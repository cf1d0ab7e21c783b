#include "baton/kernels/gemm.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "baton/kernels/cpu_team.h"
#include "vector.h"

// Vectors pass between always-inlined functions only, never across a call, so the ABI note GCC
// gives for vector values of a level the file is not compiled for does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace baton::kernels {
namespace {

constexpr int64_t kPanel = kPanelOutputs;

inline float Widen(Bf16 b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

Bf16 RoundToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<Bf16>((bits >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  return static_cast<Bf16>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Panel `panel` of the packed matrix holds W's rows from source_row(panel) on (16 of them, zero
// past `out`). Panels over the thread team, which is the one that computes later (one team
// per process, whatever thread loads the model).
template <typename T, typename Convert, typename SourceRow>
void Pack(const PackWeightsParams& p, T* panels, Convert convert, SourceRow source_row) {
  const int64_t count = (p.out + kPanel - 1) / kPanel;
  ParallelForRanges(count, [&](int64_t begin, int64_t end) {
    for (int64_t panel = begin; panel < end; ++panel) {
      T* to = panels + panel * kPanel * p.in;
      const int64_t first = source_row(panel);
      for (int64_t lane = 0; lane < kPanel; ++lane) {
        const int64_t o = first + lane;
        for (int64_t k = 0; k < p.in; ++k) {
          to[k * kPanel + lane] = o < p.out ? convert(p.w[o * p.in + k]) : convert(0.0f);
        }
      }
    }
  });
}

int64_t InOrder(int64_t panel) {
  return panel * kPanel;
}

// PackSwiGluWeights's order: gate panel i, then up panel i (up rows start at out / 2).
template <typename T, typename Convert>
void PackSwiGlu(const PackWeightsParams& p, T* panels, Convert convert) {
  const int64_t inter = p.out / 2;
  Pack(p, panels, convert,
       [inter](int64_t panel) { return (panel % 2) * inter + (panel / 2) * kPanel; });
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

// Four BF16 values as the FP32 bits they widen to: each interleaved with a zero half below it
// (one punpcklwd on SSE2, which has no zero-extending load; a conversion and a shift would take
// GCC several unpacks and shifts per vector). Any width: the generic conversion and shift.
template <typename Halves>
__attribute__((always_inline)) inline auto WidenBy16(Halves h) {
  typedef uint32_t Words __attribute__((vector_size(2 * sizeof(Halves))));
  if constexpr (sizeof(Halves) == 8) {
    typedef uint16_t Shorts8 __attribute__((vector_size(16)));
    Shorts8 low{};
    std::memcpy(&low, &h, sizeof h);
    const Shorts8 pairs = __builtin_shufflevector(Shorts8{}, low, 0, 8, 1, 9, 2, 10, 3, 11);
    Words bits;
    std::memcpy(&bits, &pairs, sizeof bits);
    return bits;
  } else {
    return __builtin_convertvector(h, Words) << 16;
  }
}

template <int kWidth>
__attribute__((always_inline)) inline void LoadWeights(NativeVec<kWidth>& v, const Bf16* w) {
  typename Bf16Lanes<kWidth>::Halves h;
  std::memcpy(&h, w, sizeof h);
  typename Bf16Lanes<kWidth>::Words bits;
#if BATON_ISA_VARIANTS
  // One zero-extending load (vpmovzxwd) where the level has it: GCC 12 splits the generic
  // conversion below into halves and reassembles them, three more instructions per vector.
  typedef short Shorts8 __attribute__((vector_size(16)));
  typedef short Shorts16 __attribute__((vector_size(32)));
  typedef int Ints16 __attribute__((vector_size(64)));
  if constexpr (kWidth == 16) {
    bits = reinterpret_cast<typename Bf16Lanes<16>::Words>(__builtin_ia32_pmovzxwd512_mask(
               reinterpret_cast<Shorts16>(h), Ints16{}, static_cast<uint16_t>(0xffff)))
           << 16;
  } else if constexpr (kWidth == 8) {
    bits = reinterpret_cast<typename Bf16Lanes<8>::Words>(
               __builtin_ia32_pmovzxwd256(reinterpret_cast<Shorts8>(h)))
           << 16;
  } else {
    bits = WidenBy16(h);
  }
#else
  bits = WidenBy16(h);
#endif
  std::memcpy(&v, &bits, sizeof v);
}

// Y tile of kRows rows x kPanels panels: acc[r][lane] += x[r][k] * w[k][lane] for k in order, one
// vector of kWidth lanes (the level's register) at a time. No sum across lanes is ever taken, so
// each output is one chain of multiply-adds in k order whatever the tile's shape or width: a
// row's result depends neither on the rows beside it nor, between levels with FMA, on the level.
// `outs` is how many of the tile's outputs exist (the last panel of W may be partial). Always
// inlined, so that each level's variant compiles it for its own instruction set.
// What a tile asks for ahead of its loads while it streams panels from memory (the first tile of
// rows over them): nothing, the next tile's panels (kNextPanels, kNextAhead inputs on: more
// streams in flight where the tile reads few), or its own panels kAheadBytes on.
enum class Prefetch { kNone, kNextPanels, kAhead };
constexpr int64_t kNextAhead = 8;
constexpr int64_t kAheadBytes = 2048;

template <int kRows, int kPanels, int kWidth, Prefetch kPrefetch, typename W>
__attribute__((always_inline)) inline void PanelTile(const float* x, int64_t x_stride, const W* w,
                                                     int64_t in, float* y, int64_t y_stride,
                                                     int64_t outs, float beta) {
  using V = NativeVec<kWidth>;
  constexpr int kParts = kPanel / kWidth;
  constexpr int kVecs = kPanels * kParts;
  const int64_t panel_size = kPanel * in;
  V acc[kRows][kVecs] = {};
  for (int64_t k = 0; k < in; ++k) {
    if constexpr (kPrefetch == Prefetch::kNextPanels) {
#pragma GCC unroll 4
      for (int i = 0; i < kPanels; ++i) {
        __builtin_prefetch(w + (kPanels + i) * panel_size + (k + kNextAhead) * kPanel);
      }
    } else if constexpr (kPrefetch == Prefetch::kAhead) {
      constexpr int64_t kAhead = kAheadBytes / (kPanel * sizeof(W));
#pragma GCC unroll 4
      for (int i = 0; i < kPanels; ++i)
        __builtin_prefetch(w + i * panel_size + (k + kAhead) * kPanel);
    }
    V wv[kVecs];
#pragma GCC unroll 16
    for (int i = 0; i < kVecs; ++i) {
      LoadWeights<kWidth>(wv[i],
                          w + (i / kParts) * panel_size + k * kPanel + (i % kParts) * kWidth);
    }
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      // A scalar times a vector: x broadcast (never V{} + x, which would add 0 first).
      const float xr = x[r * x_stride + k];
#pragma GCC unroll 16
      for (int i = 0; i < kVecs; ++i) acc[r][i] += xr * wv[i];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 16
    for (int i = 0; i < kVecs; ++i) {
      const int64_t o = (i / kParts) * kPanel + (i % kParts) * kWidth;
      float* out = y + r * y_stride + o;
      const int64_t count = std::min<int64_t>(kWidth, outs - o);
      if (count == kWidth) {
        V sum = acc[r][i];
        if (beta != 0.0f) {  // beta 0 never reads Y (BLAS semantics)
          V old;
          std::memcpy(&old, out, sizeof old);
          sum = sum + beta * old;
        }
        std::memcpy(out, &sum, sizeof sum);
      } else {
        for (int64_t l = 0; l < count; ++l) {
          out[l] = beta == 0.0f ? acc[r][i][l] : acc[r][i][l] + beta * out[l];
        }
      }
    }
  }
}

// The tile shapes of each level: kRows rows by kPanels panels of 16 outputs, in native vectors of
// kWidth floats, the accumulators, the weight vectors of one input and a broadcast of X within
// the level's registers. AVX-512 (32 registers of 16 floats): 6 x 4 accumulators, 4 weight
// vectors and X (29). AVX2 (16 registers of 8 floats): a panel is two registers, so 6 rows x 1
// panel (12), 2 weight vectors and X (15); a block of at most kFewRows rows (decode at small
// batches) takes kFewRowPanels panels at a time instead, so that more multiply-add chains run at
// once. SSE2 (16 registers of 4 floats): 2 rows x 1 panel (8), 4 weight vectors and X (13).
// kFewPrefetch and kPrefetch say what the first tile of rows over a group of panels asks for
// ahead (Prefetch). Measured on the GEMMs of a decode step of the small preset at 1 to 32 rows on
// an AMD EPYC (Zen 5): AVX2's tiles, which stream one or two panels, read 1.2 to 1.7x as fast
// asking for the next panels; AVX-512's, which stream four, gain up to 1.1x asking for their own
// 2 KiB ahead and nothing from the next panels.
template <CpuIsa kIsa>
struct PanelShape;
template <>
struct PanelShape<CpuIsa::kAvx512> {
  static constexpr int kWidth = 16, kRows = 6, kPanels = 4, kFewRows = 6, kFewRowPanels = 4;
  static constexpr Prefetch kFewPrefetch = Prefetch::kAhead, kPrefetch = Prefetch::kAhead;
};
template <>
struct PanelShape<CpuIsa::kAvx2> {
  static constexpr int kWidth = 8, kRows = 6, kPanels = 1, kFewRows = 2, kFewRowPanels = 2;
  static constexpr Prefetch kFewPrefetch = Prefetch::kNextPanels, kPrefetch = Prefetch::kNextPanels;
};
template <>
struct PanelShape<CpuIsa::kBaseline> {
  static constexpr int kWidth = 4, kRows = 2, kPanels = 1, kFewRows = 1, kFewRowPanels = 1;
  static constexpr Prefetch kFewPrefetch = Prefetch::kNone, kPrefetch = Prefetch::kNone;
};

// Rows of X whose tiles pass over the same panels before the next panels are read: the block's
// X (96 rows of up to 1536 inputs, 576 KiB) stays in L2 while the panels stream past it.
constexpr int64_t kRowBlock = 96;

// kPanels panels for `rows` rows (at most kRows), compiled with that row count.
template <int kPanels, int kWidth, int kMaxRows, Prefetch kPrefetch, typename W>
__attribute__((always_inline)) inline void TileOfRows(int64_t rows, const float* x,
                                                      int64_t x_stride, const W* w, int64_t in,
                                                      float* y, int64_t y_stride, int64_t outs,
                                                      float beta) {
  if constexpr (kMaxRows >= 1) {
    if (rows == kMaxRows) {
      return PanelTile<kMaxRows, kPanels, kWidth, kPrefetch>(x, x_stride, w, in, y, y_stride, outs,
                                                             beta);
    }
    TileOfRows<kPanels, kWidth, kMaxRows - 1, kPrefetch>(rows, x, x_stride, w, in, y, y_stride,
                                                         outs, beta);
  }
}

// A tile of `rows` rows, asking for kAsk when it is the first over its panels (with kNextPanels,
// only while the next panels are this thread's); levels that ask for nothing compile one tile.
template <int kPanels, int kWidth, int kMaxRows, Prefetch kAsk, typename W>
__attribute__((always_inline)) inline void RowTile(bool first, bool next_ours, int64_t rows,
                                                   const float* x, int64_t x_stride, const W* w,
                                                   int64_t in, float* y, int64_t y_stride,
                                                   int64_t outs, float beta) {
  if constexpr (kAsk != Prefetch::kNone) {
    if (first && (kAsk != Prefetch::kNextPanels || next_ours)) {
      return TileOfRows<kPanels, kWidth, kMaxRows, kAsk>(rows, x, x_stride, w, in, y, y_stride,
                                                         outs, beta);
    }
  }
  TileOfRows<kPanels, kWidth, kMaxRows, Prefetch::kNone>(rows, x, x_stride, w, in, y, y_stride,
                                                         outs, beta);
}

// act[r, 16j + l] = silu(g) * up for rows [r0, r1) of the panel pair j (gate panel 2j and up
// panel 2j + 1 of Y), as SwiGlu computes it, a register at a time.
template <int kWidth>
__attribute__((always_inline)) inline void SwiGluOfPair(const GemmParams& p, int64_t y_stride,
                                                        int64_t r0, int64_t r1, int64_t pair) {
  using V = NativeVec<kWidth>;
  const int64_t inter = p.out / 2;
  for (int64_t r = r0; r < r1; ++r) {
    const float* gate = p.y + r * y_stride + 2 * pair * kPanel;
    float* act = p.swiglu + r * inter + pair * kPanel;
#pragma GCC unroll 4
    for (int64_t l = 0; l < kPanel; l += kWidth) {
      V g, u;
      std::memcpy(&g, gate + l, sizeof g);
      std::memcpy(&u, gate + kPanel + l, sizeof u);
      V e = -g;
      ExpOf<kWidth>(e);
      const V y = g / (1.0f + e) * u;
      std::memcpy(act + l, &y, sizeof y);
    }
  }
}

// Panels [p_begin, p_end) of every row, in the level's tiles (with swiglu, p_begin is even and
// each pair of panels is turned into its SwiGLU outputs as soon as both are computed).
struct PanelBlock {
  template <CpuIsa kIsa, typename W>
  __attribute__((always_inline)) static void Run(const GemmParams& p, const W* panels,
                                                 int64_t x_stride, int64_t y_stride,
                                                 int64_t p_begin, int64_t p_end) {
    using Shape = PanelShape<kIsa>;
    constexpr int kWidth = Shape::kWidth, kRows = Shape::kRows;
    for (int64_t r0 = 0; r0 < p.rows; r0 += kRowBlock) {
      const int64_t r1 = std::min(p.rows, r0 + kRowBlock);
      const bool few = r1 - r0 <= Shape::kFewRows;
      const int64_t step = few ? Shape::kFewRowPanels : Shape::kPanels;
      int64_t swiglu_done = p_begin;  // panels below this have their SwiGLU outputs
      for (int64_t q = p_begin; q < p_end;) {
        const bool whole = q + step <= p_end;
        const W* w = panels + q * kPanel * p.in;
        const int64_t outs = std::min(p.out - q * kPanel, (whole ? step : 1) * kPanel);
        for (int64_t r = r0; r < r1; r += kRows) {
          const int64_t n = std::min<int64_t>(kRows, r1 - r);
          const float* x = p.x + r * x_stride;
          float* y = p.y + r * y_stride + q * kPanel;
          // The first tile of rows streams the panels from memory and asks for what the level
          // asks for (the next panels only while they are this thread's).
          const bool first = r == r0, next_ours = q + 2 * step <= p_end;
          if (!whole) {
            TileOfRows<1, kWidth, kRows, Prefetch::kNone>(n, x, x_stride, w, p.in, y, y_stride,
                                                          outs, p.beta);
          } else if (few) {
            RowTile<Shape::kFewRowPanels, kWidth, Shape::kFewRows, Shape::kFewPrefetch>(
                first, next_ours, n, x, x_stride, w, p.in, y, y_stride, outs, p.beta);
          } else {
            RowTile<Shape::kPanels, kWidth, kRows, Shape::kPrefetch>(
                first, next_ours, n, x, x_stride, w, p.in, y, y_stride, outs, p.beta);
          }
        }
        q += whole ? step : 1;
        if (p.swiglu != nullptr) {
          for (; swiglu_done + 2 <= q; swiglu_done += 2) {
            SwiGluOfPair<kWidth>(p, y_stride, r0, r1, swiglu_done / 2);
          }
        }
      }
    }
  }
};

// The panels split evenly over the thread team; each thread runs every row over its panels.
template <typename W>
void PackedGemm(const GemmParams& p, const W* panels) {
  const int64_t x_stride = p.x_stride ? p.x_stride : p.in;
  const int64_t y_stride = p.y_stride ? p.y_stride : p.out;
  // With swiglu, in pairs of panels (a gate panel and its up panel).
  const int64_t unit = p.swiglu != nullptr ? 2 : 1;
  const int64_t count = (p.out + kPanel * unit - 1) / (kPanel * unit);
  ParallelForRanges(count, [&](int64_t begin, int64_t end) {
    RunAtActiveIsa<PanelBlock>(p, panels, x_stride, y_stride, unit * begin, unit * end);
  });
}

}  // namespace

void PackWeights(const PackWeightsParams& p, float* panels) {
  Pack(
      p, panels, [](float w) { return w; }, InOrder);
}

void PackWeights(const PackWeightsParams& p, Bf16* panels) {
  Pack(p, panels, RoundToBf16, InOrder);
}

void PackSwiGluWeights(const PackWeightsParams& p, float* panels) {
  PackSwiGlu(p, panels, [](float w) { return w; });
}

void PackSwiGluWeights(const PackWeightsParams& p, Bf16* panels) {
  PackSwiGlu(p, panels, RoundToBf16);
}

void Gemm(const GemmParams& p) {
  if (p.rows == 0 || p.out == 0) return;
  if (p.swiglu != nullptr && (!p.w_packed || p.out % (2 * kPanel) != 0 || p.beta != 0.0f)) {
    std::fprintf(stderr, "Gemm: swiglu needs W packed by PackSwiGluWeights and beta 0\n");
    std::abort();
  }
  if (p.w_packed) {
    if (p.w_bf16 != nullptr) return PackedGemm(p, p.w_bf16);
    return PackedGemm(p, p.w);
  }
  // W as Linear lays it out (tests, references): packed for this call.
  const int64_t count = PackedWeightCount(p.out, p.in);
  if (p.w_bf16 != nullptr) {
    std::vector<float> widened(p.out * p.in);
    for (size_t i = 0; i < widened.size(); ++i) widened[i] = Widen(p.w_bf16[i]);
    std::vector<Bf16> panels(count);
    PackWeights({.out = p.out, .in = p.in, .w = widened.data()}, panels.data());
    return PackedGemm(p, panels.data());
  }
  std::vector<float> panels(count);
  PackWeights({.out = p.out, .in = p.in, .w = p.w}, panels.data());
  PackedGemm(p, panels.data());
}

// Widens both operands to FP32 (exact) and runs Gemm: the reference for the CUDA backend's
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
  for (int64_t i = 0; i < p.count; ++i) p.out[i] = RoundToBf16(p.in[i]);
}

}  // namespace baton::kernels
