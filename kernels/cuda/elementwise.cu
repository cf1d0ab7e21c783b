// Row-wise ops on the device: RMSNorm, RoPE, SwiGLU, embedding lookup, FP32 -> BF16. Each
// follows kernels/cpu/elementwise.cc's arithmetic (RMSNorm sums squares in double, RoPE
// computes angles in double) so that results match it to FP32 rounding.
#include <algorithm>

#include "baton/kernels/cuda/ops.h"
#include "context_impl.h"

namespace baton::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row: double sum of squares reduced in shared memory, then the scaled row.
__global__ void RmsNormKernel(RmsNormParams p) {
  __shared__ double partial[kThreads];
  const int64_t r = blockIdx.x;
  const float* x = p.x + r * p.dim;
  float* out = p.out + r * p.dim;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    sum += static_cast<double>(x[i]) * x[i];
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float inv = static_cast<float>(1.0 / sqrt(partial[0] / p.dim + p.eps));
  // Every thread read its x[i] above before the barrier, so out == x is safe.
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) out[i] = x[i] * inv * p.weight[i];
}

// Block (row, head); thread k rotates the pair (k, k + head_dim / 2).
__global__ void RopeKernel(RopeParams p) {
  const int64_t r = blockIdx.x, h = blockIdx.y, half = p.head_dim / 2;
  float* x = p.x + r * p.stride + h * p.head_dim;
  for (int64_t k = threadIdx.x; k < half; k += blockDim.x) {
    const double inv_freq = pow(p.theta, -2.0 * static_cast<double>(k) / p.head_dim);
    const double angle = static_cast<double>(p.positions[r]) * inv_freq;
    const float c = static_cast<float>(cos(angle)), s = static_cast<float>(sin(angle));
    const float a = x[k], b = x[k + half];
    x[k] = a * c - b * s;
    x[k + half] = b * c + a * s;
  }
}

__global__ void SwiGluKernel(SwiGluParams p) {
  const int64_t total = p.rows * p.inter;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = t / p.inter, i = t % p.inter;
    const float g = p.gate_up[r * 2 * p.inter + i];
    const float up = p.gate_up[r * 2 * p.inter + p.inter + i];
    p.out[t] = g / (1.0f + expf(-g)) * up;
  }
}

__global__ void EmbeddingKernel(EmbeddingParams p) {
  const int64_t r = blockIdx.x;
  const float* from = p.table + static_cast<int64_t>(p.ids[r]) * p.dim;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) p.out[r * p.dim + i] = from[i];
}

// Round to nearest even on the bit pattern, as kernels/cpu/gemm.cc's ToBf16.
__global__ void ToBf16Kernel(ToBf16Params p) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < p.count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint32_t bits = __float_as_uint(p.in[i]);
    p.out[i] = (bits & 0x7fffffffu) > 0x7f800000u
                   ? static_cast<Bf16>((bits >> 16) | 0x0040u)
                   : static_cast<Bf16>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
}

// Grid for a grid-stride loop over `n` elements.
unsigned StrideBlocks(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>(CeilDiv(n, kThreads), 65536));
}

}  // namespace

void RmsNorm(Context& ctx, const RmsNormParams& p) {
  if (p.rows == 0) return;
  RmsNormKernel<<<static_cast<unsigned>(p.rows), kThreads, 0, ctx.impl().stream>>>(p);
  ctx.impl().CheckLaunch("RmsNorm");
}

void Rope(Context& ctx, const RopeParams& p) {
  if (p.rows == 0 || p.heads == 0) return;
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.heads));
  const int threads =
      static_cast<int>(std::min<int64_t>(128, std::max<int64_t>(32, p.head_dim / 2)));
  RopeKernel<<<grid, threads, 0, ctx.impl().stream>>>(p);
  ctx.impl().CheckLaunch("Rope");
}

void SwiGlu(Context& ctx, const SwiGluParams& p) {
  if (p.rows * p.inter == 0) return;
  SwiGluKernel<<<StrideBlocks(p.rows * p.inter), kThreads, 0, ctx.impl().stream>>>(p);
  ctx.impl().CheckLaunch("SwiGlu");
}

void Embedding(Context& ctx, const EmbeddingParams& p) {
  if (p.rows == 0) return;
  EmbeddingKernel<<<static_cast<unsigned>(p.rows), kThreads, 0, ctx.impl().stream>>>(p);
  ctx.impl().CheckLaunch("Embedding");
}

void ToBf16(Context& ctx, const ToBf16Params& p) {
  if (p.count == 0) return;
  ToBf16Kernel<<<StrideBlocks(p.count), kThreads, 0, ctx.impl().stream>>>(p);
  ctx.impl().CheckLaunch("ToBf16");
}

}  // namespace baton::kernels::cuda
