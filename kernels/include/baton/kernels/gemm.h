// GEMM against PyTorch Linear weights: Y = X W^T + beta * Y, in FP32 (Gemm) or with BF16
// inputs and FP32 accumulation and output (GemmBf16, the usual serving precision on GPUs). The
// CUDA backend runs both on cuBLAS. On the CPU, Gemm runs its own kernel for every number of
// rows: W is read as panels of kPanelOutputs outputs (PackWeights lays a matrix out that way
// once, when a model loads; an unpacked W is packed for the call), each panel streamed from
// memory once per block of rows and multiplied into every row of the block, so that a decode
// step reads each weight once. W may also be BF16 on the CPU (X and Y stay FP32), which halves
// the bytes a decode step reads.
//
// Every output is one chain of fused multiply-adds over the inputs in order, whatever the
// number of rows and the instruction-set level's tile shapes, so a row's result is the one it
// has alone (a request's tokens do not depend on the others in its batch) and the levels with
// FMA (AVX2, AVX-512) agree bit for bit.
#pragma once

#include <cstdint>

namespace baton::kernels {

// A BF16 value as its bit pattern (the upper half of an FP32), so that this header needs no
// CUDA type.
using Bf16 = uint16_t;

// Outputs per panel of a packed W: panel p holds, for each input k in order, the weights of
// outputs [16p, 16p + 16) (zero past `out`).
inline constexpr int64_t kPanelOutputs = 16;

// Elements of W [out, in] packed: out rounded up to whole panels, times in.
inline int64_t PackedWeightCount(int64_t out, int64_t in) {
  return (out + kPanelOutputs - 1) / kPanelOutputs * kPanelOutputs * in;
}

// panels[PackedWeightCount(out, in)] = W [out, in] in panels; the BF16 form rounds each weight to
// nearest even (as ToBf16).
struct PackWeightsParams {
  int64_t out = 0;
  int64_t in = 0;
  const float* w = nullptr;  // [out, in], contiguous (Linear layout)
};
void PackWeights(const PackWeightsParams& p, float* panels);
void PackWeights(const PackWeightsParams& p, Bf16* panels);

// A SwiGLU MLP's gate_up [2 * inter, in] (gate rows, then up rows; inter a multiple of 16) packed
// for a product with GemmParams::swiglu: the panels of gate and up alternate (gate outputs
// [16i, 16i + 16), then the same outputs of up), so that each thread finds both halves of its
// outputs in its own panels. PackedWeightCount(2 * inter, in) elements.
void PackSwiGluWeights(const PackWeightsParams& p, float* panels);
void PackSwiGluWeights(const PackWeightsParams& p, Bf16* panels);

struct GemmParams {
  int64_t rows = 0;          // M: rows of X and Y
  int64_t in = 0;            // K: columns of X, of W
  int64_t out = 0;           // N: rows of W, columns of Y
  const float* x = nullptr;  // [rows, in], row stride x_stride
  int64_t x_stride = 0;      // 0 means `in`
  const float* w = nullptr;  // [out, in], contiguous (Linear layout)
  // CPU only: W in BF16 instead of w, same layout. Each weight is widened exactly as it is
  // read, so a row's result equals that of Gemm over the widened W.
  const Bf16* w_bf16 = nullptr;
  // CPU only: w or w_bf16 holds PackWeights's panels rather than [out, in].
  bool w_packed = false;
  float* y = nullptr;    // [rows, out], row stride y_stride
  int64_t y_stride = 0;  // 0 means `out`
  float beta = 0.0f;     // 1 adds into Y (residual connections)
  // CPU only, W packed by PackSwiGluWeights, beta 0: swiglu[r, i] = silu(gate) * up of output i
  // ([rows, out / 2], contiguous), as SwiGlu computes it, by the thread that computed it while it
  // is in cache; Y then holds the product in PackSwiGluWeights's order of outputs.
  float* swiglu = nullptr;
};

void Gemm(const GemmParams& p);

// Same shapes as GemmParams with BF16 X and W; products are exact in FP32 and summed in FP32.
struct GemmBf16Params {
  int64_t rows = 0;
  int64_t in = 0;
  int64_t out = 0;
  const Bf16* x = nullptr;  // [rows, in], row stride x_stride
  int64_t x_stride = 0;     // 0 means `in`
  const Bf16* w = nullptr;  // [out, in], contiguous
  float* y = nullptr;       // [rows, out], row stride y_stride
  int64_t y_stride = 0;     // 0 means `out`
  float beta = 0.0f;
};
void GemmBf16(const GemmBf16Params& p);

// out[i] = in[i] rounded to BF16, round to nearest even (NaN stays NaN).
struct ToBf16Params {
  int64_t count = 0;
  const float* in = nullptr;  // [count]
  Bf16* out = nullptr;        // [count]
};
void ToBf16(const ToBf16Params& p);

}  // namespace baton::kernels
