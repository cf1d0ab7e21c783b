// Device sampling with the semantics of model/sampling.cc (see sampling.h). One block per row.
//
// The CPU sorts the vocab; here every question about the sorted order ("the first top_k
// tokens", "the shortest prefix whose mass reaches top_p", "the first token whose cumulative
// weight exceeds u") is a radix selection over a 64-bit order key: larger key = earlier in the
// CPU's order (higher logit, then lower id). A selection finds, digit by digit from the top,
// the largest key T whose prefix {key >= T} carries enough weight, in 8 passes of a 256-bin
// histogram. The candidates' total weight is summed in another order than the CPU's
// sequential sum, so where a top-p target or a draw falls within rounding of a boundary the
// two sides can pick neighbouring tokens; exact weights (ties of equal logits, weights that
// underflow to 0) give the same choice. Next optimisation if sampling ever shows in a profile: keep
// the weights of the first pass in shared memory or scratch instead of recomputing exp() in every
// pass.
#include <cmath>

#include "baton/kernels/cuda/sampling.h"
#include "context_impl.h"
#include "device_util.cuh"
#include "radix_bins.h"

namespace baton::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Orderable bits of the logit (so that unsigned order is float order), then the complement of
// the id (so that a lower id sorts first on ties). -0 counts as +0, as float comparison does.
__device__ uint64_t OrderKey(float logit, int64_t id) {
  if (logit == 0.0f) logit = 0.0f;
  uint32_t bits = __float_as_uint(logit);
  bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (static_cast<uint64_t>(bits) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}

__device__ int32_t IdOf(uint64_t key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key));
}

struct Selection {
  bool found = false;
  uint64_t key = 0;    // the selected key T
  double above = 0.0;  // weight of the candidates with key > T
};

// Among candidates (key >= floor), the largest key T such that the weight of
// {candidates with key >= T} reaches `target` (>= when !strict, > when strict). Not found when
// even all the candidates fall short; a later pass that falls short by rounding ends at its
// prefix's last candidate (ChooseBin).
template <typename Weight>
__device__ Selection RadixSelect(const float* logits, int64_t vocab, uint64_t floor, Weight weight,
                                 double target, bool strict) {
  __shared__ double histogram[256];
  __shared__ uint64_t prefix;
  __shared__ double above;
  __shared__ bool found;
  if (threadIdx.x == 0) {
    prefix = 0;
    above = 0.0;
    found = true;
  }
  for (int pass = 0; pass < 8; ++pass) {
    const int shift = 56 - 8 * pass;
    const uint64_t decided = pass == 0 ? 0 : ~0ull << (shift + 8);
    histogram[threadIdx.x] = 0.0;  // kThreads == 256 bins
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const uint64_t key = OrderKey(logits[i], i);
      if (key < floor || (key & decided) != prefix) continue;
      atomicAdd(&histogram[(key >> shift) & 0xff], weight(i));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const BinChoice choice = ChooseBin(histogram, above, target, strict);
      if (choice.bin < 0 || (!choice.reached && pass == 0)) {
        found = false;  // the target lies beyond every candidate
      } else {
        prefix |= static_cast<uint64_t>(choice.bin) << shift;
        above = choice.above;
      }
    }
    __syncthreads();
    if (!found) break;
  }
  const Selection result{found, prefix, above};
  __syncthreads();  // the next selection resets the shared state
  return result.found ? result : Selection{};
}

__global__ void SampleRowsKernel(SampleRowsParams p) {
  const int64_t r = blockIdx.x;
  const float* logits = p.logits + r * (p.logits_stride ? p.logits_stride : p.vocab);
  const SampleRowSettings s = p.settings[r];
  const int64_t vocab = p.vocab;
  auto max_op = [](uint64_t a, uint64_t b) { return a > b ? a : b; };
  auto min_op = [](uint64_t a, uint64_t b) { return a < b ? a : b; };
  auto sum_op = [](double a, double b) { return a + b; };

  uint64_t local_max = 0, local_min = ~0ull;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const uint64_t key = OrderKey(logits[i], i);
    local_max = key > local_max ? key : local_max;
    local_min = key < local_min ? key : local_min;
  }
  const uint64_t first_key = BlockReduce<kThreads>(local_max, max_op);
  const uint64_t last_key = BlockReduce<kThreads>(local_min, min_op);
  const float max_logit = logits[IdOf(first_key)];

  int32_t chosen = IdOf(first_key);
  if (s.temperature > 0.0f) {
    const float temperature = s.temperature;
    const double max_scaled = static_cast<double>(max_logit / temperature);
    auto prob = [&](int64_t i) {
      return exp(static_cast<double>(logits[i] / temperature) - max_scaled);
    };
    auto one = [](int64_t) { return 1.0; };
    // Candidates are the keys >= floor: the first top_k tokens of the order.
    uint64_t floor = last_key;
    if (s.top_k > 0 && s.top_k < vocab) {
      floor = RadixSelect(logits, vocab, 0, one, static_cast<double>(s.top_k), false).key;
    }
    auto candidate_mass = [&](uint64_t from) {
      double local = 0.0;
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
        if (OrderKey(logits[i], i) >= from) local += prob(i);
      }
      return BlockReduce<kThreads>(local, sum_op);
    };
    double total = candidate_mass(floor);
    if (s.top_p > 0.0f && s.top_p < 1.0f) {
      const Selection cut = RadixSelect(logits, vocab, floor, prob, s.top_p * total, false);
      if (cut.found) {
        floor = cut.key;
        total = candidate_mass(floor);
      }
    }
    const uint64_t bits = SplitMix(s.seed ^ SplitMix(s.step + 1));
    const double u = static_cast<double>(bits >> 11) * 0x1.0p-53 * total;
    const Selection draw = RadixSelect(logits, vocab, floor, prob, u, true);
    chosen = IdOf(draw.found ? draw.key : floor);  // u at the very top: the last kept token
  }

  double local = 0.0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    local += exp(static_cast<double>(logits[i] - max_logit));
  }
  const double total = BlockReduce<kThreads>(local, sum_op);
  if (threadIdx.x == 0) {
    p.tokens[r] = chosen;
    p.logprobs[r] = static_cast<float>(logits[chosen] - max_logit - log(total));
  }
}

}  // namespace

void SampleRows(Context& ctx, const SampleRowsParams& p) {
  if (p.rows == 0) return;
  SampleRowsKernel<<<static_cast<unsigned>(p.rows), kThreads, 0, ctx.impl().stream>>>(p);
  ctx.impl().CheckLaunch("SampleRows");
}

}  // namespace baton::kernels::cuda
