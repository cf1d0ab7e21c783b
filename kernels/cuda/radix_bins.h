// One digit of the CUDA sampler's radix selection (sampling.cu), kept free of CUDA headers so
// that the CPU tests run it too (tests/kernels/radix_bins_test.cc).
//
// A pass holds a 256-bin histogram of weights over the candidates that share the digits chosen
// so far; bin b holds the keys whose current digit is b, and a higher bin is earlier in the
// order. The pass picks the highest bin at which the weight from the top (`above`, the weight
// of every earlier candidate outside this prefix, plus the bins above) first reaches `target`.
#pragma once

#ifdef __CUDACC__
#define BATON_HOST_DEVICE __host__ __device__
#else
#define BATON_HOST_DEVICE
#endif

namespace baton::kernels::cuda {

struct BinChoice {
  int bin = -1;          // -1: every bin is empty (weighs nothing)
  double above = 0.0;    // weight of the candidates before bin `bin`
  bool reached = false;  // whether the running weight reached `target` at `bin`
};

// The highest bin at which the running weight reaches `target` (> when `strict`, >= otherwise).
// When none does, the lowest bin of positive weight, with `reached` false. In a pass after the
// first, that is where the target lies: the previous pass saw this prefix's weight reach it,
// and only the histogram's double atomics, added in another order, now sum a hair below. The
// selection then goes on to this prefix's last candidate instead of being abandoned (which
// silently skipped the top-p cut). In the first pass, an unreached target means the target is
// beyond every candidate, and the caller decides (sampling.cu keeps every candidate, as the
// CPU does when its cumulative sum never reaches the target).
BATON_HOST_DEVICE inline BinChoice ChooseBin(const double* histogram, double above, double target,
                                             bool strict) {
  double acc = above;
  BinChoice lowest;
  for (int b = 255; b >= 0; --b) {
    if (!(histogram[b] > 0.0)) continue;  // zero weight: never the first to reach a target
    const double with = acc + histogram[b];
    if (strict ? with > target : with >= target) return {b, acc, true};
    lowest = {b, acc, false};
    acc = with;
  }
  return lowest;
}

}  // namespace baton::kernels::cuda
