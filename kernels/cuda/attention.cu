// CED attention on the device (baton/kernels/attention.h): one block per (row, head) of every
// entry of the batch, one launch per call. Each of the block's warps takes every kWarps-th key
// of the union (block KV [0, pos] first, then SWA [lo, pos]), computes its score with the
// lanes across head_dim, and keeps an online softmax (running max, sum and weighted values);
// the warps' partial states are merged at the end. This is exactly one softmax over the union,
// as on the CPU, without materialising the scores, so context length is unbounded.
//
// Next optimisations, when profiles say so: tile several query rows of a prefill chunk per
// block so that K/V rows are reused from shared memory (FlashAttention-style), and split long
// decode contexts across blocks (flash-decoding) so that a batch of one fills the GPU.
#include <algorithm>
#include <cmath>
#include <vector>

#include "baton/kernels/cuda/ops.h"
#include "context_impl.h"

namespace baton::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxHeadDim = 256;
constexpr int kPerLane = kMaxHeadDim / 32;

// One batch entry as the kernel sees it: the params by value with the block-KV source inlined
// (AttentionParams::global is a host pointer), and where its rows start in the flat grid.
struct Entry {
  AttentionParams p;
  BlockKvSource global;
  bool has_global = false;
  int64_t row_begin = 0;
};

__device__ inline float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__global__ void AttentionKernel(const Entry* entries, int num_entries) {
  const int64_t flat = blockIdx.x;
  int first = 0, last = num_entries - 1;  // the entry holding flat row `flat`
  while (first < last) {
    const int mid = (first + last + 1) / 2;
    if (entries[mid].row_begin <= flat) {
      first = mid;
    } else {
      last = mid - 1;
    }
  }
  const Entry& e = entries[first];
  const AttentionParams& p = e.p;
  const int64_t head = blockIdx.y;
  if (head >= p.num_heads) return;
  const int64_t row = flat - e.row_begin;
  const int64_t hd = p.head_dim, kv_dim = p.num_kv_heads * hd;
  const int64_t kv_col = head / (p.num_heads / p.num_kv_heads) * hd;
  const int64_t pos = p.positions[row], lo = p.swa_lo[row];
  const int64_t num_global = e.has_global ? pos + 1 : 0;
  const int64_t num_keys = num_global + max(int64_t{0}, pos + 1 - lo);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  float q[kPerLane], acc[kPerLane];
  const float* q_row = p.q + row * p.q_stride + head * hd;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    q[i] = d < hd ? q_row[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float running_max = -INFINITY, running_sum = 0.0f;
  const SwaSource& swa = p.swa;
  for (int64_t t = warp; t < num_keys; t += kWarps) {
    const float *k, *v;
    if (t < num_global) {
      const float* page = e.global.pages[t / e.global.block_size];
      const int64_t in_page = (t % e.global.block_size) * kv_dim + kv_col;
      k = page + e.global.k_offset + in_page;
      v = page + e.global.v_offset + in_page;
    } else {
      const int64_t j = lo + (t - num_global);
      if (j >= swa.tail_start) {
        k = swa.tail_k + (j - swa.tail_start) * swa.tail_stride + kv_col;
        v = swa.tail_v + (j - swa.tail_start) * swa.tail_stride + kv_col;
      } else {
        k = swa.ring_k + (j % swa.ring_capacity) * kv_dim + kv_col;
        v = swa.ring_v + (j % swa.ring_capacity) * kv_dim + kv_col;
      }
    }
    float partial = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < hd) partial += q[i] * k[d];
    }
    const float score = WarpSum(partial) * p.scale;
    const float new_max = fmaxf(running_max, score);
    const float correction = expf(running_max - new_max);
    const float weight = expf(score - new_max);
    running_sum = running_sum * correction + weight;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      acc[i] = acc[i] * correction + (d < hd ? weight * v[d] : 0.0f);
    }
    running_max = new_max;
  }

  __shared__ float warp_max[kWarps], warp_sum[kWarps];
  __shared__ float warp_acc[kWarps][kMaxHeadDim];
  if (lane == 0) {
    warp_max[warp] = running_max;
    warp_sum[warp] = running_sum;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < hd) warp_acc[warp][d] = acc[i];
  }
  __syncthreads();
  float global_max = -INFINITY;
  for (int w = 0; w < kWarps; ++w) {
    if (warp_sum[w] > 0.0f) global_max = fmaxf(global_max, warp_max[w]);
  }
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    if (warp_sum[w] > 0.0f) total += warp_sum[w] * expf(warp_max[w] - global_max);
  }
  float* out = p.out + row * p.num_heads * hd + head * hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (warp_sum[w] > 0.0f) o += warp_acc[w][d] * expf(warp_max[w] - global_max);
    }
    out[d] = total > 0.0f ? o / total : 0.0f;  // no visible key: the output row is zero
  }
}

}  // namespace

void Attention(Context& ctx, std::span<const AttentionParams> batch) {
  Context::Impl& impl = ctx.impl();
  std::vector<Entry> entries;
  int64_t rows = 0, max_heads = 0;
  for (const AttentionParams& p : batch) {
    if (p.rows == 0) continue;
    if (p.head_dim <= 0 || p.head_dim > kMaxHeadDim || p.num_kv_heads <= 0 ||
        p.num_heads % p.num_kv_heads != 0) {
      impl.Fail("Attention: head_dim must be in [1, 256] and num_heads a multiple of num_kv_heads");
      return;
    }
    Entry e{.p = p, .has_global = p.global != nullptr, .row_begin = rows};
    if (e.has_global) e.global = *p.global;
    e.p.global = nullptr;
    entries.push_back(e);
    rows += p.rows;
    max_heads = std::max(max_heads, p.num_heads);
  }
  if (entries.empty()) return;
  const size_t bytes = entries.size() * sizeof(Entry);
  auto* device_entries = static_cast<Entry*>(impl.Scratch(bytes));
  if (device_entries == nullptr) return;
  // From pageable memory: the runtime stages `entries` before returning, so it may go.
  if (!impl.Check(cudaMemcpyAsync(device_entries, entries.data(), bytes, cudaMemcpyHostToDevice,
                                  impl.stream),
                  "Attention: copy entries")) {
    return;
  }
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(max_heads));
  AttentionKernel<<<grid, kWarps * 32, 0, impl.stream>>>(device_entries,
                                                         static_cast<int>(entries.size()));
  impl.CheckLaunch("Attention");
}

}  // namespace baton::kernels::cuda
