// Private to kernels/cuda: device helpers that several kernels share.
#pragma once

#include <cstdint>

#include "baton/kernels/attention.h"

namespace baton::kernels::cuda {

// A reduction over a block of kThreads threads through shared memory; every thread gets the
// result. Each (kThreads, T) pair has its own buffer, synchronised again before returning so
// that the next reduction may reuse it.
template <int kThreads, typename T, typename Op>
__device__ T BlockReduce(T value, Op op) {
  __shared__ T buffer[kThreads];
  buffer[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      buffer[threadIdx.x] = op(buffer[threadIdx.x], buffer[threadIdx.x + stride]);
    __syncthreads();
  }
  const T result = buffer[0];
  __syncthreads();
  return result;
}

// Where the K and V rows of one KV head (columns [kv_col, kv_col + head_dim)) live.
struct KvRows {
  const float* k;
  const float* v;
  bool from_ring;  // a ring slot, which may be stale when no row sees it
};

// Block-KV position t, through the page table.
__device__ inline KvRows BlockKvRows(const BlockKvSource& global, int64_t t, int64_t kv_dim,
                                     int64_t kv_col) {
  const float* page = global.pages[t / global.block_size];
  const int64_t in_page = (t % global.block_size) * kv_dim + kv_col;
  return {page + global.k_offset + in_page, page + global.v_offset + in_page, false};
}

// SWA position j: the tail's row from tail_start on, the ring's slot j % C before it.
__device__ inline KvRows SwaRows(const SwaSource& swa, int64_t j, int64_t kv_dim, int64_t kv_col) {
  if (j >= swa.tail_start) {
    const int64_t row = (j - swa.tail_start) * swa.tail_stride + kv_col;
    return {swa.tail_k + row, swa.tail_v + row, false};
  }
  const int64_t slot = (j % swa.ring_capacity) * kv_dim + kv_col;
  return {swa.ring_k + slot, swa.ring_v + slot, true};
}

}  // namespace baton::kernels::cuda
