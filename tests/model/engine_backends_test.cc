// The engine on the CUDA backend against the engine on the CPU backend, on the tiny preset:
// the same step plans must give the same logits (1e-3 relative per row: both run FP32, only
// summation order differs) in every truncation mode, with chunking and s_valid > 0, and the
// same greedy tokens over decode steps, alone and batched.
//
// Without a CUDA device every test skips with the reason, so machines without a GPU still
// compile (and so type-check) this file against the CUDA backend.
#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "baton/model/engine_factory.h"
#include "baton/model/model_factory.h"
#include "gtest/gtest.h"
#include "test_dir.h"

namespace baton::model {
namespace {

constexpr double kTolerance = 1e-3;

// max |a - b| / max |b| over one logits row.
double RelativeError(std::span<const float> a, std::span<const float> b) {
  double diff = 0, scale = 1e-12;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

struct Case {
  const char* name;
  TruncationMode mode;
  int64_t keep;  // 0: C
  int64_t s_valid;
  int64_t chunk_size;
};

class EngineBackendsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::StatusOr<std::unique_ptr<Backend>> cuda = MakeBackend(Device::kCuda); !cuda.ok()) {
      GTEST_SKIP() << cuda.status().message()
                   << "; this CPU/CUDA forward comparison runs only on a machine with a GPU";
    }
  }

  // The tiny preset (or a variant of it) written with `seed`, loaded on both backends.
  void LoadBoth(const ModelConfig& config, const std::string& name, uint64_t seed = 11) {
    const std::string dir = baton::testing::ProcessTempDir() + "/cuda_ced_" + name;
    ASSERT_TRUE(MakeModel(config, seed, dir).ok());
    absl::StatusOr<std::unique_ptr<Engine>> cpu = LoadEngine(dir, Device::kCpu);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = *std::move(cpu);
    absl::StatusOr<std::unique_ptr<Engine>> gpu = LoadEngine(dir, Device::kCuda);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = *std::move(gpu);
    EXPECT_EQ(gpu_->fingerprint(), cpu_->fingerprint());
  }

  static std::vector<int32_t> Tokens(int64_t n, int64_t vocab, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> tokens(n);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % vocab);
    return tokens;
  }

  void ExpectSameResult(const PrefillResult& cpu, const PrefillResult& gpu,
                        const std::string& what) {
    const int64_t V = cpu_->config().vocab_size;
    EXPECT_EQ(gpu.consumer_rows, cpu.consumer_rows) << what;
    ASSERT_EQ(gpu.positions, cpu.positions) << what;
    ASSERT_EQ(gpu.logits.size(), cpu.logits.size()) << what;
    for (size_t r = 0; r < cpu.positions.size(); ++r) {
      const std::span<const float> a(gpu.logits.data() + r * V, V), b(cpu.logits.data() + r * V, V);
      EXPECT_LE(RelativeError(a, b), kTolerance) << what << ", position " << cpu.positions[r];
    }
  }

  // Prefill on both backends, then `steps` greedy decode steps on each with its own tokens;
  // logits and tokens must agree at every step.
  void CompareCase(const Case& c, const std::vector<int32_t>& prompt, int steps) {
    const int64_t C = cpu_->config().ring_capacity(), V = cpu_->config().vocab_size;
    const PrefillOptions options{.mode = c.mode,
                                 .keep = c.keep == 0 && c.mode != TruncationMode::kOff ? C : c.keep,
                                 .s_valid = c.s_valid,
                                 .chunk_size = c.chunk_size,
                                 .result_logits = true};
    SequenceState cpu_state(cpu_->state_layout());
    absl::StatusOr<std::unique_ptr<SequenceState>> gpu_state = gpu_->NewState();
    ASSERT_TRUE(gpu_state.ok()) << gpu_state.status();
    absl::StatusOr<PrefillResult> cpu = cpu_->Prefill(prompt, options, cpu_state);
    ASSERT_TRUE(cpu.ok()) << c.name << ": " << cpu.status();
    absl::StatusOr<PrefillResult> gpu = gpu_->Prefill(prompt, options, **gpu_state);
    ASSERT_TRUE(gpu.ok()) << c.name << ": " << gpu.status();
    ExpectSameResult(*cpu, *gpu, c.name);
    EXPECT_EQ((*gpu_state)->length, cpu_state.length);
    EXPECT_EQ((*gpu_state)->s_valid, cpu_state.s_valid);

    std::vector<float> cpu_logits(cpu->logits.end() - V, cpu->logits.end());
    std::vector<float> gpu_logits(gpu->logits.end() - V, gpu->logits.end());
    for (int step = 0; step < steps; ++step) {
      const int32_t cpu_token = Argmax(cpu_logits), gpu_token = Argmax(gpu_logits);
      ASSERT_EQ(gpu_token, cpu_token) << c.name << ", decode step " << step;
      const DecodeItem cpu_item{
          .state = &cpu_state, .token = cpu_token, .logits = cpu_logits.data()};
      ASSERT_TRUE(cpu_->Decode({&cpu_item, 1}).ok());
      const DecodeItem gpu_item{
          .state = gpu_state->get(), .token = gpu_token, .logits = gpu_logits.data()};
      absl::Status s = gpu_->Decode({&gpu_item, 1});
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_LE(RelativeError(gpu_logits, cpu_logits), kTolerance)
          << c.name << ", decode step " << step;
    }
    EXPECT_EQ(Argmax(gpu_logits), Argmax(cpu_logits)) << c.name << ", after the last step";
  }

  std::unique_ptr<Engine> cpu_;
  std::unique_ptr<Engine> gpu_;
};

// tiny: W = 16, C = 22. Prompts of 61 rows in chunks of 9 or 7 rows, so that chunks cross
// the retained boundary L - K, run placeholders in compact, and write fewer than C ring rows.
const Case kCases[] = {
    {"off, one chunk", TruncationMode::kOff, 0, 0, 0},
    {"off, chunks of 9, s_valid 10", TruncationMode::kOff, 0, 10, 9},
    {"mask K=C, chunks of 9", TruncationMode::kMask, 0, 0, 9},
    {"mask K=C, chunks of 9, s_valid 10", TruncationMode::kMask, 0, 10, 9},
    {"compact K=C, one chunk", TruncationMode::kCompact, 0, 0, 0},
    {"compact K=C, chunks of 9, s_valid 10", TruncationMode::kCompact, 0, 10, 9},
    {"compact K=30, chunks of 7", TruncationMode::kCompact, 30, 0, 7},
    {"compact K=30, chunks of 7, s_valid 16", TruncationMode::kCompact, 30, 16, 7},
    {"compact K=45, chunks of 25, s_valid 20", TruncationMode::kCompact, 45, 20, 25},
};

TEST_F(EngineBackendsTest, PrefillAndDecodeMatchTheCpuInEveryMode) {
  LoadBoth(*PresetConfig("tiny"), "tiny");
  const std::vector<int32_t> prompt = Tokens(61, cpu_->config().vocab_size, 5);
  for (const Case& c : kCases) CompareCase(c, prompt, 3);
}

TEST_F(EngineBackendsTest, GqaUntiedSharedSwaVariantMatchesTheCpu) {
  // Two query heads per KV head, an lm_head of its own, SWA K/V from the shared rows.
  ModelConfig variant = *PresetConfig("tiny");
  variant.num_key_value_heads = 2;
  variant.tie_word_embeddings = false;
  variant.yoco_swa_share_hidden = true;
  LoadBoth(variant, "variant");
  const std::vector<int32_t> prompt = Tokens(50, cpu_->config().vocab_size, 6);
  CompareCase(kCases[1], prompt, 3);
  CompareCase(kCases[7], prompt, 3);
}

TEST_F(EngineBackendsTest, SharedBlockKvMatchesTheCpu) {
  // Two block-KV groups (block_kv_sources [4, 6]): layers 5 and 7 read another layer's pages.
  ModelConfig shared = *PresetConfig("tiny");
  shared.block_kv_sources = {4, 6};
  LoadBoth(shared, "shared");
  const std::vector<int32_t> prompt = Tokens(50, cpu_->config().vocab_size, 7);
  CompareCase(kCases[1], prompt, 3);
  CompareCase(kCases[5], prompt, 3);
}

TEST_F(EngineBackendsTest, BatchedDecodeMatchesTheCpu) {
  LoadBoth(*PresetConfig("tiny"), "tiny_batch");
  const ModelConfig& config = cpu_->config();
  const int64_t V = config.vocab_size, C = config.ring_capacity();
  // Requests of different lengths and truncation, so their positions, SWA bounds and ring
  // slots all differ inside one batch.
  struct Request {
    int64_t length;
    PrefillOptions options;
  };
  const Request requests[] = {
      {23, {}},
      {40, {.mode = TruncationMode::kCompact, .keep = C, .s_valid = 8, .chunk_size = 16}},
      {57, {.mode = TruncationMode::kMask, .keep = 30, .chunk_size = 10}},
  };
  const size_t n = std::size(requests);
  std::vector<std::unique_ptr<SequenceState>> cpu_states;
  std::vector<std::unique_ptr<SequenceState>> gpu_states;
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < n; ++i) {
    const std::vector<int32_t> prompt = Tokens(requests[i].length, V, 100 + i);
    cpu_states.push_back(std::make_unique<SequenceState>(cpu_->state_layout()));
    absl::StatusOr<std::unique_ptr<SequenceState>> state = gpu_->NewState();
    ASSERT_TRUE(state.ok()) << state.status();
    gpu_states.push_back(*std::move(state));
    absl::StatusOr<PrefillResult> cpu = cpu_->Prefill(prompt, requests[i].options, *cpu_states[i]);
    absl::StatusOr<PrefillResult> gpu = gpu_->Prefill(prompt, requests[i].options, *gpu_states[i]);
    ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << " / " << gpu.status();
    ExpectSameResult(*cpu, *gpu, "request " + std::to_string(i));
    tokens.push_back(Argmax(cpu->logits));
    ASSERT_EQ(Argmax(gpu->logits), tokens.back());
  }
  std::vector<float> cpu_logits(n * V), gpu_logits(n * V);
  for (int step = 0; step < 3; ++step) {
    std::vector<DecodeItem> cpu_batch;
    std::vector<DecodeItem> gpu_batch;
    for (size_t i = 0; i < n; ++i) {
      cpu_batch.push_back({cpu_states[i].get(), tokens[i], cpu_logits.data() + i * V});
      gpu_batch.push_back({gpu_states[i].get(), tokens[i], gpu_logits.data() + i * V});
    }
    ASSERT_TRUE(cpu_->Decode(cpu_batch).ok());
    absl::Status s = gpu_->Decode(gpu_batch);
    ASSERT_TRUE(s.ok()) << s;
    for (size_t i = 0; i < n; ++i) {
      const std::span<const float> a(gpu_logits.data() + i * V, V), b(cpu_logits.data() + i * V, V);
      EXPECT_LE(RelativeError(a, b), kTolerance) << "request " << i << ", step " << step;
      tokens[i] = Argmax(b);
      EXPECT_EQ(Argmax(a), tokens[i]) << "request " << i << ", step " << step;
    }
  }
}

// A node's pool lays states out in one range of backend memory, rings and pages given by
// address: the engine must compute the same through them as through states of its own.
TEST_F(EngineBackendsTest, StateInAPoolOfDeviceMemoryMatchesTheCpu) {
  LoadBoth(*PresetConfig("tiny"), "tiny_pool");
  const StateLayout layout = cpu_->state_layout();
  const int64_t pages = 16;
  BackendArray<float> rings(gpu_->backend(),
                            layout.producer_swa_floats() + layout.consumer_swa_floats());
  BackendArray<float> page_memory(gpu_->backend(), pages * layout.page_floats());
  ASSERT_NE(rings.data(), nullptr);
  ASSERT_NE(page_memory.data(), nullptr);
  ContiguousPageAllocator allocator(layout, pages, page_memory.data());
  const std::vector<int32_t> prompt = Tokens(44, cpu_->config().vocab_size, 9);
  const PrefillOptions options{.mode = TruncationMode::kCompact,
                               .keep = layout.ring_capacity,
                               .chunk_size = 12,
                               .result_logits = true};
  SequenceState cpu_state(layout);
  SequenceState gpu_state(layout, &allocator, rings.data(),
                          rings.data() + layout.producer_swa_floats());
  absl::StatusOr<PrefillResult> cpu = cpu_->Prefill(prompt, options, cpu_state);
  absl::StatusOr<PrefillResult> gpu = gpu_->Prefill(prompt, options, gpu_state);
  ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << " / " << gpu.status();
  ExpectSameResult(*cpu, *gpu, "pool state");
  EXPECT_EQ(gpu_state.pages().front(), page_memory.data());
}

TEST_F(EngineBackendsTest, ProducerRowsCallbackSeesTheCpuRows) {
  LoadBoth(*PresetConfig("tiny"), "tiny_rows");
  const int64_t kv_dim = cpu_->state_layout().kv_dim;
  const std::vector<int32_t> prompt = Tokens(33, cpu_->config().vocab_size, 4);
  // layer -> K rows by position, concatenated.
  auto collect = [&](std::vector<std::vector<float>>& rows) {
    return [&rows, kv_dim](int64_t layer, int64_t q_start, int64_t n, const float* k, const float*,
                           int64_t stride) {
      if (static_cast<int64_t>(rows.size()) <= layer) rows.resize(layer + 1);
      for (int64_t j = 0; j < n; ++j)
        rows[layer].insert(rows[layer].end(), k + j * stride, k + j * stride + kv_dim);
    };
  };
  std::vector<std::vector<float>> cpu_rows, gpu_rows;
  PrefillOptions options{.s_valid = 5, .chunk_size = 8};
  SequenceState cpu_state(cpu_->state_layout());
  absl::StatusOr<std::unique_ptr<SequenceState>> gpu_state = gpu_->NewState();
  ASSERT_TRUE(gpu_state.ok()) << gpu_state.status();
  options.on_producer_rows = collect(cpu_rows);
  ASSERT_TRUE(cpu_->Prefill(prompt, options, cpu_state).ok());
  options.on_producer_rows = collect(gpu_rows);
  ASSERT_TRUE(gpu_->Prefill(prompt, options, **gpu_state).ok());
  ASSERT_EQ(gpu_rows.size(), cpu_rows.size());
  for (size_t l = 0; l < cpu_rows.size(); ++l) {
    ASSERT_EQ(gpu_rows[l].size(), cpu_rows[l].size());
    EXPECT_LE(RelativeError(gpu_rows[l], cpu_rows[l]), kTolerance) << "producer layer " << l;
  }
}

// Allocate hands out zeroed memory, also memory that a freed allocation had filled: the
// zeroing is queued on the backend's stream, ordered before what the caller queues next.
// The replay-on-decode split on each backend (DESIGN section 6): a producers-only engine's
// boundary rows, and the full engine's replay over them in pieces of 5 rows, give the CPU's rows
// and last-row logits.
TEST_F(EngineBackendsTest, ReplayOnDecodeMatchesTheCpu) {
  const std::string dir = baton::testing::ProcessTempDir() + "/cuda_ced_replay";
  ASSERT_TRUE(MakeModel(*PresetConfig("tiny"), 11, dir).ok());
  struct Run {
    std::vector<float> boundary, logits;
  };
  auto run = [&](Device device, const std::vector<int32_t>& prompt, TruncationMode mode,
                 int64_t keep) -> Run {
    Run out;
    auto producers = LoadEngine(dir, device, WeightType::kFp32, HeldLayers::kProducers);
    auto full = LoadEngine(dir, device);
    EXPECT_TRUE(producers.ok() && full.ok());
    if (!producers.ok() || !full.ok()) return out;
    const ModelConfig& c = (*full)->config();
    const int64_t L = static_cast<int64_t>(prompt.size());
    out.boundary.resize(BoundaryRowCount(L, mode, keep, 0) * c.hidden_size);
    auto prefill_state = (*producers)->NewState();
    EXPECT_TRUE(prefill_state.ok());
    EXPECT_TRUE((*producers)
                    ->Prefill(prompt, {.mode = mode, .keep = keep, .boundary_rows = out.boundary},
                              **prefill_state)
                    .ok());
    SequenceState host((*full)->state_layout());
    auto state = (*full)->NewState();
    EXPECT_TRUE(state.ok() && host.EnsurePages(L).ok() && (*state)->EnsurePages(L).ok());
    EXPECT_TRUE((*producers)->StageOut(StateCopies(**prefill_state, host, L)).ok());
    EXPECT_TRUE((*full)->StageIn(StateCopies(host, **state, L)).ok());
    (*state)->length = L;
    const TruncationSpec spec = *ReplaySpec(c, L, mode, keep, 0);
    out.logits.resize(c.vocab_size);
    for (int64_t q = spec.s_valid; q < L; q += 5) {
      const ReplayItem item{.state = state->get(),
                            .spec = spec,
                            .q_start = q,
                            .rows = std::min<int64_t>(5, L - q),
                            .boundary = out.boundary.data() + (q - spec.s_valid) * c.hidden_size,
                            .logits = out.logits.data()};
      EXPECT_TRUE((*full)->Step({}, {&item, 1}).ok());
    }
    return out;
  };
  const int64_t C = PresetConfig("tiny")->ring_capacity();
  for (const auto& [mode, keep] :
       {std::pair{TruncationMode::kOff, int64_t{0}}, std::pair{TruncationMode::kCompact, C},
        std::pair{TruncationMode::kMask, C + 5}}) {
    const std::vector<int32_t> prompt = Tokens(61, 512, 5);
    const Run cpu = run(Device::kCpu, prompt, mode, keep);
    const Run gpu = run(Device::kCuda, prompt, mode, keep);
    ASSERT_EQ(gpu.boundary.size(), cpu.boundary.size());
    EXPECT_LE(RelativeError(gpu.boundary, cpu.boundary), kTolerance) << TruncationModeName(mode);
    EXPECT_LE(RelativeError(gpu.logits, cpu.logits), kTolerance) << TruncationModeName(mode);
    EXPECT_EQ(Argmax(gpu.logits), Argmax(cpu.logits)) << TruncationModeName(mode);
  }
}

TEST_F(EngineBackendsTest, AllocatedDeviceMemoryStartsZeroedAfterReuse) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(Device::kCuda);
  ASSERT_TRUE(backend.ok()) << backend.status();
  constexpr size_t kFloats = size_t{1} << 22;  // 16 MiB
  const std::vector<float> filled(kFloats, 3.5f);
  for (int round = 0; round < 4; ++round) {
    void* memory = (*backend)->Allocate(kFloats * sizeof(float));
    ASSERT_NE(memory, nullptr);
    std::vector<float> seen(kFloats, -1.0f);
    (*backend)->CopyOut(seen.data(), memory, kFloats * sizeof(float));
    ASSERT_TRUE((*backend)->Synchronize().ok());
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 0.0f), static_cast<ptrdiff_t>(kFloats))
        << "round " << round;
    (*backend)->CopyIn(memory, filled.data(), kFloats * sizeof(float));
    (*backend)->Free(memory);
  }
  EXPECT_TRUE((*backend)->Synchronize().ok());
}

// The CUDA backend's options as a program settles them at start-up: the flag, else the
// environment's variable (as main read it), else the default; an unknown name in the variable is
// refused naming it. No device is needed, and nothing here reads the environment: the variable
// is set to a name no kernel has, and the results do not change.
TEST(CudaOptionsTest, TheFlagThenTheVariableThenTheDefault) {
  using kernels::PrefillAttention;
  ASSERT_EQ(setenv(kernels::kPrefillAttentionVariable, "flash", 1), 0);
  auto settled = [](std::optional<PrefillAttention> flag,
                    const char* variable) -> absl::StatusOr<PrefillAttention> {
    DeviceFlags flags{.cuda_prefill_attention = flag};
    if (absl::Status s = ApplyPrefillAttentionVariable(variable, flags); !s.ok()) return s;
    return CudaOptionsOf(flags).prefill_attention;
  };
  EXPECT_EQ(*settled(std::nullopt, nullptr), PrefillAttention::kSimple);
  EXPECT_EQ(*settled(std::nullopt, ""), PrefillAttention::kSimple);
  EXPECT_EQ(*settled(PrefillAttention::kGemm, nullptr), PrefillAttention::kGemm);
  EXPECT_EQ(*settled(std::nullopt, "gemm"), PrefillAttention::kGemm);
  EXPECT_EQ(*settled(PrefillAttention::kSimple, "gemm"), PrefillAttention::kSimple);
  EXPECT_EQ(*settled(PrefillAttention::kGemm, "flash"), PrefillAttention::kGemm)
      << "the flag is read, not the variable";

  const absl::StatusOr<PrefillAttention> from_variable = settled(std::nullopt, "flash");
  EXPECT_EQ(from_variable.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(from_variable.status().message().find(
                "BATON_CUDA_PREFILL_ATTENTION: 'flash' is unknown; allowed: simple, gemm"),
            std::string::npos)
      << from_variable.status();
  ASSERT_EQ(unsetenv(kernels::kPrefillAttentionVariable), 0);
  EXPECT_STREQ(kernels::PrefillAttentionName(PrefillAttention::kGemm), "gemm");
  EXPECT_STREQ(kernels::PrefillAttentionName(PrefillAttention::kSimple), "simple");
}

}  // namespace
}  // namespace baton::model
