#include "baton/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace baton::kernels {
namespace {

inline float Dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

inline void Axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// One (row, head): scores over global keys [0, pos] then SWA keys [lo, pos], one softmax.
void AttendRowHead(const AttentionParams& p, int64_t row, int64_t head, std::vector<float>& score) {
  const int64_t hd = p.head_dim;
  const int64_t kv_dim = p.num_kv_heads * hd;
  const int64_t kv_head = head / (p.num_heads / p.num_kv_heads);
  const int64_t kv_col = kv_head * hd;
  const int64_t pos = p.positions[row];
  const int64_t lo = p.swa_lo[row];
  const float* q = p.q + row * p.q_stride + head * hd;
  const int64_t num_global = p.global != nullptr ? pos + 1 : 0;
  const int64_t num_swa = std::max<int64_t>(0, pos + 1 - lo);
  score.resize(num_global + num_swa);

  const SwaSource& swa = p.swa;
  auto swa_k = [&](int64_t j) {
    return j >= swa.tail_start ? swa.tail_k + (j - swa.tail_start) * swa.tail_stride + kv_col
                               : swa.ring_k + (j % swa.ring_capacity) * kv_dim + kv_col;
  };
  auto swa_v = [&](int64_t j) {
    return j >= swa.tail_start ? swa.tail_v + (j - swa.tail_start) * swa.tail_stride + kv_col
                               : swa.ring_v + (j % swa.ring_capacity) * kv_dim + kv_col;
  };
  auto global_row = [&](int64_t j, int64_t offset) {
    const BlockKvSource& g = *p.global;
    return g.pages[j / g.block_size] + offset + (j % g.block_size) * kv_dim + kv_col;
  };

  float max_score = -INFINITY;
  for (int64_t j = 0; j < num_global; ++j) {
    score[j] = Dot(q, global_row(j, p.global->k_offset), hd) * p.scale;
    max_score = std::max(max_score, score[j]);
  }
  for (int64_t j = 0; j < num_swa; ++j) {
    float& s = score[num_global + j];
    s = Dot(q, swa_k(lo + j), hd) * p.scale;
    max_score = std::max(max_score, s);
  }
  float* out = p.out + row * p.num_heads * hd + head * hd;
  std::fill(out, out + hd, 0.0f);
  if (score.empty()) return;  // no visible key: the output row is zero
  float total = 0.0f;
  for (float& s : score) {
    s = std::exp(s - max_score);
    total += s;
  }
  const float inv_total = 1.0f / total;
  for (int64_t j = 0; j < num_global; ++j) {
    Axpy(score[j] * inv_total, global_row(j, p.global->v_offset), out, hd);
  }
  for (int64_t j = 0; j < num_swa; ++j) {
    Axpy(score[num_global + j] * inv_total, swa_v(lo + j), out, hd);
  }
}

}  // namespace

void Attention(std::span<const AttentionParams> batch) {
  // Flatten (entry, row, head) so that the parallel loop balances across all of them.
  std::vector<int64_t> first_task(batch.size() + 1, 0);
  for (size_t e = 0; e < batch.size(); ++e) {
    first_task[e + 1] = first_task[e] + batch[e].rows * batch[e].num_heads;
  }
  const int64_t tasks = first_task.back();
#pragma omp parallel
  {
    std::vector<float> score;
#pragma omp for schedule(dynamic, 4)
    for (int64_t t = 0; t < tasks; ++t) {
      const size_t e = static_cast<size_t>(
          std::upper_bound(first_task.begin(), first_task.end(), t) - first_task.begin() - 1);
      const AttentionParams& p = batch[e];
      const int64_t local = t - first_task[e];
      AttendRowHead(p, local / p.num_heads, local % p.num_heads, score);
    }
  }
}

}  // namespace baton::kernels
