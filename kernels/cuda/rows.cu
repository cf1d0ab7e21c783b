// Row movement on the device (baton/kernels/rows.h): one block per row, threads across the
// row's floats. Ring writes are ScatterRows with the plan's slots (-1: no write).
#include "baton/kernels/cuda/ops.h"
#include "context_impl.h"

namespace baton::kernels::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void GatherRowsKernel(GatherRowsParams p) {
  const int64_t r = blockIdx.x;
  const int32_t from = p.index[r];
  if (from < 0) return;
  for (int64_t i = threadIdx.x; i < p.width; i += blockDim.x) {
    p.dst[r * p.dst_stride + i] = p.src[from * p.src_stride + i];
  }
}

__global__ void ScatterRowsKernel(ScatterRowsParams p) {
  const int64_t r = blockIdx.x;
  const int32_t to = p.index[r];
  if (to < 0) return;
  for (int64_t i = threadIdx.x; i < p.width; i += blockDim.x) {
    p.dst[to * p.dst_stride + i] = p.src[r * p.src_stride + i];
  }
}

__global__ void WriteBlockKvKernel(WriteBlockKvParams p) {
  const int64_t r = blockIdx.x;
  const int64_t pos = p.positions[r];
  float* row = p.pages[pos / p.block_size] + p.offset + (pos % p.block_size) * p.width;
  for (int64_t i = threadIdx.x; i < p.width; i += blockDim.x) row[i] = p.src[r * p.src_stride + i];
}

}  // namespace

void GatherRows(Context& ctx, const GatherRowsParams& p) {
  if (p.rows == 0) return;
  GatherRowsKernel<<<static_cast<unsigned>(p.rows), kThreads, 0, ctx.impl().stream>>>(p);
  ctx.impl().CheckLaunch("GatherRows");
}

void ScatterRows(Context& ctx, const ScatterRowsParams& p) {
  if (p.rows == 0) return;
  ScatterRowsKernel<<<static_cast<unsigned>(p.rows), kThreads, 0, ctx.impl().stream>>>(p);
  ctx.impl().CheckLaunch("ScatterRows");
}

void WriteBlockKv(Context& ctx, const WriteBlockKvParams& p) {
  if (p.rows == 0) return;
  WriteBlockKvKernel<<<static_cast<unsigned>(p.rows), kThreads, 0, ctx.impl().stream>>>(p);
  ctx.impl().CheckLaunch("WriteBlockKv");
}

}  // namespace baton::kernels::cuda
