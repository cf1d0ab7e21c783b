// What arriving prompts do to streams already decoding, through a running router (e.g. `baton
// up`): --running streams generate long completions; once each has streamed a few tokens and a
// quiet window has passed, --arrivals prompts of --arrival-prompt-len tokens arrive at once.
// Reports the arrivals' time to first token (p50, p99) and the running streams' inter-token
// latency p99 in the quiet window and while the arrivals are prefilled and replayed, and their
// ratio (the figure of the replay-on-decode split's --replay-rows-per-step: Sarathi-Serve's
// chunking applied to the replay). Before the arrivals, one lone request of --lone-prompt-len
// tokens measures prefill tokens/s from its timings (prefill_ms).
//
//   baton_arrival_bench --addr HOST:PORT [--running 8] [--running-prompt-len 64] [--running-tokens
//   2000]
//                       [--arrivals 16] [--arrival-prompt-len 2048] [--quiet-ms 1500]
//                       [--vocab 4096]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <mutex>
#include <random>
#include <thread>

#include "CLI/CLI.hpp"
#include "baton/v1/generation.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "percentile.h"

namespace {

using Clock = std::chrono::steady_clock;

baton::v1::GenerateRequest Request(int prompt_len, int max_tokens, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  baton::v1::GenerateRequest request;
  for (int i = 0; i < prompt_len; ++i) request.add_prompt_token_ids(rng() % vocab);
  request.mutable_sampling()->set_max_tokens(max_tokens);
  request.mutable_sampling()->set_ignore_eos(true);
  return request;
}

// One token's arrival at the client: when, and how long after the stream's previous message
// (a message's gap is split over its tokens).
struct Gap {
  Clock::time_point at;
  double ms;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"baton arrival benchmark: running streams' ITL while prompts arrive"};
  std::string addr;
  int running = 8, running_prompt_len = 64, running_tokens = 2000, arrivals = 16;
  int arrival_prompt_len = 2048, lone_prompt_len = 0;
  int quiet_ms = 1500, vocab = 4096;
  app.add_option("--addr", addr, "Router address")->required();
  app.add_option("--running", running, "Streams decoding before the arrivals");
  app.add_option("--running-prompt-len", running_prompt_len, "Their prompts' tokens");
  app.add_option("--running-tokens", running_tokens,
                 "Their max_tokens (cancelled once the arrivals have their first tokens)");
  app.add_option("--arrivals", arrivals, "Prompts arriving at once");
  app.add_option("--arrival-prompt-len", arrival_prompt_len, "Their tokens");
  app.add_option("--lone-prompt-len", lone_prompt_len,
                 "The lone request's tokens, whose prefill tokens/s is reported (0: as the "
                 "arrivals')");
  app.add_option("--quiet-ms", quiet_ms,
                 "The window without arrivals that the baseline ITL is from");
  app.add_option("--vocab", vocab, "Token ids are drawn from [0, vocab)");
  CLI11_PARSE(app, argc, argv);
  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  auto stub = baton::v1::Generation::NewStub(channel);

  // Prefill tokens/s of one lone prompt (cold: its tokens are no other request's).
  if (lone_prompt_len <= 0) lone_prompt_len = arrival_prompt_len;
  double prefill_ms = 0;
  {
    grpc::ClientContext context;
    auto reader = stub->Generate(&context, Request(lone_prompt_len, 1, vocab, 1));
    baton::v1::GenerateResponse response;
    while (reader->Read(&response)) {
      if (response.has_timings()) prefill_ms = response.timings().prefill_ms();
    }
    if (!reader->Finish().ok()) {
      std::cerr << "the lone request failed\n";
      return 1;
    }
  }

  // The running streams: they decode until cancelled.
  std::mutex mutex;
  std::vector<Gap> gaps;
  std::atomic<int> warm{0};
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::thread> streams;
  for (int i = 0; i < running; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    streams.emplace_back([&, i, context = contexts.back().get()] {
      auto reader =
          stub->Generate(context, Request(running_prompt_len, running_tokens, vocab, 100 + i));
      baton::v1::GenerateResponse response;
      auto last = Clock::now();
      int tokens = 0;
      while (reader->Read(&response)) {
        const int n = response.token_ids_size();
        if (n == 0) continue;
        const auto now = Clock::now();
        const double gap = std::chrono::duration<double, std::milli>(now - last).count();
        if (tokens > 0) {
          std::lock_guard<std::mutex> lock(mutex);
          for (int t = 0; t < n; ++t) gaps.push_back({now, gap / n});
        }
        if (tokens < 4 && tokens + n >= 4) ++warm;
        tokens += n;
        last = now;
      }
      (void)reader->Finish();
    });
  }
  while (warm.load() < running) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto quiet_start = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(quiet_ms));

  // The arrivals, all at once.
  const auto arrivals_start = Clock::now();
  std::vector<double> ttft(arrivals, -1);
  std::vector<std::thread> arriving;
  for (int i = 0; i < arrivals; ++i) {
    arriving.emplace_back([&, i] {
      grpc::ClientContext context;
      const auto sent = Clock::now();
      auto reader = stub->Generate(&context, Request(arrival_prompt_len, 2, vocab, 1000 + i));
      baton::v1::GenerateResponse response;
      while (reader->Read(&response)) {
        if (response.token_ids_size() > 0 && ttft[i] < 0) {
          ttft[i] = std::chrono::duration<double, std::milli>(Clock::now() - sent).count();
        }
      }
      if (!reader->Finish().ok()) ttft[i] = -1;
    });
  }
  for (auto& t : arriving) t.join();
  const auto arrivals_end = Clock::now();
  for (auto& context : contexts) context->TryCancel();
  for (auto& t : streams) t.join();

  std::vector<double> quiet, busy, first;
  for (const Gap& g : gaps) {
    if (g.at >= quiet_start && g.at < arrivals_start) quiet.push_back(g.ms);
    if (g.at >= arrivals_start && g.at <= arrivals_end) busy.push_back(g.ms);
  }
  int failed = 0;
  for (double t : ttft) {
    if (t < 0) {
      ++failed;
    } else {
      first.push_back(t);
    }
  }
  const double quiet_p99 = Percentile(quiet, 0.99), busy_p99 = Percentile(busy, 0.99);
  std::cout
      << nlohmann::json{{"prefill_tokens_per_s",
                         prefill_ms > 0 ? lone_prompt_len / prefill_ms * 1e3 : 0},
                        {"lone_prompt_len", lone_prompt_len},
                        {"arrivals", arrivals},
                        {"arrival_prompt_len", arrival_prompt_len},
                        {"failed", failed},
                        {"ttft_ms",
                         {{"p50", Percentile(first, 0.5)}, {"p99", Percentile(first, 0.99)}}},
                        {"running", running},
                        {"itl_ms_quiet", {{"p50", Percentile(quiet, 0.5)}, {"p99", quiet_p99}}},
                        {"itl_ms_arrivals", {{"p50", Percentile(busy, 0.5)}, {"p99", busy_p99}}},
                        {"itl_p99_ratio", quiet_p99 > 0 ? busy_p99 / quiet_p99 : 0},
                        {"tokens_quiet", quiet.size()},
                        {"tokens_arrivals", busy.size()}}
             .dump()
      << "\n";
  return failed == 0 ? 0 : 1;
}
