// The CUDA backend of every op in baton/kernels/*.h, with the same params structs.
//
// Pointer rules: every data pointer inside a params struct (x, weight, q, out, positions,
// swa_lo, ring and tail rows, ids, index, the page table `pages` and the pages it lists) is a
// DEVICE pointer. The params structs themselves, the span of AttentionParams and the
// BlockKvSource that AttentionParams::global points at live in HOST memory: the launcher reads
// them and copies what the kernels need. Shapes and semantics are those documented in the
// shared headers; results match the CPU backend up to summation order (and, for SwiGLU and
// attention, CUDA's expf), which tests/kernels/backend_ops_test.cc checks.
//
// Every op is queued on ctx's stream and returns at once; errors surface in
// Context::Synchronize(). Launch-shape limits (checked, reported as errors): head_dim <= 256.
#pragma once

#include <span>

#include "baton/kernels/attention.h"
#include "baton/kernels/cuda/context.h"
#include "baton/kernels/elementwise.h"
#include "baton/kernels/gemm.h"
#include "baton/kernels/rows.h"

namespace baton::kernels::cuda {

// cuBLAS, FP32 inputs and FP32 compute (TF32 stays off so that results track the CPU's).
void Gemm(Context& ctx, const GemmParams& p);
// cuBLAS tensor cores: BF16 X and W, FP32 accumulation, FP32 Y.
void GemmBf16(Context& ctx, const GemmBf16Params& p);
void ToBf16(Context& ctx, const ToBf16Params& p);

void RmsNorm(Context& ctx, const RmsNormParams& p);
void Rope(Context& ctx, const RopeParams& p);
void SwiGlu(Context& ctx, const SwiGluParams& p);
void Embedding(Context& ctx, const EmbeddingParams& p);

void GatherRows(Context& ctx, const GatherRowsParams& p);
void ScatterRows(Context& ctx, const ScatterRowsParams& p);
void WriteBlockKv(Context& ctx, const WriteBlockKvParams& p);

// Producer SWA attention (global == nullptr) and consumer union attention (global set) for a
// batch of entries in one launch: one softmax per (row, head) over block KV [0, pos] and SWA
// keys [swa_lo, pos] (ring slot pos % C before tail_start, tail rows after it).
void Attention(Context& ctx, std::span<const AttentionParams> batch);

}  // namespace baton::kernels::cuda
