// CED attention on the device (baton/kernels/attention.h): one block per (row, head) of every
// entry of the batch, one launch per call. Each of the block's warps takes every kWarps-th key
// of the union (block KV [0, pos] first, then SWA [lo, pos]), computes its score with the
// lanes across head_dim, and keeps an online softmax (running max, sum and weighted values);
// the warps' partial states are merged at the end. This is exactly one softmax over the union,
// as on the CPU, without materialising the scores, so context length is unbounded.
//
// When (rows x heads) blocks would leave multiprocessors idle (decode at small batches), each
// row's keys are split into up to kMaxSplits ranges, one block each, and a combine kernel
// merges their partial softmax states (flash-decoding). Entries of kGemmAttentionMinRows rows or
// more run on tensor cores instead when the context selects PrefillAttention::kGemm
// (attention_gemm.cu).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "attention_gemm.h"
#include "baton/kernels/cuda/ops.h"
#include "context_impl.h"
#include "device_util.cuh"

namespace baton::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxHeadDim = 256;
constexpr int kPerLane = kMaxHeadDim / 32;
constexpr int64_t kMaxSplits = 16;

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

// The entry holding flat row `flat`.
__device__ const Entry& EntryOf(const Entry* entries, int num_entries, int64_t flat) {
  int first = 0, last = num_entries - 1;
  while (first < last) {
    const int mid = (first + last + 1) / 2;
    if (entries[mid].row_begin <= flat) {
      first = mid;
    } else {
      last = mid - 1;
    }
  }
  return entries[first];
}

// A split's partial softmax state for one (row, head): running max, sum of weights, and the
// weighted values (not yet divided by the sum).
constexpr int64_t kPartialFloats = 2 + kMaxHeadDim;

// Split-KV (flash-decoding): with `splits` > 1, block (row, head, s) takes the s-th of
// `splits` equal ranges of the row's keys and writes its partial state to `partials`;
// CombineKernel then merges the splits. With splits == 1 the block writes the output itself.
__global__ void AttentionKernel(const Entry* entries, int num_entries, int splits,
                                float* partials) {
  const int64_t flat = blockIdx.x;
  const Entry& e = EntryOf(entries, num_entries, flat);
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
  const int64_t per_split = (num_keys + splits - 1) / splits;
  const int64_t key_begin = min(num_keys, blockIdx.z * per_split);
  const int64_t key_end = min(num_keys, key_begin + per_split);
  for (int64_t t = key_begin + warp; t < key_end; t += kWarps) {
    const KvRows rows = t < num_global ? BlockKvRows(e.global, t, kv_dim, kv_col)
                                       : SwaRows(swa, lo + (t - num_global), kv_dim, kv_col);
    const float *k = rows.k, *v = rows.v;
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
  float* partial =
      splits > 1 ? partials + ((flat * gridDim.y + head) * splits + blockIdx.z) * kPartialFloats
                 : nullptr;
  if (partial != nullptr && threadIdx.x == 0) {
    partial[0] = global_max;
    partial[1] = total;
  }
  float* out = p.out + row * p.num_heads * hd + head * hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (warp_sum[w] > 0.0f) o += warp_acc[w][d] * expf(warp_max[w] - global_max);
    }
    if (partial != nullptr) {
      partial[2 + d] = o;
    } else {
      out[d] = total > 0.0f ? o / total : 0.0f;  // no visible key: the output row is zero
    }
  }
}

// Merges the `splits` partial states of each (row, head) into its output row, as a block
// merges its warps' states.
__global__ void CombineKernel(const Entry* entries, int num_entries, int splits,
                              const float* partials) {
  const int64_t flat = blockIdx.x, head = blockIdx.y;
  const Entry& e = EntryOf(entries, num_entries, flat);
  const AttentionParams& p = e.p;
  if (head >= p.num_heads) return;
  const int64_t row = flat - e.row_begin, hd = p.head_dim;
  const float* split = partials + (flat * gridDim.y + head) * splits * kPartialFloats;
  float global_max = -INFINITY;
  for (int s = 0; s < splits; ++s) {
    if (split[s * kPartialFloats + 1] > 0.0f) {
      global_max = fmaxf(global_max, split[s * kPartialFloats]);
    }
  }
  float total = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float* part = split + s * kPartialFloats;
    if (part[1] > 0.0f) total += part[1] * expf(part[0] - global_max);
  }
  float* out = p.out + row * p.num_heads * hd + head * hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float* part = split + s * kPartialFloats;
      if (part[1] > 0.0f) o += part[2 + d] * expf(part[0] - global_max);
    }
    out[d] = total > 0.0f ? o / total : 0.0f;
  }
}

}  // namespace

void Attention(Context& ctx, std::span<const AttentionParams> batch) {
  Context::Impl& impl = ctx.impl();
  std::vector<Entry> entries;
  int64_t rows = 0, max_heads = 0;
  const bool gemm_path = impl.prefill_attention == PrefillAttention::kGemm;
  for (const AttentionParams& p : batch) {
    if (p.rows == 0) continue;
    if (p.head_dim <= 0 || p.head_dim > kMaxHeadDim || p.num_kv_heads <= 0 ||
        p.num_heads % p.num_kv_heads != 0) {
      impl.Fail("Attention: head_dim must be in [1, 256] and num_heads a multiple of num_kv_heads");
      return;
    }
    if (gemm_path && p.rows >= kGemmAttentionMinRows) {
      if (!GemmAttention(impl, p)) return;
      continue;
    }
    Entry e{.p = p, .has_global = p.global != nullptr, .row_begin = rows};
    if (e.has_global) e.global = *p.global;
    e.p.global = nullptr;
    entries.push_back(e);
    rows += p.rows;
    max_heads = std::max(max_heads, p.num_heads);
  }
  if (entries.empty()) return;
  // Split the keys when (rows x heads) blocks would leave multiprocessors idle: a decode batch
  // of one request has as many blocks as heads (32 on 132 SMs of an H200).
  const int64_t blocks = rows * max_heads;
  const int64_t wanted = 2 * static_cast<int64_t>(impl.multiprocessors);
  const int splits = blocks >= wanted
                         ? 1
                         : static_cast<int>(std::min<int64_t>(kMaxSplits, CeilDiv(wanted, blocks)));
  const size_t bytes = entries.size() * sizeof(Entry);
  const size_t partials_at = (bytes + 255) & ~size_t{255};
  const size_t partial_bytes = splits > 1 ? sizeof(float) * blocks * splits * kPartialFloats : 0;
  auto* scratch = static_cast<char*>(impl.Scratch(partials_at + partial_bytes));
  if (scratch == nullptr) return;
  auto* device_entries = reinterpret_cast<Entry*>(scratch);
  auto* partials = splits > 1 ? reinterpret_cast<float*>(scratch + partials_at) : nullptr;
  // Through page-locked staging: a true asynchronous DMA (from pageable memory the runtime
  // would stage the copy while the host waits, and stream capture refuses it).
  Context::Impl::Staging* staging = impl.AcquireStaging(bytes);
  if (staging == nullptr) return;
  std::memcpy(staging->host, entries.data(), bytes);
  const bool copied = impl.Check(
      cudaMemcpyAsync(device_entries, staging->host, bytes, cudaMemcpyHostToDevice, impl.stream),
      "Attention: copy entries");
  impl.Staged(staging);
  if (!copied) return;
  const int num_entries = static_cast<int>(entries.size());
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(max_heads),
                  static_cast<unsigned>(splits));
  AttentionKernel<<<grid, kWarps * 32, 0, impl.stream>>>(device_entries, num_entries, splits,
                                                         partials);
  if (!impl.CheckLaunch("Attention") || splits == 1) return;
  CombineKernel<<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(max_heads)), 128, 0,
                  impl.stream>>>(device_entries, num_entries, splits, partials);
  impl.CheckLaunch("Attention: combine the key splits");
}

}  // namespace baton::kernels::cuda
