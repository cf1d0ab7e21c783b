// The kernel harness (STYLE rule 4; llama.cpp's test-backend-ops): every case of the one op list
// (op_cases.h) runs on every model::Backend this process can make, against the case's reference
// computed in double precision: the CPU backend at every instruction-set level this CPU runs
// (cpu_isa.h), and the CUDA backend (model::MakeBackend). Each test is one (case, backend) pair,
// e.g. Ops/BackendOpsTest.MatchesTheReference/GemmFp32_7x33x17_Strided_on_cpu_avx2 or
// ..._on_cuda, so that a GPU run can take the CUDA side alone (--gtest_filter='*_on_cuda').
//
// What passing promises: each backend's outputs, padding and untouched rows included, lie within
// the case's tolerance of the reference (exact for data movement; FP32 rounding for row-wise
// ops; summation-order bounds for GEMM and attention); CUDA's also lie within the CPU/CUDA
// consistency tolerance of the CPU backend's, run on the same inputs at the CPU's best level.
// Without a CUDA build or device the CUDA tests skip, naming the reason.
//
// Below the harness, the properties of the CPU backend alone (bit-for-bit products across
// levels, batches and weight layouts; the BATON_CPU_ISA override) and of the ops that
// model::Backend does not carry (ToBf16, GemmBf16, PackWeights), on the list's inputs.
// cuda_consistency_test.cc holds the CUDA side of those, and what only a CUDA context has.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "baton/kernels/cpu_isa.h"
#include "baton/kernels/elementwise.h"
#include "baton/kernels/gemm.h"
#include "baton/model/engine_factory.h"
#include "op_cases.h"

namespace baton::kernels {
namespace {

using op_cases::Bf16ToFloat;
using op_cases::ExpectClose;
using op_cases::OpCaseSpec;
using op_cases::Uniform;

// A backend to run on: the CPU at one level, or CUDA.
struct Target {
  model::Device device = model::Device::kCpu;
  CpuIsa isa = CpuIsa::kBaseline;  // the CPU's level (CUDA: unused)

  std::string Name() const {
    return device == model::Device::kCpu ? std::string("cpu_") + CpuIsaName(isa) : "cuda";
  }
};

struct BackendOp {
  OpCaseSpec op;
  Target target;
};

void PrintTo(const BackendOp& test, std::ostream* os) {
  *os << test.op.name << " on " << test.target.Name();
}

std::vector<BackendOp> EveryOpOnEveryBackend() {
  std::vector<BackendOp> tests;
  for (const OpCaseSpec& op : op_cases::OpCases()) {
    for (const CpuIsa isa : SupportedCpuIsas()) tests.push_back({op, {model::Device::kCpu, isa}});
    if (!op.cpu_only) tests.push_back({op, {model::Device::kCuda}});
  }
  return tests;
}

class BackendOpsTest : public ::testing::TestWithParam<BackendOp> {
 protected:
  void SetUp() override {
    const Target& target = GetParam().target;
    if (target.device == model::Device::kCpu) {
      ASSERT_TRUE(SetCpuIsa(target.isa)) << CpuIsaName(target.isa);
      backend_ = model::MakeCpuBackend();
      return;
    }
    absl::StatusOr<std::unique_ptr<model::Backend>> backend = model::MakeBackend(target.device);
    if (!backend.ok()) {
      GTEST_SKIP() << backend.status().message() << "; the " << target.Name()
                   << " side of the harness runs only where that backend can be made";
    }
    backend_ = *std::move(backend);
    // The CPU it is compared with runs as a deployment runs it, at the best level.
    ASSERT_TRUE(SetCpuIsa(SupportedCpuIsas().back()));
  }

  std::unique_ptr<model::Backend> backend_;
};

INSTANTIATE_TEST_SUITE_P(Ops, BackendOpsTest, ::testing::ValuesIn(EveryOpOnEveryBackend()),
                         [](const ::testing::TestParamInfo<BackendOp>& info) {
                           return info.param.op.name + "_on_" + info.param.target.Name();
                         });

TEST_P(BackendOpsTest, MatchesTheReference) {
  const OpCaseSpec& spec = GetParam().op;
  const std::string on = " on " + GetParam().target.Name();
  const std::unique_ptr<op_cases::OpCase> op = spec.make();
  const std::vector<op_cases::Output> got = op->Run(*backend_);
  if (backend_->device() == model::Device::kCpu) {
    op_cases::ExpectOutputsClose(op->Reference(), got, spec.cpu, spec.name + on);
    return;
  }
  const std::vector<op_cases::Output> cpu = op->Run(*model::MakeCpuBackend());
  op_cases::ExpectOutputsClose(cpu, got, spec.cuda, spec.name + on + " against the cpu");
  op_cases::ExpectOutputsClose(op->Reference(), got, op_cases::Chained(spec.cuda, spec.cpu),
                               spec.name + on);
}

// ---- The CPU backend alone: properties that hold bit for bit, at every level.

uint32_t Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

class CpuOpsTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override { ASSERT_TRUE(SetCpuIsa(GetParam())) << CpuIsaName(GetParam()); }
};

INSTANTIATE_TEST_SUITE_P(Levels, CpuOpsTest, ::testing::ValuesIn(SupportedCpuIsas()),
                         [](const ::testing::TestParamInfo<CpuIsa>& info) {
                           return std::string(CpuIsaName(info.param));
                         });

// A W packed once into panels gives the product of the same W unpacked, to the bit, on every
// FP32 shape of the list.
TEST_P(CpuOpsTest, PackedWeightsGiveTheUnpackedProductBitForBit) {
  std::vector<op_cases::GemmShape> shapes = op_cases::GemmTileShapes();
  for (const op_cases::GemmShape& s : op_cases::GemmModelShapes()) shapes.push_back(s);
  for (const op_cases::GemmShape& s : shapes) {
    const op_cases::GemmData d = op_cases::MakeGemmData(s);
    std::vector<float> panels(PackedWeightCount(s.out, s.in)), y = d.y, packed_y = d.y;
    PackWeights({.out = s.out, .in = s.in, .w = d.w.data()}, panels.data());
    for (const bool packed : {false, true}) {
      Gemm({.rows = s.rows,
            .in = s.in,
            .out = s.out,
            .x = d.x.data(),
            .x_stride = s.x_stride,
            .w = packed ? panels.data() : d.w.data(),
            .w_packed = packed,
            .y = packed ? packed_y.data() : y.data(),
            .y_stride = s.y_stride,
            .beta = s.beta});
    }
    EXPECT_EQ(packed_y, y) << s.rows << "x" << s.in << "x" << s.out;
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
  const op_cases::GemmShape& s = op_cases::kDecodeBatchGemm;
  const op_cases::GemmData d = op_cases::MakeGemmData(s);
  std::vector<float> batch(s.rows * s.out);
  Gemm({.rows = s.rows,
        .in = s.in,
        .out = s.out,
        .x = d.x.data(),
        .w = d.w.data(),
        .y = batch.data()});
  for (int64_t r = 0; r < s.rows; ++r) {
    std::vector<float> alone(s.out);
    Gemm({.rows = 1,
          .in = s.in,
          .out = s.out,
          .x = d.x.data() + r * s.in,
          .w = d.w.data(),
          .y = alone.data()});
    EXPECT_EQ(0, std::memcmp(alone.data(), batch.data() + r * s.out, s.out * sizeof(float)))
        << "row " << r;
  }
}

// BF16 weights are widened exactly as they are read, so each row of Gemm over them equals the
// FP32 product of that row alone with the widened matrix, bit for bit, at every number of rows
// (outputs past the last whole panel), with beta, packed or not.
TEST_P(CpuOpsTest, Bf16WeightsGiveTheProductOfTheWidenedWeights) {
  const op_cases::Bf16WeightsData d = op_cases::MakeBf16WeightsData();
  std::vector<Bf16> panels(PackedWeightCount(d.out, d.in));
  PackWeights({.out = d.out, .in = d.in, .w = d.widened.data()}, panels.data());
  for (const int64_t rows : op_cases::kBf16WeightsRows) {
    const std::vector<float> x = op_cases::Bf16WeightsX(d, rows);
    for (const float beta : {0.0f, 1.0f}) {
      std::vector<float> expected = op_cases::Bf16WeightsY(d, rows), got = expected;
      for (int64_t r = 0; r < rows; ++r) {
        Gemm({.rows = 1,
              .in = d.in,
              .out = d.out,
              .x = x.data() + r * d.in,
              .w = d.widened.data(),
              .y = expected.data() + r * d.out,
              .beta = beta});
      }
      std::vector<float> packed_got = got;
      Gemm({.rows = rows,
            .in = d.in,
            .out = d.out,
            .x = x.data(),
            .w_bf16 = d.narrow.data(),
            .y = got.data(),
            .beta = beta});
      EXPECT_EQ(got, expected) << rows << " rows, beta " << beta;
      Gemm({.rows = rows,
            .in = d.in,
            .out = d.out,
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
// the product followed by SwiGlu, bit for bit, FP32 and BF16, at every number of rows.
TEST_P(CpuOpsTest, SwiGluFusedIntoTheProductEqualsTheProductThenSwiGlu) {
  const op_cases::SwiGluGemmData d = op_cases::MakeSwiGluGemmData();
  const int64_t inter = d.inter, in = d.in;
  std::vector<float> panels(PackedWeightCount(2 * inter, in));
  std::vector<Bf16> narrow_panels(panels.size());
  PackSwiGluWeights({.out = 2 * inter, .in = in, .w = d.w.data()}, panels.data());
  PackSwiGluWeights({.out = 2 * inter, .in = in, .w = d.w.data()}, narrow_panels.data());
  for (const int64_t rows : op_cases::kSwiGluGemmRows) {
    const std::vector<float> x = op_cases::SwiGluGemmX(d, rows);
    for (const bool bf16 : {false, true}) {
      std::vector<float> gate_up(rows * 2 * inter), expected(rows * inter);
      Gemm({.rows = rows,
            .in = in,
            .out = 2 * inter,
            .x = x.data(),
            .w = bf16 ? nullptr : d.w.data(),
            .w_bf16 = bf16 ? d.narrow.data() : nullptr,
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
  const std::vector<float> in = op_cases::Bf16RoundingInputs();
  std::vector<Bf16> out(in.size());
  ToBf16({.count = static_cast<int64_t>(in.size()), .in = in.data(), .out = out.data()});
  for (size_t i = 0; i < in.size(); ++i) {
    if (std::isnan(in[i])) {
      EXPECT_TRUE(std::isnan(Bf16ToFloat(out[i]))) << "NaN " << i << " became a number";
      EXPECT_EQ(out[i] & 0x8000u, (Bits(in[i]) >> 16) & 0x8000u) << "sign of NaN " << i;
      continue;
    }
    // The nearest BF16 value; on a tie, the one with an even mantissa. Above the largest finite
    // value the next one up counts as 2^128 (IEEE rounding, as if the exponent had no bound), so
    // that a float past the last half ulp, such as the largest float, rounds to infinity.
    const uint32_t b = Bits(in[i]);
    const Bf16 down = static_cast<Bf16>(b >> 16), up = static_cast<Bf16>(down + 1);
    const double up_value =
        (up & 0x7fffu) == 0x7f80u ? std::copysign(std::ldexp(1.0, 128), in[i]) : Bf16ToFloat(up);
    const double d_down = std::abs(double(in[i]) - Bf16ToFloat(down));
    const double d_up = std::isinf(in[i]) ? INFINITY : std::abs(double(in[i]) - up_value);
    const Bf16 nearest = d_down < d_up ? down : d_up < d_down ? up : (down & 1u) == 0 ? down : up;
    EXPECT_EQ(out[i], nearest) << "value " << in[i] << " (bits " << std::hex << b << ")";
  }
  EXPECT_EQ(out[10000], 0x3f80u);  // tie, even below: down
  EXPECT_EQ(out[10001], 0x3f82u);  // tie, odd below: up
  EXPECT_EQ(out[10002], 0x3f81u);  // above the tie: up
}

TEST_P(CpuOpsTest, GemmBf16AccumulatesInFp32) {
  for (const op_cases::GemmBf16Shape& s : op_cases::GemmBf16Shapes()) {
    const op_cases::GemmBf16Data d = op_cases::MakeGemmBf16Data(s);
    ExpectClose(op_cases::GemmBf16Reference(s, d), op_cases::GemmBf16OnTheCpu(s, d), 1e-4f, 1e-4f,
                "GemmBf16, x_stride " + std::to_string(s.x_stride));
  }
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
  const op_cases::Bf16WeightsData d = op_cases::MakeBf16WeightsData();
  for (int64_t rows : {1, 2, 3, 5, 7, 13, 32, 64, 100}) {
    const std::vector<float> x = op_cases::Bf16WeightsX(d, rows);
    for (bool bf16 : {false, true}) {
      std::vector<std::vector<float>> y;
      for (CpuIsa isa : fused) {
        ASSERT_TRUE(SetCpuIsa(isa));
        y.emplace_back(rows * d.out);
        Gemm({.rows = rows,
              .in = d.in,
              .out = d.out,
              .x = x.data(),
              .w = bf16 ? nullptr : d.w.data(),
              .w_bf16 = bf16 ? d.narrow.data() : nullptr,
              .y = y.back().data()});
      }
      for (size_t i = 1; i < y.size(); ++i) {
        EXPECT_EQ(y[i], y[0]) << CpuIsaName(fused[i]) << " against " << CpuIsaName(fused[0]) << ", "
                              << rows << " rows" << (bf16 ? ", bf16" : "");
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

// The level a main hands the kernels (BATON_CPU_ISA's value): a name that is no level, or one
// this CPU lacks, is refused by name and changes nothing; none gives the best this CPU has. The
// kernels read no environment themselves: a variable set now changes nothing either.
TEST(CpuIsaTest, UseCpuIsaTakesANamedLevelAndRefusesOthersChangingNothing) {
  const CpuIsa before = ActiveCpuIsa();
  EXPECT_EQ(UseCpuIsa("avx9"),
            "BATON_CPU_ISA: 'avx9' is not a level; use baseline, avx2 or avx512");
  EXPECT_EQ(ActiveCpuIsa(), before);
  EXPECT_EQ(UseCpuIsa("baseline"), "");
  EXPECT_EQ(ActiveCpuIsa(), CpuIsa::kBaseline);
  setenv("BATON_CPU_ISA", "avx9", 1);
  EXPECT_EQ(ActiveCpuIsa(), CpuIsa::kBaseline);
  unsetenv("BATON_CPU_ISA");
  EXPECT_EQ(UseCpuIsa(nullptr), "");
  EXPECT_EQ(ActiveCpuIsa(), SupportedCpuIsas().back());
  EXPECT_TRUE(SetCpuIsa(before));
}

}  // namespace
}  // namespace baton::kernels
