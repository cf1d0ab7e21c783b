#include "baton/kernels/gemm.h"

#include <cblas.h>

namespace baton::kernels {

void Gemm(const GemmParams& p) {
  if (p.rows == 0 || p.out == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(p.rows),
              static_cast<int>(p.out), static_cast<int>(p.in), 1.0f, p.x,
              static_cast<int>(p.x_stride ? p.x_stride : p.in), p.w, static_cast<int>(p.in), p.beta,
              p.y, static_cast<int>(p.y_stride ? p.y_stride : p.out));
}

}  // namespace baton::kernels
