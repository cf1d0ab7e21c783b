// Time to first token and inter-token latency through a running router (e.g. `baton up`),
// at several numbers of concurrent streams. Each stream sends requests one after another.
// With --rate, requests instead arrive at a fixed rate (open loop, --rate-requests of them)
// and the bench also reports goodput: the share of requests that completed with TTFT and
// every inter-token gap within the SLO (DistServe's measure; --slo-ttft-ms, --slo-itl-ms).
// With --http URL (the router's OpenAI API, http://HOST:PORT/v1) each level runs four times,
// over gRPC, then streamed from /v1/completions (server-sent events) twice, then over gRPC
// again, with the same shape of requests (prompts of their own per pass, so none is a
// prefix-store hit of another); the rows say which ("api"). Both ask for log-probabilities,
// which is how an SSE client counts the tokens in a chunk.
//
//   baton_serving_bench --addr HOST:PORT [--http URL] [--concurrency 1,8,32] [--requests 4]
//                       [--prompt-len 512] [--max-tokens 32] [--vocab 4096]
//                       [--rate R --rate-requests N --slo-ttft-ms 2000 --slo-itl-ms 200]
#include <curl/curl.h>

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
#include "percentile.h"

namespace {

using Clock = std::chrono::steady_clock;

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
  request.set_logprobs(true);
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

// A streamed /v1/completions response as it arrives: each server-sent event with tokens (its
// logprobs list them) is a message, timed on arrival.
struct SseState {
  Clock::time_point sent, last;
  Sample sample;
  std::string pending;
};

size_t OnSseBytes(char* data, size_t size, size_t n, void* out) {
  SseState& s = *static_cast<SseState*>(out);
  s.pending.append(data, size * n);
  const auto now = Clock::now();
  size_t end;
  while ((end = s.pending.find("\n\n")) != std::string::npos) {
    const std::string event = s.pending.substr(0, end);
    s.pending.erase(0, end + 2);
    if (event.rfind("data: {", 0) != 0) continue;
    const nlohmann::json chunk = nlohmann::json::parse(event.substr(6), nullptr, false);
    if (!chunk.contains("choices") || chunk["choices"].empty()) continue;
    const nlohmann::json& lp = chunk["choices"][0]["logprobs"];
    const int tokens =
        lp.is_object() && lp.contains("tokens") ? static_cast<int>(lp["tokens"].size()) : 0;
    if (tokens == 0) continue;
    const double gap = std::chrono::duration<double, std::milli>(now - s.last).count();
    if (s.sample.ttft_ms < 0) {
      s.sample.ttft_ms = gap;
    } else {
      s.sample.worst_gap_ms = std::max(s.sample.worst_gap_ms, gap);
      for (int i = 0; i < tokens; ++i) s.sample.itl_ms.push_back(gap / tokens);
    }
    s.last = now;
    s.sample.tokens += tokens;
  }
  return size * n;
}

// The same request through the OpenAI API: a streamed /v1/completions of the same token ids.
Sample RunOneHttp(const std::string& url, const Shape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  nlohmann::json prompt = nlohmann::json::array();
  for (int i = 0; i < shape.prompt_len; ++i) prompt.push_back(rng() % shape.vocab);
  const std::string body = nlohmann::json{{"prompt", prompt}, {"max_tokens", shape.max_tokens},
                                          {"temperature", 0}, {"ignore_eos", true},
                                          {"logprobs", 0},    {"stream", true}}
                               .dump();
  SseState state;
  CURL* curl = curl_easy_init();
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  const std::string endpoint = url + "/completions";
  curl_easy_setopt(curl, CURLOPT_URL, endpoint.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &OnSseBytes);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &state);
  state.sent = state.last = Clock::now();
  long status = 0;
  const bool sent = curl_easy_perform(curl) == CURLE_OK;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  state.sample.ok = sent && status == 200 && state.sample.tokens == shape.max_tokens;
  return state.sample;
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
  std::string http;
  app.add_option("--addr", addr, "Router address")->required();
  app.add_option("--http", http,
                 "The router's OpenAI API base URL (http://HOST:PORT/v1): each level also runs "
                 "through it");
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
  std::vector<std::string> apis = {"grpc"};
  if (!http.empty()) apis.push_back("http");
  // One request each way first, unrecorded: connections and the nodes' first-request costs.
  for (const std::string& api : apis) {
    if (api == "http") {
      (void)RunOneHttp(http, shape, 1u << 31);
    } else {
      (void)RunOne(channel, shape, (1u << 31) + 1);
    }
  }
  for (int64_t streams : rate > 0 ? std::vector<int64_t>{} : *levels) {
    // With --http, each level runs gRPC, HTTP, HTTP, gRPC (ABBA), so that drift over the run
    // (a warming store, a busier machine) falls on both sides alike.
    std::vector<std::string> order = apis;
    if (apis.size() == 2) order = {"grpc", "http", "http", "grpc"};
    for (size_t pass = 0; pass < order.size(); ++pass) {
      const std::string& api = order[pass];
      Level level;
      const auto start = Clock::now();
      std::vector<std::thread> threads;
      for (int64_t s = 0; s < streams; ++s) {
        threads.emplace_back([&, s] {
          for (int r = 0; r < requests; ++r) {
            // Prompts of their own per API: the same prompt again would be a prefix-store
            // hit for the second.
            const uint64_t seed = 1000 * streams + s + 7919 * r + (uint64_t{pass} << 30);
            level.Add(api == "http" ? RunOneHttp(http, shape, seed) : RunOne(channel, shape, seed),
                      slo_ttft_ms, slo_itl_ms);
          }
        });
      }
      for (auto& t : threads) t.join();
      nlohmann::json row = level.Json(std::chrono::duration<double>(Clock::now() - start).count());
      row["streams"] = streams;
      row["requests"] = streams * requests;
      row["api"] = api;
      out.push_back(row);
    }
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}
