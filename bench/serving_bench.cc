// Time to first token and inter-token latency through a running router (e.g. `baton up`),
// at several numbers of concurrent streams. Each stream sends requests one after another.
// With --rate, requests instead arrive at a fixed rate (open loop, --rate-requests of them)
// and the bench also reports goodput: the share of requests that completed with TTFT and
// every inter-token gap within the SLO (DistServe's measure; --slo-ttft-ms, --slo-itl-ms).
//
//   baton_serving_bench --addr HOST:PORT [--concurrency 1,8,32] [--requests 4]
//                       [--prompt-len 512] [--max-tokens 32] [--vocab 4096]
//                       [--rate R --rate-requests N --slo-ttft-ms 2000 --slo-itl-ms 200]
#include <algorithm>
#include <chrono>
#include <iostream>
#include <mutex>
#include <random>
#include <thread>

#include "CLI/CLI.hpp"
#include "baton/common/parse.h"
#include "baton/v1/generation.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[static_cast<size_t>(q * (values.size() - 1) + 0.5)];
}

struct Shape {
  int prompt_len, max_tokens, vocab;
};

// What one request saw.
struct Sample {
  bool ok = false;
  double ttft_ms = -1;
  std::vector<double> itl_ms;  // per token after the first (a message's gap split over its tokens)
  double worst_gap_ms = 0;     // the longest wait for a message after the first
  int tokens = 0;
};

Sample RunOne(const std::shared_ptr<grpc::Channel>& channel, const Shape& shape, uint64_t seed) {
  auto stub = baton::v1::Generation::NewStub(channel);
  std::mt19937_64 rng(seed);
  baton::v1::GenerateRequest request;
  for (int i = 0; i < shape.prompt_len; ++i) request.add_prompt_token_ids(rng() % shape.vocab);
  request.mutable_sampling()->set_max_tokens(shape.max_tokens);
  request.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext context;
  const auto sent = Clock::now();
  auto reader = stub->Generate(&context, request);
  baton::v1::GenerateResponse response;
  Sample sample;
  auto last = sent;
  while (reader->Read(&response)) {
    const auto now = Clock::now();
    const int n = response.token_ids_size();
    if (n == 0) continue;
    const double gap = std::chrono::duration<double, std::milli>(now - last).count();
    if (sample.ttft_ms < 0) {
      sample.ttft_ms = gap;
    } else {
      sample.worst_gap_ms = std::max(sample.worst_gap_ms, gap);
      for (int i = 0; i < n; ++i) sample.itl_ms.push_back(gap / n);
    }
    last = now;
    sample.tokens += n;
  }
  sample.ok = reader->Finish().ok();
  return sample;
}

// The samples of one level (a number of streams, or a rate), summed up.
struct Level {
  std::mutex mutex;
  std::vector<double> ttft, itl;
  int errors = 0, tokens = 0, good = 0;
  void Add(const Sample& s, double slo_ttft_ms, double slo_itl_ms) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!s.ok) {
      ++errors;
      return;
    }
    ttft.push_back(s.ttft_ms);
    itl.insert(itl.end(), s.itl_ms.begin(), s.itl_ms.end());
    tokens += s.tokens;
    if (s.ttft_ms <= slo_ttft_ms && s.worst_gap_ms <= slo_itl_ms) ++good;
  }
  nlohmann::json Json(double seconds) const {
    return {{"errors", errors},
            {"ttft_ms",
             {{"p50", Percentile(ttft, 0.5)},
              {"p90", Percentile(ttft, 0.9)},
              {"p99", Percentile(ttft, 0.99)}}},
            {"itl_ms",
             {{"p50", Percentile(itl, 0.5)},
              {"p90", Percentile(itl, 0.9)},
              {"p99", Percentile(itl, 0.99)}}},
            {"output_tokens_per_s", tokens / seconds}};
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"baton serving latency benchmark"};
  std::string addr, concurrency_text = "1,8,32";
  int requests = 4;
  Shape shape{.prompt_len = 512, .max_tokens = 32, .vocab = 4096};
  app.add_option("--addr", addr, "Router address")->required();
  app.add_option("--concurrency", concurrency_text, "Concurrent streams, a list");
  app.add_option("--requests", requests, "Requests per stream");
  app.add_option("--prompt-len", shape.prompt_len, "Prompt tokens");
  app.add_option("--max-tokens", shape.max_tokens, "Completion tokens per request");
  app.add_option("--vocab", shape.vocab, "Token ids are drawn from [0, vocab)");
  double rate = 0, slo_ttft_ms = 2000, slo_itl_ms = 200;
  int rate_requests = 64;
  app.add_option("--rate", rate, "Requests per second, open loop (0: closed-loop streams)");
  app.add_option("--rate-requests", rate_requests, "Requests sent at --rate");
  app.add_option("--slo-ttft-ms", slo_ttft_ms, "Goodput: largest time to first token");
  app.add_option("--slo-itl-ms", slo_itl_ms, "Goodput: largest inter-token gap");
  CLI11_PARSE(app, argc, argv);
  auto levels = baton::ParseIntList(concurrency_text, "--concurrency");
  if (!levels.ok()) {
    std::cerr << levels.status().message() << "\n";
    return 2;
  }
  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  nlohmann::json out = nlohmann::json::array();
  if (rate > 0) {
    // Open loop: request i leaves at i / rate seconds whatever the others are doing.
    Level level;
    const auto start = Clock::now();
    std::vector<std::thread> threads;
    for (int i = 0; i < rate_requests; ++i) {
      std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(i / rate)));
      threads.emplace_back(
          [&, i] { level.Add(RunOne(channel, shape, 7 + i), slo_ttft_ms, slo_itl_ms); });
    }
    for (auto& t : threads) t.join();
    nlohmann::json row = level.Json(std::chrono::duration<double>(Clock::now() - start).count());
    row["rate"] = rate;
    row["requests"] = rate_requests;
    row["goodput"] = static_cast<double>(level.good) / rate_requests;
    out.push_back(row);
  }
  for (int64_t streams : rate > 0 ? std::vector<int64_t>{} : *levels) {
    Level level;
    const auto start = Clock::now();
    std::vector<std::thread> threads;
    for (int64_t s = 0; s < streams; ++s) {
      threads.emplace_back([&, s] {
        for (int r = 0; r < requests; ++r) {
          level.Add(RunOne(channel, shape, 1000 * streams + s + 7919 * r), slo_ttft_ms,
                    slo_itl_ms);
        }
      });
    }
    for (auto& t : threads) t.join();
    nlohmann::json row = level.Json(std::chrono::duration<double>(Clock::now() - start).count());
    row["streams"] = streams;
    row["requests"] = streams * requests;
    out.push_back(row);
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}
