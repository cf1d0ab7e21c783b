#include "baton/kernels/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

// Many-row entries (prefill chunks) run tile by tile on GEMMs: the keys an entry can see are
// gathered once into contiguous buffers, then for each (tile of query rows, head) the scores
// are one sgemm per key source, masked to each row's visible range, softmaxed together, and
// multiplied into the values with two more sgemms. Same arithmetic as AttendRowHead up to
// summation order.
constexpr int64_t kTileRows = 64;
constexpr int64_t kTiledMinRows = 64;

struct GatheredKeys {
  std::vector<float> global_k, global_v;  // [n_global, kv_dim], positions 0..n_global-1
  std::vector<float> swa_k, swa_v;        // [n_swa, kv_dim], positions swa_begin..
  int64_t n_global = 0;
  int64_t swa_begin = 0;
  int64_t n_swa = 0;
};

GatheredKeys Gather(const AttentionParams& p) {
  GatheredKeys g;
  const int64_t kv_dim = p.num_kv_heads * p.head_dim;
  const int64_t last = p.positions[p.rows - 1];
  if (p.global != nullptr) {
    const BlockKvSource& src = *p.global;
    g.n_global = last + 1;
    g.global_k.resize(g.n_global * kv_dim);
    g.global_v.resize(g.n_global * kv_dim);
    for (int64_t start = 0; start < g.n_global; start += src.block_size) {
      const int64_t n = std::min(src.block_size, g.n_global - start);
      const float* page = src.pages[start / src.block_size];
      std::memcpy(g.global_k.data() + start * kv_dim, page + src.k_offset, n * kv_dim * 4);
      std::memcpy(g.global_v.data() + start * kv_dim, page + src.v_offset, n * kv_dim * 4);
    }
  }
  g.swa_begin = p.swa_lo[0];
  for (int64_t r = 0; r < p.rows; ++r) g.swa_begin = std::min<int64_t>(g.swa_begin, p.swa_lo[r]);
  g.n_swa = std::max<int64_t>(0, last + 1 - g.swa_begin);
  g.swa_k.resize(g.n_swa * kv_dim);
  g.swa_v.resize(g.n_swa * kv_dim);
  const SwaSource& swa = p.swa;
  for (int64_t i = 0; i < g.n_swa; ++i) {
    const int64_t j = g.swa_begin + i;
    const float* k = j >= swa.tail_start ? swa.tail_k + (j - swa.tail_start) * swa.tail_stride
                                         : swa.ring_k + (j % swa.ring_capacity) * kv_dim;
    const float* v = j >= swa.tail_start ? swa.tail_v + (j - swa.tail_start) * swa.tail_stride
                                         : swa.ring_v + (j % swa.ring_capacity) * kv_dim;
    std::memcpy(g.swa_k.data() + i * kv_dim, k, kv_dim * 4);
    std::memcpy(g.swa_v.data() + i * kv_dim, v, kv_dim * 4);
  }
  return g;
}

void AttendTile(const AttentionParams& p, const GatheredKeys& g, int64_t r0, int64_t head,
                std::vector<float>& scores) {
  const int64_t hd = p.head_dim, kv_dim = p.num_kv_heads * hd;
  const int64_t kv_col = head / (p.num_heads / p.num_kv_heads) * hd;
  const int64_t r1 = std::min(p.rows, r0 + kTileRows), n = r1 - r0;
  const int64_t last = p.positions[r1 - 1];
  const int64_t n_g = p.global != nullptr ? last + 1 : 0;
  int64_t lo_min = p.swa_lo[r0];
  for (int64_t r = r0; r < r1; ++r) lo_min = std::min<int64_t>(lo_min, p.swa_lo[r]);
  const int64_t n_s = std::max<int64_t>(0, last + 1 - lo_min);
  const int64_t ld = n_g + n_s;
  scores.resize(n * std::max<int64_t>(ld, 1));
  const float* q = p.q + r0 * p.q_stride + head * hd;
  float* out = p.out + r0 * p.num_heads * hd + head * hd;
  const int ldo = static_cast<int>(p.num_heads * hd);
  if (n_g > 0) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n_g, hd, p.scale, q, p.q_stride,
                g.global_k.data() + kv_col, kv_dim, 0.0f, scores.data(), ld);
  }
  const float* swa_k = g.swa_k.data() + (lo_min - g.swa_begin) * kv_dim + kv_col;
  const float* swa_v = g.swa_v.data() + (lo_min - g.swa_begin) * kv_dim + kv_col;
  if (n_s > 0) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n_s, hd, p.scale, q, p.q_stride, swa_k,
                kv_dim, 0.0f, scores.data() + n_g, ld);
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = p.positions[r0 + i], lo = p.swa_lo[r0 + i];
    float* row = scores.data() + i * ld;
    float max_score = -INFINITY;
    auto visible = [&](int64_t c) {
      return c < n_g ? c <= pos : (lo_min + c - n_g >= lo && lo_min + c - n_g <= pos);
    };
    for (int64_t c = 0; c < ld; ++c) {
      if (visible(c)) max_score = std::max(max_score, row[c]);
    }
    float total = 0.0f;
    for (int64_t c = 0; c < ld; ++c) {
      row[c] = visible(c) ? std::exp(row[c] - max_score) : 0.0f;
      total += row[c];
    }
    const float inv = total > 0 ? 1.0f / total : 0.0f;
    for (int64_t c = 0; c < ld; ++c) row[c] *= inv;
  }
  if (n_g > 0) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, n_g, 1.0f, scores.data(), ld,
                g.global_v.data() + kv_col, kv_dim, 0.0f, out, ldo);
  }
  if (n_s > 0) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, n_s, 1.0f, scores.data() + n_g,
                ld, swa_v, kv_dim, n_g > 0 ? 1.0f : 0.0f, out, ldo);
  }
  if (ld == 0) {
    for (int64_t i = 0; i < n; ++i) std::fill(out + i * ldo, out + i * ldo + hd, 0.0f);
  }
}

}  // namespace

void Attention(std::span<const AttentionParams> batch) {
  // Many-row entries on GEMM tiles; the rest (decode steps, short chunks) row by row.
  for (const AttentionParams& p : batch) {
    if (p.rows < kTiledMinRows) continue;
    const GatheredKeys keys = Gather(p);
    const int64_t tiles = (p.rows + kTileRows - 1) / kTileRows;
#pragma omp parallel
    {
      std::vector<float> scores;
#pragma omp for schedule(dynamic, 1) collapse(2)
      for (int64_t t = 0; t < tiles; ++t) {
        for (int64_t h = 0; h < p.num_heads; ++h) AttendTile(p, keys, t * kTileRows, h, scores);
      }
    }
  }
  // Flatten (entry, row, head) of the row-by-row entries so that the loop balances them.
  std::vector<int64_t> first_task(batch.size() + 1, 0);
  for (size_t e = 0; e < batch.size(); ++e) {
    const int64_t rows = batch[e].rows < kTiledMinRows ? batch[e].rows : 0;
    first_task[e + 1] = first_task[e] + rows * batch[e].num_heads;
  }
  const int64_t tasks = first_task.back();
  if (tasks == 0) return;
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
