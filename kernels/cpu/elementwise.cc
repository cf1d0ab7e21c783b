#include "baton/kernels/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "vector.h"

namespace baton::kernels {

void RmsNorm(const RmsNormParams& p) {
#pragma omp parallel for schedule(static) if (p.rows > 8)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.dim;
    float* out = p.out + r * p.dim;
    double sum = 0.0;
    for (int64_t i = 0; i < p.dim; ++i) sum += static_cast<double>(x[i]) * x[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(sum / p.dim + p.eps));
    for (int64_t i = 0; i < p.dim; ++i) out[i] = x[i] * inv * p.weight[i];
  }
}

void Rope(const RopeParams& p) {
  const int64_t half = p.head_dim / 2;
  std::vector<double> inv_freq(half);
  for (int64_t k = 0; k < half; ++k) {
    inv_freq[k] = std::pow(p.theta, -2.0 * static_cast<double>(k) / p.head_dim);
  }
#pragma omp parallel for schedule(static) if (p.rows > 8)
  for (int64_t r = 0; r < p.rows; ++r) {
    std::vector<float> cos_row(half), sin_row(half);
    for (int64_t k = 0; k < half; ++k) {
      const double angle = static_cast<double>(p.positions[r]) * inv_freq[k];
      cos_row[k] = static_cast<float>(std::cos(angle));
      sin_row[k] = static_cast<float>(std::sin(angle));
    }
    for (int64_t h = 0; h < p.heads; ++h) {
      float* x = p.x + r * p.stride + h * p.head_dim;
      for (int64_t k = 0; k < half; ++k) {
        const float a = x[k];
        const float b = x[k + half];
        x[k] = a * cos_row[k] - b * sin_row[k];
        x[k + half] = b * cos_row[k] + a * sin_row[k];
      }
    }
  }
}

namespace {

// out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + e^-gate[i]) * up[i], a register at a time.
struct SwiGluRow {
  template <CpuIsa kIsa>
  __attribute__((always_inline)) static void Run(const float* gate, const float* up, int64_t inter,
                                                 float* out) {
    constexpr int kW = kNativeWidth<kIsa>;
    using V = NativeVec<kW>;
    for (int64_t i = 0; i < inter; i += kW) {
      const int64_t count = std::min<int64_t>(kW, inter - i);
      V g = {}, u = {};
      LoadFirst<kW>(g, gate + i, count);
      LoadFirst<kW>(u, up + i, count);
      V e = -g;
      ExpOf<kW>(e);
      const V y = g / (1.0f + e) * u;
      StoreFirst<kW>(out + i, y, count);
    }
  }
};

}  // namespace

void SwiGlu(const SwiGluParams& p) {
#pragma omp parallel for schedule(static) if (p.rows > 8)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* gate = p.gate_up + r * 2 * p.inter;
    RunAtActiveIsa<SwiGluRow>(gate, gate + p.inter, p.inter, p.out + r * p.inter);
  }
}

void Embedding(const EmbeddingParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    std::memcpy(p.out + r * p.dim, p.table + static_cast<int64_t>(p.ids[r]) * p.dim,
                sizeof(float) * p.dim);
  }
}

}  // namespace baton::kernels
