#include "baton/kernels/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "baton/kernels/cpu_team.h"
#include "vector.h"

namespace baton::kernels {

namespace {

// fn(r) for every row: a decode step's few rows on the calling thread (handing them to the team
// costs more than they do), more rows over the team.
template <typename Fn>
void ForRows(int64_t rows, Fn&& fn) {
  if (rows <= 8) {
    for (int64_t r = 0; r < rows; ++r) fn(r);
    return;
  }
  ParallelForRanges(rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) fn(r);
  });
}

// One row of RMSNorm, a register at a time: the squares summed in the level's lanes (then the
// lanes in order), out = x * inv * weight.
struct RmsNormRow {
  template <CpuIsa kIsa>
  __attribute__((always_inline)) static void Run(const float* x, const float* weight,
                                                 int64_t dim, float eps, float* out) {
    constexpr int kW = kNativeWidth<kIsa>;
    using V = NativeVec<kW>;
    const int64_t whole = dim / kW * kW;
    V squares = {};
    for (int64_t i = 0; i < whole; i += kW) {
      V v;
      std::memcpy(&v, x + i, sizeof v);
      squares += v * v;
    }
    double sum = 0.0;
    for (int l = 0; l < kW; ++l) sum += squares[l];
    for (int64_t i = whole; i < dim; ++i) sum += static_cast<double>(x[i]) * x[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(sum / dim + eps));
    for (int64_t i = 0; i < whole; i += kW) {
      V v, w;
      std::memcpy(&v, x + i, sizeof v);
      std::memcpy(&w, weight + i, sizeof w);
      v = v * inv * w;
      std::memcpy(out + i, &v, sizeof v);
    }
    for (int64_t i = whole; i < dim; ++i) out[i] = x[i] * inv * weight[i];
  }
};

// The cos and sin of every position's angles (rounded to FP32 from double, as Hugging Face's
// cached tables are): a decode step calls Rope with the same positions for every layer, so the
// table of the last two position lists is kept per thread (the producers' and the consumers'),
// checked against the positions themselves.
struct RopeTable {
  std::vector<int32_t> positions;
  int64_t head_dim = 0;
  double theta = 0;
  std::vector<float> cos, sin;  // [rows, head_dim / 2]

  bool Holds(const RopeParams& p) const {
    return head_dim == p.head_dim && theta == p.theta &&
           positions.size() == static_cast<size_t>(p.rows) &&
           std::equal(positions.begin(), positions.end(), p.positions);
  }
  void Fill(const RopeParams& p) {
    const int64_t half = p.head_dim / 2;
    positions.assign(p.positions, p.positions + p.rows);
    head_dim = p.head_dim;
    theta = p.theta;
    cos.resize(p.rows * half);
    sin.resize(p.rows * half);
    std::vector<double> inv_freq(half);
    for (int64_t k = 0; k < half; ++k) {
      inv_freq[k] = std::pow(p.theta, -2.0 * static_cast<double>(k) / p.head_dim);
    }
    ForRows(p.rows, [&](int64_t r) {
      for (int64_t k = 0; k < half; ++k) {
        const double angle = static_cast<double>(p.positions[r]) * inv_freq[k];
        cos[r * half + k] = static_cast<float>(std::cos(angle));
        sin[r * half + k] = static_cast<float>(std::sin(angle));
      }
    });
  }
};

const RopeTable& TableFor(const RopeParams& p) {
  thread_local RopeTable tables[2];
  thread_local int last = 0;
  for (int i : {last, 1 - last}) {
    if (tables[i].Holds(p)) {
      last = i;
      return tables[i];
    }
  }
  last = 1 - last;  // the older of the two
  tables[last].Fill(p);
  return tables[last];
}

void RotateRow(const RopeParams& p, const RopeTable& table, int64_t r) {
  const int64_t half = p.head_dim / 2;
  const float* c = table.cos.data() + r * half;
  const float* s = table.sin.data() + r * half;
  for (int64_t h = 0; h < p.heads; ++h) {
    float* x = p.x + r * p.stride + h * p.head_dim;
    for (int64_t k = 0; k < half; ++k) {
      const float a = x[k];
      const float b = x[k + half];
      x[k] = a * c[k] - b * s[k];
      x[k + half] = b * c[k] + a * s[k];
    }
  }
}

}  // namespace

void RmsNorm(const RmsNormParams& p) {
  ForRows(p.rows, [&](int64_t r) {
    RunAtActiveIsa<RmsNormRow>(p.x + r * p.dim, p.weight, p.dim, p.eps, p.out + r * p.dim);
  });
}

void Rope(const RopeParams& p) {
  if (p.rows == 0) return;
  const RopeTable& table = TableFor(p);
  ForRows(p.rows, [&](int64_t r) { RotateRow(p, table, r); });
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
  ForRows(p.rows, [&](int64_t r) {
    const float* gate = p.gate_up + r * 2 * p.inter;
    RunAtActiveIsa<SwiGluRow>(gate, gate + p.inter, p.inter, p.out + r * p.inter);
  });
}

void Embedding(const EmbeddingParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    std::memcpy(p.out + r * p.dim, p.table + static_cast<int64_t>(p.ids[r]) * p.dim,
                sizeof(float) * p.dim);
  }
}

}  // namespace baton::kernels
