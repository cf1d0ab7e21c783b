// The CUDA side of what the kernel harness (backend_ops_test.cc) cannot reach through
// model::Backend, on the inputs of the one op list (op_cases.h): the ops the backend interface
// does not carry (ToBf16, GemmBf16 and device sampling, against the CPU's and model/sampling.cc),
// and what only a CUDA context has: the prefill attention modes (the tensor-core GEMM path within
// BF16 rounding of the CPU), attention launches queued back to back and replayed from a CUDA
// graph (each reading its own entries), and page-locked host memory. Tolerances: exact for BF16
// rounding, the same summation-order bounds as the harness for GEMM and attention.
//
// Without a CUDA device every test skips with the reason, so CI machines without a GPU stay
// green while still compiling (and so type-checking) this file against the CUDA backend.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "baton/kernels/attention.h"
#include "baton/kernels/cuda/context.h"
#include "baton/kernels/cuda/ops.h"
#include "baton/kernels/cuda/sampling.h"
#include "baton/kernels/gemm.h"
#include "baton/model/sampling.h"
#include "op_cases.h"

namespace baton::kernels {
namespace {

using op_cases::AttentionCase;
using op_cases::AttentionData;
using op_cases::ExpectClose;
using op_cases::Uniform;

// Mirrors host buffers on the device and translates host pointers into them, so that a test
// builds one set of params over host memory and derives the device set mechanically.
class Mirror {
 public:
  explicit Mirror(cuda::Context& ctx) : ctx_(ctx) {}
  ~Mirror() {
    for (auto& [host, buffer] : buffers_) ctx_.Free(buffer.device);
  }

  // Uploads `bytes` at `host` (again, if already mirrored) and returns the device copy.
  void* Upload(const void* host, size_t bytes) {
    auto it = buffers_.find(host);
    if (it == buffers_.end() || it->second.bytes != bytes) {
      // A new host buffer, perhaps where freed ones were: every mirror it overlaps is stale
      // (Device() would otherwise translate into a freed buffer's old copy).
      const char* begin = static_cast<const char*>(host);
      auto stale = buffers_.upper_bound(begin);
      if (stale != buffers_.begin()) {
        auto before = std::prev(stale);
        if (static_cast<const char*>(before->first) + before->second.bytes > begin) stale = before;
      }
      while (stale != buffers_.end() && static_cast<const char*>(stale->first) < begin + bytes) {
        ctx_.Free(stale->second.device);
        stale = buffers_.erase(stale);
      }
      it = buffers_.end();
    }
    if (it == buffers_.end()) {
      it = buffers_.emplace(host, Buffer{ctx_.Malloc(bytes), bytes}).first;
    }
    ctx_.CopyToDevice(it->second.device, host, bytes);
    return it->second.device;
  }
  template <typename T>
  T* Upload(const std::vector<T>& v) {
    return static_cast<T*>(Upload(v.data(), v.size() * sizeof(T)));
  }

  // The device address of `host`, which must lie inside a mirrored buffer.
  template <typename T>
  T* Device(const T* host) const {
    const char* p = reinterpret_cast<const char*>(host);
    auto it = buffers_.upper_bound(p);
    EXPECT_NE(it, buffers_.begin()) << "pointer outside every mirrored buffer";
    --it;
    const char* base = static_cast<const char*>(it->first);
    EXPECT_LE(static_cast<size_t>(p - base), it->second.bytes);
    return reinterpret_cast<T*>(static_cast<char*>(it->second.device) + (p - base));
  }

  template <typename T>
  std::vector<T> Download(const std::vector<T>& host) {
    std::vector<T> out(host.size());
    ctx_.CopyToHost(out.data(), Device(host.data()), host.size() * sizeof(T));
    EXPECT_TRUE(ctx_.Synchronize().ok());
    return out;
  }

 private:
  struct Buffer {
    void* device;
    size_t bytes;
  };
  cuda::Context& ctx_;
  std::map<const void*, Buffer> buffers_;
};

class CudaConsistencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device: " << cuda::NoDeviceReason()
                   << "; this CPU/CUDA comparison runs only on a machine with a GPU";
    }
    absl::StatusOr<std::unique_ptr<cuda::Context>> ctx = cuda::Context::Create(0);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    ctx_ = *std::move(ctx);
    mirror_ = std::make_unique<Mirror>(*ctx_);
  }
  void TearDown() override {
    if (ctx_ != nullptr) {
      EXPECT_TRUE(ctx_->Synchronize().ok());
    }
    mirror_.reset();
  }
  void Sync() { ASSERT_TRUE(ctx_->Synchronize().ok()) << "a CUDA launch failed"; }

  std::unique_ptr<cuda::Context> ctx_;
  std::unique_ptr<Mirror> mirror_;
};

// The prefill attention kernels' names (backend_options.h, re-exported here): this test runs on
// any machine.
TEST(CudaPrefillAttentionTest, NamesAreChecked) {
  EXPECT_EQ(*cuda::ParsePrefillAttention("gemm", "x"), cuda::PrefillAttention::kGemm);
  EXPECT_EQ(*cuda::ParsePrefillAttention("simple", "x"), cuda::PrefillAttention::kSimple);
  EXPECT_STREQ(cuda::PrefillAttentionName(cuda::PrefillAttention::kGemm), "gemm");
  const absl::StatusOr<cuda::PrefillAttention> bad =
      cuda::ParsePrefillAttention("flash", "--prefill-attention");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      bad.status().message(),
      ::testing::HasSubstr("--prefill-attention: 'flash' is unknown; allowed: simple, gemm"));
}

// A context starts with the kernel its options name, whatever the environment says: the
// program settled the variable at start-up (model::ApplyPrefillAttentionVariable), and no kernel
// reads it.
TEST(CudaPrefillAttentionTest, AContextStartsWithTheKernelItsOptionsName) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::NoDeviceReason();
  ASSERT_EQ(setenv("BATON_CUDA_PREFILL_ATTENTION", "gemm", 1), 0);
  absl::StatusOr<std::unique_ptr<cuda::Context>> plain = cuda::Context::Create(0);
  ASSERT_EQ(unsetenv("BATON_CUDA_PREFILL_ATTENTION"), 0);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->prefill_attention(), cuda::PrefillAttention::kSimple);
  absl::StatusOr<std::unique_ptr<cuda::Context>> gemm =
      cuda::Context::Create(0, {.prefill_attention = cuda::PrefillAttention::kGemm});
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  EXPECT_EQ((*gemm)->prefill_attention(), cuda::PrefillAttention::kGemm);
}

TEST_F(CudaConsistencyTest, ToBf16RoundsLikeTheCpu) {
  std::vector<float> in = op_cases::Bf16RoundingInputs();
  std::vector<Bf16> out_cpu(in.size()), out(in.size());
  ToBf16({.count = static_cast<int64_t>(in.size()), .in = in.data(), .out = out_cpu.data()});
  mirror_->Upload(in);
  mirror_->Upload(out);
  cuda::ToBf16(*ctx_, {.count = static_cast<int64_t>(in.size()),
                       .in = mirror_->Device(in.data()),
                       .out = mirror_->Device(out.data())});
  EXPECT_EQ(out_cpu, mirror_->Download(out));
}

TEST_F(CudaConsistencyTest, GemmBf16AccumulatesInFp32) {
  for (const op_cases::GemmBf16Shape& s : op_cases::GemmBf16Shapes()) {
    op_cases::GemmBf16Data d = op_cases::MakeGemmBf16Data(s);
    mirror_->Upload(d.x);
    mirror_->Upload(d.w);
    mirror_->Upload(d.y);
    cuda::GemmBf16(*ctx_, {.rows = s.rows,
                           .in = s.in,
                           .out = s.out,
                           .x = mirror_->Device(d.x.data()),
                           .x_stride = s.x_stride,
                           .w = mirror_->Device(d.w.data()),
                           .y = mirror_->Device(d.y.data()),
                           .beta = 1.0f});
    Sync();
    ExpectClose(op_cases::GemmBf16OnTheCpu(s, d), mirror_->Download(d.y), 2e-6f * s.in, 1e-5f,
                "GemmBf16, x_stride " + std::to_string(s.x_stride));
  }
}

// One batch of attention cases: computed on the CPU, its inputs uploaded, its device params
// ready to launch.
struct AttentionBatch {
  std::vector<std::unique_ptr<AttentionData>> data;
  std::vector<std::vector<float>> cpu_out;
  std::vector<BlockKvSource> gpu_global;
  std::vector<std::vector<float*>> device_tables;
  std::vector<AttentionParams> gpu_batch;
};

std::unique_ptr<AttentionBatch> PrepareAttentionBatch(Mirror& mirror,
                                                      const std::vector<AttentionCase>& cases,
                                                      bool poison_unseen_ring = false) {
  auto batch = std::make_unique<AttentionBatch>();
  auto& data = batch->data;
  for (const AttentionCase& c : cases) {
    data.push_back(std::make_unique<AttentionData>(c));
    if (poison_unseen_ring) op_cases::PoisonUnseenRing(*data.back());
  }
  std::vector<AttentionParams> cpu_batch;
  batch->gpu_global.resize(data.size());
  batch->device_tables.resize(data.size());
  for (const auto& d : data) batch->cpu_out.push_back(d->out);
  for (size_t e = 0; e < data.size(); ++e) {
    const AttentionData& d = *data[e];
    cpu_batch.push_back(d.Params(d.qkv.data(), d.ring.data(), batch->cpu_out[e].data(),
                                 d.positions.data(), d.lo.data(),
                                 d.c.global ? &d.global_cpu : nullptr));
  }
  Attention(cpu_batch);

  for (size_t e = 0; e < data.size(); ++e) {
    AttentionData& d = *data[e];
    mirror.Upload(d.qkv);
    mirror.Upload(d.ring);
    mirror.Upload(d.out);
    mirror.Upload(d.positions);
    mirror.Upload(d.lo);
    if (d.c.global) {
      mirror.Upload(d.pages);
      for (float* page : d.page_table) batch->device_tables[e].push_back(mirror.Device(page));
      batch->gpu_global[e] = d.global_cpu;
      batch->gpu_global[e].pages = mirror.Upload(batch->device_tables[e]);
    }
    batch->gpu_batch.push_back(
        d.Params(mirror.Device(d.qkv.data()), mirror.Device(d.ring.data()),
                 mirror.Device(d.out.data()), mirror.Device(d.positions.data()),
                 mirror.Device(d.lo.data()), d.c.global ? &batch->gpu_global[e] : nullptr));
  }
  return batch;
}

void ExpectAttentionMatches(Mirror& mirror, const AttentionBatch& batch, const std::string& what) {
  for (size_t e = 0; e < batch.data.size(); ++e) {
    ExpectClose(batch.cpu_out[e], mirror.Download(batch.data[e]->out), 2e-5f, 1e-4f,
                what + " entry " + std::to_string(e));
  }
}

// Launches queued back to back, with no synchronisation between them: each launch's entries go
// through the context's page-locked staging slots (8, used in turn), which must not be
// rewritten before the copy that reads them has run. Twenty launches of four kinds, every one
// with its own data (seeds differ by repetition), cycle the slots more than twice.
TEST_F(CudaConsistencyTest, AttentionLaunchesQueuedBackToBackReadTheirOwnEntries) {
  const std::vector<std::pair<std::vector<AttentionCase>, std::string>> kinds = {
      {op_cases::LongContextDecodeCases(), "long-context decode"},
      {op_cases::ConsumerUnionCases(), "consumer union"},
      {op_cases::ProducerSwaCases(), "producer SWA"},
      {op_cases::EdgeShapeCases(), "edge shapes"}};
  std::vector<std::unique_ptr<AttentionBatch>> batches;
  std::vector<std::string> names;
  for (uint64_t rep = 0; rep < 5; ++rep) {
    for (const auto& [cases, what] : kinds) {
      std::vector<AttentionCase> reseeded = cases;
      for (AttentionCase& c : reseeded) c.seed += 1000 * rep;
      batches.push_back(PrepareAttentionBatch(*mirror_, reseeded));
      names.push_back(what + " #" + std::to_string(rep));
    }
  }
  for (const auto& batch : batches) cuda::Attention(*ctx_, batch->gpu_batch);
  Sync();
  for (size_t i = 0; i < batches.size(); ++i)
    ExpectAttentionMatches(*mirror_, *batches[i], names[i]);
}

// A CUDA graph of twelve attention launches (more than the eight staging slots): each launch's
// entries must come from a buffer the graph owns, since a replay copies them again. The
// outputs are wiped between replays, so only the replay can have written them.
TEST_F(CudaConsistencyTest, AGraphOfAttentionLaunchesReplaysEachLaunchsOwnEntries) {
  // The first capture on a fresh context: scratch would have to grow, which capture refuses,
  // naming why, and the context stays usable.
  std::unique_ptr<AttentionBatch> first =
      PrepareAttentionBatch(*mirror_, op_cases::EdgeShapeCases());
  absl::StatusOr<std::unique_ptr<cuda::Context::Graph>> refused =
      ctx_->Capture([&] { cuda::Attention(*ctx_, first->gpu_batch); });
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("would grow while capturing"));
  cuda::Attention(*ctx_, first->gpu_batch);  // eager: grows the scratch
  Sync();
  ExpectAttentionMatches(*mirror_, *first, "eager after a refused capture");

  const std::vector<std::vector<AttentionCase>> kinds = {op_cases::LongContextDecodeCases(),
                                                         op_cases::ConsumerUnionCases(),
                                                         op_cases::EdgeShapeCases()};
  std::vector<std::unique_ptr<AttentionBatch>> batches;
  for (uint64_t rep = 0; rep < 4; ++rep) {
    for (const std::vector<AttentionCase>& cases : kinds) {
      std::vector<AttentionCase> reseeded = cases;
      for (AttentionCase& c : reseeded) c.seed += 2000 + 100 * rep;
      batches.push_back(PrepareAttentionBatch(*mirror_, reseeded));
    }
  }
  for (const auto& batch : batches) cuda::Attention(*ctx_, batch->gpu_batch);  // sizes scratch
  Sync();
  absl::StatusOr<std::unique_ptr<cuda::Context::Graph>> graph = ctx_->Capture([&] {
    for (const auto& batch : batches) cuda::Attention(*ctx_, batch->gpu_batch);
  });
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int replay = 0; replay < 2; ++replay) {
    for (const auto& batch : batches) {
      for (const auto& d : batch->data) {
        ctx_->Memset(mirror_->Device(d->out.data()), 0xff, d->out.size() * sizeof(float));  // NaN
      }
    }
    (*graph)->Replay();
    Sync();
    for (size_t i = 0; i < batches.size(); ++i) {
      ExpectAttentionMatches(*mirror_, *batches[i],
                             "replay " + std::to_string(replay) + " launch " + std::to_string(i));
    }
  }
}

// The tensor-core prefill path (PrefillAttention::kGemm) on every attention case, ring slots
// outside every window poisoned with NaN: within BF16 rounding of the CPU (atol = rtol = 1e-2;
// a numpy model of BF16 Q, K, V and weights over these shapes peaks at a third of that), and
// visibly not the FP32 kernel (some output differs from the CPU by more than FP32 rounding),
// so the path really ran. Entries of fewer than kGemmAttentionMinRows rows take the simple
// kernel in the same call and must stay FP32-exact.
TEST_F(CudaConsistencyTest, GemmPrefillAttentionMatchesTheCpuToBf16Rounding) {
  ctx_->set_prefill_attention(cuda::PrefillAttention::kGemm);
  const std::vector<std::pair<std::vector<AttentionCase>, std::string>> sets = {
      {op_cases::ProducerSwaCases(), "producer SWA"},
      {op_cases::ConsumerUnionCases(), "consumer union"},
      {op_cases::DecodeBatchCases(), "decode"},
      {op_cases::EdgeShapeCases(), "edge shapes"}};
  for (const auto& [cases, what] : sets) {
    std::unique_ptr<AttentionBatch> batch = PrepareAttentionBatch(*mirror_, cases, true);
    cuda::Attention(*ctx_, batch->gpu_batch);
    Sync();
    bool any_gemm = false;
    float largest_gemm_error = 0.0f;
    for (size_t e = 0; e < cases.size(); ++e) {
      const std::vector<float> gpu = mirror_->Download(batch->data[e]->out);
      const std::string entry = what + " entry " + std::to_string(e);
      if (cases[e].rows < cuda::kGemmAttentionMinRows) {
        ExpectClose(batch->cpu_out[e], gpu, 2e-5f, 1e-4f, entry + " (simple kernel)");
        continue;
      }
      any_gemm = true;
      ExpectClose(batch->cpu_out[e], gpu, 1e-2f, 1e-2f, entry + " (gemm)");
      for (size_t i = 0; i < gpu.size(); ++i) {
        largest_gemm_error = std::max(largest_gemm_error, std::abs(gpu[i] - batch->cpu_out[e][i]));
      }
    }
    if (any_gemm) {
      EXPECT_GT(largest_gemm_error, 1e-6f)
          << what << ": no output shows BF16 rounding; did the GEMM path run?";
    }
  }
  ctx_->set_prefill_attention(cuda::PrefillAttention::kSimple);
}

// Samples every row of `logits` ([rows, vocab]) on the device and compares each token and its
// logprob with model::SampleToken on the CPU.
void ExpectSamplingMatches(cuda::Context& ctx, Mirror& mirror, std::vector<float> logits,
                           std::vector<cuda::SampleRowSettings> settings, int64_t vocab) {
  const int64_t rows = static_cast<int64_t>(settings.size());
  std::vector<int32_t> tokens(rows, -1);
  std::vector<float> logprobs(rows);
  mirror.Upload(logits);
  mirror.Upload(settings.data(), settings.size() * sizeof(cuda::SampleRowSettings));
  mirror.Upload(tokens);
  mirror.Upload(logprobs);
  cuda::SampleRows(ctx, {.rows = rows,
                         .vocab = vocab,
                         .logits = mirror.Device(logits.data()),
                         .settings = mirror.Device(settings.data()),
                         .tokens = mirror.Device(tokens.data()),
                         .logprobs = mirror.Device(logprobs.data())});
  ASSERT_TRUE(ctx.Synchronize().ok());
  const std::vector<int32_t> gpu_tokens = mirror.Download(tokens);
  const std::vector<float> gpu_logprobs = mirror.Download(logprobs);
  int mismatches = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const cuda::SampleRowSettings& s = settings[r];
    const model::SampledToken expected = model::SampleToken(
        std::span<const float>(logits.data() + r * vocab, vocab),
        {.temperature = s.temperature, .top_k = s.top_k, .top_p = s.top_p, .seed = s.seed}, s.step);
    if (expected.token != gpu_tokens[r]) {
      ++mismatches;
      ADD_FAILURE() << "vocab " << vocab << " row " << r << " (T " << s.temperature << ", k "
                    << s.top_k << ", p " << s.top_p << ", step " << s.step << "): cpu "
                    << expected.token << " cuda " << gpu_tokens[r];
      continue;
    }
    EXPECT_NEAR(expected.logprob, gpu_logprobs[r], 1e-5f) << "row " << r;
  }
  EXPECT_EQ(mismatches, 0) << "vocab " << vocab;
}

TEST_F(CudaConsistencyTest, SamplingMatchesModelSampleToken) {
  for (const int64_t vocab : {1000, 32000}) {
    std::vector<cuda::SampleRowSettings> settings;
    for (float temperature : {0.0f, 0.7f, 1.0f, 1.5f}) {
      for (int32_t top_k : {0, 1, 5, 50}) {
        for (float top_p : {1.0f, 0.9f, 0.5f}) {
          for (uint64_t step : {0, 1, 7}) {
            settings.push_back({.temperature = temperature,
                                .top_k = top_k,
                                .top_p = top_p,
                                .seed = 12345 + settings.size(),
                                .step = step});
          }
        }
      }
    }
    const int64_t rows = static_cast<int64_t>(settings.size());
    std::vector<float> logits = Uniform(rows * vocab, 50 + vocab, -6.0f, 6.0f);
    // Every third row: logits on a coarse grid, so that ties (broken by lower id) matter.
    for (int64_t r = 0; r < rows; r += 3) {
      for (int64_t i = 0; i < vocab; ++i) {
        logits[r * vocab + i] = std::round(logits[r * vocab + i] * 2.0f) / 2.0f;
      }
    }
    ExpectSamplingMatches(*ctx_, *mirror_, std::move(logits), std::move(settings), vocab);
  }
}

// Exact ties at the top-p boundary: 20 tied maxima at top_k 20 hold exactly p = 0.5 of the
// weight in their first ten (both sides keep ten), and at p = 0.35 the cut falls inside the
// tie (seven). Many seeds per row, so that a kept set of the wrong size shows.
TEST_F(CudaConsistencyTest, SamplingTopPOnExactTies) {
  const int64_t vocab = 1000;
  std::vector<cuda::SampleRowSettings> settings;
  for (float top_p : {0.5f, 0.35f, 0.05f}) {
    for (int32_t top_k : {20, 0}) {
      for (uint64_t seed = 0; seed < 40; ++seed) {
        settings.push_back({.temperature = 1.0f,
                            .top_k = top_k,
                            .top_p = top_p,
                            .seed = 77 + seed,
                            .step = seed % 5});
      }
    }
  }
  const int64_t rows = static_cast<int64_t>(settings.size());
  // The other tokens weigh exactly 0 (exp underflows): the totals, and so the targets and
  // the draws, are exact on both sides. (A tail of tiny positive weights would be summed in
  // different orders on the two sides and could move a tie's cut by rounding alone.)
  std::vector<float> logits(rows * vocab, -1e4f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < 20; ++i) logits[r * vocab + 300 + i * 7] = 4.0f;
  }
  ExpectSamplingMatches(*ctx_, *mirror_, std::move(logits), std::move(settings), vocab);
}

// A node's transfer staging is host memory page-locked once (RegisterHost) and copied to
// and from device memory at every commit.
TEST_F(CudaConsistencyTest, RegisteredHostMemoryRoundTripsThroughTheDevice) {
  std::vector<float> staging = Uniform(4096, 60);
  const std::vector<float> region(staging.begin(), staging.end());
  ASSERT_TRUE(ctx_->RegisterHost(staging.data(), staging.size() * sizeof(float)).ok());
  cuda::DeviceArray<float> device(*ctx_, staging.size());
  ctx_->CopyToDevice(device.data(), staging.data(), staging.size() * sizeof(float));
  std::fill(staging.begin(), staging.end(), 0.0f);
  ctx_->CopyToHost(staging.data(), device.data(), staging.size() * sizeof(float));
  Sync();
  EXPECT_EQ(staging, region);
  ctx_->UnregisterHost(staging.data());
  // Registering it twice is refused, and the context stays usable.
  ASSERT_TRUE(ctx_->RegisterHost(staging.data(), staging.size() * sizeof(float)).ok());
  EXPECT_FALSE(ctx_->RegisterHost(staging.data(), staging.size() * sizeof(float)).ok());
  ctx_->UnregisterHost(staging.data());
  EXPECT_TRUE(ctx_->Synchronize().ok());
}

}  // namespace
}  // namespace baton::kernels
