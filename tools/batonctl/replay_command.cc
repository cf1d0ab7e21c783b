// batonctl replay: plays a workload trace (Mooncake JSONL) against a running cluster and
// reports what its users would see: hit rates, cached tokens, replayed rows, time to first
// token and inter-token latency percentiles, throughput.
//
// Each trace line becomes one Generate request at its timestamp (scaled by --time-scale; 0
// sends as fast as the concurrency bound allows), with the deterministic tokens of its hash
// ids (so equal ids give equal blocks and the prefix store sees the trace's reuse), and
// output_length completion tokens with EOS ignored. At most --concurrency requests are in
// flight; a request whose time has come waits for a free slot (its latency counts from when
// it was sent, its lateness is reported).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "baton/v1/generation.grpc.pb.h"
#include "client.h"
#include "commands.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "trace.h"

namespace baton::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct ReplayOptions {
  std::string trace;
  ClientOptions client;
  double time_scale = 1.0;
  int64_t max_requests = 0;  // 0: the whole trace
  double length_scale = 1.0;
  int64_t concurrency = 8;
  int64_t vocab_size = 4096;
  int64_t max_output_tokens = 0;  // 0: the trace's output_length
  int64_t timeout_ms = 600000;
  std::string cache_salt;
  int64_t keep = 0;  // every request compact at this keep (0: the router's default)
  bool json = false;
  bool progress = true;
};

struct RequestResult {
  bool ok = false;
  std::string error;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t local_cached_tokens = 0;  // of those, from the prefill node's local block cache
  int64_t replayed_rows = 0;
  double predicted_ttft_ms = 0;  // the router's prediction when it chose the prefill node
  int64_t output_tokens = 0;
  double ttft_ms = 0;
  double late_ms = 0;  // sent this long after its scheduled time
  std::vector<double> itl_ms;
};

RequestResult Send(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                   int64_t timeout_ms, const ClientOptions& client) {
  RequestResult r;
  r.prompt_tokens = request.prompt_token_ids_size();
  grpc::ClientContext context;
  Authenticate(client, context);
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  const auto start = Clock::now();
  auto last = start;
  auto reader = stub.Generate(&context, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    const auto now = Clock::now();
    const int n = response.token_ids_size();
    if (n > 0) {
      const double gap = std::chrono::duration<double, std::milli>(now - last).count();
      if (r.output_tokens == 0) {
        r.ttft_ms = gap;
        for (int i = 1; i < n; ++i) r.itl_ms.push_back(0);
      } else {
        for (int i = 0; i < n; ++i) r.itl_ms.push_back(gap / n);
      }
      r.output_tokens += n;
      last = now;
    }
    if (response.has_usage()) {
      r.cached_tokens = response.usage().cached_tokens();
      r.local_cached_tokens = response.usage().local_cached_tokens();
      r.replayed_rows = response.usage().replayed_rows();
    }
    if (response.has_timings()) r.predicted_ttft_ms = response.timings().predicted_ttft_ms();
  }
  const grpc::Status status = reader->Finish();
  r.ok = status.ok();
  if (!r.ok) r.error = absl::StrCat(status.error_code(), ": ", status.error_message());
  return r;
}

// Nearest-rank percentile of `values` (0 when empty).
double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(q / 100 * values.size()));
  return values[std::max<size_t>(rank, 1) - 1];
}

nlohmann::json Percentiles(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return {{"p50", Percentile(values, 50)},
          {"p90", Percentile(values, 90)},
          {"p99", Percentile(values, 99)},
          {"mean", values.empty() ? 0 : sum / static_cast<double>(values.size())}};
}

void DrawProgress(int64_t done, int64_t total, int64_t errors) {
  constexpr int kWidth = 30;
  const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  std::cerr << "\r[" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] "
            << done << "/" << total << " requests, " << errors << " errors" << std::flush;
}

// Sends the trace's requests at their times (scaled by --time-scale), --concurrency at once;
// each one's result, in the trace's order, and the seconds it all took.
std::vector<RequestResult> SendAll(const ReplayOptions& o, const std::vector<TraceRequest>& trace,
                                   const TokenOptions& tokens, v1::Generation::Stub& stub,
                                   double& duration_s) {
  const int64_t total = static_cast<int64_t>(trace.size());
  const double first_ms = trace.front().timestamp_ms;
  std::vector<RequestResult> results(total);
  std::atomic<int64_t> next{0}, done{0}, errors{0};
  std::mutex progress_mutex;
  const auto start = Clock::now();
  auto worker = [&] {
    while (true) {
      const int64_t i = next.fetch_add(1);
      if (i >= total) return;
      const TraceRequest& line = trace[i];
      const auto due = start + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double, std::milli>(
                                       (line.timestamp_ms - first_ms) * o.time_scale));
      std::this_thread::sleep_until(due);
      v1::GenerateRequest request;
      for (int32_t t : TraceTokens(line, tokens)) request.add_prompt_token_ids(t);
      int64_t max_tokens = std::max<int64_t>(1, line.output_length);
      if (o.max_output_tokens > 0) max_tokens = std::min(max_tokens, o.max_output_tokens);
      request.mutable_sampling()->set_max_tokens(static_cast<uint32_t>(max_tokens));
      request.mutable_sampling()->set_ignore_eos(true);
      request.set_cache_salt(o.cache_salt);
      if (o.keep > 0) {
        request.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_COMPACT);
        request.mutable_truncation()->set_keep(static_cast<uint32_t>(o.keep));
      }
      request.set_request_id(absl::StrCat("replay-", getpid(), "-", i));
      const double late =
          std::max(0.0, std::chrono::duration<double, std::milli>(Clock::now() - due).count());
      results[i] = Send(stub, request, o.timeout_ms, o.client);
      results[i].late_ms = late;
      if (!results[i].ok) ++errors;
      const int64_t finished = ++done;
      if (o.progress) {
        std::lock_guard<std::mutex> lock(progress_mutex);
        DrawProgress(finished, total, errors.load());
      }
    }
  };
  std::vector<std::thread> workers;
  for (int64_t w = 0; w < std::min(o.concurrency, total); ++w) workers.emplace_back(worker);
  for (std::thread& w : workers) w.join();
  if (o.progress) std::cerr << "\n";
  duration_s = std::chrono::duration<double>(Clock::now() - start).count();
  return results;
}

// The replay's report: counts, hit rates, tokens, TTFT, ITL and lateness percentiles, and
// every request's own figures.
nlohmann::json ReplayReport(const ReplayOptions& o, const std::vector<RequestResult>& results,
                            double duration_s) {
  const int64_t total = static_cast<int64_t>(results.size());
  int64_t ok = 0, hits = 0, prompt_tokens = 0, cached = 0, replayed = 0, output = 0;
  std::vector<double> ttft, itl, late, predicted;
  int64_t local_cached = 0;
  nlohmann::json per_request = nlohmann::json::array();
  std::map<std::string, int64_t> error_counts;
  for (int64_t i = 0; i < total; ++i) {
    const RequestResult& r = results[static_cast<size_t>(i)];
    nlohmann::json entry = {{"index", i},
                            {"ok", r.ok},
                            {"prompt_tokens", r.prompt_tokens},
                            {"cached_tokens", r.cached_tokens},
                            {"local_cached_tokens", r.local_cached_tokens},
                            {"replayed_rows", r.replayed_rows},
                            {"predicted_ttft_ms", r.predicted_ttft_ms},
                            {"output_tokens", r.output_tokens},
                            {"ttft_ms", r.ttft_ms},
                            {"late_ms", r.late_ms}};
    if (!r.ok) {
      entry["error"] = r.error;
      ++error_counts[r.error.substr(0, r.error.find(':'))];
    } else {
      ++ok;
      hits += r.cached_tokens > 0;
      prompt_tokens += r.prompt_tokens;
      cached += r.cached_tokens;
      local_cached += r.local_cached_tokens;
      predicted.push_back(r.predicted_ttft_ms);
      replayed += r.replayed_rows;
      output += r.output_tokens;
      ttft.push_back(r.ttft_ms);
      itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
      late.push_back(r.late_ms);
    }
    per_request.push_back(std::move(entry));
  }
  const double request_hit_rate = ok > 0 ? static_cast<double>(hits) / ok : 0;
  const double token_hit_rate = prompt_tokens > 0 ? static_cast<double>(cached) / prompt_tokens : 0;
  return {{"kind", "replay"},
          {"trace", o.trace},
          {"addr", o.client.addr},
          {"time_scale", o.time_scale},
          {"length_scale", o.length_scale},
          {"concurrency", o.concurrency},
          {"requests", total},
          {"completed", ok},
          {"errors", total - ok},
          {"errors_by_code", error_counts},
          {"request_hit_rate", request_hit_rate},
          {"token_hit_rate", token_hit_rate},
          {"prompt_tokens", prompt_tokens},
          {"cached_tokens", cached},
          {"local_cached_tokens", local_cached},
          {"store_cached_tokens", cached - local_cached},
          {"replayed_rows", replayed},
          {"output_tokens", output},
          {"ttft_ms", Percentiles(ttft)},
          {"predicted_ttft_ms", Percentiles(predicted)},
          {"itl_ms", Percentiles(itl)},
          {"late_ms", Percentiles(late)},
          {"duration_s", duration_s},
          {"output_tokens_per_s", output / duration_s},
          {"requests_per_s", static_cast<double>(ok) / duration_s},
          {"per_request", per_request}};
}

// The report as text: what --json prints, summed up.
void PrintReplay(const nlohmann::json& report) {
  const auto q = [&](const char* what, const char* p) { return report[what][p].get<double>(); };
  const int64_t total = report["requests"], ok = report["completed"];
  const int64_t cached = report["cached_tokens"], local_cached = report["local_cached_tokens"];
  const int64_t output = report["output_tokens"];
  const double duration_s = report["duration_s"];
  std::cout << absl::StrFormat(
      "requests        %d (%d completed, %d errors)\n"
      "hit rate        %.3f of requests, %.3f of prompt tokens\n"
      "tokens          %d prompt, %d cached (%d local, %d store), %d consumer rows "
      "replayed, %d output\n"
      "TTFT ms         p50 %.1f  p90 %.1f  p99 %.1f\n"
      "ITL ms          p50 %.1f  p90 %.1f  p99 %.1f\n"
      "sent late ms    p50 %.1f  p90 %.1f  p99 %.1f\n"
      "throughput      %.1f output tokens/s over %.1f s\n",
      total, ok, total - ok, report["request_hit_rate"].get<double>(),
      report["token_hit_rate"].get<double>(), report["prompt_tokens"].get<int64_t>(), cached,
      local_cached, cached - local_cached, report["replayed_rows"].get<int64_t>(), output,
      q("ttft_ms", "p50"), q("ttft_ms", "p90"), q("ttft_ms", "p99"), q("itl_ms", "p50"),
      q("itl_ms", "p90"), q("itl_ms", "p99"), q("late_ms", "p50"), q("late_ms", "p90"),
      q("late_ms", "p99"), output / duration_s, duration_s);
  for (const auto& [code, n] : report["errors_by_code"].items()) {
    std::cout << "errors          " << n.get<int64_t>() << " with status " << code << "\n";
  }
}

int RunReplay(const ReplayOptions& o) {
  const char* cmd = "replay";
  if (!(o.time_scale >= 0) || !std::isfinite(o.time_scale)) {
    return ReportError(
        cmd, absl::InvalidArgumentError(absl::StrCat("--time-scale is ", o.time_scale,
                                                     "; it must be >= 0 (0: no waiting)")));
  }
  if (o.concurrency < 1 || o.max_requests < 0 || o.max_output_tokens < 0 || o.timeout_ms < 1) {
    return ReportError(cmd, absl::InvalidArgumentError(
                                "--concurrency and --timeout-ms must be >= 1; --max-requests "
                                "and --max-output-tokens >= 0"));
  }
  const TokenOptions tokens{.length_scale = o.length_scale, .vocab_size = o.vocab_size};
  if (absl::Status s = ValidateTokenOptions(tokens); !s.ok()) return ReportError(cmd, s);
  absl::StatusOr<std::vector<TraceRequest>> trace = LoadTrace(o.trace);
  if (!trace.ok()) return ReportError(cmd, trace.status());
  if (o.max_requests > 0 && static_cast<int64_t>(trace->size()) > o.max_requests) {
    trace->resize(o.max_requests);
  }

  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = ClientChannel(o.client);
  if (!channel.ok()) return ReportError(cmd, channel.status());
  if (!(*channel)->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    return ReportError(
        cmd, absl::UnavailableError(absl::StrCat("--addr: no router answers at ", o.client.addr)));
  }
  auto stub = v1::Generation::NewStub(*channel);

  double duration_s = 0;
  const std::vector<RequestResult> results = SendAll(o, *trace, tokens, *stub, duration_s);
  const nlohmann::json report = ReplayReport(o, results, duration_s);
  if (o.json) {
    std::cout << report.dump(2) << "\n";
  } else {
    PrintReplay(report);
  }
  return kExitOk;  // failed requests are in the report
}

}  // namespace

Command AddReplayCommand(CLI::App& app) {
  auto o = std::make_shared<ReplayOptions>();
  CLI::App* command =
      app.add_subcommand("replay", "Replay a workload trace (Mooncake JSONL) against a cluster");
  command->add_option("--trace", o->trace, "Trace file, one JSON request a line")->required();
  AddClientFlags(*command, o->client);
  command->add_option("--time-scale", o->time_scale,
                      "Multiplies the trace's arrival times (0: send without waiting)");
  command->add_option("--max-requests", o->max_requests, "Replay the first N lines (0: all)");
  command->add_option("--length-scale", o->length_scale,
                      "Scales prompt lengths and tokens per hash id (e.g. 0.05 for a CPU)");
  command->add_option("--concurrency", o->concurrency, "Requests in flight at most");
  command->add_option("--vocab-size", o->vocab_size,
                      "Token ids are drawn from [3, vocab-size) (the model's vocabulary)");
  command->add_option("--max-output-tokens", o->max_output_tokens,
                      "Cap on each request's output_length (0: no cap)");
  command->add_option("--timeout-ms", o->timeout_ms, "Deadline of each request");
  command->add_option("--cache-salt", o->cache_salt, "cache_salt of every request");
  command
      ->add_option("--keep", o->keep,
                   "Every request compact at this keep (at least the model's C; 0: the "
                   "router's default truncation)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  command->add_flag("--json", o->json, "Print one JSON object (with per-request results)");
  command->add_flag("!--no-progress", o->progress, "No progress bar on stderr");
  return {command, [o] { return RunReplay(*o); }};
}

}  // namespace baton::tools
