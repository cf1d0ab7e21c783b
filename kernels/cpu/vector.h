// Vector helpers of the CPU kernels' hot loops (private to kernels/cpu).
//
// The build targets baseline x86-64 (SSE2), which keeps the binaries portable; the hot loops
// are also compiled for AVX2 + FMA and AVX-512 and picked at load time by the CPU (GCC
// function multiversioning: BATON_VECTOR_CLONES on the function that holds the loop, never on
// one that opens an OpenMP region, whose outlined body would not be cloned).
#pragma once

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BATON_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define BATON_VECTOR_CLONES
#endif

namespace baton::kernels {

// Sixteen floats as one value (GCC vector extension): one AVX-512 register, two AVX2 or four
// SSE registers, whichever the clone was compiled for.
typedef float Vec16 __attribute__((vector_size(64)));

// The sum of a vector's sixteen lanes by halving (four adds, not fifteen in a chain).
inline float SumLanes(Vec16 x) {
  typedef float Vec8 __attribute__((vector_size(32)));
  typedef float Vec4 __attribute__((vector_size(16)));
  const Vec8 h8 = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
  const Vec4 h4 =
      __builtin_shufflevector(h8, h8, 0, 1, 2, 3) + __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
  return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

}  // namespace baton::kernels
