// The one list of kernel op cases (STYLE rule 4; llama.cpp's test-backend-ops). Every case
// makes its inputs from fixed seeds, computes its reference in double precision, and runs itself
// on any model::Backend through backend memory only (Allocate, CopyIn, the op, CopyOut,
// Synchronize), so that backend_ops_test.cc runs each case on the CPU at every instruction-set
// level and on CUDA with the same code. Each case carries its tolerances: the CPU's against the
// reference, and the CUDA backend's against the CPU (what the CPU/CUDA consistency harness held
// it to before the harnesses were one).
//
// The inputs of the ops that model::Backend does not carry (ToBf16, GemmBf16, PackWeights) and
// of the CPU-only and CUDA-only tests (cuda_consistency_test.cc) come from here too, so that a
// property tested on one backend alone is tested on the same data as the list.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "baton/kernels/attention.h"
#include "baton/kernels/gemm.h"
#include "baton/model/backend.h"

namespace baton::kernels::op_cases {

// n values uniform in [lo, hi) from SplitMix64 (the decode cases fill hundreds of millions of
// floats of block-KV pages; std::uniform_real_distribution takes seconds for that).
inline std::vector<float> Uniform(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& x : v) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float unit = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // 24 bits: [0, 1)
    x = lo + (hi - lo) * unit;
  }
  return v;
}

// A float from its bit pattern, and a BF16 value widened exactly (its bits are the upper half).
inline float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float Bf16ToFloat(Bf16 v) {
  return FromBits(static_cast<uint32_t>(v) << 16);
}

// |expected - actual| <= atol + rtol * |expected| everywhere (NaN only where expected is NaN,
// an infinity only where expected is that infinity); reports the worst element.
inline void ExpectClose(const std::vector<float>& expected, const std::vector<float>& actual,
                        float atol, float rtol, const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  size_t worst = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    // NaN only where NaN is expected, and an infinity only where the same one is (the
    // difference of two infinities is NaN, which no comparison below would catch).
    if (std::isnan(actual[i]) != std::isnan(expected[i]) ||
        ((std::isinf(actual[i]) || std::isinf(expected[i])) && actual[i] != expected[i])) {
      worst = i;
      worst_excess = INFINITY;
      break;
    }
    const double excess =
        std::abs(double(expected[i]) - actual[i]) - (atol + rtol * std::abs(expected[i]));
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  EXPECT_LE(worst_excess, 0.0) << what << ": element " << worst << " expected " << expected[worst]
                               << ", got " << actual[worst] << " (atol " << atol << ", rtol "
                               << rtol << ")";
}

// |actual - expected| <= atol + rtol * |expected|; {0, 0} is bit-for-bit equality (up to the
// sign of zero and the payload of NaN).
struct Tolerance {
  float atol = 0.0f;
  float rtol = 0.0f;
};

// What holds when a is within `to_b` = (ta, ra) of b and b within `to_reference` = (tb, rb) of
// the reference: |a - ref| <= |a - b| + |b - ref| <= ta + ra |b| + tb + rb |ref|, and
// |b| <= (1 + rb) |ref| + tb.
inline Tolerance Chained(Tolerance to_b, Tolerance to_reference) {
  return {to_b.atol + to_reference.atol * (1.0f + to_b.rtol),
          to_b.rtol + to_reference.rtol + to_b.rtol * to_reference.rtol};
}

// One output array of a case (a buffer as the op left it, padding included), by name.
struct Output {
  std::string what;
  std::vector<float> values;
};

// Every output of `actual` within `tolerance` of the same output of `expected`.
inline void ExpectOutputsClose(const std::vector<Output>& expected,
                               const std::vector<Output>& actual, Tolerance tolerance,
                               const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(expected[i].what, actual[i].what) << what;
    ExpectClose(expected[i].values, actual[i].values, tolerance.atol, tolerance.rtol,
                what + ", " + expected[i].what);
  }
}

// One op call (or a short sequence of calls on the same buffers, such as RoPE over an array of
// positions rewritten in place) over inputs made when the case is made.
class OpCase {
 public:
  virtual ~OpCase() = default;
  // The outputs by definition, computed in double on the host.
  virtual std::vector<Output> Reference() const = 0;
  // Copies the inputs into `backend`'s memory, runs the op there and copies the outputs back.
  virtual std::vector<Output> Run(model::Backend& backend) const = 0;
};

// An entry of the list: its name and tolerances are known before its inputs exist (the decode
// cases hold gigabytes of block-KV pages, made only by the test that runs them).
struct OpCaseSpec {
  std::string name;       // letters, digits and '_': part of the test's name
  bool cpu_only = false;  // GemmParams' CPU-only fields (BF16 or packed W, fused SwiGLU)
  Tolerance cpu;          // the CPU against the reference
  Tolerance cuda;         // the CUDA backend against the CPU
  std::function<std::unique_ptr<OpCase>()> make;
};

// Every case, in a fixed order.
std::vector<OpCaseSpec> OpCases();

// ---- Inputs shared with the tests of one backend.

// Y [rows, out] = X [rows, in] W^T + beta Y, with row strides (0: dense).
struct GemmShape {
  int64_t rows = 0, in = 0, out = 0;
  int64_t x_stride = 0, y_stride = 0;
  float beta = 0.0f;
};
struct GemmData {
  std::vector<float> x, w, y;  // y: Y before the call
};
GemmData MakeGemmData(const GemmShape& s);
// FP32 GEMM shapes of the list: whole and partial tiles of every CPU level (rows past 6 and 2,
// panels past 4 and outputs past the last whole panel of 16), blocks of 96 rows, strides, beta.
std::vector<GemmShape> GemmTileShapes();
// A decode batch of 101 rows: tiles of every height, two blocks of rows (one of GemmTileShapes).
inline constexpr GemmShape kDecodeBatchGemm{.rows = 101, .in = 200, .out = 37};
// Model-sized products (K up to 4096), X and Y with padded rows.
std::vector<GemmShape> GemmModelShapes();

// W [37, 203] (seed 9), rounded to BF16 by ToBf16, and that widened back to FP32 exactly; X and
// Y for a number of rows.
struct Bf16WeightsData {
  int64_t in = 203, out = 37;
  std::vector<float> w, widened;
  std::vector<Bf16> narrow;
};
Bf16WeightsData MakeBf16WeightsData();
std::vector<float> Bf16WeightsX(const Bf16WeightsData& d, int64_t rows);
std::vector<float> Bf16WeightsY(const Bf16WeightsData& d, int64_t rows);
// Row counts for BF16 weights: one decode row, a few, tiles, and blocks of 96 rows.
inline const std::vector<int64_t> kBf16WeightsRows = {1, 7, 32, 70, 130};

// A SwiGLU MLP's gate_up [2 * 48, 70] (seed 50) and its X for a number of rows.
struct SwiGluGemmData {
  int64_t inter = 48, in = 70;
  std::vector<float> w;
  std::vector<Bf16> narrow;  // w rounded to BF16
};
SwiGluGemmData MakeSwiGluGemmData();
std::vector<float> SwiGluGemmX(const SwiGluGemmData& d, int64_t rows);
// Row counts for the fused product: pairs of panels split unevenly over the threads, blocks of
// 96 rows.
inline const std::vector<int64_t> kSwiGluGemmRows = {1, 2, 5, 7, 64, 130};

// 10,000 values in [-1e4, 1e4), then, from index 10,000: ties exactly half a BF16 ulp above an
// even and an odd mantissa, a value just above a tie, infinities, NaNs (quiet, and signalling
// with its payload in the low bits), zeros of both signs, the largest float (rounds to
// infinity), a value whose lower 16 bits are all ones and the smallest subnormal.
std::vector<float> Bf16RoundingInputs();

// GemmBf16: BF16 X [rows, in] (row stride x_stride) and W, FP32 Y with beta 1.
struct GemmBf16Shape {
  int64_t rows = 0, in = 0, out = 0, x_stride = 0;
};
struct GemmBf16Data {
  std::vector<Bf16> x, w;
  std::vector<float> y;  // Y before the call
};
std::vector<GemmBf16Shape> GemmBf16Shapes();
GemmBf16Data MakeGemmBf16Data(const GemmBf16Shape& s);
// Y after the call by definition (products of the BF16 values, summed in double), and as the
// CPU's GemmBf16 leaves it.
std::vector<float> GemmBf16Reference(const GemmBf16Shape& s, const GemmBf16Data& d);
std::vector<float> GemmBf16OnTheCpu(const GemmBf16Shape& s, const GemmBf16Data& d);

// ---- Attention.

// One attention entry's host data: q/k/v rows as the model lays them out (q, then this row's K
// and V in one qkv row), a ring of C slots for earlier SWA positions, optional block-KV pages.
struct AttentionCase {
  int64_t heads = 8, kv_heads = 2, head_dim = 64;
  int64_t window = 64, capacity = 70, block_size = 16;
  int64_t first_position = 0, rows = 1;
  int64_t swa_floor = 0;  // max(s_keep, s_valid): lo_i = clamp(max(i - W + 1, floor), 0, i + 1)
  bool global = false;
  bool no_swa = false;  // lo_i = i + 1 for every row (no SWA key)
  uint64_t seed = 1;
};

struct AttentionData {
  AttentionCase c;
  std::vector<float> qkv, ring, pages, out;
  std::vector<int32_t> positions, lo;
  std::vector<float*> page_table;  // host pointers
  BlockKvSource global_cpu;

  explicit AttentionData(const AttentionCase& cs) : c(cs) {
    const int64_t q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
    const int64_t qkv_dim = q_dim + 2 * kv_dim;
    qkv = Uniform(c.rows * qkv_dim, c.seed, -2.0f, 2.0f);
    ring = Uniform(2 * c.capacity * kv_dim, c.seed + 1);
    out.assign(c.rows * q_dim, 0.0f);
    for (int64_t r = 0; r < c.rows; ++r) {
      const int64_t pos = c.first_position + r;
      positions.push_back(static_cast<int32_t>(pos));
      const int64_t lo = std::clamp<int64_t>(std::max(pos - c.window + 1, c.swa_floor), 0, pos + 1);
      this->lo.push_back(static_cast<int32_t>(c.no_swa ? pos + 1 : lo));
    }
    if (c.global) {
      const int64_t last = c.first_position + c.rows - 1;
      const int64_t num_pages = last / c.block_size + 1;
      // Two layers per page; this entry reads layer 1 (K at 2*B*kv_dim, V after it).
      const int64_t page_floats = 2 * 2 * c.block_size * kv_dim;
      pages = Uniform(num_pages * page_floats, c.seed + 2);
      for (int64_t p = 0; p < num_pages; ++p) {
        page_table.push_back(pages.data() + ((p * 5 + 1) % num_pages) * page_floats);
      }
      global_cpu = {.pages = page_table.data(),
                    .block_size = c.block_size,
                    .k_offset = 2 * c.block_size * kv_dim,
                    .v_offset = 3 * c.block_size * kv_dim};
    }
  }

  // Params over `q`/`ring` pointers (host or device); `global` as given.
  AttentionParams Params(const float* qkv_base, const float* ring_base, float* out_base,
                         const int32_t* positions_base, const int32_t* lo_base,
                         const BlockKvSource* global_source) const {
    const int64_t q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
    const int64_t qkv_dim = q_dim + 2 * kv_dim;
    return {.rows = c.rows,
            .num_heads = c.heads,
            .num_kv_heads = c.kv_heads,
            .head_dim = c.head_dim,
            .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
            .q = qkv_base,
            .q_stride = qkv_dim,
            .out = out_base,
            .positions = positions_base,
            .swa_lo = lo_base,
            .swa = {.ring_k = ring_base,
                    .ring_v = ring_base + c.capacity * kv_dim,
                    .ring_capacity = c.capacity,
                    .tail_k = qkv_base + q_dim,
                    .tail_v = qkv_base + q_dim + kv_dim,
                    .tail_stride = qkv_dim,
                    .tail_start = c.first_position},
            .global = global_source};
  }
};

// NaN in every ring slot whose position no row of the entry can see (below every row's lo): a
// kernel may read such slots (the CUDA GEMM path gathers them), but none may let them reach an
// output.
inline void PoisonUnseenRing(AttentionData& d) {
  const int64_t kv_dim = d.c.kv_heads * d.c.head_dim, C = d.c.capacity;
  const int64_t min_lo = *std::min_element(d.lo.begin(), d.lo.end());
  for (int64_t pos = std::max<int64_t>(0, d.c.first_position - C);
       pos < std::min(min_lo, d.c.first_position); ++pos) {
    for (const int64_t base : {int64_t{0}, C * kv_dim}) {
      std::fill_n(d.ring.begin() + base + (pos % C) * kv_dim, kv_dim, NAN);
    }
  }
}

// The attention cases of the op list. Producer SWA prefill chunks: >= 64 rows take the CPU's
// tiled path, fewer its row path.
inline std::vector<AttentionCase> ProducerSwaCases() {
  return {{.first_position = 300, .rows = 100, .seed = 21},
          {.first_position = 0, .rows = 70, .seed = 22},
          {.first_position = 40, .rows = 10, .seed = 23}};
}

// Compact-like chunk: rows 420..499 with s_keep 430, so rows 420..429 see no SWA key (lo =
// i + 1) but still their block KV; MHA at head_dim 128, GQA at head_dim 96 (not a multiple of
// the warp), a chunk after a prefix hit (floor = s_valid).
inline std::vector<AttentionCase> ConsumerUnionCases() {
  return {{.heads = 4,
           .kv_heads = 4,
           .head_dim = 128,
           .window = 128,
           .capacity = 134,
           .block_size = 64,
           .first_position = 420,
           .rows = 80,
           .swa_floor = 430,
           .global = true,
           .seed = 31},
          {.heads = 6,
           .kv_heads = 3,
           .head_dim = 96,
           .first_position = 257,
           .rows = 30,
           .swa_floor = 260,
           .global = true,
           .seed = 32},
          {.heads = 8,
           .kv_heads = 1,
           .head_dim = 32,
           .window = 16,
           .capacity = 22,
           .first_position = 1000,
           .rows = 65,
           .global = true,
           .seed = 33}};
}

// A decode batch: 64 one-row entries over paged block KV, GQA 32/8, some after a prefix hit;
// then groups of 8, 1 and 7 query heads per kv head (the CPU row path's score blocks of 8, 4, 2
// and 1 heads), the last two with a few rows.
inline std::vector<AttentionCase> DecodeBatchCases() {
  std::vector<AttentionCase> cases;
  for (int i = 0; i < 64; ++i) {
    cases.push_back({.heads = 32,
                     .kv_heads = 8,
                     .head_dim = 128,
                     .window = 128,
                     .capacity = 134,
                     .block_size = 64,
                     .first_position = (i * 977) % 3000,
                     .rows = 1,
                     .swa_floor = i % 5 == 0 ? 2000 : 0,
                     .global = true,
                     .seed = static_cast<uint64_t>(100 + i)});
  }
  cases.push_back({.heads = 8,
                   .kv_heads = 1,
                   .window = 128,
                   .capacity = 134,
                   .block_size = 64,
                   .first_position = 520,
                   .global = true,
                   .seed = 200});
  cases.push_back({.heads = 4,
                   .kv_heads = 4,
                   .head_dim = 128,
                   .window = 128,
                   .capacity = 134,
                   .block_size = 64,
                   .first_position = 77,
                   .rows = 3,
                   .global = true,
                   .seed = 201});
  cases.push_back({.heads = 7,
                   .kv_heads = 1,
                   .window = 128,
                   .capacity = 134,
                   .block_size = 64,
                   .first_position = 300,
                   .rows = 2,
                   .swa_floor = 250,
                   .global = true,
                   .seed = 202});
  return cases;
}

// Decode of one or two requests at long contexts: too few (row, head) blocks to fill a GPU, so
// the CUDA launcher splits each row's keys across blocks and merges the splits.
inline std::vector<AttentionCase> LongContextDecodeCases() {
  return {{.heads = 32,
           .kv_heads = 8,
           .head_dim = 128,
           .window = 128,
           .capacity = 134,
           .block_size = 64,
           .first_position = 6001,
           .global = true,
           .seed = 300},
          {.heads = 8,
           .kv_heads = 1,
           .window = 128,
           .capacity = 134,
           .block_size = 64,
           .first_position = 4100,
           .swa_floor = 4050,
           .global = true,
           .seed = 301}};
}

// Many rows over a long context, as the tiled path folds and streams them: the consumers'
// replayed rows after a hit (eight query heads on one kv head, the rows of a tile past a
// hit's s_valid) and a prefill chunk of GQA 8/2 whose last row tile is short, each over
// thousands of block-KV keys (many key tiles, each row's running softmax rescaled as its max
// grows) and a window that starts mid key tile; then few rows whose heads fill a product over
// a long context, as a decode node's replay piece: 8 rows of 8 heads on one kv head (one task,
// its key tiles split over the team's threads and merged) and 16 rows of GQA 32/8.
inline std::vector<AttentionCase> LongContextTileCases() {
  return {{.heads = 8,
           .kv_heads = 1,
           .head_dim = 128,
           .window = 128,
           .capacity = 134,
           .block_size = 64,
           .first_position = 3900,
           .rows = 140,
           .swa_floor = 3950,
           .global = true,
           .seed = 310},
          {.heads = 8,
           .kv_heads = 2,
           .head_dim = 64,
           .window = 200,
           .capacity = 210,
           .first_position = 2300,
           .rows = 150,
           .global = true,
           .seed = 311},
          {.heads = 8,
           .kv_heads = 1,
           .head_dim = 128,
           .window = 128,
           .capacity = 134,
           .block_size = 64,
           .first_position = 4000,
           .rows = 8,
           .swa_floor = 3990,
           .global = true,
           .seed = 312},
          {.heads = 32,
           .kv_heads = 8,
           .head_dim = 64,
           .first_position = 1500,
           .rows = 16,
           .global = true,
           .seed = 313}};
}

// No visible key at all (producer row with lo = i + 1): output zero; head dims at the CUDA
// kernel's limits.
inline std::vector<AttentionCase> EdgeShapeCases() {
  return {{.first_position = 5, .rows = 3, .no_swa = true, .seed = 41},
          {.heads = 2,
           .kv_heads = 1,
           .head_dim = 256,
           .first_position = 90,
           .rows = 4,
           .global = true,
           .seed = 42},
          {.heads = 3,
           .kv_heads = 3,
           .head_dim = 2,
           .first_position = 7,
           .rows = 5,
           .global = true,
           .seed = 43}};
}

}  // namespace baton::kernels::op_cases
