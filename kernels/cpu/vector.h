// Vector helpers of the CPU kernels' hot loops (private to kernels/cpu).
//
// The build targets baseline x86-64 (SSE2), which keeps the binaries portable; each hot loop
// is also compiled for AVX2 + FMA (x86-64-v3) and AVX-512 (x86-64-v4), and the level
// ActiveCpuIsa names (cpu_isa.h) runs: a loop is an Op, a struct whose always-inlined
// `template <CpuIsa kIsa> static void Run(...)` holds it, called through RunAtActiveIsa<Op>,
// which calls the variant compiled for that level. kIsa lets an Op pick tile shapes for the
// level's register file: 16 floats (Vec16) are one AVX-512 register, two AVX2 ones, and AVX2
// has 16 registers where AVX-512 has 32, so a tile of accumulators that fits one spills on the
// other. Never put an OpenMP region inside an Op: its outlined body would be compiled once,
// at the baseline. Loops over arrays of accumulators carry `#pragma GCC unroll`, so that the
// arrays live in registers whatever the optimisation level: built at -O2 without them, an
// attention microbenchmark ran at half the speed, its accumulators on the stack.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

#include "baton/kernels/cpu_isa.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BATON_ISA_VARIANTS 1
#define BATON_TARGET_AVX2 __attribute__((target("arch=x86-64-v3")))
#define BATON_TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#else
// Other compilers and CPUs build the baseline only (SupportedCpuIsas then lists it alone).
#define BATON_ISA_VARIANTS 0
#define BATON_TARGET_AVX2
#define BATON_TARGET_AVX512
#endif

namespace baton::kernels {

template <typename Op, typename... A>
BATON_TARGET_AVX512 void RunAvx512(A&&... a) {
  Op::template Run<CpuIsa::kAvx512>(std::forward<A>(a)...);
}
template <typename Op, typename... A>
BATON_TARGET_AVX2 void RunAvx2(A&&... a) {
  Op::template Run<CpuIsa::kAvx2>(std::forward<A>(a)...);
}
template <typename Op, typename... A>
void RunBaseline(A&&... a) {
  Op::template Run<CpuIsa::kBaseline>(std::forward<A>(a)...);
}

// Op::Run<level>(a...), compiled for and run at the active level.
template <typename Op, typename... A>
void RunAtActiveIsa(A&&... a) {
  switch (ActiveCpuIsa()) {
    case CpuIsa::kAvx512:
      return RunAvx512<Op>(std::forward<A>(a)...);
    case CpuIsa::kAvx2:
      return RunAvx2<Op>(std::forward<A>(a)...);
    case CpuIsa::kBaseline:
      break;
  }
  RunBaseline<Op>(std::forward<A>(a)...);
}

// Sixteen floats as one value (GCC vector extension): one AVX-512 register, two AVX2 or four
// SSE registers. Loops whose arrays of accumulators must stay in registers use NativeVec.
typedef float Vec16 __attribute__((vector_size(64)));

// kWidth floats as one value, for a loop that keeps its vectors the width of the level's
// registers (16 floats on AVX-512, 8 on AVX2, 4 on SSE2): GCC keeps arrays of vectors wider
// than the registers in memory, so a Vec16 accumulator array built for AVX2 runs from the
// stack.
template <int kWidth>
struct NativeVecOf;
template <>
struct NativeVecOf<16> {
  typedef float type __attribute__((vector_size(64)));
};
template <>
struct NativeVecOf<8> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct NativeVecOf<4> {
  typedef float type __attribute__((vector_size(16)));
};
template <int kWidth>
using NativeVec = typename NativeVecOf<kWidth>::type;

// The sum of a vector's sixteen lanes by halving (four adds, not fifteen in a chain).
inline float SumLanes(const Vec16& x) {
  typedef float Vec8 __attribute__((vector_size(32)));
  typedef float Vec4 __attribute__((vector_size(16)));
  const Vec8 h8 = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
  const Vec4 h4 =
      __builtin_shufflevector(h8, h8, 0, 1, 2, 3) + __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
  return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

// The first `count` (at most 16) lanes of x from or to memory; a whole vector is one load or
// store (a copy of variable length is a byte loop).
__attribute__((always_inline)) inline void LoadLanes(Vec16& x, const float* from, int64_t count) {
  if (count == 16) {
    std::memcpy(&x, from, sizeof x);
  } else {
    std::memcpy(&x, from, count * sizeof(float));
  }
}

__attribute__((always_inline)) inline void StoreLanes(float* to, const Vec16& x, int64_t count) {
  if (count == 16) {
    std::memcpy(to, &x, sizeof x);
  } else {
    std::memcpy(to, &x, count * sizeof(float));
  }
}

// Sums of lanes of N vectors at once (N = 4, 8 or 16), overwriting v: the vectors are halved
// together, each level adding pairs of lanes kBit apart in two vectors and packing both halves
// into one, so that 16 sums cost 45 vector operations (8 sums 24, 4 sums 15) instead of 16
// horizontal sums of about 8 each. The sum of v[k] lands in lane k * 16 / N of v[0], added in
// exactly SumLanes's order, so it is bit-equal to SumLanes(v[k]).
template <int kBit, size_t... L>
__attribute__((always_inline)) inline void PairSum(Vec16& a, const Vec16& c,
                                                   std::index_sequence<L...>) {
  a = __builtin_shufflevector(a, c, ((L % (2 * kBit)) < kBit ? L : 16 + L - kBit)...) +
      __builtin_shufflevector(a, c, ((L % (2 * kBit)) < kBit ? L + kBit : 16 + L)...);
}

template <int kBit, int kCount>
__attribute__((always_inline)) inline void HalveLanes(Vec16* v) {
  constexpr auto lanes = std::make_index_sequence<16>{};
  if constexpr (kCount > 1) {
#pragma GCC unroll 8
    for (int i = 0; i < kCount / 2; ++i) PairSum<kBit>(v[i], v[i + kCount / 2], lanes);
  } else {
    PairSum<kBit>(v[0], v[0], lanes);
  }
}

template <int N>
__attribute__((always_inline)) inline void SumLanesOf(Vec16* v, float* sums) {
  static_assert(N == 4 || N == 8 || N == 16);
  HalveLanes<8, N>(v);
  HalveLanes<4, (N > 1 ? N / 2 : 1)>(v);
  HalveLanes<2, (N > 2 ? N / 4 : 1)>(v);
  HalveLanes<1, (N > 4 ? N / 8 : 1)>(v);
#pragma GCC unroll 16
  for (int k = 0; k < N; ++k) sums[k] = v[0][k * 16 / N];
}

// x = e^x in sixteen lanes: 2^k e^r with k = round(x / ln 2), |r| <= ln(2) / 2, and e^r as
// 1 + r + r^2 p(r) with Cephes's degree-5 minimax p (within a few ulp of expf). x is held to
// [-87, 88], where 2^k stays a normal float: below -87 the result is e^-87 (about 1.6e-38)
// rather than smaller, above 88 it is e^88 (about 1.7e38) rather than infinity; NaN stays NaN.
__attribute__((always_inline)) inline void Exp(Vec16& x) {
  typedef int32_t Int16 __attribute__((vector_size(64)));
  const Vec16 hi = Vec16{} + 88.0f, lo = Vec16{} - 87.0f;
  x = x > hi ? hi : x;
  x = x < lo ? lo : x;
  const Vec16 shifter = Vec16{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const Vec16 k = (x * 1.44269504f + shifter) - shifter;
  const Vec16 r = (x - k * 0.693359375f) - k * -2.12194440e-4f;  // ln 2 in two parts
  Vec16 p = Vec16{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const Vec16 e = p * r * r + r + 1.0f;
  Int16 bits;
  std::memcpy(&bits, &e, sizeof bits);
  bits += __builtin_convertvector(k, Int16) << 23;
  std::memcpy(&x, &bits, sizeof x);
}

}  // namespace baton::kernels
