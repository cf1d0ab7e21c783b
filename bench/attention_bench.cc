// The CPU attention kernel alone, for decode-shaped calls: `batch` requests of `rows` query rows
// each (1: a decode step; a few: speculative verify rows or a replay piece) over a global block-KV
// context of each --context length plus the SWA window, as a consumer layer calls it
// (kernels::Attention, one call per layer). Prints each shape's time per call with two limits
// measured in the same run: the FLOPs it must do (QK^T and PV) at OpenBLAS's sgemm rate, and the
// keys and values it must read at the machine's streaming read rate; the figure of merit is the
// call's time over the larger of them. The model bench (baton_model_bench) times whole steps,
// whose weights hide what the attention alone costs.
//
//   baton_attention_bench [--contexts 4096,32768] [--batches 1,8] [--rows 1] [--heads 8]
//     [--kv-heads 1] [--head-dim 64] [--window 128] [--repeats 20] [--json]
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "baton/common/parse.h"
#include "baton/kernels/attention.h"
#include "baton/kernels/cpu_isa.h"
#include "baton/kernels/cpu_team.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kBlock = 64;  // positions per block-KV page

double SgemmGflops() {
  const int n = 2048;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  double best = INFINITY;
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return 2.0 * n * n * n / best / 1e9;
}

// The best of three streaming reads of 512 MiB on the kernels' thread team, as the model
// bench's probe reads.
double ReadGBps() {
  typedef float Lanes __attribute__((vector_size(64)));
  const size_t vectors = size_t{1} << 23;
  std::vector<Lanes> data(vectors, Lanes{} + 1.0f);
  std::atomic<float> keep = 0;
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    baton::kernels::RunOnCpuTeam([&](int64_t t, int64_t team) {
      const size_t begin = vectors * t / team, end = vectors * (t + 1) / team;
      const size_t quarter = (end - begin) / 4;
      Lanes sums[4] = {};
      for (size_t j = 0; j < quarter; ++j) {
#pragma GCC unroll 4
        for (size_t s = 0; s < 4; ++s) sums[s] += data[begin + s * quarter + j];
      }
      const Lanes sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
      keep = keep + sum[0];
    });
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, static_cast<double>(vectors * sizeof(Lanes)) / seconds / 1e9);
  }
  return best;
}

// One request's state: block KV of `context` positions in pages, an SWA ring and its own rows.
struct Request {
  std::vector<std::vector<float>> pages;  // [kBlock, 2 * kv_dim]: K rows then V rows
  std::vector<const float*> page_table;
  std::vector<float> ring_k, ring_v, tail_k, tail_v, q, out;
  std::vector<int32_t> positions, swa_lo;
  baton::kernels::BlockKvSource global;
};

Request MakeRequest(int64_t context, int64_t rows, int64_t kv_dim, int64_t window,
                    std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto fill = [&](std::vector<float>& v, size_t n) {
    v.resize(n);
    for (float& x : v) x = normal(rng);
  };
  Request r;
  const int64_t positions = context + rows;
  for (int64_t p = 0; p < positions; p += kBlock) {
    r.pages.emplace_back();
    fill(r.pages.back(), static_cast<size_t>(2 * kBlock * kv_dim));
    r.page_table.push_back(r.pages.back().data());
  }
  r.global = {.pages = r.page_table.data(),
              .block_size = kBlock,
              .k_offset = 0,
              .v_offset = kBlock * kv_dim};
  fill(r.ring_k, static_cast<size_t>(window * kv_dim));
  fill(r.ring_v, static_cast<size_t>(window * kv_dim));
  fill(r.tail_k, static_cast<size_t>(rows * kv_dim));
  fill(r.tail_v, static_cast<size_t>(rows * kv_dim));
  for (int64_t i = 0; i < rows; ++i) {
    r.positions.push_back(static_cast<int32_t>(context + i));
    r.swa_lo.push_back(static_cast<int32_t>(std::max<int64_t>(0, context + i - window + 1)));
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"baton CPU attention benchmark (decode-shaped calls)"};
  std::string contexts_text = "4096,32768", batches_text = "1,8";
  int64_t rows = 1, heads = 8, kv_heads = 1, head_dim = 64, window = 128;
  int repeats = 20;
  bool json = false;
  app.add_option("--contexts", contexts_text, "Global block-KV positions before the rows, a list");
  app.add_option("--batches", batches_text, "Requests per call, a list");
  app.add_option("--rows", rows, "Query rows per request")->check(CLI::Range(1, 256));
  app.add_option("--heads", heads, "Query heads")->check(CLI::Range(1, 256));
  app.add_option("--kv-heads", kv_heads, "KV heads (dividing --heads)")->check(CLI::Range(1, 256));
  app.add_option("--head-dim", head_dim, "Head size")->check(CLI::Range(1, 512));
  app.add_option("--window", window, "SWA window (ring slots)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--repeats", repeats, "Timed calls per figure (median)")
      ->check(CLI::Range(1, 100000));
  app.add_flag("--json", json, "Print one JSON object");
  CLI11_PARSE(app, argc, argv);
  if (heads % kv_heads != 0) {
    std::cerr << "--kv-heads: must divide --heads (" << heads << ")\n";
    return 2;
  }
  const auto contexts = baton::ParseIntList(contexts_text, "--contexts");
  const auto batches = baton::ParseIntList(batches_text, "--batches");
  if (!contexts.ok() || !batches.ok()) {
    std::cerr << (contexts.ok() ? batches.status() : contexts.status()).message() << "\n";
    return 2;
  }

  nlohmann::json out;
  out["machine"] = {{"sgemm_gflops", SgemmGflops()},
                    {"read_gbps", ReadGBps()},
                    {"threads", baton::kernels::CpuTeamSize()},
                    {"isa", baton::kernels::CpuIsaName(baton::kernels::ActiveCpuIsa())}};
  const double sgemm = out["machine"]["sgemm_gflops"].get<double>();
  const double read = out["machine"]["read_gbps"].get<double>();
  const int64_t kv_dim = kv_heads * head_dim;
  std::mt19937 rng(7);
  for (int64_t context : *contexts) {
    for (int64_t batch : *batches) {
      std::vector<Request> requests;
      for (int64_t b = 0; b < batch; ++b) {
        requests.push_back(MakeRequest(context, rows, kv_dim, window, rng));
      }
      std::vector<baton::kernels::AttentionParams> params;
      for (Request& r : requests) {
        std::normal_distribution<float> normal(0.0f, 1.0f);
        r.q.resize(static_cast<size_t>(rows * heads * head_dim));
        for (float& x : r.q) x = normal(rng);
        r.out.assign(r.q.size(), 0.0f);
        params.push_back({.rows = rows,
                          .num_heads = heads,
                          .num_kv_heads = kv_heads,
                          .head_dim = head_dim,
                          .scale = 1.0f / std::sqrt(static_cast<float>(head_dim)),
                          .q = r.q.data(),
                          .q_stride = heads * head_dim,
                          .out = r.out.data(),
                          .positions = r.positions.data(),
                          .swa_lo = r.swa_lo.data(),
                          .swa = {.ring_k = r.ring_k.data(),
                                  .ring_v = r.ring_v.data(),
                                  .ring_capacity = window,
                                  .tail_k = r.tail_k.data(),
                                  .tail_v = r.tail_v.data(),
                                  .tail_stride = kv_dim,
                                  .tail_start = context},
                          .global = &r.global});
      }
      std::vector<double> seconds;
      for (int i = 0; i < repeats + 1; ++i) {
        const auto start = Clock::now();
        baton::kernels::Attention(params);
        if (i > 0) seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      }
      std::sort(seconds.begin(), seconds.end());
      const double s = seconds[seconds.size() / 2];
      // Each row sees its block KV [0, pos] and its window: QK^T and PV, 2 FLOPs a product.
      const double keys = static_cast<double>(context + window);
      const double flops = 4.0 * batch * rows * heads * head_dim * keys;
      const double bytes = 2.0 * 4 * batch * keys * kv_dim;
      const double bound = std::max(flops / (sgemm * 1e9), bytes / (read * 1e9));
      out["attention"].push_back({{"context", context},
                                  {"batch", batch},
                                  {"rows", rows},
                                  {"ms", s * 1e3},
                                  {"gflops", flops / s / 1e9},
                                  {"gbps", bytes / s / 1e9},
                                  {"over_bound", s / bound}});
    }
  }
  if (json) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << absl::StrFormat("machine: sgemm %.1f GFLOP/s, read %.2f GB/s, %d threads, isa %s\n",
                               sgemm, read, out["machine"]["threads"].get<int>(),
                               out["machine"]["isa"].get<std::string>());
  for (const auto& a : out["attention"]) {
    std::cout << absl::StrFormat(
        "attention context=%-6d batch=%-3d rows=%-3d %8.3f ms %7.1f GFLOP/s %6.1f GB/s %5.2fx "
        "its bound\n",
        a["context"].get<int64_t>(), a["batch"].get<int64_t>(), a["rows"].get<int64_t>(),
        a["ms"].get<double>(), a["gflops"].get<double>(), a["gbps"].get<double>(),
        a["over_bound"].get<double>());
  }
  return 0;
}
