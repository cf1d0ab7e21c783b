// Prefill and decode figures of the CPU forward pass on one model, beside this machine's own
// limits measured in the same run: OpenBLAS sgemm GFLOP/s, memcpy bandwidth and read bandwidth
// (a vectorised streaming read over a buffer far larger than the last-level cache, on every
// thread of the kernels' team; taken again beside each decode figure's own steps, whose entry
// reports it as read_gbps). A decode step's bound is max(bytes it must read / that read
// bandwidth, FLOPs it must do / sgemm rate). Prints a table, or one JSON object with --json.
// Prefill and decode run at each instruction-set level --isas names (kernels/cpu_isa.h; each entry
// says its "isa"; machine.isa is the level the process started at), decode at each
// --decode-context, with FP32 weights ("decode") and with BF16 weight matrices ("decode_bf16", with
// each step over the FP32 one). Not a test: nothing here asserts a time.
//
// Prefill runs off, then compact at each keep of --keep (a list: the time to first token against
// K, each entry measured in the same run as off), then a prefix hit at each keep's cap ("hit
// replay": the state holds the hit's floor((L - K) / B) blocks, and the prefill computes the
// rest, the K consumer rows over all L positions among them); decode states are prefilled at the
// first keep.
//
//   baton_model_bench --model DIR [--lengths 1024,4096] [--keep 140] [--batches 1,8,32]
//                     [--decode-context 16,512] [--isas avx2,avx512] [--repeats 3] [--json]
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <span>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "baton/common/parse.h"
#include "baton/kernels/cpu_isa.h"
#include "baton/kernels/cpu_team.h"
#include "baton/model/engine_factory.h"
#include "baton/model/work_estimator.h"
#include "nlohmann/json.hpp"

namespace {

using baton::model::Engine;
using baton::model::TruncationMode;
using baton::model::WeightType;
using Clock = std::chrono::steady_clock;

template <typename F>
double MedianSeconds(int repeats, F&& run) {
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = Clock::now();
    run();
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <typename F>
double BestSeconds(int repeats, F&& run) {
  double best = INFINITY;
  for (int i = 0; i < repeats; ++i) {
    const auto start = Clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

double SgemmGflops(int repeats) {
  const int n = 2048;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  const double seconds = MedianSeconds(repeats, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
  });
  return 2.0 * n * n * n / seconds / 1e9;
}

double MemcpyGBps(int repeats) {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> from(bytes, 1), to(bytes, 0);
  const double seconds =
      MedianSeconds(repeats, [&] { std::memcpy(to.data(), from.data(), bytes); });
  return static_cast<double>(bytes) / seconds / 1e9;
}

// A streaming read of 1 GiB on the kernels' thread team: each thread reads its slice as four
// streams at once (four quarters advanced together, each summed into its own vector of 16
// floats, so that no load waits on another), as the GEMM streams four panels of weights; the
// sum is kept so that the loads are not optimised away. The buffer is made once, so that a
// decode figure can take the probe beside its own steps: on machines whose memory other tenants
// share, the bandwidth moves by a quarter within a minute, and a bound measured minutes earlier
// would say more about the neighbours than about the step.
class ReadProbe {
 public:
  ReadProbe() : data_(kVectors, Lanes{} + 1.0f) {}

  // Bytes per second of one read of the whole buffer.
  double GBps() {
    const auto start = Clock::now();
    std::atomic<float> total = 0;
    baton::kernels::RunOnCpuTeam([&](int64_t t, int64_t team) {
      const size_t begin = kVectors * t / team, end = kVectors * (t + 1) / team;
      const size_t quarter = (end - begin) / kStreams;
      Lanes sums[kStreams] = {};
      for (size_t i = 0; i < quarter; ++i) {
#pragma GCC unroll 4
        for (size_t s = 0; s < kStreams; ++s) sums[s] += data_[begin + s * quarter + i];
      }
      const Lanes sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
      float part = 0;
      for (int l = 0; l < 16; ++l) part += sum[l];
      total += part;
    });
    keep_ = keep_ + total.load();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return static_cast<double>(kVectors * sizeof(Lanes)) / seconds / 1e9;
  }

  // The best of `reads` reads: a floor for the steps measured beside it.
  double BestGBps(int reads) {
    double best = 0;
    for (int i = 0; i < reads; ++i) best = std::max(best, GBps());
    return best;
  }

 private:
  typedef float Lanes __attribute__((vector_size(64)));
  static constexpr size_t kStreams = 4;
  static constexpr size_t kVectors = size_t{1} << 24;  // 1 GiB
  std::vector<Lanes> data_;
  volatile float keep_ = 0;
};

// FLOPs of one decode row at position t (untruncated): the estimator's work for a prompt of
// t + 1 tokens computed as chunks [0, t) and [t, t + 1), less its work for the first t tokens
// alone. Each estimate counts the LM head of its last row once, so they cancel and one is
// added back.
double DecodeRowFlops(const baton::ModelConfig& config, int64_t t) {
  auto total = [&](std::span<const int64_t> lens, int64_t prompt_len) {
    return baton::model::EstimateWork({.prompt_len = prompt_len,
                                       .window = config.sliding_window,
                                       .max_backtrack = config.max_backtrack},
                                      lens, &config)
        .flops->total();
  };
  const int64_t split[] = {t, 1}, prefix[] = {t};
  return total(split, t + 1) - total(prefix, t) +
         2.0 * static_cast<double>(config.hidden_size) * static_cast<double>(config.vocab_size);
}

std::vector<int32_t> Prompt(int64_t length, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> tokens(length);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % vocab);
  return tokens;
}

}  // namespace

// A prefix hit at the cap, as a prefill node serves it: the state holds what the hit loads (block
// KV and rings of the first h = floor((L - K) / B) blocks' positions, made here by a prefill of
// them), and the timed prefill computes the rest, [h, L): the producers of those rows and the K
// consumer rows over all L positions of block KV (the replay after a hit).
void MeasureHitReplay(Engine& model, const std::vector<int32_t>& prompt, int64_t k,
                      baton::kernels::CpuIsa isa, int repeats, nlohmann::json& out) {
  const baton::ModelConfig& config = model.config();
  const int64_t L = static_cast<int64_t>(prompt.size());
  const int64_t h = std::max<int64_t>(0, L - k) / config.kv_block_size * config.kv_block_size;
  if (h == 0) return;
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    baton::model::SequenceState state(model.state_layout());
    const std::span<const int32_t> prefix(prompt.data(), static_cast<size_t>(h));
    if (!model.Prefill(prefix, {.mode = TruncationMode::kCompact, .keep = k}, state).ok()) {
      std::abort();
    }
    const auto start = Clock::now();
    if (!model.Prefill(prompt, {.mode = TruncationMode::kCompact, .keep = k, .s_valid = h}, state)
             .ok()) {
      std::abort();
    }
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  const double seconds = times[times.size() / 2];
  const int64_t rest[] = {L - h};
  const auto estimate = baton::model::EstimateWork({.prompt_len = L,
                                                    .keep = k,
                                                    .mode = TruncationMode::kCompact,
                                                    .window = config.sliding_window,
                                                    .max_backtrack = config.max_backtrack,
                                                    .s_valid = h},
                                                   rest, &config);
  out["hit_replay"].push_back({{"length", L},
                               {"isa", baton::kernels::CpuIsaName(isa)},
                               {"keep", k},
                               {"hit", h},
                               {"seconds", seconds},
                               {"model_flops", estimate.flops->total()},
                               {"model_gflops_per_s", estimate.flops->total() / seconds / 1e9}});
}

int main(int argc, char** argv) {
  CLI::App app{"baton CPU model benchmark"};
  std::string model_dir, lengths_text = "1024,4096", batches_text = "1,8,32";
  std::string contexts_text = "512", keeps_text = "140";
  int repeats = 3;
  bool json_output = false;
  std::string isas_text;
  app.add_option("--model", model_dir, "Model directory")->required();
  app.add_option("--lengths", lengths_text, "Prefill lengths");
  app.add_option("--keep", keeps_text,
                 "Compact keeps K, comma-separated (prefill at each; decode at the first)");
  app.add_option("--batches", batches_text, "Decode batch sizes");
  app.add_option("--decode-context", contexts_text,
                 "Prompt lengths before decode steps, a list (each batch is measured at each)");
  app.add_option("--repeats", repeats, "Repeats per figure (median)");
  app.add_option("--isas", isas_text,
                 "Instruction-set levels to run decode at, e.g. baseline,avx2,avx512 (default: "
                 "the active level, BATON_CPU_ISA or the best this CPU has)");
  app.add_flag("--json", json_output, "Print one JSON object");
  CLI11_PARSE(app, argc, argv);
  // The kernels' level and wait policy from the environment (BATON_CPU_ISA, OMP_WAIT_POLICY).
  if (std::string error = baton::kernels::ConfigureCpuKernels(std::getenv("BATON_CPU_ISA"),
                                                              std::getenv("OMP_WAIT_POLICY"));
      !error.empty()) {
    std::cerr << error << "\n";
    return 2;
  }
  auto lengths = baton::ParseIntList(lengths_text, "--lengths");
  auto batches = baton::ParseIntList(batches_text, "--batches");
  auto contexts = baton::ParseIntList(contexts_text, "--decode-context");
  auto keeps = baton::ParseIntList(keeps_text, "--keep");
  for (const auto* list : {&lengths, &batches, &contexts, &keeps}) {
    if (!list->ok()) {
      std::cerr << list->status().message() << "\n";
      return 2;
    }
  }
  auto loaded = baton::model::LoadEngine(model_dir);
  if (!loaded.ok()) {
    std::cerr << loaded.status().message() << "\n";
    return 2;
  }
  const baton::kernels::CpuIsa started_at = baton::kernels::ActiveCpuIsa();
  std::vector<baton::kernels::CpuIsa> isas;
  for (absl::string_view name : absl::StrSplit(isas_text, ',', absl::SkipEmpty())) {
    const std::optional<baton::kernels::CpuIsa> isa =
        baton::kernels::ParseCpuIsa(std::string_view(name.data(), name.size()));
    if (!isa.has_value() || !baton::kernels::SetCpuIsa(*isa)) {
      std::cerr << "--isas: '" << name
                << "' is not a level this CPU runs (baseline, avx2, avx512)\n";
      return 2;
    }
    isas.push_back(*isa);
  }
  if (isas.empty()) isas.push_back(started_at);
  Engine& model = **loaded;
  const baton::ModelConfig& config = model.config();
  nlohmann::json out;
  ReadProbe read_probe;
  out["machine"] = {{"sgemm_gflops", SgemmGflops(repeats)},
                    {"memcpy_gbps", MemcpyGBps(repeats)},
                    {"read_gbps", read_probe.BestGBps(std::max(repeats, 5))},
                    {"threads", baton::kernels::CpuTeamSize()},
                    {"isa", baton::kernels::CpuIsaName(started_at)}};

  for (baton::kernels::CpuIsa isa : isas)
    for (int64_t L : *lengths) {
      baton::kernels::SetCpuIsa(isa);
      const auto prompt = Prompt(L, config.vocab_size, 1);
      std::vector<std::pair<TruncationMode, int64_t>> settings = {{TruncationMode::kOff, 0}};
      for (int64_t k : *keeps) settings.push_back({TruncationMode::kCompact, k});
      for (const auto& [mode, k] : settings) {
        const double seconds = MedianSeconds(repeats, [&] {
          baton::model::SequenceState state(model.state_layout());
          auto result = model.Prefill(prompt, {.mode = mode, .keep = k}, state);
          if (!result.ok()) std::abort();
        });
        const int64_t lens[] = {L};
        const auto estimate = baton::model::EstimateWork({.prompt_len = L,
                                                          .keep = k,
                                                          .mode = mode,
                                                          .window = config.sliding_window,
                                                          .max_backtrack = config.max_backtrack},
                                                         lens, &config);
        out["prefill"].push_back({{"length", L},
                                  {"isa", baton::kernels::CpuIsaName(isa)},
                                  {"mode", std::string(baton::model::TruncationModeName(mode))},
                                  {"keep", k},
                                  {"seconds", seconds},
                                  {"tokens_per_s", L / seconds},
                                  {"model_flops", estimate.flops->total()},
                                  {"model_gflops_per_s", estimate.flops->total() / seconds / 1e9}});
      }
      for (int64_t k : *keeps) MeasureHitReplay(model, prompt, k, isa, repeats, out);
    }

  // Decode: every request holds a prompt of each --decode-context length; one step for the whole
  // batch. Measured with FP32 weights ("decode") and again with BF16 weight matrices
  // ("decode_bf16").
  auto loaded_bf16 =
      baton::model::LoadEngine(model_dir, baton::model::Device::kCpu, WeightType::kBf16);
  if (!loaded_bf16.ok()) {
    std::cerr << loaded_bf16.status().message() << "\n";
    return 2;
  }
  const auto layout = model.state_layout();
  auto measure_decode = [&](Engine& engine, WeightType weight_type, const std::string& key) {
    // Bytes of weights one step reads: every matrix in the engine's type (a tied LM head reads
    // the embedding table in FP32), the norms in FP32, and one embedding row per request.
    int64_t matrix_bytes = 0;
    auto weights = baton::model::LoadCedWeights(model_dir);
    for (const auto& slot : baton::model::WeightTensorSlots(*weights)) {
      int64_t n = 1;
      for (int64_t dim : slot.shape) n *= dim;
      if (slot.name.find("embed") != std::string::npos) {
        if (config.tie_word_embeddings) matrix_bytes += n * 4;
        continue;
      }
      const bool matrix = slot.shape.size() == 2;
      matrix_bytes += n * (matrix && weight_type == WeightType::kBf16 ? 2 : 4);
    }
    for (baton::kernels::CpuIsa isa : isas)
      for (int64_t decode_context : *contexts)
        for (int64_t batch : *batches) {
          baton::kernels::SetCpuIsa(isa);
          std::vector<std::unique_ptr<baton::model::SequenceState>> states;
          for (int64_t i = 0; i < batch; ++i) {
            states.push_back(std::make_unique<baton::model::SequenceState>(layout));
            auto result = engine.Prefill(Prompt(decode_context, config.vocab_size, 100 + i),
                                         {.mode = TruncationMode::kCompact, .keep = keeps->front()},
                                         *states.back());
            if (!result.ok()) std::abort();
          }
          std::vector<std::vector<float>> logits(batch, std::vector<float>(config.vocab_size));
          // `repeats` rounds of `steps` steps after one untimed step; the median step. The read
          // probe runs before each round and after the last: the bound below uses the best of
          // those reads, the bandwidth the memory gave while these steps ran.
          const int steps = 8;
          std::vector<double> step_seconds;
          double read_gbps = 0;
          for (int s = 0; s <= steps * repeats; ++s) {
            if (s % steps == 1) read_gbps = std::max(read_gbps, read_probe.GBps());
            std::vector<baton::model::DecodeItem> items;
            for (int64_t i = 0; i < batch; ++i)
              items.push_back({states[i].get(), 7, logits[i].data()});
            const auto start = Clock::now();
            if (!engine.Decode(items).ok()) std::abort();
            if (s > 0) {
              step_seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
            }
          }
          read_gbps = std::max(read_gbps, read_probe.GBps());
          std::sort(step_seconds.begin(), step_seconds.end());
          const double seconds = step_seconds[step_seconds.size() / 2];
          // Bytes one step must read: every weight once, plus each request's embedding row, block
          // KV and rings, at the timed steps' middle context.
          const int64_t context = decode_context + 1 + steps * repeats / 2;
          const int64_t state_bytes = 4 * (context * layout.block_kv_groups * 2 * layout.kv_dim +
                                           layout.producer_swa_floats() +
                                           layout.consumer_swa_floats() + config.hidden_size);
          const double bytes = static_cast<double>(matrix_bytes + batch * state_bytes);
          const double bandwidth_bound = bytes / (read_gbps * 1e9);
          // FLOPs one step must do: each request's row at that context, at the sgemm rate.
          const double flops = static_cast<double>(batch) * DecodeRowFlops(config, context);
          const double compute_bound = flops / (out["machine"]["sgemm_gflops"].get<double>() * 1e9);
          const double bound = std::max(bandwidth_bound, compute_bound);
          out[key].push_back({{"batch", batch},
                              {"isa", baton::kernels::CpuIsaName(isa)},
                              {"context", decode_context},
                              {"weights", std::string(baton::model::WeightTypeName(weight_type))},
                              {"step_ms", seconds * 1e3},
                              {"bytes_read", bytes},
                              {"read_gbps", read_gbps},
                              {"bandwidth_bound_ms", bandwidth_bound * 1e3},
                              {"flops", flops},
                              {"compute_bound_ms", compute_bound * 1e3},
                              {"bound_ms", bound * 1e3},
                              {"step_over_bound", seconds / bound}});
        }
  };
  measure_decode(model, WeightType::kFp32, "decode");
  measure_decode(**loaded_bf16, WeightType::kBf16, "decode_bf16");
  for (size_t i = 0; i < out["decode"].size(); ++i) {
    out["decode_bf16"][i]["step_over_fp32"] =
        out["decode_bf16"][i]["step_ms"].get<double>() / out["decode"][i]["step_ms"].get<double>();
  }

  if (json_output) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << absl::StrFormat(
      "machine: sgemm %.1f GFLOP/s (%d threads), memcpy %.2f GB/s, read %.2f GB/s, isa %s\n",
      out["machine"]["sgemm_gflops"].get<double>(), out["machine"]["threads"].get<int>(),
      out["machine"]["memcpy_gbps"].get<double>(), out["machine"]["read_gbps"].get<double>(),
      out["machine"]["isa"].get<std::string>());
  for (const auto& p : out["prefill"]) {
    std::cout << absl::StrFormat("prefill %-8s L=%-5d %-7s %8.1f tok/s %7.1f model GFLOP/s\n",
                                 p["isa"].get<std::string>(), p["length"].get<int64_t>(),
                                 p["mode"].get<std::string>(), p["tokens_per_s"].get<double>(),
                                 p["model_gflops_per_s"].get<double>());
  }
  for (const auto& p : out["hit_replay"]) {
    std::cout << absl::StrFormat(
        "hit replay %-8s L=%-5d K=%-4d hit %-5d %9.2f ms %7.1f model GFLOP/s (%.2f of sgemm)\n",
        p["isa"].get<std::string>(), p["length"].get<int64_t>(), p["keep"].get<int64_t>(),
        p["hit"].get<int64_t>(), p["seconds"].get<double>() * 1e3,
        p["model_gflops_per_s"].get<double>(),
        p["model_gflops_per_s"].get<double>() / out["machine"]["sgemm_gflops"].get<double>());
  }
  for (const auto& d : out["decode"]) {
    std::cout << absl::StrFormat(
        "decode %-8s context=%-5d batch=%-3d step %7.2f ms (bandwidth bound %.2f ms, compute "
        "bound %.2f ms)\n",
        d["isa"].get<std::string>(), d["context"].get<int64_t>(), d["batch"].get<int64_t>(),
        d["step_ms"].get<double>(), d["bandwidth_bound_ms"].get<double>(),
        d["compute_bound_ms"].get<double>());
  }
  for (const auto& d : out["decode_bf16"]) {
    std::cout << absl::StrFormat(
        "decode %-8s context=%-5d batch=%-3d bf16 weights: step %7.2f ms (%.2fx the fp32 step; "
        "bandwidth bound %.2f ms)\n",
        d["isa"].get<std::string>(), d["context"].get<int64_t>(), d["batch"].get<int64_t>(),
        d["step_ms"].get<double>(), d["step_over_fp32"].get<double>(),
        d["bandwidth_bound_ms"].get<double>());
  }
  return 0;
}
