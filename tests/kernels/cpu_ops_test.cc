// Every op of the CPU backend, at every instruction-set level this CPU runs (cpu_isa.h: each
// test is instantiated per level, e.g. Levels/CpuOpsTest.PagedBlockKvDecodeBatch/avx2),
// against a naive reference computed here in double precision, over
// the same op list (and, for attention, the same cases: op_cases.h) that the CPU/CUDA
// consistency harness uses. Tolerances: exact for data movement and BF16 rounding; FP32
// rounding for row-wise ops; summation-order bounds for GEMM and attention. Sampling runs on
// model/sampling.cc, which the model tests cover and the CUDA harness compares against.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "baton/kernels/attention.h"
#include "baton/kernels/cpu_isa.h"
#include "baton/kernels/elementwise.h"
#include "baton/kernels/gemm.h"
#include "baton/kernels/rows.h"
#include "op_cases.h"

namespace baton::kernels {
namespace {

using op_cases::AttentionCase;
using op_cases::AttentionData;
using op_cases::ExpectClose;
using op_cases::Uniform;

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
class CpuOpsTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override { ASSERT_TRUE(SetCpuIsa(GetParam())) << CpuIsaName(GetParam()); }
};

INSTANTIATE_TEST_SUITE_P(Levels, CpuOpsTest, ::testing::ValuesIn(SupportedCpuIsas()),
                         [](const ::testing::TestParamInfo<CpuIsa>& info) {
                           return std::string(CpuIsaName(info.param));
                         });

uint32_t Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}
float Bf16ToFloat(Bf16 v) {
  return FromBits(static_cast<uint32_t>(v) << 16);
}

TEST_P(CpuOpsTest, GemmFp32WithStridesAndBeta) {
  struct Shape {
    int64_t rows, in, out, x_stride, y_stride;
    float beta;
  };
  // Shapes cover whole and partial tiles of every level (rows past 6 and 2, panels past 4 and
  // outputs past the last whole panel of 16), blocks of 96 rows, and W as Linear lays it out
  // and packed.
  for (const Shape& s : {Shape{7, 33, 17, 40, 20, 0.0f}, Shape{1, 512, 96, 0, 0, 1.0f},
                         Shape{32, 1536, 130, 0, 0, 1.0f}, Shape{5, 16, 4, 16, 4, 0.0f},
                         Shape{33, 64, 9, 0, 0, 0.0f}, Shape{65, 70, 3, 71, 5, 1.0f},
                         Shape{2, 100, 80, 0, 0, 0.0f}, Shape{200, 48, 70, 0, 0, 1.0f}}) {
    const int64_t xs = s.x_stride ? s.x_stride : s.in, ys = s.y_stride ? s.y_stride : s.out;
    const std::vector<float> x = Uniform(s.rows * xs, 1), w = Uniform(s.out * s.in, 2);
    std::vector<float> y = Uniform(s.rows * ys, 3), expected = y;
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t o = 0; o < s.out; ++o) {
        double sum = 0;
        for (int64_t k = 0; k < s.in; ++k) sum += double(x[r * xs + k]) * w[o * s.in + k];
        expected[r * ys + o] = static_cast<float>(sum + s.beta * y[r * ys + o]);
      }
    }
    std::vector<float> panels(PackedWeightCount(s.out, s.in)), packed_y = y;
    PackWeights({.out = s.out, .in = s.in, .w = w.data()}, panels.data());
    Gemm({.rows = s.rows,
          .in = s.in,
          .out = s.out,
          .x = x.data(),
          .x_stride = s.x_stride,
          .w = w.data(),
          .y = y.data(),
          .y_stride = s.y_stride,
          .beta = s.beta});
    Gemm({.rows = s.rows,
          .in = s.in,
          .out = s.out,
          .x = x.data(),
          .x_stride = s.x_stride,
          .w = panels.data(),
          .w_packed = true,
          .y = packed_y.data(),
          .y_stride = s.y_stride,
          .beta = s.beta});
    // Columns of Y beyond `out` (the stride's padding) stay as they were.
    ExpectClose(expected, y, 1e-5f, 1e-4f, "gemm " + std::to_string(s.rows));
    EXPECT_EQ(packed_y, y) << "packed W, " << s.rows << " rows";
  }
}

// PackWeights lays W out in panels of 16 outputs, input by input, zero past the last output;
// its BF16 form holds each weight rounded as ToBf16 rounds it.
TEST_P(CpuOpsTest, PackedWeightsAreThePanelsOfW) {
  const int64_t out = 37, in = 5;
  const std::vector<float> w = Uniform(out * in, 4);
  ASSERT_EQ(PackedWeightCount(out, in), 48 * in);
  std::vector<float> panels(PackedWeightCount(out, in), NAN);
  std::vector<Bf16> narrow_panels(panels.size(), 0xffff), narrow(w.size());
  PackWeights({.out = out, .in = in, .w = w.data()}, panels.data());
  PackWeights({.out = out, .in = in, .w = w.data()}, narrow_panels.data());
  ToBf16({.count = out * in, .in = w.data(), .out = narrow.data()});
  for (int64_t o = 0; o < 48; ++o) {
    for (int64_t k = 0; k < in; ++k) {
      const int64_t at = (o / 16) * 16 * in + k * 16 + o % 16;
      EXPECT_EQ(panels[at], o < out ? w[o * in + k] : 0.0f) << "output " << o << ", input " << k;
      EXPECT_EQ(narrow_panels[at], o < out ? narrow[o * in + k] : Bf16{0}) << o << ", " << k;
    }
  }
}

// A decode step's rows go through one GEMM: each row's product must be the one it would get
// alone, to the bit, so that a request's tokens do not depend on which others share its batch.
TEST_P(CpuOpsTest, ARowsProductDoesNotDependOnItsBatch) {
  const int64_t rows = 101, in = 200, out = 37;  // tiles of every height, two blocks of rows
  const std::vector<float> x = Uniform(rows * in, 7), w = Uniform(out * in, 8);
  std::vector<float> batch(rows * out);
  Gemm({.rows = rows, .in = in, .out = out, .x = x.data(), .w = w.data(), .y = batch.data()});
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> alone(out);
    Gemm({.rows = 1,
          .in = in,
          .out = out,
          .x = x.data() + r * in,
          .w = w.data(),
          .y = alone.data()});
    EXPECT_EQ(0, std::memcmp(alone.data(), batch.data() + r * out, out * sizeof(float)))
        << "row " << r;
  }
}

// BF16 weights are widened exactly as they are read, so each row of Gemm over them equals the
// FP32 product of that row alone with the widened matrix, bit for bit, at every number of rows
// (outputs past the last whole panel), with beta, packed or not.
TEST_P(CpuOpsTest, Bf16WeightsGiveTheProductOfTheWidenedWeights) {
  const int64_t in = 203, out = 37;
  const std::vector<float> w = Uniform(out * in, 9);
  std::vector<Bf16> narrow(w.size());
  ToBf16({.count = static_cast<int64_t>(w.size()), .in = w.data(), .out = narrow.data()});
  std::vector<float> widened(w.size());
  for (size_t i = 0; i < w.size(); ++i) widened[i] = Bf16ToFloat(narrow[i]);
  for (int64_t rows : {1, 7, 32, 70, 130}) {
    const std::vector<float> x = Uniform(rows * in, 10 + rows);
    for (float beta : {0.0f, 1.0f}) {
      std::vector<float> expected = Uniform(rows * out, 20 + rows), got = expected;
      for (int64_t r = 0; r < rows; ++r) {
        Gemm({.rows = 1,
              .in = in,
              .out = out,
              .x = x.data() + r * in,
              .w = widened.data(),
              .y = expected.data() + r * out,
              .beta = beta});
      }
      std::vector<float> packed_got = got;
      Gemm({.rows = rows,
            .in = in,
            .out = out,
            .x = x.data(),
            .w_bf16 = narrow.data(),
            .y = got.data(),
            .beta = beta});
      EXPECT_EQ(got, expected) << rows << " rows, beta " << beta;
      std::vector<Bf16> panels(PackedWeightCount(out, in));
      PackWeights({.out = out, .in = in, .w = widened.data()}, panels.data());
      Gemm({.rows = rows,
            .in = in,
            .out = out,
            .x = x.data(),
            .w_bf16 = panels.data(),
            .w_packed = true,
            .y = packed_got.data(),
            .beta = beta});
      EXPECT_EQ(packed_got, expected) << rows << " rows, beta " << beta << ", packed";
    }
  }
}

// A gate_up packed by PackSwiGluWeights, multiplied with swiglu: its SwiGLU outputs are those of
// the product followed by SwiGlu, bit for bit, FP32 and BF16, at every number of rows (pairs of
// panels split unevenly over the threads, blocks of 96 rows).
TEST_P(CpuOpsTest, SwiGluFusedIntoTheProductEqualsTheProductThenSwiGlu) {
  const int64_t inter = 48, in = 70;
  const std::vector<float> w = Uniform(2 * inter * in, 50);
  std::vector<Bf16> narrow(w.size());
  ToBf16({.count = static_cast<int64_t>(w.size()), .in = w.data(), .out = narrow.data()});
  std::vector<float> panels(PackedWeightCount(2 * inter, in));
  std::vector<Bf16> narrow_panels(panels.size());
  PackSwiGluWeights({.out = 2 * inter, .in = in, .w = w.data()}, panels.data());
  PackSwiGluWeights({.out = 2 * inter, .in = in, .w = w.data()}, narrow_panels.data());
  for (int64_t rows : {1, 2, 5, 7, 64, 130}) {
    const std::vector<float> x = Uniform(rows * in, 60 + rows, -3.0f, 3.0f);
    for (bool bf16 : {false, true}) {
      std::vector<float> gate_up(rows * 2 * inter), expected(rows * inter);
      Gemm({.rows = rows,
            .in = in,
            .out = 2 * inter,
            .x = x.data(),
            .w = bf16 ? nullptr : w.data(),
            .w_bf16 = bf16 ? narrow.data() : nullptr,
            .y = gate_up.data()});
      SwiGlu({.rows = rows, .inter = inter, .gate_up = gate_up.data(), .out = expected.data()});
      std::vector<float> scratch(rows * 2 * inter), act(rows * inter, NAN);
      Gemm({.rows = rows,
            .in = in,
            .out = 2 * inter,
            .x = x.data(),
            .w = bf16 ? nullptr : panels.data(),
            .w_bf16 = bf16 ? narrow_panels.data() : nullptr,
            .w_packed = true,
            .y = scratch.data(),
            .swiglu = act.data()});
      EXPECT_EQ(act, expected) << rows << " rows" << (bf16 ? ", bf16" : "");
    }
  }
}

TEST_P(CpuOpsTest, ToBf16RoundsToNearestEvenAndKeepsNaN) {
  std::vector<float> in = Uniform(10000, 4, -1e4f, 1e4f);
  // Ties: exactly half an ulp of BF16 above an even and an odd mantissa; infinities; NaNs.
  in.push_back(FromBits(0x3f808000u));  // tie, even below: rounds down to 0x3f80
  in.push_back(FromBits(0x3f818000u));  // tie, odd below: rounds up to 0x3f82
  in.push_back(FromBits(0x3f808001u));  // above the tie: up
  in.push_back(std::numeric_limits<float>::infinity());
  in.push_back(-std::numeric_limits<float>::infinity());
  in.push_back(std::numeric_limits<float>::quiet_NaN());
  in.push_back(FromBits(0xff800001u));  // a signalling NaN whose payload is in the low bits
  std::vector<Bf16> out(in.size());
  ToBf16({.count = static_cast<int64_t>(in.size()), .in = in.data(), .out = out.data()});
  for (size_t i = 0; i < in.size(); ++i) {
    if (std::isnan(in[i])) {
      EXPECT_TRUE(std::isnan(Bf16ToFloat(out[i]))) << "NaN " << i << " became a number";
      EXPECT_EQ(out[i] & 0x8000u, (Bits(in[i]) >> 16) & 0x8000u) << "sign of NaN " << i;
      continue;
    }
    // The nearest BF16 value; on a tie, the one with an even mantissa.
    const uint32_t b = Bits(in[i]);
    const Bf16 down = static_cast<Bf16>(b >> 16), up = static_cast<Bf16>(down + 1);
    const double d_down = std::abs(double(in[i]) - Bf16ToFloat(down));
    const double d_up = std::isinf(in[i]) ? INFINITY : std::abs(double(in[i]) - Bf16ToFloat(up));
    const Bf16 nearest = d_down < d_up ? down : d_up < d_down ? up : (down & 1u) == 0 ? down : up;
    EXPECT_EQ(out[i], nearest) << "value " << in[i] << " (bits " << std::hex << b << ")";
  }
  EXPECT_EQ(out[10000], 0x3f80u);
  EXPECT_EQ(out[10001], 0x3f82u);
  EXPECT_EQ(out[10002], 0x3f81u);
}

TEST_P(CpuOpsTest, GemmBf16AccumulatesInFp32) {
  const int64_t rows = 33, in = 1024, out = 768, x_stride = 1030;
  const std::vector<float> xf = Uniform(rows * x_stride, 5), wf = Uniform(out * in, 6);
  std::vector<Bf16> x(xf.size()), w(wf.size());
  ToBf16({.count = static_cast<int64_t>(xf.size()), .in = xf.data(), .out = x.data()});
  ToBf16({.count = static_cast<int64_t>(wf.size()), .in = wf.data(), .out = w.data()});
  std::vector<float> y = Uniform(rows * out, 7), expected = y;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0;
      for (int64_t k = 0; k < in; ++k) {
        sum += double(Bf16ToFloat(x[r * x_stride + k])) * Bf16ToFloat(w[o * in + k]);
      }
      expected[r * out + o] = static_cast<float>(sum + y[r * out + o]);
    }
  }
  GemmBf16({.rows = rows,
            .in = in,
            .out = out,
            .x = x.data(),
            .x_stride = x_stride,
            .w = w.data(),
            .y = y.data(),
            .beta = 1.0f});
  ExpectClose(expected, y, 1e-4f, 1e-4f, "gemm bf16");
}

TEST_P(CpuOpsTest, RmsNormOutOfPlaceAndInPlace) {
  const int64_t rows = 19, dim = 4096 + 7;
  std::vector<float> x = Uniform(rows * dim, 8, -3.0f, 3.0f);
  const std::vector<float> weight = Uniform(dim, 9);
  const float eps = 1e-5f;
  std::vector<float> expected(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double squares = 0;
    for (int64_t i = 0; i < dim; ++i) squares += double(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(squares / dim + eps);
    for (int64_t i = 0; i < dim; ++i) {
      expected[r * dim + i] = static_cast<float>(x[r * dim + i] * inv * weight[i]);
    }
  }
  std::vector<float> out(x.size());
  RmsNorm({.rows = rows,
           .dim = dim,
           .x = x.data(),
           .weight = weight.data(),
           .out = out.data(),
           .eps = eps});
  ExpectClose(expected, out, 1e-6f, 1e-5f, "rmsnorm");
  RmsNorm({.rows = rows,
           .dim = dim,
           .x = x.data(),
           .weight = weight.data(),
           .out = x.data(),
           .eps = eps});
  ExpectClose(expected, x, 1e-6f, 1e-5f, "rmsnorm in place");
}

// Rows of `stride` floats, `heads` heads each, rotated by the definition (in double, cos and sin
// rounded to FP32 as the op does).
std::vector<float> NaiveRope(const std::vector<float>& x, const std::vector<int32_t>& positions,
                             int64_t heads, int64_t head_dim, int64_t stride, double theta) {
  const int64_t half = head_dim / 2;
  std::vector<float> expected = x;  // padding columns stay as they are
  for (size_t r = 0; r < positions.size(); ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* in = x.data() + r * stride + h * head_dim;
      float* e = expected.data() + r * stride + h * head_dim;
      for (int64_t k = 0; k < half; ++k) {
        const double angle = positions[r] * std::pow(theta, -2.0 * k / head_dim);
        // The op rounds cos and sin to FP32, as Hugging Face's cached tables do.
        const double c = static_cast<float>(std::cos(angle));
        const double s = static_cast<float>(std::sin(angle));
        e[k] = static_cast<float>(in[k] * c - in[k + half] * s);
        e[k + half] = static_cast<float>(in[k + half] * c + in[k] * s);
      }
    }
  }
  return expected;
}

// Decode-sized (one row, a few) and prefill-sized row counts; the CPU op keeps the cos and sin
// of the last position lists it saw, so the same array rewritten in place, and two lists in
// turn, must each give their own rotation.
TEST_P(CpuOpsTest, RopeOnStridedHeadsAtLargePositions) {
  const double theta = 500000.0;
  for (int64_t head_dim : {2, 64, 128}) {
    for (int64_t rows : {1, 3, 21}) {
      const int64_t heads = 5, stride = heads * head_dim + 16;
      std::vector<int32_t> positions, others;
      for (int64_t r = 0; r < rows; ++r) {
        positions.push_back(static_cast<int32_t>(r * 9973 % 200000));
        others.push_back(static_cast<int32_t>(r * 7919 % 100000 + 3));
      }
      const std::string what =
          "rope head_dim " + std::to_string(head_dim) + ", " + std::to_string(rows) + " rows";
      for (int round = 0; round < 3; ++round) {
        for (std::vector<int32_t>* list : {&positions, &others}) {
          std::vector<float> x = Uniform(rows * stride, 10 + round);
          const std::vector<float> expected =
              NaiveRope(x, *list, heads, head_dim, stride, theta);
          Rope({.rows = rows,
                .heads = heads,
                .head_dim = head_dim,
                .x = x.data(),
                .stride = stride,
                .positions = list->data(),
                .theta = theta});
          ExpectClose(expected, x, 1e-6f, 1e-5f, what + ", round " + std::to_string(round));
        }
        for (int32_t& p : positions) p += 1;  // the same array, rewritten: a decode step later
      }
    }
  }
}

TEST_P(CpuOpsTest, SwiGluAndEmbedding) {
  const int64_t rows = 17, inter = 1536 + 3, vocab = 300, dim = 200;
  std::vector<float> gate_up = Uniform(rows * 2 * inter, 11, -8.0f, 8.0f);
  // Gates past the range where e^-g is a normal float, on both sides.
  const float extremes[] = {-1e4f, -120.0f, -89.0f, -87.5f, -86.9f, 87.5f, 89.0f, 120.0f, 1e4f};
  for (size_t i = 0; i < std::size(extremes); ++i) gate_up[3 * 2 * inter + 5 * i] = extremes[i];
  std::vector<float> act(rows * inter), expected(rows * inter);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < inter; ++i) {
      const double g = gate_up[r * 2 * inter + i], u = gate_up[r * 2 * inter + inter + i];
      expected[r * inter + i] = static_cast<float>(g / (1.0 + std::exp(-g)) * u);
    }
  }
  SwiGlu({.rows = rows, .inter = inter, .gate_up = gate_up.data(), .out = act.data()});
  ExpectClose(expected, act, 1e-6f, 1e-5f, "swiglu");

  const std::vector<float> table = Uniform(vocab * dim, 12);
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < rows; ++r) ids.push_back(static_cast<int32_t>((r * 37 + 5) % vocab));
  ids.back() = vocab - 1;
  std::vector<float> emb(rows * dim);
  Embedding(
      {.rows = rows, .dim = dim, .table = table.data(), .ids = ids.data(), .out = emb.data()});
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(std::equal(emb.begin() + r * dim, emb.begin() + (r + 1) * dim,
                           table.begin() + ids[r] * dim))
        << "embedding row " << r;
  }
}

TEST_P(CpuOpsTest, GatherScatterAndBlockKvWrite) {
  const int64_t rows = 40, width = 96, src_stride = 130, capacity = 50, B = 16, pages = 8;
  const std::vector<float> src = Uniform(rows * src_stride, 13);
  std::vector<int32_t> index;
  for (int64_t r = 0; r < rows; ++r) index.push_back(r % 7 == 3 ? -1 : static_cast<int32_t>(r));

  // Gather: dst[r] = src[index[r]], rows with -1 untouched.
  std::vector<float> gathered = Uniform(rows * width, 14), expected = gathered;
  for (int64_t r = 0; r < rows; ++r) {
    if (index[r] < 0) continue;
    std::copy_n(src.begin() + index[r] * src_stride, width, expected.begin() + r * width);
  }
  GatherRows({.rows = rows,
              .width = width,
              .src = src.data(),
              .src_stride = src_stride,
              .index = index.data(),
              .dst = gathered.data(),
              .dst_stride = width});
  EXPECT_EQ(gathered, expected) << "GatherRows";

  // Scatter into ring slots: dst[slot] = src[r], slot -1 skipped.
  std::vector<int32_t> slots;
  for (int64_t r = 0; r < rows; ++r) {
    slots.push_back(r % 5 == 1 ? -1 : static_cast<int32_t>((r * 11) % capacity));
  }
  std::vector<float> ring = Uniform(capacity * width, 15), ring_expected = ring;
  for (int64_t r = 0; r < rows; ++r) {
    if (slots[r] < 0) continue;
    std::copy_n(src.begin() + r * src_stride, width, ring_expected.begin() + slots[r] * width);
  }
  ScatterRows({.rows = rows,
               .width = width,
               .src = src.data(),
               .src_stride = src_stride,
               .index = slots.data(),
               .dst = ring.data(),
               .dst_stride = width});
  EXPECT_EQ(ring, ring_expected) << "ScatterRows";

  // Block KV: position p to pages[p / B] + offset + (p % B) * width, through a shuffled table.
  const int64_t page_floats = 2 * B * width, offset = B * width;  // the V half of each page
  std::vector<float> memory = Uniform(pages * page_floats, 16), memory_expected = memory;
  std::vector<float*> table, table_expected;
  for (int64_t p = 0; p < pages; ++p) {
    table.push_back(memory.data() + ((p * 3 + 2) % pages) * page_floats);
    table_expected.push_back(memory_expected.data() + ((p * 3 + 2) % pages) * page_floats);
  }
  std::vector<int32_t> positions;
  for (int64_t r = 0; r < rows; ++r) positions.push_back(static_cast<int32_t>(70 + r * 1));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = positions[r];
    std::copy_n(src.begin() + r * src_stride, width,
                table_expected[p / B] + offset + (p % B) * width);
  }
  WriteBlockKv({.rows = rows,
                .width = width,
                .src = src.data(),
                .src_stride = src_stride,
                .positions = positions.data(),
                .pages = table.data(),
                .block_size = B,
                .offset = offset});
  EXPECT_EQ(memory, memory_expected) << "WriteBlockKv";
}

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

// All cases of a list as one batch (so the flattening of entries is exercised), each entry
// against its naive attention.
void ExpectAttentionMatchesTheDefinition(const std::vector<AttentionCase>& cases,
                                         const std::string& what, bool poison_unseen_ring = false) {
  std::vector<std::unique_ptr<AttentionData>> data;
  std::vector<AttentionParams> batch;
  for (const AttentionCase& c : cases) {
    data.push_back(std::make_unique<AttentionData>(c));
    AttentionData& d = *data.back();
    if (poison_unseen_ring) op_cases::PoisonUnseenRing(d);
    std::fill(d.out.begin(), d.out.end(), NAN);  // every output element must be written
    batch.push_back(d.Params(d.qkv.data(), d.ring.data(), d.out.data(), d.positions.data(),
                             d.lo.data(), c.global ? &d.global_cpu : nullptr));
  }
  Attention(batch);
  for (size_t e = 0; e < data.size(); ++e) {
    ExpectClose(NaiveAttention(*data[e]), data[e]->out, 2e-5f, 1e-4f,
                what + " entry " + std::to_string(e));
  }
}

TEST_P(CpuOpsTest, ProducerSwaAttentionPrefillChunks) {
  ExpectAttentionMatchesTheDefinition(op_cases::ProducerSwaCases(), "producer SWA");
}

TEST_P(CpuOpsTest, ConsumerUnionAttentionWithTruncatedLowerBounds) {
  ExpectAttentionMatchesTheDefinition(op_cases::ConsumerUnionCases(), "consumer union");
}

TEST_P(CpuOpsTest, PagedBlockKvDecodeBatch) {
  ExpectAttentionMatchesTheDefinition(op_cases::DecodeBatchCases(), "decode");
}

// Ring slots outside every row's window hold NaN: no output may see them.
TEST_P(CpuOpsTest, AttentionNeverReadsRingSlotsOutsideEveryWindow) {
  for (const auto& [cases, what] : {std::pair{op_cases::ConsumerUnionCases(), "consumer union"},
                                    std::pair{op_cases::ProducerSwaCases(), "producer SWA"},
                                    std::pair{op_cases::DecodeBatchCases(), "decode"}}) {
    ExpectAttentionMatchesTheDefinition(cases, std::string(what) + ", poisoned ring", true);
  }
}

// One or a few one-row entries (a decode step at batch 1 to 3) have fewer (row, kv head) pairs
// than threads: their keys are split into several tasks whose softmaxes are merged; positions
// where a split sees no key at all (a row at position 0 without block KV), too.
TEST_P(CpuOpsTest, FewRowDecodeSplitsItsKeysAcrossTasks) {
  ExpectAttentionMatchesTheDefinition({{.heads = 8, .kv_heads = 1, .first_position = 0, .seed = 7}},
                                      "one row at position 0");
  ExpectAttentionMatchesTheDefinition(
      {{.heads = 4, .kv_heads = 1, .first_position = 5, .no_swa = true, .seed = 8}},
      "one row with no visible key");
  for (int64_t heads : {8, 7, 1, 12}) {
    AttentionCase c{.heads = heads,
                    .kv_heads = 1,
                    .window = 128,
                    .capacity = 134,
                    .block_size = 64,
                    .first_position = 700,
                    .global = true,
                    .seed = static_cast<uint64_t>(400 + heads)};
    ExpectAttentionMatchesTheDefinition({c}, "one row, " + std::to_string(heads) + " heads");
    std::vector<AttentionCase> three(3, c);
    for (int i = 0; i < 3; ++i) three[i].seed += 10 * i + 1;
    ExpectAttentionMatchesTheDefinition(three, "three rows, " + std::to_string(heads) + " heads");
  }
}

TEST_P(CpuOpsTest, LongContextDecode) {
  ExpectAttentionMatchesTheDefinition(op_cases::LongContextDecodeCases(), "long-context decode");
}

TEST_P(CpuOpsTest, AttentionEdgeShapes) {
  ExpectAttentionMatchesTheDefinition(op_cases::EdgeShapeCases(), "edge shapes");
}

// The levels with fused multiply-adds (AVX2 and AVX-512) sum every output in one order, whatever
// their tile shapes: their products agree bit for bit, FP32 and BF16 weights, at every batch a
// decode step takes (rows past each level's tiles, outputs past the last whole tile).
TEST(CpuIsaTest, FusedLevelsGiveTheSameProductsBitForBit) {
  std::vector<CpuIsa> fused;
  for (CpuIsa isa : SupportedCpuIsas()) {
    if (isa != CpuIsa::kBaseline) fused.push_back(isa);
  }
  if (fused.size() < 2) GTEST_SKIP() << "this CPU runs fewer than two levels with FMA";
  const int64_t in = 211, out = 23;
  const std::vector<float> w = Uniform(out * in, 31);
  std::vector<Bf16> narrow(w.size());
  ToBf16({.count = static_cast<int64_t>(w.size()), .in = w.data(), .out = narrow.data()});
  for (int64_t rows : {1, 2, 3, 5, 7, 13, 32, 64, 100}) {
    const std::vector<float> x = Uniform(rows * in, 40 + rows);
    for (bool bf16 : {false, true}) {
      std::vector<std::vector<float>> y;
      for (CpuIsa isa : fused) {
        ASSERT_TRUE(SetCpuIsa(isa));
        y.emplace_back(rows * out);
        Gemm({.rows = rows,
              .in = in,
              .out = out,
              .x = x.data(),
              .w = bf16 ? nullptr : w.data(),
              .w_bf16 = bf16 ? narrow.data() : nullptr,
              .y = y.back().data()});
      }
      for (size_t i = 1; i < y.size(); ++i) {
        EXPECT_EQ(y[i], y[0]) << CpuIsaName(fused[i]) << " against " << CpuIsaName(fused[0])
                              << ", " << rows << " rows" << (bf16 ? ", bf16" : "");
      }
    }
  }
}

TEST(CpuIsaTest, TheOverrideNamesTheVariableAndWhatIsAllowed) {
  EXPECT_EQ(CpuIsaEnvironmentError(nullptr), "");
  EXPECT_EQ(CpuIsaEnvironmentError(""), "");
  EXPECT_EQ(CpuIsaEnvironmentError("baseline"), "");
  EXPECT_EQ(CpuIsaEnvironmentError("avx9"),
            "BATON_CPU_ISA: 'avx9' is not a level; use baseline, avx2 or avx512");
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    const std::vector<CpuIsa> levels = SupportedCpuIsas();
    const bool supported = std::find(levels.begin(), levels.end(), isa) != levels.end();
    const std::string error = CpuIsaEnvironmentError(CpuIsaName(isa));
    EXPECT_EQ(error.empty(), supported) << error;
    if (!supported) {
      EXPECT_NE(error.find("it runs baseline"), std::string::npos) << error;
    }
    EXPECT_EQ(SetCpuIsa(isa), supported);
  }
  for (CpuIsa isa : SupportedCpuIsas()) EXPECT_EQ(ParseCpuIsa(CpuIsaName(isa)), isa);
}

// A process whose BATON_CPU_ISA names no level stops at the first kernel, exit code 2, rather
// than run at a level nobody asked for.
TEST(CpuIsaDeathTest, AnUnknownLevelEndsTheProcessNamingTheVariable) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: the level is not settled
  setenv("BATON_CPU_ISA", "avx9", 1);
  EXPECT_EXIT(ActiveCpuIsa(), ::testing::ExitedWithCode(2),
              "BATON_CPU_ISA: 'avx9' is not a level; use baseline, avx2 or avx512");
  unsetenv("BATON_CPU_ISA");
}

}  // namespace
}  // namespace baton::kernels
