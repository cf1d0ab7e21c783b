#include "baton/kernels/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "baton/kernels/cpu_team.h"
#include "vector.h"

namespace baton::kernels {
namespace {

// Sixteen independent partial sums: the compiler turns the inner loop into vector FMAs, where
// one running sum would make every product wait for the one before it.
__attribute__((always_inline)) inline float Dot(const float* a, const float* b, int64_t n) {
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

// o_h += sum_{j in [j0, j1)} s_h[j] * values[j] for kHeads heads h (their weights `s_stride`
// apart, their outputs `o_stride` apart), for a head_dim known at compile time, in native vectors
// of kW floats: the rows are accumulated in registers across the keys and stored once, and each
// value row is loaded once for all kHeads heads. `column` is where in each value row the kHd
// columns start: a wide row is accumulated in parts where the level's registers cannot hold it
// whole. Each head sums its keys in order, however many heads share the pass.
template <int64_t kHd, int kW, int kHeads>
__attribute__((always_inline)) inline void AccumulateValues(const float* s, int64_t s_stride,
                                                            const float* const* values, int64_t j0,
                                                            int64_t j1, float* o, int64_t o_stride,
                                                            int64_t column) {
  using V = NativeVec<kW>;
  static_assert(kHd % kW == 0);
  constexpr int64_t kVecs = kHd / kW;
  V acc[kHeads][kVecs];
#pragma GCC unroll 4
  for (int h = 0; h < kHeads; ++h) std::memcpy(acc[h], o + h * o_stride, sizeof acc[h]);
  for (int64_t j = j0; j < j1; ++j) {
    V x[kVecs];
#pragma GCC unroll 16
    for (int64_t v = 0; v < kVecs; ++v)
      std::memcpy(&x[v], values[j] + column + kW * v, sizeof x[v]);
#pragma GCC unroll 4
    for (int h = 0; h < kHeads; ++h) {
      const float w = s[h * s_stride + j];
#pragma GCC unroll 16
      for (int64_t v = 0; v < kVecs; ++v) acc[h][v] += w * x[v];
    }
  }
#pragma GCC unroll 4
  for (int h = 0; h < kHeads; ++h) std::memcpy(o + h * o_stride, acc[h], sizeof acc[h]);
}

// AccumulateValues over kHeads heads of kHd columns, in parts of at most kPart columns (what the
// level's registers hold): kPart columns at a time, then the rest.
template <int64_t kHd, int kW, int64_t kPart, int kHeads>
__attribute__((always_inline)) inline void AccumulateHead(const float* s, int64_t s_stride,
                                                          const float* const* values, int64_t j0,
                                                          int64_t j1, float* o, int64_t o_stride,
                                                          int64_t column = 0) {
  constexpr int64_t kFirst = kHd < kPart ? kHd : kPart;
  AccumulateValues<kFirst, kW, kHeads>(s, s_stride, values, j0, j1, o, o_stride, column);
  if constexpr (kHd > kFirst) {
    AccumulateHead<kHd - kFirst, kW, kPart, kHeads>(s, s_stride, values, j0, j1, o + kFirst,
                                                    o_stride, column + kFirst);
  }
}

// Swaps bit kBit of the row index with bit kBit of the lane index between rows a and c (row a
// has the bit clear, row c = a + kBit): one level of a kW x kW transpose.
template <int kBit, int kW, size_t... L>
__attribute__((always_inline)) inline void SwapIndexBit(NativeVec<kW>& a, NativeVec<kW>& c,
                                                        std::index_sequence<L...>) {
  const NativeVec<kW> lo = __builtin_shufflevector(a, c, ((L & kBit) ? kW + L - kBit : L)...);
  const NativeVec<kW> hi = __builtin_shufflevector(a, c, ((L & kBit) ? kW + L : L + kBit)...);
  a = lo;
  c = hi;
}

template <int kBit, int kW>
__attribute__((always_inline)) inline void TransposeLevel(NativeVec<kW> (&r)[kW]) {
  if constexpr (kBit >= 1) {
#pragma GCC unroll 16
    for (int i = 0; i < kW; ++i) {
      if ((i & kBit) == 0) {
        SwapIndexBit<kBit, kW>(r[i], r[i + kBit], std::make_index_sequence<kW>{});
      }
    }
    TransposeLevel<kBit / 2, kW>(r);
  }
}

// keys_t[d * kW + i] = keys[i][d] for d < hd (a multiple of kW): a block of kW key rows turned
// into one vector per dimension, kW x kW at a time in the level's registers.
template <int kW>
__attribute__((always_inline)) inline void TransposeKeys(const float* const* keys, int64_t hd,
                                                         float* keys_t) {
  for (int64_t c = 0; c < hd; c += kW) {
    NativeVec<kW> r[kW];
#pragma GCC unroll 16
    for (int i = 0; i < kW; ++i) std::memcpy(&r[i], keys[i] + c, sizeof r[i]);
    TransposeLevel<kW / 2, kW>(r);
    std::memcpy(keys_t + c * kW, r, sizeof r);
  }
}

// Scores of one block of kW keys for kHeads query heads (q: their rows, hd apart): each head's
// kW dots advance one dimension per vector FMA, so no dot ends in a horizontal sum. Each dot sums
// its dimensions in the same order whatever the batch; with fewer than 4 heads, kSplit partial
// sums per head keep enough FMAs in flight. Writes `count` scores per head to s (rows n apart).
template <int kHeads, int kW>
__attribute__((always_inline)) inline void ScoreBlock(const float* q, int64_t hd,
                                                      const float* keys_t, float scale, float* s,
                                                      int64_t n, int64_t count) {
  using V = NativeVec<kW>;
  constexpr int kSplit = kHeads >= 4 ? 1 : 4 / kHeads;
  V acc[kHeads][kSplit] = {};
  for (int64_t d = 0; d < hd; d += kSplit) {
#pragma GCC unroll 4
    for (int sp = 0; sp < kSplit; ++sp) {
      V k;
      std::memcpy(&k, keys_t + (d + sp) * kW, sizeof k);
#pragma GCC unroll 8
      for (int h = 0; h < kHeads; ++h) acc[h][sp] += q[h * hd + d + sp] * k;
    }
  }
#pragma GCC unroll 8
  for (int h = 0; h < kHeads; ++h) {
    V total = acc[h][0];
    for (int sp = 1; sp < kSplit; ++sp) total += acc[h][sp];
    total *= scale;
    StoreFirst<kW>(s + h * n, total, count);
  }
}

// s[j] = e^(s[j] - shift) over [0, n), kW lanes at a time; returns their sum.
template <int kW>
__attribute__((always_inline)) inline float ExpShiftedSum(float* s, int64_t n, float shift) {
  using V = NativeVec<kW>;
  V sum = {};
  for (int64_t j = 0; j < n; j += kW) {
    const int64_t count = std::min<int64_t>(kW, n - j);
    V x = V{} + shift;  // lanes past the last score are e^0, kept out of the sum
    LoadFirst<kW>(x, s + j, count);
    x -= shift;
    ExpOf<kW>(x);
    for (int64_t l = count; l < kW; ++l) x[l] = 0.0f;
    sum += x;
    StoreFirst<kW>(s + j, x, count);
  }
  float total = 0.0f;
  for (int l = 0; l < kW; ++l) total += sum[l];
  return total;
}

// One block of a row's scores into its running softmax (FlashAttention's online softmax): the
// `n` scores become e^(score - max), with max the row's largest score so far; where that max
// grew, the row's output so far (`hd` floats) and its sum are scaled down to it first.
template <int kW>
__attribute__((always_inline)) inline void FoldIntoRunningSoftmax(float* score, int64_t n,
                                                                  float& max, float& total,
                                                                  float* out, int64_t hd) {
  using V = NativeVec<kW>;
  V lanes = V{} - INFINITY;
  int64_t c = 0;
  for (; c + kW <= n; c += kW) {
    V x;
    std::memcpy(&x, score + c, sizeof x);
    lanes = x > lanes ? x : lanes;
  }
  float top = max;
  for (int l = 0; l < kW; ++l) top = std::max(top, lanes[l]);
  for (; c < n; ++c) top = std::max(top, score[c]);
  const float shrink = std::exp(max - top);  // 0 at the row's first keys
  const float sum = ExpShiftedSum<kW>(score, n, top);
  if (shrink != 1.0f) {
    for (int64_t d = 0; d < hd; ++d) out[d] *= shrink;
  }
  total = total * shrink + sum;
  max = top;
}

// One split of a (row, kv head)'s keys, for a merge after every split is done: each head's
// output over the split's keys weighted by e^(score - max) (not yet divided by their sum), the
// max and the sum.
struct SplitResult {
  float* out = nullptr;    // [group, head_dim]
  float* max = nullptr;    // [group]
  float* total = nullptr;  // [group]
};

// What one task reuses across its (row, kv head) pairs.
struct RowScratch {
  std::vector<float> score;                // [group, n]
  std::vector<const float*> keys, values;  // the n visible rows, in visiting order
  std::vector<float> keys_t;               // [head_dim, kW]: one block of keys, transposed
  std::vector<float> max, total;           // [group]: each head's running softmax
};

// One (row, kv head): the G = H / Hkv query heads that share the kv head, over global keys
// [0, pos] then SWA keys [lo, pos], one softmax per head. Each key and value row is read once
// for all G heads (grouped-query attention), so a decode step reads a request's KV once per
// layer instead of once per query head.
// The level's shape: kW lanes per vector (its register width: a block of kW keys is transposed
// in kW registers, and its scores are one vector per head), kMaxHeads heads of a group scored at
// once and kWholeHd the widest head_dim whose values accumulate whole, within the registers:
// AVX-512 holds 8 heads' scores or 128 columns in 8 of its 32 registers of 16; AVX2 holds 4
// heads (with a split of their sums) or 64 columns in 8 of its 16 registers of 8. kRegisters,
// the register file, bounds how many heads accumulate their values together.
template <CpuIsa kIsa>
struct AttendShape;
template <>
struct AttendShape<CpuIsa::kAvx512> {
  static constexpr int kW = 16, kMaxHeads = 8, kWholeHd = 128, kRegisters = 32;
};
template <>
struct AttendShape<CpuIsa::kAvx2> {
  static constexpr int kW = 8, kMaxHeads = 4, kWholeHd = 64, kRegisters = 16;
};
template <>
struct AttendShape<CpuIsa::kBaseline> {
  static constexpr int kW = 4, kMaxHeads = 4, kWholeHd = 32, kRegisters = 16;
};

struct AttendRowGroup {
  // Visible keys [a, b) of (row, kv column `kv_col`), in visiting order, into `scratch`: the
  // visible keys are global positions [0, num_global) out of their pages, then SWA positions
  // [lo, pos] from the ring (slot = position % C) and then the tail.
  __attribute__((always_inline)) static void GatherRows(const AttentionParams& p, int64_t row,
                                                        int64_t kv_col, int64_t num_global,
                                                        int64_t a, int64_t b, RowScratch& scratch) {
    const int64_t kv_dim = p.num_kv_heads * p.head_dim;
    const int64_t lo = p.swa_lo[row];
    scratch.keys.resize(b - a);
    scratch.values.resize(b - a);
    const float** keys = scratch.keys.data();
    const float** values = scratch.values.data();
    int64_t j = a;
    if (j < num_global) {
      const BlockKvSource& g = *p.global;
      for (const int64_t stop = std::min(b, num_global); j < stop;) {
        const float* rows = g.pages[j / g.block_size] + kv_col;
        const int64_t first = j % g.block_size;
        const int64_t count = std::min(g.block_size - first, stop - j);
        for (int64_t i = first; i < first + count; ++i, ++j) {
          keys[j - a] = rows + g.k_offset + i * kv_dim;
          values[j - a] = rows + g.v_offset + i * kv_dim;
        }
      }
    }
    const SwaSource& swa = p.swa;
    for (; j < b; ++j) {
      const int64_t at = lo + (j - num_global);
      if (at >= swa.tail_start) {
        keys[j - a] = swa.tail_k + (at - swa.tail_start) * swa.tail_stride + kv_col;
        values[j - a] = swa.tail_v + (at - swa.tail_start) * swa.tail_stride + kv_col;
      } else {
        const int64_t slot = at % swa.ring_capacity;
        keys[j - a] = swa.ring_k + slot * kv_dim + kv_col;
        values[j - a] = swa.ring_v + slot * kv_dim + kv_col;
      }
    }
  }

  // The scores of the group's heads `q` against the n `keys`, scaled, into scratch.score
  // ([group, n]).
  template <CpuIsa kIsa>
  __attribute__((always_inline)) static void Score(const AttentionParams& p, const float* q,
                                                   const float** keys, int64_t n, int64_t group,
                                                   RowScratch& scratch) {
    using Shape = AttendShape<kIsa>;
    const int64_t hd = p.head_dim;
    std::vector<float>& score = scratch.score;
    score.resize(group * n);  // [group, n]
    constexpr int kW = Shape::kW;
    if (hd % kW == 0) {
      // Blocks of kW keys, transposed once for every head of the group.
      scratch.keys_t.resize(hd * kW);
      for (int64_t j0 = 0; j0 < n; j0 += kW) {
        const int64_t count = std::min<int64_t>(kW, n - j0);
        const float* block[kW];
        for (int64_t i = 0; i < kW; ++i) block[i] = keys[j0 + std::min(i, count - 1)];
        // The next block's key rows, asked for while this block computes (about 0.9x the
        // attention's time in a decode batch of 32).
        for (int64_t i = j0 + kW; i < std::min<int64_t>(n, j0 + 2 * kW); ++i) {
          for (int64_t c = 0; c < hd; c += 16) __builtin_prefetch(keys[i] + c, 0, 3);
        }
        TransposeKeys<kW>(block, hd, scratch.keys_t.data());
        const float* kt = scratch.keys_t.data();
        float* s = score.data() + j0;
        int64_t g = 0;
        if constexpr (Shape::kMaxHeads >= 8) {
          for (; g + 8 <= group; g += 8)
            ScoreBlock<8, kW>(q + g * hd, hd, kt, p.scale, s + g * n, n, count);
        }
        for (; g + 4 <= group; g += 4)
          ScoreBlock<4, kW>(q + g * hd, hd, kt, p.scale, s + g * n, n, count);
        for (; g + 2 <= group; g += 2)
          ScoreBlock<2, kW>(q + g * hd, hd, kt, p.scale, s + g * n, n, count);
        for (; g < group; ++g) ScoreBlock<1, kW>(q + g * hd, hd, kt, p.scale, s + g * n, n, count);
      }
    } else {
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t g = 0; g < group; ++g)
          score[g * n + j] = Dot(q + g * hd, keys[j], hd) * p.scale;
      }
    }
  }

  // out[g] += the group's weights `score` ([group, n]) times the n `values`.
  template <CpuIsa kIsa>
  __attribute__((always_inline)) static void AccumulateValues(const float* score,
                                                              const float** values, int64_t n,
                                                              int64_t group, int64_t hd,
                                                              float* out) {
    using Shape = AttendShape<kIsa>;
    // out[g] = sum_j s[g][j] v_j over blocks of keys whose values stay in L1 while every head of
    // the group reads them; keys are summed in order, as the definition reads. A head_dim wider
    // than the level's registers hold accumulates in parts of kWholeHd columns, and as many
    // heads as the registers hold accumulate together, each value row loaded once for them.
    for (int64_t j0 = 0; j0 < n; j0 += kValueBlock) {
      const int64_t j1 = std::min(n, j0 + kValueBlock);
      switch (hd) {
        case 32:
          AccumulateGroup<32, Shape>(score, values, n, j0, j1, group, out);
          break;
        case 64:
          AccumulateGroup<64, Shape>(score, values, n, j0, j1, group, out);
          break;
        case 96:
          AccumulateGroup<96, Shape>(score, values, n, j0, j1, group, out);
          break;
        case 128:
          AccumulateGroup<128, Shape>(score, values, n, j0, j1, group, out);
          break;
        case 256:
          AccumulateGroup<256, Shape>(score, values, n, j0, j1, group, out);
          break;
        default:
          for (int64_t g = 0; g < group; ++g) {
            for (int64_t j = j0; j < j1; ++j) {
              for (int64_t i = 0; i < hd; ++i) out[g * hd + i] += score[g * n + j] * values[j][i];
            }
          }
      }
    }
  }

  // The group's heads over keys [j0, j1) for a head_dim of kHd: kHeads at a time, where kHeads
  // heads' accumulators and one value row fit the level's registers beside the weight.
  template <int64_t kHd, typename Shape>
  __attribute__((always_inline)) static void AccumulateGroup(const float* score,
                                                             const float** values, int64_t n,
                                                             int64_t j0, int64_t j1, int64_t group,
                                                             float* out) {
    constexpr int kW = Shape::kW;
    constexpr int64_t kPart = Shape::kWholeHd;
    constexpr int64_t kVecs = (kHd < kPart ? kHd : kPart) / kW;
    constexpr int kHeads = Shape::kRegisters / kVecs - 1 >= 4   ? 4
                           : Shape::kRegisters / kVecs - 1 >= 2 ? 2
                                                                : 1;
    int64_t g = 0;
    if constexpr (kHeads > 1) {
      for (; g + kHeads <= group; g += kHeads) {
        AccumulateHead<kHd, kW, kPart, kHeads>(score + g * n, n, values, j0, j1, out + g * kHd,
                                               kHd);
      }
    }
    for (; g < group; ++g) {
      AccumulateHead<kHd, kW, kPart, 1>(score + g * n, n, values, j0, j1, out + g * kHd, kHd);
    }
  }

  // The keys one pass scores, folds into the running softmax and multiplies into the values:
  // their scores ([group, kChunk]: 4 KiB at 8 heads) stay in L1, and their key and value rows
  // (32 KiB each at head_dim 64) in L2.
  static constexpr int64_t kChunk = 128;

  // Asks for the key and value rows of the global keys among [a, b), so that a long context
  // streams from memory under the arithmetic instead of between it.
  __attribute__((always_inline)) static void PrefetchChunk(const AttentionParams& p, int64_t kv_col,
                                                           int64_t num_global, int64_t a,
                                                           int64_t b) {
    if (a >= std::min(b, num_global)) return;  // the window's keys are few and already near
    const BlockKvSource& g = *p.global;
    const int64_t kv_dim = p.num_kv_heads * p.head_dim, bytes = p.head_dim * 4;
    for (int64_t j = a; j < std::min(b, num_global); ++j) {
      const float* rows = g.pages[j / g.block_size] + kv_col + (j % g.block_size) * kv_dim;
      for (int64_t c = 0; c < bytes; c += 64) {
        __builtin_prefetch(reinterpret_cast<const char*>(rows + g.k_offset) + c, 0, 2);
        __builtin_prefetch(reinterpret_cast<const char*>(rows + g.v_offset) + c, 0, 2);
      }
    }
  }

  template <CpuIsa kIsa>
  __attribute__((always_inline)) static void Run(const AttentionParams& p, int64_t row,
                                                 int64_t kv_head, int64_t split, int64_t splits,
                                                 const SplitResult* result, RowScratch& scratch) {
    constexpr int kW = AttendShape<kIsa>::kW;
    const int64_t hd = p.head_dim;
    const int64_t group = p.num_heads / p.num_kv_heads;
    const int64_t pos = p.positions[row];
    const int64_t num_global = p.global != nullptr ? pos + 1 : 0;
    const int64_t visible = num_global + std::max<int64_t>(0, pos + 1 - p.swa_lo[row]);
    // This split's keys [k0, k1) of the visible ones (all of them unless the keys are split).
    const int64_t k0 = visible * split / splits, k1 = visible * (split + 1) / splits;
    const float* q = p.q + row * p.q_stride + kv_head * group * hd;  // the group's heads, in a row
    float* out =
        result != nullptr ? result->out : p.out + row * p.num_heads * hd + kv_head * group * hd;
    std::fill(out, out + group * hd, 0.0f);
    scratch.max.assign(group, -INFINITY);
    scratch.total.assign(group, 0.0f);
    // The keys a chunk at a time under each head's running softmax; the rows three chunks ahead
    // are asked for while this one computes.
    for (int64_t a = k0; a < k1; a += kChunk) {
      const int64_t b = std::min(k1, a + kChunk), n = b - a;
      PrefetchChunk(p, kv_head * hd, num_global, std::min(k1, b + 2 * kChunk),
                    std::min(k1, b + 3 * kChunk));
      GatherRows(p, row, kv_head * hd, num_global, a, b, scratch);
      Score<kIsa>(p, q, scratch.keys.data(), n, group, scratch);
      for (int64_t g = 0; g < group; ++g) {
        FoldIntoRunningSoftmax<kW>(scratch.score.data() + g * n, n, scratch.max[g],
                                   scratch.total[g], out + g * hd, hd);
      }
      AccumulateValues<kIsa>(scratch.score.data(), scratch.values.data(), n, group, hd, out);
    }
    if (result != nullptr) {  // the split's maxima and sums, for the merge (-inf and 0: no key)
      std::copy_n(scratch.max.data(), group, result->max);
      std::copy_n(scratch.total.data(), group, result->total);
      return;
    }
    for (int64_t g = 0; g < group; ++g) {
      const float inv = scratch.total[g] > 0 ? 1.0f / scratch.total[g] : 0.0f;  // none visible: 0
      for (int64_t d = 0; d < hd; ++d) out[g * hd + d] *= inv;
    }
  }
};

// Pair `local` (row, kv head) of `p` from its `splits` results (`result_of(split)`):
// out = sum_s e^(max_s - M) out_s / sum_s e^(max_s - M) total_s, M the largest max_s.
template <typename ResultOf>
void MergeSplits(const AttentionParams& p, int64_t local, int64_t splits,
                 const ResultOf& result_of) {
  const int64_t row = local / p.num_kv_heads, kv_head = local % p.num_kv_heads;
  const int64_t group = p.num_heads / p.num_kv_heads, hd = p.head_dim;
  float* out = p.out + row * p.num_heads * hd + kv_head * group * hd;
  for (int64_t g = 0; g < group; ++g) {
    float top = -INFINITY;
    for (int64_t split = 0; split < splits; ++split) top = std::max(top, result_of(split).max[g]);
    float* o = out + g * hd;
    std::fill(o, o + hd, 0.0f);
    if (top == -INFINITY) continue;  // no visible key in any split: zero
    float total = 0.0f;
    for (int64_t split = 0; split < splits; ++split) {
      const SplitResult r = result_of(split);
      const float weight = std::exp(r.max[g] - top);
      total += weight * r.total[g];
      for (int64_t i = 0; i < hd; ++i) o[i] += weight * r.out[g * hd + i];
    }
    for (int64_t i = 0; i < hd; ++i) o[i] /= total;
  }
}

// Many-row entries (prefill chunks, the replayed rows after a hit) run as tiled GEMMs, the way
// FlashAttention does: for each (tile of query rows, kv head) the query heads that share the kv
// head are folded into the rows of one product (GQA packing: each key and value is read once
// for all of them), and the keys are taken kKeyTile at a time: a tile's scores are one sgemm,
// masked to each row's visible range and folded into a running softmax (its max, its sum, and
// the output rescaled when the max grows), then multiplied into the values with one more sgemm.
// The scores never outgrow a tile, so they stay in cache at any context length. Same arithmetic
// as AttendRowGroup up to summation order (the exponential is the same vector ExpOf, at the
// level's width as there). A row's output depends only on the entry's rows, never on the other
// entries of the batch.
constexpr int64_t kTiledMinRows = 64;
constexpr int64_t kTiledMinFolded = 64;  // or (row, query head) pairs, over as many keys:
constexpr int64_t kTiledMinKeys = 1024;
constexpr int64_t kMinKeyTilesPerSplit = 2;
constexpr int64_t kFoldedRows = 256;  // (row, query head) pairs of one product at most
constexpr int64_t kMaxTileRows = 64;
constexpr int64_t kKeyTile = 256;  // within one K block of OpenBLAS's sgemm

// The keys an entry can see, gathered once into contiguous buffers: the block KV's [0, last]
// out of its pages, and the SWA keys (the ring's slots and the tail's rows) in position order.
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

// One tile's folded rows: product row i * group + h is row r0 + i's query head h of the kv
// head, with its running softmax.
struct FoldedTile {
  int64_t r0 = 0, rows = 0, group = 0;
  std::vector<float> q, out, scores, max, total;
  std::vector<std::pair<int64_t, int64_t>> seen;  // per tile row: its visible columns of a key tile
};

// A key tile's scores (`width` columns per folded row) into each row's running softmax, at the
// level's vector width: the columns a row does not see are zeroed, the rest become
// e^(score - max) with max the row's largest score so far, and where that max grew, the row's
// output and sum so far are scaled down to it.
struct FoldScores {
  template <CpuIsa kIsa>
  __attribute__((always_inline)) static void Run(FoldedTile& tile, int64_t width,
                                                 int64_t head_dim) {
    constexpr int kW = AttendShape<kIsa>::kW;
    for (int64_t i = 0; i < tile.rows; ++i) {
      const auto [begin, end] = tile.seen[i];
      for (int64_t h = 0; h < tile.group; ++h) {
        const int64_t row = i * tile.group + h;
        float* score = tile.scores.data() + row * width;
        std::fill(score, score + begin, 0.0f);
        std::fill(score + end, score + width, 0.0f);
        if (begin == end) continue;  // nothing visible here: the row's softmax is unchanged
        FoldIntoRunningSoftmax<kW>(score + begin, end - begin, tile.max[row], tile.total[row],
                                   tile.out.data() + row * head_dim, head_dim);
      }
    }
  }
};

// The rows of `tile` whose query heads share kv head `kv_head`, folded into one matrix.
void FoldQueries(const AttentionParams& p, int64_t kv_head, FoldedTile& tile) {
  const int64_t hd = p.head_dim, m = tile.rows * tile.group;
  tile.q.resize(m * hd);
  for (int64_t i = 0; i < tile.rows; ++i) {
    const float* q = p.q + (tile.r0 + i) * p.q_stride + kv_head * tile.group * hd;
    std::memcpy(tile.q.data() + i * tile.group * hd, q, tile.group * hd * sizeof(float));
  }
  tile.out.assign(m * hd, 0.0f);
  tile.max.assign(m, -INFINITY);
  tile.total.assign(m, 0.0f);
}

// Keys [k0, k1) of one source into the running softmax of `tile`: their keys and values at `k`
// and `v` (position j's row at (j - k0) * kv_dim), tile row i seeing [lo(i), hi(i)) of them.
template <typename Visible>
void FoldKeyTile(const AttentionParams& p, const float* k, const float* v, int64_t k0, int64_t k1,
                 const Visible& visible, FoldedTile& tile) {
  const int64_t hd = p.head_dim, ld = p.num_kv_heads * hd;
  const int64_t m = tile.rows * tile.group, width = k1 - k0;
  tile.scores.resize(m * width);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, width, hd, p.scale, tile.q.data(), hd, k,
              ld, 0.0f, tile.scores.data(), width);
  tile.seen.resize(tile.rows);
  for (int64_t i = 0; i < tile.rows; ++i) {
    const auto [lo, hi] = visible(tile.r0 + i);
    const int64_t begin = std::clamp<int64_t>(lo, k0, k1) - k0;
    tile.seen[i] = {begin, std::max(begin, std::clamp<int64_t>(hi, k0, k1) - k0)};
  }
  RunAtActiveIsa<FoldScores>(tile, width, hd);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hd, width, 1.0f, tile.scores.data(),
              width, v, ld, 1.0f, tile.out.data(), hd);
}

// One key tile: positions [k0, k1) of the block KV (global) or of the SWA keys.
struct KeyTile {
  bool global = false;
  int64_t k0 = 0, k1 = 0;
};

// The key tiles of `tile`'s rows in visiting order: the block KV's keys [0, last] and the SWA
// keys [least lo, last], kKeyTile at a time on a grid from position 0.
void KeyTilesOf(const AttentionParams& p, const FoldedTile& tile, std::vector<KeyTile>& out) {
  out.clear();
  const int64_t r1 = tile.r0 + tile.rows, last = p.positions[r1 - 1];
  if (p.global != nullptr) {
    for (int64_t k0 = 0; k0 <= last; k0 += kKeyTile) {
      out.push_back({true, k0, std::min(last + 1, k0 + kKeyTile)});
    }
  }
  int64_t lo_min = p.swa_lo[tile.r0];
  for (int64_t r = tile.r0; r < r1; ++r) lo_min = std::min<int64_t>(lo_min, p.swa_lo[r]);
  for (int64_t k0 = lo_min; k0 <= last;) {
    const int64_t k1 = std::min(last + 1, (k0 / kKeyTile + 1) * kKeyTile);
    out.push_back({false, k0, k1});
    k0 = k1;
  }
}

// Key tiles `tiles` into the running softmax of `tile`'s rows for kv head `kv_head`.
void FoldKeyTiles(const AttentionParams& p, const GatheredKeys& g, int64_t kv_head,
                  std::span<const KeyTile> tiles, FoldedTile& tile) {
  const int64_t kv_dim = p.num_kv_heads * p.head_dim, kv_col = kv_head * p.head_dim;
  const auto global = [&](int64_t r) { return std::pair<int64_t, int64_t>(0, p.positions[r] + 1); };
  const auto swa = [&](int64_t r) {
    return std::pair<int64_t, int64_t>(p.swa_lo[r], p.positions[r] + 1);
  };
  for (const KeyTile& t : tiles) {
    if (t.global) {
      const int64_t at = t.k0 * kv_dim + kv_col;
      FoldKeyTile(p, g.global_k.data() + at, g.global_v.data() + at, t.k0, t.k1, global, tile);
    } else {
      const int64_t at = (t.k0 - g.swa_begin) * kv_dim + kv_col;
      FoldKeyTile(p, g.swa_k.data() + at, g.swa_v.data() + at, t.k0, t.k1, swa, tile);
    }
  }
}

// Each folded row of `tile` divided by its softmax's sum into its place in the output.
void StoreTile(const AttentionParams& p, int64_t kv_head, const FoldedTile& tile) {
  const int64_t hd = p.head_dim;
  for (int64_t i = 0; i < tile.rows; ++i) {
    float* out = p.out + (tile.r0 + i) * p.num_heads * hd + kv_head * tile.group * hd;
    for (int64_t h = 0; h < tile.group; ++h) {
      const int64_t row = i * tile.group + h;
      const float total = tile.total[row];
      const float inv = total > 0 ? 1.0f / total : 0.0f;  // no visible key: zero
      const float* o = tile.out.data() + row * hd;
      for (int64_t c = 0; c < hd; ++c) out[h * hd + c] = o[c] * inv;
    }
  }
}

// The keys the entry's rows can see in all: block KV [0, last] and SWA [least lo, last].
int64_t VisibleKeys(const AttentionParams& p) {
  const int64_t last = p.positions[p.rows - 1];
  int64_t lo_min = last + 1;
  for (int64_t r = 0; r < p.rows; ++r) lo_min = std::min<int64_t>(lo_min, p.swa_lo[r]);
  return (p.global != nullptr ? last + 1 : 0) + (last + 1 - lo_min);
}

// Entries the tiled path takes: many rows, or few rows over a long context whose folded rows
// (rows x query heads per kv head) fill a product (a decode node's replay piece of 8 rows of 8
// heads over 4K keys read the keys once for all 64 instead of once per row).
bool Tiled(const AttentionParams& p) {
  if (p.rows >= kTiledMinRows) return true;
  return p.rows * (p.num_heads / p.num_kv_heads) >= kTiledMinFolded &&
         VisibleKeys(p) >= kTiledMinKeys;
}

// An entry on GEMM tiles: its visible keys gathered once, then each (tile of rows, kv head) one
// task. The team's threads run OpenBLAS single-threaded (cpu_team.h), so each task is one
// thread's. With fewer tasks than threads (a replay piece of a few rows), each task's key tiles
// are split over several tasks, their running softmaxes merged after (flash-decoding's split;
// the split depends on the entry and the team alone, never on the rest of the batch).
void AttendTiled(const AttentionParams& p) {
  const GatheredKeys keys = Gather(p);
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t tile_rows = std::clamp<int64_t>(kFoldedRows / group, 1, kMaxTileRows);
  const int64_t tasks = (p.rows + tile_rows - 1) / tile_rows * p.num_kv_heads;
  const auto start = [&](int64_t task, FoldedTile& tile, std::vector<KeyTile>& key_tiles) {
    tile.r0 = task / p.num_kv_heads * tile_rows;
    tile.rows = std::min(tile_rows, p.rows - tile.r0);
    tile.group = group;
    FoldQueries(p, task % p.num_kv_heads, tile);
    KeyTilesOf(p, tile, key_tiles);
  };
  const int64_t threads = CpuTeamSize();
  const int64_t splits =
      tasks >= threads ? 1
                       : std::clamp<int64_t>((threads + tasks - 1) / tasks, 1,
                                             VisibleKeys(p) / (kKeyTile * kMinKeyTilesPerSplit));
  if (splits <= 1) {
    ParallelForEachTask(tasks, [&](int64_t task) {
      thread_local FoldedTile tile;
      thread_local std::vector<KeyTile> key_tiles;
      start(task, tile, key_tiles);
      FoldKeyTiles(p, keys, task % p.num_kv_heads, key_tiles, tile);
      StoreTile(p, task % p.num_kv_heads, tile);
    });
    return;
  }
  // Each split's folded rows: (output not yet divided, max, sum) per row, merged below.
  const int64_t hd = p.head_dim, folded = tile_rows * group, stride = folded * (hd + 2);
  std::vector<float> parts(tasks * splits * stride);
  ParallelForEachTask(tasks * splits, [&](int64_t t) {
    thread_local FoldedTile tile;
    thread_local std::vector<KeyTile> key_tiles;
    const int64_t task = t / splits, split = t % splits;
    start(task, tile, key_tiles);
    const auto n = static_cast<int64_t>(key_tiles.size());
    const std::span<const KeyTile> mine(key_tiles.data() + split * n / splits,
                                        key_tiles.data() + (split + 1) * n / splits);
    FoldKeyTiles(p, keys, task % p.num_kv_heads, mine, tile);
    float* part = parts.data() + t * stride;
    const int64_t m = tile.rows * group;
    std::copy_n(tile.out.data(), m * hd, part);
    std::copy_n(tile.max.data(), m, part + folded * hd);
    std::copy_n(tile.total.data(), m, part + folded * (hd + 1));
  });
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t r0 = task / p.num_kv_heads * tile_rows, kv_head = task % p.num_kv_heads;
    for (int64_t i = 0; i < std::min(tile_rows, p.rows - r0); ++i) {
      // Tile row i's heads in split s: their outputs, maxima and sums, as the row path's.
      MergeSplits(p, (r0 + i) * p.num_kv_heads + kv_head, splits, [&](int64_t split) {
        float* part = parts.data() + (task * splits + split) * stride;
        return SplitResult{.out = part + i * group * hd,
                           .max = part + folded * hd + i * group,
                           .total = part + folded * (hd + 1) + i * group};
      });
    }
  }
}

}  // namespace

void Attention(std::span<const AttentionParams> batch) {
  // Many-row entries on GEMM tiles; the rest (decode steps, short chunks) row by row.
  for (const AttentionParams& p : batch) {
    if (Tiled(p)) AttendTiled(p);
  }
  // Flatten (entry, row, kv head) of the row-by-row entries so that the loop balances them.
  std::vector<int64_t> first_task(batch.size() + 1, 0);
  for (size_t e = 0; e < batch.size(); ++e) {
    const int64_t rows = Tiled(batch[e]) ? 0 : batch[e].rows;
    first_task[e + 1] = first_task[e] + rows * batch[e].num_kv_heads;
  }
  const int64_t pairs = first_task.back();
  if (pairs == 0) return;
  // Fewer (row, kv head) pairs than would keep every thread busy (a decode step of one or a few
  // requests of few kv heads): each pair's keys are split into `splits` tasks, whose weighted
  // outputs are merged once every split is done (flash-decoding's split of the keys).
  const int64_t threads = CpuTeamSize();
  int64_t splits = 1;
  if (pairs < threads) {
    splits = (threads + pairs - 1) / pairs;
  } else if (pairs < 2 * threads && pairs % threads != 0) {
    splits = 2;
  }
  const int64_t tasks = pairs * splits;
  // Each split's results: [pair][split] x (group outputs of head_dim, group maxima, group sums).
  std::vector<int64_t> first_float(batch.size() + 1, 0);
  if (splits > 1) {
    for (size_t e = 0; e < batch.size(); ++e) {
      const AttentionParams& p = batch[e];
      const int64_t pairs_of_e = first_task[e + 1] - first_task[e];
      const int64_t group = p.num_heads / p.num_kv_heads;
      first_float[e + 1] = first_float[e] + pairs_of_e * splits * group * (p.head_dim + 2);
    }
  }
  std::vector<float> split_results(first_float.back());
  auto entry_of = [&](int64_t pair) {
    return static_cast<size_t>(
        std::upper_bound(first_task.begin(), first_task.end(), pair) - first_task.begin() - 1);
  };
  // Split `split` of pair `local` of entry e.
  auto result_of = [&](size_t e, int64_t local, int64_t split) {
    const AttentionParams& p = batch[e];
    const int64_t group = p.num_heads / p.num_kv_heads;
    float* base = split_results.data() + first_float[e] +
                  (local * splits + split) * group * (p.head_dim + 2);
    return SplitResult{.out = base,
                       .max = base + group * p.head_dim,
                       .total = base + group * (p.head_dim + 1)};
  };
  ParallelForEachTask(tasks, [&](int64_t t) {
    // Kept by each thread between calls: a decode step calls Attention once per layer.
    thread_local RowScratch scratch;
    const int64_t pair = t / splits, split = t % splits;
    const size_t e = entry_of(pair);
    const AttentionParams& p = batch[e];
    const int64_t local = pair - first_task[e];
    const SplitResult result = splits > 1 ? result_of(e, local, split) : SplitResult{};
    RunAtActiveIsa<AttendRowGroup>(p, local / p.num_kv_heads, local % p.num_kv_heads, split, splits,
                                   splits > 1 ? &result : nullptr, scratch);
  });
  if (splits == 1) return;
  // Fewer than two pairs per thread: merged on this thread.
  // out = sum_s e^(max_s - M) out_s / sum_s e^(max_s - M) total_s, M the largest max_s.
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const size_t e = entry_of(pair);
    const int64_t local = pair - first_task[e];
    MergeSplits(batch[e], local, splits, [&](int64_t split) { return result_of(e, local, split); });
  }
}

}  // namespace baton::kernels
