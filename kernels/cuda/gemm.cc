// GEMM on cuBLAS. cuBLAS is column-major: row-major Y [rows, out] is column-major Y^T
// [out, rows] with leading dimension y_stride, and Y^T = W X^T, where the Linear weight
// W [out, in] (row-major) is column-major [in, out] taken transposed, and X [rows, in] is
// column-major X^T [in, rows] taken as is.
#include "baton/kernels/cuda/ops.h"
#include "context_impl.h"

namespace baton::kernels::cuda {
namespace {

void GemmEx(Context& ctx, int64_t rows, int64_t in, int64_t out, const void* x, int64_t x_stride,
            const void* w, float* y, int64_t y_stride, float beta, cudaDataType_t input_type,
            const char* what) {
  if (rows == 0 || out == 0) return;
  const float alpha = 1.0f;
  Context::Impl& impl = ctx.impl();
  impl.Check(
      cublasGemmEx(impl.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out),
                   static_cast<int>(rows), static_cast<int>(in), &alpha, w, input_type,
                   static_cast<int>(in), x, input_type, static_cast<int>(x_stride ? x_stride : in),
                   &beta, y, CUDA_R_32F, static_cast<int>(y_stride ? y_stride : out),
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      what);
}

}  // namespace

void Gemm(Context& ctx, const GemmParams& p) {
  GemmEx(ctx, p.rows, p.in, p.out, p.x, p.x_stride, p.w, p.y, p.y_stride, p.beta, CUDA_R_32F,
         "cublasGemmEx (FP32)");
}

void GemmBf16(Context& ctx, const GemmBf16Params& p) {
  GemmEx(ctx, p.rows, p.in, p.out, p.x, p.x_stride, p.w, p.y, p.y_stride, p.beta, CUDA_R_16BF,
         "cublasGemmEx (BF16 in, FP32 accumulate)");
}

}  // namespace baton::kernels::cuda
