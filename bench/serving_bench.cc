// Time to first token and inter-token latency through a running router (e.g. `baton up`),
// at several numbers of concurrent streams. Each stream sends requests one after another.
//
//   baton_serving_bench --addr HOST:PORT [--concurrency 1,8,32] [--requests 4]
//                       [--prompt-len 512] [--max-tokens 32] [--vocab 4096]
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"baton serving latency benchmark"};
  std::string addr, concurrency_text = "1,8,32";
  int requests = 4, prompt_len = 512, max_tokens = 32, vocab = 4096;
  app.add_option("--addr", addr, "Router address")->required();
  app.add_option("--concurrency", concurrency_text, "Concurrent streams, a list");
  app.add_option("--requests", requests, "Requests per stream");
  app.add_option("--prompt-len", prompt_len, "Prompt tokens");
  app.add_option("--max-tokens", max_tokens, "Completion tokens per request");
  app.add_option("--vocab", vocab, "Token ids are drawn from [0, vocab)");
  CLI11_PARSE(app, argc, argv);
  auto levels = baton::ParseIntList(concurrency_text, "--concurrency");
  if (!levels.ok()) {
    std::cerr << levels.status().message() << "\n";
    return 2;
  }
  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  nlohmann::json out = nlohmann::json::array();
  for (int64_t streams : *levels) {
    std::mutex mutex;
    std::vector<double> ttft, itl;
    int errors = 0, tokens = 0;
    const auto start = Clock::now();
    std::vector<std::thread> threads;
    for (int64_t s = 0; s < streams; ++s) {
      threads.emplace_back([&, s] {
        auto stub = baton::v1::Generation::NewStub(channel);
        std::mt19937_64 rng(1000 * streams + s);
        for (int r = 0; r < requests; ++r) {
          baton::v1::GenerateRequest request;
          for (int i = 0; i < prompt_len; ++i) request.add_prompt_token_ids(rng() % vocab);
          request.mutable_sampling()->set_max_tokens(max_tokens);
          request.mutable_sampling()->set_ignore_eos(true);
          grpc::ClientContext context;
          const auto sent = Clock::now();
          auto reader = stub->Generate(&context, request);
          baton::v1::GenerateResponse response;
          std::vector<double> my_itl;
          double my_ttft = -1;
          auto last = sent;
          int my_tokens = 0;
          while (reader->Read(&response)) {
            const auto now = Clock::now();
            const int n = response.token_ids_size();
            if (n == 0) continue;
            if (my_ttft < 0) {
              my_ttft = std::chrono::duration<double, std::milli>(now - sent).count();
            } else {
              const double gap = std::chrono::duration<double, std::milli>(now - last).count();
              for (int i = 0; i < n; ++i) my_itl.push_back(gap / n);
            }
            last = now;
            my_tokens += n;
          }
          const bool ok = reader->Finish().ok();
          std::lock_guard<std::mutex> lock(mutex);
          if (!ok) {
            ++errors;
            continue;
          }
          ttft.push_back(my_ttft);
          itl.insert(itl.end(), my_itl.begin(), my_itl.end());
          tokens += my_tokens;
        }
      });
    }
    for (auto& t : threads) t.join();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    out.push_back({{"streams", streams},
                   {"requests", streams * requests},
                   {"errors", errors},
                   {"ttft_ms",
                    {{"p50", Percentile(ttft, 0.5)},
                     {"p90", Percentile(ttft, 0.9)},
                     {"p99", Percentile(ttft, 0.99)}}},
                   {"itl_ms",
                    {{"p50", Percentile(itl, 0.5)},
                     {"p90", Percentile(itl, 0.9)},
                     {"p99", Percentile(itl, 0.99)}}},
                   {"output_tokens_per_s", tokens / seconds}});
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}
