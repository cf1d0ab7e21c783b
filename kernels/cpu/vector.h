// Vector helpers of the CPU kernels' hot loops (private to kernels/cpu).
//
// The build targets baseline x86-64 (SSE2), which keeps the binaries portable; each hot loop
// is also compiled for AVX2 + FMA (x86-64-v3) and AVX-512 (x86-64-v4), and the level
// ActiveCpuIsa names (cpu_isa.h) runs: a loop is an Op, a struct whose always-inlined
// `template <CpuIsa kIsa> static void Run(...)` holds it, called through RunAtActiveIsa<Op>,
// which calls the variant compiled for that level. kIsa lets an Op pick its vector width and
// tile shapes for the level's register file: an AVX-512 register holds 16 floats, an AVX2 one 8,
// and AVX2 has 16 registers where AVX-512 has 32, so a tile of accumulators that fits one spills
// on the other. Never put an OpenMP region inside an Op: its outlined body would be compiled once,
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

// kWidth floats as one value (GCC vector extension), for loops that keep their vectors the
// width of the level's registers (16 floats on AVX-512, 8 on AVX2, 4 on SSE2): GCC keeps arrays
// of vectors wider than the registers in memory, so a 16-float accumulator array built for AVX2
// runs from the stack.
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

// Floats in one register of the level: 16 (AVX-512), 8 (AVX2), 4 (SSE2).
template <CpuIsa kIsa>
inline constexpr int kNativeWidth = kIsa == CpuIsa::kAvx512 ? 16 : kIsa == CpuIsa::kAvx2 ? 8 : 4;

// The first `count` (at most kW) lanes of x from or to memory; a whole vector is one load or
// store (a copy of variable length is a byte loop).
template <int kW>
__attribute__((always_inline)) inline void LoadFirst(NativeVec<kW>& x, const float* from,
                                                     int64_t count) {
  if (count == kW) {
    std::memcpy(&x, from, sizeof x);
  } else {
    std::memcpy(&x, from, count * sizeof(float));
  }
}

template <int kW>
__attribute__((always_inline)) inline void StoreFirst(float* to, const NativeVec<kW>& x,
                                                      int64_t count) {
  if (count == kW) {
    std::memcpy(to, &x, sizeof x);
  } else {
    std::memcpy(to, &x, count * sizeof(float));
  }
}

// The integer vector of kW lanes, for bit manipulation of NativeVec<kW>.
template <int kW>
struct IntVecOf {
  typedef int32_t type __attribute__((vector_size(kW * 4)));
};

// x = e^x lane by lane, in vectors of kW floats (the level's registers): 2^k e^r with
// k = round(x / ln 2), |r| <= ln(2) / 2, and e^r as 1 + r + r^2 p(r) with Cephes's degree-5
// minimax p (within a few ulp of expf). x is held to [-87, 88], where 2^k stays a normal float:
// below -87 the result is e^-87 (about 1.6e-38) rather than smaller, above 88 it is e^88 (about
// 1.7e38) rather than infinity; NaN stays NaN.
template <int kW>
__attribute__((always_inline)) inline void ExpOf(NativeVec<kW>& x) {
  using V = NativeVec<kW>;
  using I = typename IntVecOf<kW>::type;
  const V hi = V{} + 88.0f, lo = V{} - 87.0f;
  x = x > hi ? hi : x;
  x = x < lo ? lo : x;
  const V shifter = V{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const V k = (x * 1.44269504f + shifter) - shifter;
  const V r = (x - k * 0.693359375f) - k * -2.12194440e-4f;  // ln 2 in two parts
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const V e = p * r * r + r + 1.0f;
  I bits;
  std::memcpy(&bits, &e, sizeof bits);
  bits += __builtin_convertvector(k, I) << 23;
  std::memcpy(&x, &bits, sizeof x);
}

}  // namespace baton::kernels
