#include "baton/kernels/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "vector.h"

namespace baton::kernels {
namespace {

// Sixteen independent partial sums: the compiler turns the inner loop into vector FMAs, where
// one running sum would make every product wait for the one before it.
inline float Dot(const float* a, const float* b, int64_t n) {
  constexpr int64_t kLanes = 16;
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += a[i + l] * b[i + l];
  }
  float sum = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) sum += lanes[l];
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Keys whose value rows one pass keeps in L1 (64 rows of head_dim 128 are 32 KiB).
constexpr int64_t kValueBlock = 64;

// q . k for a head_dim known at compile time, in vector registers.
template <int64_t kHd>
inline float DotHd(const float* q, const float* k) {
  static_assert(kHd % 16 == 0);
  Vec16 acc = {};
  for (int64_t v = 0; v < kHd / 16; ++v) {
    Vec16 a, b;
    std::memcpy(&a, q + 16 * v, sizeof a);
    std::memcpy(&b, k + 16 * v, sizeof b);
    acc += a * b;
  }
  return SumLanes(acc);
}

// o += sum_{j in [j0, j1)} s[j] * values[j], for a head_dim known at compile time: the row is
// accumulated in registers across the keys and stored once.
template <int64_t kHd>
inline void AccumulateValues(const float* s, const float* const* values, int64_t j0, int64_t j1,
                             float* o) {
  static_assert(kHd % 16 == 0);
  constexpr int64_t kVecs = kHd / 16;
  Vec16 acc[kVecs];
  std::memcpy(acc, o, sizeof acc);
  for (int64_t j = j0; j < j1; ++j) {
    const Vec16 w = Vec16{} + s[j];
    for (int64_t v = 0; v < kVecs; ++v) {
      Vec16 x;
      std::memcpy(&x, values[j] + 16 * v, sizeof x);
      acc[v] += w * x;
    }
  }
  std::memcpy(o, acc, sizeof acc);
}

// One (row, kv head): the G = H / Hkv query heads that share the kv head, over global keys
// [0, pos] then SWA keys [lo, pos], one softmax per head. Each key and value row is read once
// for all G heads (grouped-query attention), so a decode step reads a request's KV once per
// layer instead of once per query head.
BATON_VECTOR_CLONES void AttendRowGroup(const AttentionParams& p, int64_t row, int64_t kv_head,
                                        std::vector<float>& score,
                                        std::vector<const float*>& values) {
  const int64_t hd = p.head_dim;
  const int64_t kv_dim = p.num_kv_heads * hd;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t kv_col = kv_head * hd;
  const int64_t pos = p.positions[row];
  const int64_t lo = p.swa_lo[row];
  const int64_t num_global = p.global != nullptr ? pos + 1 : 0;
  const int64_t num_swa = std::max<int64_t>(0, pos + 1 - lo);
  const int64_t n = num_global + num_swa;
  score.resize(group * n);  // [group, n]

  const SwaSource& swa = p.swa;
  // Key (or value) j of the n visible ones: global positions first, then SWA from lo.
  auto key_row = [&](int64_t j, bool value) {
    if (j < num_global) {
      const BlockKvSource& g = *p.global;
      return g.pages[j / g.block_size] + (value ? g.v_offset : g.k_offset) +
             (j % g.block_size) * kv_dim + kv_col;
    }
    const int64_t at = lo + j - num_global;
    if (at >= swa.tail_start) {
      return (value ? swa.tail_v : swa.tail_k) + (at - swa.tail_start) * swa.tail_stride + kv_col;
    }
    return (value ? swa.ring_v : swa.ring_k) + (at % swa.ring_capacity) * kv_dim + kv_col;
  };

  const float* q = p.q + row * p.q_stride + kv_head * group * hd;  // the group's heads, in a row
  for (int64_t j = 0; j < n; ++j) {
    const float* k = key_row(j, false);
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = q + g * hd;
      const float dot = hd == 64    ? DotHd<64>(qg, k)
                        : hd == 128 ? DotHd<128>(qg, k)
                                    : Dot(qg, k, hd);
      score[g * n + j] = dot * p.scale;
    }
  }
  float* out = p.out + row * p.num_heads * hd + kv_head * group * hd;
  std::fill(out, out + group * hd, 0.0f);
  if (n == 0) return;  // no visible key: the output rows are zero
  for (int64_t g = 0; g < group; ++g) {
    float* s = score.data() + g * n;
    const float max_score = *std::max_element(s, s + n);
    float total = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = std::exp(s[j] - max_score);
      total += s[j];
    }
    const float inv_total = 1.0f / total;
    for (int64_t j = 0; j < n; ++j) s[j] *= inv_total;
  }
  // out[g] = sum_j s[g][j] v_j over blocks of keys whose values stay in L1 while every head of
  // the group reads them; keys are summed in order, as the definition reads.
  values.resize(n);
  for (int64_t j = 0; j < n; ++j) values[j] = key_row(j, true);
  for (int64_t j0 = 0; j0 < n; j0 += kValueBlock) {
    const int64_t j1 = std::min(n, j0 + kValueBlock);
    for (int64_t g = 0; g < group; ++g) {
      const float* s = score.data() + g * n;
      float* o = out + g * hd;
      switch (hd) {
        case 64:
          AccumulateValues<64>(s, values.data(), j0, j1, o);
          break;
        case 128:
          AccumulateValues<128>(s, values.data(), j0, j1, o);
          break;
        default:
          for (int64_t j = j0; j < j1; ++j) {
            for (int64_t i = 0; i < hd; ++i) o[i] += s[j] * values[j][i];
          }
      }
    }
  }
}

// Many-row entries (prefill chunks) run tile by tile on GEMMs: the keys an entry can see are
// gathered once into contiguous buffers, then for each (tile of query rows, head) the scores
// are one sgemm per key source, masked to each row's visible range, softmaxed together, and
// multiplied into the values with two more sgemms. Same arithmetic as AttendRowGroup up to
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
  // Flatten (entry, row, kv head) of the row-by-row entries so that the loop balances them.
  std::vector<int64_t> first_task(batch.size() + 1, 0);
  for (size_t e = 0; e < batch.size(); ++e) {
    const int64_t rows = batch[e].rows < kTiledMinRows ? batch[e].rows : 0;
    first_task[e + 1] = first_task[e] + rows * batch[e].num_kv_heads;
  }
  const int64_t tasks = first_task.back();
  if (tasks == 0) return;
#pragma omp parallel
  {
    std::vector<float> score;
    std::vector<const float*> values;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const size_t e = static_cast<size_t>(
          std::upper_bound(first_task.begin(), first_task.end(), t) - first_task.begin() - 1);
      const AttentionParams& p = batch[e];
      const int64_t local = t - first_task[e];
      AttendRowGroup(p, local / p.num_kv_heads, local % p.num_kv_heads, score, values);
    }
  }
}

}  // namespace baton::kernels
