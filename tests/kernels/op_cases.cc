// The op cases of op_cases.h: for each op, its inputs, its reference in double precision and
// its run on a model::Backend; then the list itself (OpCases).
#include "op_cases.h"

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <utility>

#include "baton/kernels/elementwise.h"
#include "baton/kernels/rows.h"

namespace baton::kernels::op_cases {
namespace {

std::vector<Bf16> Narrow(const std::vector<float>& w) {
  std::vector<Bf16> narrow(w.size());
  ToBf16({.count = static_cast<int64_t>(w.size()), .in = w.data(), .out = narrow.data()});
  return narrow;
}

// One run's backend memory: inputs copied in, outputs copied back, everything freed with it.
// The host arrays a copy reads must stay as they are until Finish (the backend contract says
// nothing of when a copy reads its source), so In takes no temporaries.
class Staging {
 public:
  explicit Staging(model::Backend& backend) : backend_(backend) {}

  // Backend memory holding a copy of `host`.
  template <typename T>
  T* In(const std::vector<T>& host) {
    T* memory = Zeroed<T>(host.size());
    backend_.CopyIn(memory, host.data(), host.size() * sizeof(T));
    return memory;
  }
  template <typename T>
  T* In(const std::vector<T>&& host) = delete;
  // Backend memory of `count` zeros (Allocate zeroes it).
  template <typename T>
  T* Zeroed(size_t count) {
    arrays_.emplace_back(backend_, std::max<size_t>(count * sizeof(T), 1));
    if (arrays_.back().data() == nullptr) {
      std::fprintf(stderr, "op_cases: the backend has no memory left for %zu bytes\n",
                   count * sizeof(T));
      std::abort();
    }
    return reinterpret_cast<T*>(arrays_.back().data());
  }
  // Backend memory of `count` copies of `value` (NaN in an output: every element is written).
  float* Filled(size_t count, float value) {
    fills_.emplace_back(count, value);
    return In(fills_.back());
  }
  // Copies `host` into memory In or Zeroed returned (an array rewritten in place between ops).
  template <typename T>
  void Rewrite(T* memory, const std::vector<T>& host) {
    backend_.CopyIn(memory, host.data(), host.size() * sizeof(T));
  }
  // `count` floats at `memory` as the ops queued so far leave them, as output `what`.
  void Out(std::string what, const float* memory, size_t count) {
    outputs_.push_back({std::move(what), std::vector<float>(count)});
    backend_.CopyOut(outputs_.back().values.data(), memory, count * sizeof(float));
  }
  // Waits for every op and copy; the outputs in the order Out named them.
  std::vector<Output> Finish() {
    const absl::Status status = backend_.Synchronize();
    EXPECT_TRUE(status.ok()) << status;
    return {std::make_move_iterator(outputs_.begin()), std::make_move_iterator(outputs_.end())};
  }

 private:
  model::Backend& backend_;
  // Deques: the memory and the host arrays the copies use never move.
  std::deque<model::BackendArray<char>> arrays_;
  std::deque<std::vector<float>> fills_;
  std::deque<Output> outputs_;
};

// ---- GEMM.

std::vector<float> GemmReference(const GemmShape& s, const std::vector<float>& x,
                                 const std::vector<float>& w, const std::vector<float>& y) {
  const int64_t xs = s.x_stride ? s.x_stride : s.in, ys = s.y_stride ? s.y_stride : s.out;
  std::vector<float> expected = y;  // columns of Y beyond `out` (the stride's padding) stay
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t o = 0; o < s.out; ++o) {
      double sum = 0;
      for (int64_t k = 0; k < s.in; ++k) sum += double(x[r * xs + k]) * w[o * s.in + k];
      expected[r * ys + o] = static_cast<float>(sum + s.beta * y[r * ys + o]);
    }
  }
  return expected;
}

std::string GemmName(const char* op, const GemmShape& s) {
  std::string name = std::string(op) + "_" + std::to_string(s.rows) + "x" + std::to_string(s.in) +
                     "x" + std::to_string(s.out);
  if (s.x_stride != 0 || s.y_stride != 0) name += "_Strided";
  if (s.beta != 0.0f) name += "_Beta1";
  return name;
}

// FP32 X and W; W as Linear lays it out, or packed into panels on the host first (as a model
// load does).
class GemmFp32Case : public OpCase {
 public:
  GemmFp32Case(const GemmShape& s, bool packed) : s_(s), packed_(packed), d_(MakeGemmData(s)) {}
  std::vector<Output> Reference() const override {
    return {{"Y", GemmReference(s_, d_.x, d_.w, d_.y)}};
  }
  std::vector<Output> Run(model::Backend& backend) const override {
    Staging staging(backend);
    std::vector<float> panels;
    if (packed_) {
      panels.resize(PackedWeightCount(s_.out, s_.in));
      PackWeights({.out = s_.out, .in = s_.in, .w = d_.w.data()}, panels.data());
    }
    float* y = staging.In(d_.y);
    backend.Gemm({.rows = s_.rows,
                  .in = s_.in,
                  .out = s_.out,
                  .x = staging.In(d_.x),
                  .x_stride = s_.x_stride,
                  .w = staging.In(packed_ ? panels : d_.w),
                  .w_packed = packed_,
                  .y = y,
                  .y_stride = s_.y_stride,
                  .beta = s_.beta});
    staging.Out("Y", y, d_.y.size());
    return staging.Finish();
  }

 private:
  GemmShape s_;
  bool packed_;
  GemmData d_;
};

// BF16 W (CPU only): the reference is the product with the widened W.
class GemmBf16WeightsCase : public OpCase {
 public:
  GemmBf16WeightsCase(int64_t rows, bool packed)
      : rows_(rows), packed_(packed), d_(MakeBf16WeightsData()) {
    x_ = Bf16WeightsX(d_, rows);
    y_ = Bf16WeightsY(d_, rows);
  }
  std::vector<Output> Reference() const override {
    return {{"Y", GemmReference(Shape(), x_, d_.widened, y_)}};
  }
  std::vector<Output> Run(model::Backend& backend) const override {
    Staging staging(backend);
    std::vector<Bf16> panels;
    if (packed_) {
      panels.resize(PackedWeightCount(d_.out, d_.in));
      PackWeights({.out = d_.out, .in = d_.in, .w = d_.widened.data()}, panels.data());
    }
    float* y = staging.In(y_);
    backend.Gemm({.rows = rows_,
                  .in = d_.in,
                  .out = d_.out,
                  .x = staging.In(x_),
                  .w_bf16 = staging.In(packed_ ? panels : d_.narrow),
                  .w_packed = packed_,
                  .y = y,
                  .beta = Shape().beta});
    staging.Out("Y", y, y_.size());
    return staging.Finish();
  }

 private:
  // Beta 1 unpacked, 0 packed: both paths with and without the residual.
  GemmShape Shape() const {
    return {.rows = rows_, .in = d_.in, .out = d_.out, .beta = packed_ ? 0.0f : 1.0f};
  }
  int64_t rows_;
  bool packed_;
  Bf16WeightsData d_;
  std::vector<float> x_, y_;
};

// A gate_up packed by PackSwiGluWeights, with the product's SwiGLU written as it is computed
// (CPU only); the reference is silu(gate) * up of the product in double.
class GemmSwiGluFusedCase : public OpCase {
 public:
  GemmSwiGluFusedCase(int64_t rows, bool bf16)
      : rows_(rows), bf16_(bf16), d_(MakeSwiGluGemmData()), x_(SwiGluGemmX(d_, rows)) {}
  std::vector<Output> Reference() const override {
    const int64_t inter = d_.inter, in = d_.in;
    std::vector<float> expected(rows_ * inter);
    auto weight = [&](int64_t o, int64_t k) {
      return bf16_ ? double(Bf16ToFloat(d_.narrow[o * in + k])) : double(d_.w[o * in + k]);
    };
    for (int64_t r = 0; r < rows_; ++r) {
      for (int64_t i = 0; i < inter; ++i) {
        double g = 0, u = 0;
        for (int64_t k = 0; k < in; ++k) {
          g += x_[r * in + k] * weight(i, k);
          u += x_[r * in + k] * weight(inter + i, k);
        }
        expected[r * inter + i] = static_cast<float>(g / (1.0 + std::exp(-g)) * u);
      }
    }
    return {{"swiglu", expected}};
  }
  std::vector<Output> Run(model::Backend& backend) const override {
    Staging staging(backend);
    const PackWeightsParams pack{.out = 2 * d_.inter, .in = d_.in, .w = d_.w.data()};
    std::vector<float> panels;
    std::vector<Bf16> narrow_panels;
    if (bf16_) {
      narrow_panels.resize(PackedWeightCount(pack.out, pack.in));
      PackSwiGluWeights(pack, narrow_panels.data());
    } else {
      panels.resize(PackedWeightCount(pack.out, pack.in));
      PackSwiGluWeights(pack, panels.data());
    }
    const size_t act_count = rows_ * d_.inter;
    float* act = staging.Filled(act_count, NAN);
    backend.Gemm({.rows = rows_,
                  .in = d_.in,
                  .out = pack.out,
                  .x = staging.In(x_),
                  .w = bf16_ ? nullptr : staging.In(panels),
                  .w_bf16 = bf16_ ? staging.In(narrow_panels) : nullptr,
                  .w_packed = true,
                  .y = staging.Zeroed<float>(rows_ * pack.out),
                  .swiglu = act});
    staging.Out("swiglu", act, act_count);
    return staging.Finish();
  }

 private:
  int64_t rows_;
  bool bf16_;
  SwiGluGemmData d_;
  std::vector<float> x_;
};

// ---- Row-wise ops.

// Out of place into a buffer of NaN (every element is written), or in place.
class RmsNormCase : public OpCase {
 public:
  explicit RmsNormCase(bool in_place)
      : in_place_(in_place), x_(Uniform(kRows * kDim, 8, -3.0f, 3.0f)), weight_(Uniform(kDim, 9)) {}
  std::vector<Output> Reference() const override {
    std::vector<float> expected(x_.size());
    for (int64_t r = 0; r < kRows; ++r) {
      double squares = 0;
      for (int64_t i = 0; i < kDim; ++i) squares += double(x_[r * kDim + i]) * x_[r * kDim + i];
      const double inv = 1.0 / std::sqrt(squares / kDim + kEps);
      for (int64_t i = 0; i < kDim; ++i) {
        expected[r * kDim + i] = static_cast<float>(x_[r * kDim + i] * inv * weight_[i]);
      }
    }
    return {{"out", expected}};
  }
  std::vector<Output> Run(model::Backend& backend) const override {
    Staging staging(backend);
    float* x = staging.In(x_);
    float* out = in_place_ ? x : staging.Filled(x_.size(), NAN);
    backend.RmsNorm({.rows = kRows,
                     .dim = kDim,
                     .x = x,
                     .weight = staging.In(weight_),
                     .out = out,
                     .eps = kEps});
    staging.Out("out", out, x_.size());
    return staging.Finish();
  }

 private:
  static constexpr int64_t kRows = 19, kDim = 4096 + 7;
  static constexpr float kEps = 1e-5f;
  bool in_place_;
  std::vector<float> x_, weight_;
};

// RoPE on 5 heads of rows with 16 floats of padding after the heads, for `rounds` rounds over
// each list of positions in turn; after each round the first list's array is rewritten in
// place, one position later (a decode step). The CPU op keeps the cos and sin of the last
// position arrays it saw, so each call must still give its own rotation.
class RopeCase : public OpCase {
 public:
  RopeCase(int64_t head_dim, int64_t rows, std::vector<std::vector<int32_t>> lists, int rounds)
      : head_dim_(head_dim),
        rows_(rows),
        stride_(kHeads * head_dim + 16),
        lists_(std::move(lists)),
        rounds_(rounds) {}
  std::vector<Output> Reference() const override {
    std::vector<Output> outputs;
    for (int round = 0; round < rounds_; ++round) {
      for (size_t l = 0; l < lists_.size(); ++l) {
        outputs.push_back({What(round, l), Rotated(X(round), List(round, l))});
      }
    }
    return outputs;
  }
  std::vector<Output> Run(model::Backend& backend) const override {
    Staging staging(backend);
    std::vector<std::vector<float>> xs;
    std::vector<std::vector<int32_t>> firsts;  // the first list's array at each round
    for (int round = 0; round < rounds_; ++round) {
      xs.push_back(X(round));
      firsts.push_back(List(round, 0));
    }
    std::vector<int32_t*> positions;
    for (size_t l = 0; l < lists_.size(); ++l) {
      positions.push_back(staging.In(l == 0 ? firsts[0] : lists_[l]));
    }
    float* x = staging.Zeroed<float>(xs[0].size());
    for (int round = 0; round < rounds_; ++round) {
      if (round > 0) staging.Rewrite(positions[0], firsts[round]);
      for (size_t l = 0; l < lists_.size(); ++l) {
        staging.Rewrite(x, xs[round]);
        backend.Rope({.rows = rows_,
                      .heads = kHeads,
                      .head_dim = head_dim_,
                      .x = x,
                      .stride = stride_,
                      .positions = positions[l],
                      .theta = kTheta});
        staging.Out(What(round, l), x, xs[round].size());
      }
    }
    return staging.Finish();
  }

 private:
  static constexpr int64_t kHeads = 5;
  static constexpr double kTheta = 500000.0;

  std::string What(int round, size_t list) const {
    return "round " + std::to_string(round) + ", positions " + std::to_string(list);
  }
  std::vector<float> X(int round) const { return Uniform(rows_ * stride_, 10 + round); }
  // List `l` at `round`: the first list one position later every round.
  std::vector<int32_t> List(int round, size_t l) const {
    std::vector<int32_t> list = lists_[l];
    if (l == 0) {
      for (int32_t& p : list) p += round;
    }
    return list;
  }
  // Rotated by the definition, in double, cos and sin rounded to FP32 as the op does (as Hugging
  // Face's cached tables do); the padding columns stay as they are.
  std::vector<float> Rotated(const std::vector<float>& x,
                             const std::vector<int32_t>& positions) const {
    const int64_t half = head_dim_ / 2;
    std::vector<float> expected = x;
    for (int64_t r = 0; r < rows_; ++r) {
      for (int64_t h = 0; h < kHeads; ++h) {
        const float* in = x.data() + r * stride_ + h * head_dim_;
        float* e = expected.data() + r * stride_ + h * head_dim_;
        for (int64_t k = 0; k < half; ++k) {
          const double angle = positions[r] * std::pow(kTheta, -2.0 * k / head_dim_);
          const double c = static_cast<float>(std::cos(angle));
          const double s = static_cast<float>(std::sin(angle));
          e[k] = static_cast<float>(in[k] * c - in[k + half] * s);
          e[k + half] = static_cast<float>(in[k + half] * c + in[k] * s);
        }
      }
    }
    return expected;
  }

  int64_t head_dim_, rows_, stride_;
  std::vector<std::vector<int32_t>> lists_;
  int rounds_;
};

// Decode-sized (one row, a few) and prefill-sized row counts at scattered positions up to
// 200,000, with a second list of positions used in turn, three rounds.
std::unique_ptr<OpCase> RopeDecodeStepsCase(int64_t head_dim, int64_t rows) {
  std::vector<int32_t> positions, others;
  for (int64_t r = 0; r < rows; ++r) {
    positions.push_back(static_cast<int32_t>(r * 9973 % 200000));
    others.push_back(static_cast<int32_t>(r * 7919 % 100000 + 3));
  }
  return std::make_unique<RopeCase>(head_dim, rows,
                                    std::vector<std::vector<int32_t>>{positions, others}, 3);
}

// 21 rows at positions growing quadratically from 0 to about 160,000, once.
std::unique_ptr<OpCase> RopeWidePositionsCase(int64_t head_dim) {
  const int64_t rows = 21;
  std::vector<int32_t> positions(rows);
  for (int64_t r = 0; r < rows; ++r) positions[r] = static_cast<int32_t>(r * r * 397 + r);
  return std::make_unique<RopeCase>(head_dim, rows, std::vector<std::vector<int32_t>>{positions},
                                    1);
}

// Gates in [-8, 8), and gates past the range where e^-g is a normal float, on both sides.
class SwiGluCase : public OpCase {
 public:
  SwiGluCase() : gate_up_(Uniform(kRows * 2 * kInter, 11, -8.0f, 8.0f)) {
    const float extremes[] = {-1e4f, -120.0f, -89.0f, -87.5f, -86.9f, 87.5f, 89.0f, 120.0f, 1e4f};
    for (size_t i = 0; i < std::size(extremes); ++i) gate_up_[3 * 2 * kInter + 5 * i] = extremes[i];
  }
  std::vector<Output> Reference() const override {
    std::vector<float> expected(kRows * kInter);
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t i = 0; i < kInter; ++i) {
        const double g = gate_up_[r * 2 * kInter + i], u = gate_up_[r * 2 * kInter + kInter + i];
        expected[r * kInter + i] = static_cast<float>(g / (1.0 + std::exp(-g)) * u);
      }
    }
    return {{"out", expected}};
  }
  std::vector<Output> Run(model::Backend& backend) const override {
    Staging staging(backend);
    float* out = staging.Filled(kRows * kInter, NAN);
    backend.SwiGlu({.rows = kRows, .inter = kInter, .gate_up = staging.In(gate_up_), .out = out});
    staging.Out("out", out, kRows * kInter);
    return staging.Finish();
  }

 private:
  static constexpr int64_t kRows = 17, kInter = 1536 + 3;
  std::vector<float> gate_up_;
};

// Rows of a table, the last vocabulary row among them.
class EmbeddingCase : public OpCase {
 public:
  EmbeddingCase() : table_(Uniform(kVocab * kDim, 12)) {
    for (int64_t r = 0; r < kRows; ++r) ids_.push_back(static_cast<int32_t>((r * 37 + 5) % kVocab));
    ids_[3] = ids_.back() = kVocab - 1;
  }
  std::vector<Output> Reference() const override {
    std::vector<float> expected(kRows * kDim);
    for (int64_t r = 0; r < kRows; ++r) {
      std::copy_n(table_.begin() + ids_[r] * kDim, kDim, expected.begin() + r * kDim);
    }
    return {{"out", expected}};
  }
  std::vector<Output> Run(model::Backend& backend) const override {
    Staging staging(backend);
    float* out = staging.Filled(kRows * kDim, NAN);
    backend.Embedding({.rows = kRows,
                       .dim = kDim,
                       .table = staging.In(table_),
                       .ids = staging.In(ids_),
                       .out = out});
    staging.Out("out", out, kRows * kDim);
    return staging.Finish();
  }

 private:
  static constexpr int64_t kRows = 17, kVocab = 300, kDim = 200;
  std::vector<float> table_;
  std::vector<int32_t> ids_;
};

// ---- Row movement: 40 source rows of 96 floats, 130 apart.

constexpr int64_t kMoveRows = 40, kMoveWidth = 96, kMoveStride = 130;

std::vector<float> MoveSource() {
  return Uniform(kMoveRows * kMoveStride, 13);
}

// dst[r] = src[index[r]], rows whose index is -1 untouched.
class GatherRowsCase : public OpCase {
 public:
  explicit GatherRowsCase(std::vector<int32_t> index)
      : src_(MoveSource()), index_(std::move(index)), dst_(Uniform(kMoveRows * kMoveWidth, 14)) {}
  std::vector<Output> Reference() const override {
    std::vector<float> expected = dst_;
    for (int64_t r = 0; r < kMoveRows; ++r) {
      if (index_[r] < 0) continue;
      std::copy_n(src_.begin() + index_[r] * kMoveStride, kMoveWidth,
                  expected.begin() + r * kMoveWidth);
    }
    return {{"dst", expected}};
  }
  std::vector<Output> Run(model::Backend& backend) const override {
    Staging staging(backend);
    float* dst = staging.In(dst_);
    backend.GatherRows({.rows = kMoveRows,
                        .width = kMoveWidth,
                        .src = staging.In(src_),
                        .src_stride = kMoveStride,
                        .index = staging.In(index_),
                        .dst = dst,
                        .dst_stride = kMoveWidth});
    staging.Out("dst", dst, dst_.size());
    return staging.Finish();
  }

 private:
  std::vector<float> src_;
  std::vector<int32_t> index_;
  std::vector<float> dst_;
};

// dst[slot[r]] = src[r] into a ring of 50 slots, slot -1 skipped.
class ScatterRowsCase : public OpCase {
 public:
  explicit ScatterRowsCase(std::vector<int32_t> slots)
      : src_(MoveSource()), slots_(std::move(slots)), ring_(Uniform(kCapacity * kMoveWidth, 15)) {}
  std::vector<Output> Reference() const override {
    std::vector<float> expected = ring_;
    for (int64_t r = 0; r < kMoveRows; ++r) {
      if (slots_[r] < 0) continue;
      std::copy_n(src_.begin() + r * kMoveStride, kMoveWidth,
                  expected.begin() + slots_[r] * kMoveWidth);
    }
    return {{"ring", expected}};
  }
  std::vector<Output> Run(model::Backend& backend) const override {
    Staging staging(backend);
    float* ring = staging.In(ring_);
    backend.ScatterRows({.rows = kMoveRows,
                         .width = kMoveWidth,
                         .src = staging.In(src_),
                         .src_stride = kMoveStride,
                         .index = staging.In(slots_),
                         .dst = ring,
                         .dst_stride = kMoveWidth});
    staging.Out("ring", ring, ring_.size());
    return staging.Finish();
  }

 private:
  static constexpr int64_t kCapacity = 50;
  std::vector<float> src_;
  std::vector<int32_t> slots_;
  std::vector<float> ring_;
};

// Positions 70..109 into 8 pages of B = 16 positions through a page table in scrambled order
// (as a pool hands pages out): position p to pages[p / B] + offset + (p % B) * width.
class WriteBlockKvCase : public OpCase {
 public:
  // Pages of `page_floats`; page p of the table is page (p * 3 + table_shift) % 8 of memory.
  WriteBlockKvCase(int64_t page_floats, int64_t offset, int64_t table_shift)
      : page_floats_(page_floats),
        offset_(offset),
        src_(MoveSource()),
        memory_(Uniform(kPages * page_floats, 16)) {
    for (int64_t r = 0; r < kMoveRows; ++r) positions_.push_back(static_cast<int32_t>(70 + r));
    for (int64_t p = 0; p < kPages; ++p) page_of_.push_back((p * 3 + table_shift) % kPages);
  }
  std::vector<Output> Reference() const override {
    std::vector<float> expected = memory_;
    for (int64_t r = 0; r < kMoveRows; ++r) {
      const int64_t p = positions_[r];
      std::copy_n(
          src_.begin() + r * kMoveStride, kMoveWidth,
          expected.begin() + page_of_[p / kB] * page_floats_ + offset_ + (p % kB) * kMoveWidth);
    }
    return {{"pages", expected}};
  }
  std::vector<Output> Run(model::Backend& backend) const override {
    Staging staging(backend);
    float* memory = staging.In(memory_);
    std::vector<float*> table;
    for (const int64_t page : page_of_) table.push_back(memory + page * page_floats_);
    backend.WriteBlockKv({.rows = kMoveRows,
                          .width = kMoveWidth,
                          .src = staging.In(src_),
                          .src_stride = kMoveStride,
                          .positions = staging.In(positions_),
                          .pages = staging.In(table),
                          .block_size = kB,
                          .offset = offset_});
    staging.Out("pages", memory, memory_.size());
    return staging.Finish();
  }

 private:
  static constexpr int64_t kB = 16, kPages = 8;
  int64_t page_floats_, offset_;
  std::vector<float> src_, memory_;
  std::vector<int32_t> positions_;
  std::vector<int64_t> page_of_;
};

// ---- Attention.

// The attention of one entry by definition: for each (row, head), one softmax over the global
// keys [0, pos] (when the entry has block KV) and the SWA keys [lo, pos], in double.
std::vector<float> NaiveAttention(const AttentionData& d) {
  const AttentionCase& c = d.c;
  const int64_t hd = c.head_dim, q_dim = c.heads * hd, kv_dim = c.kv_heads * hd;
  const int64_t qkv_dim = q_dim + 2 * kv_dim, group = c.heads / c.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<float> out(c.rows * q_dim, 0.0f);
  for (int64_t r = 0; r < c.rows; ++r) {
    const int64_t pos = d.positions[r], lo = d.lo[r];
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t col = (h / group) * hd;
      std::vector<const float*> keys, values;
      if (c.global) {
        for (int64_t j = 0; j <= pos; ++j) {
          const float* page = d.page_table[j / c.block_size];
          keys.push_back(page + d.global_cpu.k_offset + (j % c.block_size) * kv_dim + col);
          values.push_back(page + d.global_cpu.v_offset + (j % c.block_size) * kv_dim + col);
        }
      }
      for (int64_t j = lo; j <= pos; ++j) {
        if (j >= c.first_position) {  // this entry's own rows (the tail)
          const float* row = d.qkv.data() + (j - c.first_position) * qkv_dim;
          keys.push_back(row + q_dim + col);
          values.push_back(row + q_dim + kv_dim + col);
        } else {  // the ring: position j in slot j % C
          keys.push_back(d.ring.data() + (j % c.capacity) * kv_dim + col);
          values.push_back(d.ring.data() + c.capacity * kv_dim + (j % c.capacity) * kv_dim + col);
        }
      }
      if (keys.empty()) continue;  // no visible key: zero
      const float* q = d.qkv.data() + r * qkv_dim + h * hd;
      std::vector<double> score(keys.size());
      double max_score = -INFINITY;
      for (size_t k = 0; k < keys.size(); ++k) {
        double dot = 0;
        for (int64_t i = 0; i < hd; ++i) dot += double(q[i]) * keys[k][i];
        score[k] = dot * scale;
        max_score = std::max(max_score, score[k]);
      }
      double total = 0;
      for (double& s : score) total += (s = std::exp(s - max_score));
      std::vector<double> sum(hd, 0.0);
      for (size_t k = 0; k < keys.size(); ++k) {
        const double weight = score[k] / total;
        for (int64_t i = 0; i < hd; ++i) sum[i] += weight * values[k][i];
      }
      for (int64_t i = 0; i < hd; ++i) out[r * q_dim + h * hd + i] = static_cast<float>(sum[i]);
    }
  }
  return out;
}

// Entries run as one batch (so that the flattening of entries is exercised), outputs filled
// with NaN before (every element must be written); with `poison_unseen_ring`, ring slots no row
// of an entry can see hold NaN (PoisonUnseenRing).
class AttentionBatchCase : public OpCase {
 public:
  AttentionBatchCase(const std::vector<AttentionCase>& cases, bool poison_unseen_ring) {
    for (const AttentionCase& c : cases) {
      data_.push_back(std::make_unique<AttentionData>(c));
      if (poison_unseen_ring) PoisonUnseenRing(*data_.back());
      std::fill(data_.back()->out.begin(), data_.back()->out.end(), NAN);
    }
  }
  std::vector<Output> Reference() const override {
    std::vector<Output> outputs;
    for (size_t e = 0; e < data_.size(); ++e)
      outputs.push_back({What(e), NaiveAttention(*data_[e])});
    return outputs;
  }
  std::vector<Output> Run(model::Backend& backend) const override {
    Staging staging(backend);
    std::vector<BlockKvSource> global(data_.size());  // host memory, as the params say
    std::vector<std::vector<float*>> tables(data_.size());
    std::vector<float*> outs;
    std::vector<AttentionParams> batch;
    for (size_t e = 0; e < data_.size(); ++e) {
      const AttentionData& d = *data_[e];
      if (d.c.global) {
        float* pages = staging.In(d.pages);
        for (const float* page : d.page_table) tables[e].push_back(pages + (page - d.pages.data()));
        global[e] = d.global_cpu;
        global[e].pages = staging.In(tables[e]);
      }
      outs.push_back(staging.In(d.out));
      batch.push_back(d.Params(staging.In(d.qkv), staging.In(d.ring), outs.back(),
                               staging.In(d.positions), staging.In(d.lo),
                               d.c.global ? &global[e] : nullptr));
    }
    backend.Attention(batch);
    for (size_t e = 0; e < data_.size(); ++e) staging.Out(What(e), outs[e], data_[e]->out.size());
    return staging.Finish();
  }

 private:
  static std::string What(size_t entry) { return "entry " + std::to_string(entry); }
  std::vector<std::unique_ptr<AttentionData>> data_;
};

// ---- The list.

// The CPU against the double-precision reference: FP32 rounding for row-wise ops, summation
// order for GEMM and attention, nothing for data movement.
constexpr Tolerance kExact{};
constexpr Tolerance kGemmCpu{1e-5f, 1e-4f};
// Each output of a product over K inputs is one FP32 chain of K fused multiply-adds of terms up
// to 1 in size, whose rounding grows with K (about K * 2^-24 / 3, root mean square): near-zero
// outputs of model-sized products need a bound that grows with it.
Tolerance GemmModelCpu(int64_t in) {
  return {4e-8f * static_cast<float>(in), 1e-4f};
}
// The fused SwiGLU: inputs in [-3, 3), so gate and up are three times a unit product, and
// silu(gate) * up multiplies the rounding of one by the other.
constexpr Tolerance kSwiGluGemmCpu{1e-4f, 1e-4f};
constexpr Tolerance kRowWiseCpu{1e-6f, 1e-5f};
constexpr Tolerance kAttention{2e-5f, 1e-4f};  // the CPU against the reference, CUDA against it

// The CUDA backend against the CPU: cuBLAS sums in another order (the bound grows with K).
Tolerance GemmCuda(int64_t in) {
  return {2e-6f * static_cast<float>(in), 1e-5f};
}

}  // namespace

GemmData MakeGemmData(const GemmShape& s) {
  const int64_t xs = s.x_stride ? s.x_stride : s.in, ys = s.y_stride ? s.y_stride : s.out;
  return {
      .x = Uniform(s.rows * xs, 1), .w = Uniform(s.out * s.in, 2), .y = Uniform(s.rows * ys, 3)};
}

std::vector<GemmShape> GemmTileShapes() {
  return {{.rows = 7, .in = 33, .out = 17, .x_stride = 40, .y_stride = 20},
          {.rows = 1, .in = 512, .out = 96, .beta = 1.0f},
          {.rows = 32, .in = 1536, .out = 130, .beta = 1.0f},
          {.rows = 5, .in = 16, .out = 4, .x_stride = 16, .y_stride = 4},
          {.rows = 33, .in = 64, .out = 9},
          {.rows = 65, .in = 70, .out = 3, .x_stride = 71, .y_stride = 5, .beta = 1.0f},
          {.rows = 2, .in = 100, .out = 80},
          {.rows = 200, .in = 48, .out = 70, .beta = 1.0f},
          kDecodeBatchGemm};
}

std::vector<GemmShape> GemmModelShapes() {
  auto padded = [](int64_t rows, int64_t in, int64_t out, float beta) {
    return GemmShape{
        .rows = rows, .in = in, .out = out, .x_stride = in + 3, .y_stride = out + 5, .beta = beta};
  };
  return {padded(1, 64, 96, 0.0f), padded(37, 512, 1536, 1.0f), padded(130, 1536, 512, 1.0f),
          padded(8, 4096, 128, 0.0f)};
}

Bf16WeightsData MakeBf16WeightsData() {
  Bf16WeightsData d;
  d.w = Uniform(d.out * d.in, 9);
  d.narrow = Narrow(d.w);
  for (const Bf16 v : d.narrow) d.widened.push_back(Bf16ToFloat(v));
  return d;
}

std::vector<float> Bf16WeightsX(const Bf16WeightsData& d, int64_t rows) {
  return Uniform(rows * d.in, 10 + rows);
}

std::vector<float> Bf16WeightsY(const Bf16WeightsData& d, int64_t rows) {
  return Uniform(rows * d.out, 20 + rows);
}

SwiGluGemmData MakeSwiGluGemmData() {
  SwiGluGemmData d;
  d.w = Uniform(2 * d.inter * d.in, 50);
  d.narrow = Narrow(d.w);
  return d;
}

std::vector<float> SwiGluGemmX(const SwiGluGemmData& d, int64_t rows) {
  return Uniform(rows * d.in, 60 + rows, -3.0f, 3.0f);
}

std::vector<float> Bf16RoundingInputs() {
  std::vector<float> in = Uniform(10000, 4, -1e4f, 1e4f);
  for (const uint32_t bits :
       {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xff800001u,
        0x00000000u, 0x80000000u, 0x7f7fffffu, 0x3f80ffffu, 0x00000001u}) {
    in.push_back(FromBits(bits));
  }
  return in;
}

std::vector<GemmBf16Shape> GemmBf16Shapes() {
  return {{.rows = 33, .in = 1024, .out = 768, .x_stride = 1030},
          {.rows = 33, .in = 1024, .out = 768}};
}

GemmBf16Data MakeGemmBf16Data(const GemmBf16Shape& s) {
  const int64_t xs = s.x_stride ? s.x_stride : s.in;
  return {.x = Narrow(Uniform(s.rows * xs, 5)),
          .w = Narrow(Uniform(s.out * s.in, 6)),
          .y = Uniform(s.rows * s.out, 7)};
}

std::vector<float> GemmBf16Reference(const GemmBf16Shape& s, const GemmBf16Data& d) {
  const int64_t xs = s.x_stride ? s.x_stride : s.in;
  std::vector<float> expected = d.y;
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t o = 0; o < s.out; ++o) {
      double sum = 0;
      for (int64_t k = 0; k < s.in; ++k) {
        sum += double(Bf16ToFloat(d.x[r * xs + k])) * Bf16ToFloat(d.w[o * s.in + k]);
      }
      expected[r * s.out + o] = static_cast<float>(sum + d.y[r * s.out + o]);
    }
  }
  return expected;
}

std::vector<float> GemmBf16OnTheCpu(const GemmBf16Shape& s, const GemmBf16Data& d) {
  std::vector<float> y = d.y;
  GemmBf16({.rows = s.rows,
            .in = s.in,
            .out = s.out,
            .x = d.x.data(),
            .x_stride = s.x_stride,
            .w = d.w.data(),
            .y = y.data(),
            .beta = 1.0f});
  return y;
}

std::vector<OpCaseSpec> OpCases() {
  std::vector<OpCaseSpec> cases;
  auto add = [&](std::string name, bool cpu_only, Tolerance cpu, Tolerance cuda,
                 std::function<std::unique_ptr<OpCase>()> make) {
    cases.push_back({std::move(name), cpu_only, cpu, cuda, std::move(make)});
  };

  for (const bool packed : {false, true}) {
    for (const bool model_sized : {false, true}) {
      for (const GemmShape& s : model_sized ? GemmModelShapes() : GemmTileShapes()) {
        add(GemmName(packed ? "GemmFp32PackedW" : "GemmFp32", s), packed,
            model_sized ? GemmModelCpu(s.in) : kGemmCpu, GemmCuda(s.in),
            [s, packed] { return std::make_unique<GemmFp32Case>(s, packed); });
      }
    }
  }
  for (const int64_t rows : kBf16WeightsRows) {
    for (const bool packed : {false, true}) {
      add((packed ? "GemmBf16WeightsPacked_" : "GemmBf16Weights_") + std::to_string(rows) + "rows",
          true, kGemmCpu, {},
          [rows, packed] { return std::make_unique<GemmBf16WeightsCase>(rows, packed); });
    }
  }
  for (const int64_t rows : kSwiGluGemmRows) {
    for (const bool bf16 : {false, true}) {
      add(std::string("GemmSwiGluFused") + (bf16 ? "Bf16W_" : "_") + std::to_string(rows) + "rows",
          true, kSwiGluGemmCpu, {},
          [rows, bf16] { return std::make_unique<GemmSwiGluFusedCase>(rows, bf16); });
    }
  }

  add("RmsNorm", false, kRowWiseCpu, {1e-6f, 1e-6f},
      [] { return std::make_unique<RmsNormCase>(false); });
  add("RmsNormInPlace", false, kRowWiseCpu, {1e-6f, 1e-6f},
      [] { return std::make_unique<RmsNormCase>(true); });
  for (const int64_t head_dim : {2, 64, 128}) {
    for (const int64_t rows : {1, 3, 21}) {
      add("RopeDecodeSteps_HeadDim" + std::to_string(head_dim) + "_" + std::to_string(rows) +
              "rows",
          false, kRowWiseCpu, {1e-6f, 1e-6f},
          [head_dim, rows] { return RopeDecodeStepsCase(head_dim, rows); });
    }
  }
  for (const int64_t head_dim : {32, 64, 128, 256}) {
    add("RopeWidePositions_HeadDim" + std::to_string(head_dim), false, kRowWiseCpu, {1e-6f, 1e-6f},
        [head_dim] { return RopeWidePositionsCase(head_dim); });
  }
  add("SwiGluWithExtremeGates", false, kRowWiseCpu, {1e-6f, 2e-6f},
      [] { return std::make_unique<SwiGluCase>(); });
  add("Embedding", false, kExact, kExact, [] { return std::make_unique<EmbeddingCase>(); });

  std::vector<int32_t> in_order, reversed, strided_slots, tail_slots;
  for (int32_t r = 0; r < kMoveRows; ++r) {
    in_order.push_back(r % 7 == 3 ? -1 : r);
    reversed.push_back(r % 7 == 3 ? -1 : static_cast<int32_t>(kMoveRows - 1 - r));
    strided_slots.push_back(r % 5 == 1 ? -1 : (r * 11) % 50);
    // The plan's rule for a chunk's ring writes: slot pos % C for its last rows, -1 before.
    tail_slots.push_back(r < 12 ? -1 : (1000 + r) % 50);
  }
  add("GatherRows_InOrderWithSkips", false, kExact, kExact,
      [in_order] { return std::make_unique<GatherRowsCase>(in_order); });
  add("GatherRows_ReversedWithSkips", false, kExact, kExact,
      [reversed] { return std::make_unique<GatherRowsCase>(reversed); });
  add("ScatterRows_StridedSlotsWithSkips", false, kExact, kExact,
      [strided_slots] { return std::make_unique<ScatterRowsCase>(strided_slots); });
  add("ScatterRows_RingSlotsOfAChunksLastRows", false, kExact, kExact,
      [tail_slots] { return std::make_unique<ScatterRowsCase>(tail_slots); });
  constexpr int64_t B = 16;
  add("WriteBlockKv_VHalfOfOneLayerPages", false, kExact, kExact,
      [] { return std::make_unique<WriteBlockKvCase>(2 * B * kMoveWidth, B * kMoveWidth, 2); });
  add("WriteBlockKv_SecondLayerOfTwoLayerPages", false, kExact, kExact, [] {
    return std::make_unique<WriteBlockKvCase>(2 * 2 * B * kMoveWidth, 3 * B * kMoveWidth, 0);
  });

  auto attention = [&](std::string name, std::vector<AttentionCase> entries, bool poison) {
    add("Attention" + std::move(name), false, kAttention, kAttention,
        [entries = std::move(entries), poison] {
          return std::make_unique<AttentionBatchCase>(entries, poison);
        });
  };
  attention("ProducerSwaPrefillChunks", ProducerSwaCases(), false);
  attention("ConsumerUnionWithTruncatedLowerBounds", ConsumerUnionCases(), false);
  attention("PagedBlockKvDecodeBatch", DecodeBatchCases(), false);
  // One request alone (the CUDA launcher splits its keys across 32 blocks), then two.
  attention("LongContextDecode_OneRequest", {LongContextDecodeCases()[0]}, false);
  attention("LongContextDecode_TwoRequests", LongContextDecodeCases(), false);
  attention("LongContextTiles", LongContextTileCases(), false);
  attention("LongContextTiles_PoisonedRingOutsideEveryWindow", LongContextTileCases(), true);
  attention("EdgeShapes", EdgeShapeCases(), false);
  // Ring slots outside every row's window hold NaN: no output may see them.
  attention("ProducerSwa_PoisonedRingOutsideEveryWindow", ProducerSwaCases(), true);
  attention("ConsumerUnion_PoisonedRingOutsideEveryWindow", ConsumerUnionCases(), true);
  attention("DecodeBatch_PoisonedRingOutsideEveryWindow", DecodeBatchCases(), true);
  // One or a few one-row entries (a decode step at batch 1 to 3) have fewer (row, kv head)
  // pairs than the CPU has threads: their keys are split into several tasks whose softmaxes are
  // merged; positions where a split sees no key at all (a row at position 0 without block KV),
  // too.
  attention("FewRowDecode_OneRowAtPosition0",
            {{.heads = 8, .kv_heads = 1, .first_position = 0, .seed = 7}}, false);
  attention("FewRowDecode_OneRowWithNoVisibleKey",
            {{.heads = 4, .kv_heads = 1, .first_position = 5, .no_swa = true, .seed = 8}}, false);
  for (const int64_t heads : {8, 7, 1, 12}) {
    const AttentionCase c{.heads = heads,
                          .kv_heads = 1,
                          .window = 128,
                          .capacity = 134,
                          .block_size = 64,
                          .first_position = 700,
                          .global = true,
                          .seed = static_cast<uint64_t>(400 + heads)};
    attention("FewRowDecode_OneRow" + std::to_string(heads) + "Heads", {c}, false);
    std::vector<AttentionCase> three(3, c);
    for (int i = 0; i < 3; ++i) three[i].seed += 10 * i + 1;
    attention("FewRowDecode_ThreeRows" + std::to_string(heads) + "Heads", three, false);
  }
  return cases;
}

}  // namespace baton::kernels::op_cases
