// `batonctl capacity`: how many prefill and decode nodes a workload needs at its TTFT and ITL
// targets. It runs the trace through the cluster simulation (the router's own placement and
// cost model, at the rates a running cluster measured) at the node counts capacity.h's search
// tries, and prints every point it explored with its predicted percentiles, then the cheapest
// one that meets both targets.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "baton/common/model_config.h"
#include "baton/kvstore/hit_policy.h"
#include "capacity.h"
#include "cluster_sim.h"
#include "commands.h"
#include "nlohmann/json.hpp"
#include "trace.h"

namespace baton::tools {
namespace {

struct CapacityOptions {
  std::string trace;
  std::string model_config;
  double ttft_p99_ms = 0;
  double itl_p99_ms = 0;
  int64_t max_nodes = 64;
  int64_t threads = 1;
  std::string policy = "predicted-ttft";
  int64_t prefill_slots = 2;
  int64_t decode_slots = 64;
  std::string block_cache_bytes = "0";
  std::string rates;
  std::string decode_rates;
  decode_node::StepPolicy decode_step = ClusterOptions{}.decode_step;
  std::string split;  // "": replay-on-decode when --decode-rates has replay_ms_per_gflop
  double time_scale = 1.0;
  int64_t max_requests = 0;
  int64_t max_output_tokens = 0;
  double length_scale = 1.0;
  int64_t trace_block = kMooncakeTraceBlock;
  int64_t block_size = 0;     // 0: the model's
  int64_t sample_one_in = 1;  // 1: search on the whole trace
  bool json = false;
};

// The largest --block-size: a block is a unit of cache bookkeeping here, and one past a trace's
// hash id (512 tokens in Mooncake's) only loses hits.
constexpr int64_t kMaxSimulatedBlock = 65536;

absl::Status FlagError(absl::string_view flag, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", what));
}

// One cluster shape the search may answer with: its split, policy and cache size.
struct Shape {
  std::string split;  // "prefill-all" or "replay-on-decode"
  std::string policy;
  RoutePolicy route = RoutePolicy::kPredictedTtft;
  uint64_t block_cache_bytes = 0;
};

struct ShapedPoint {
  Shape shape;
  CapacityPoint point;
};

nlohmann::json PointJson(const ShapedPoint& shaped) {
  const CapacityPoint& p = shaped.point;
  return {{"split", shaped.shape.split},
          {"policy", shaped.shape.policy},
          {"block_cache_bytes", shaped.shape.block_cache_bytes},
          {"prefill_nodes", p.prefill_nodes},
          {"decode_nodes", p.decode_nodes},
          {"ttft_ms", {{"p50", p.ttft_p50_ms}, {"p99", p.ttft_p99_ms}}},
          {"itl_ms", {{"p50", p.itl_p50_ms}, {"p99", p.itl_p99_ms}}},
          {"requests_per_s", p.requests_per_s},
          {"meets", p.meets},
          {"stopped", p.stopped},
          {"sample_one_in", p.sample_one_in},
          {"seconds", p.seconds}};
}

// The numeric flags, each in its range.
absl::Status CheckCapacityFlags(const CapacityOptions& o) {
  if (!(o.ttft_p99_ms > 0) || !std::isfinite(o.ttft_p99_ms)) {
    return FlagError("--ttft-p99-ms", "must be a finite number > 0");
  }
  if (!(o.itl_p99_ms >= 0) || !std::isfinite(o.itl_p99_ms)) {
    return FlagError("--itl-p99-ms", "must be a finite number >= 0 (0: none)");
  }
  if (o.max_nodes < 1 || o.max_nodes > 1024) {
    return FlagError("--max-nodes", absl::StrCat(o.max_nodes, " must lie in [1, 1024]"));
  }
  if (o.threads < 0 || o.threads > 256) {
    return FlagError("--threads", absl::StrCat(o.threads, " must lie in [0, 256] (0: every core)"));
  }
  if (o.prefill_slots < 1 || o.prefill_slots > 1024 || o.decode_slots < 1 ||
      o.decode_slots > 65536) {
    return FlagError("--prefill-slots and --decode-slots", "must lie in [1, 1024] and [1, 65536]");
  }
  if (o.sample_one_in < 1 || o.sample_one_in > o.max_nodes) {
    return FlagError("--sample-one-in",
                     absl::StrCat(o.sample_one_in, " must lie in [1, --max-nodes ", o.max_nodes,
                                  "] (1: the whole trace)"));
  }
  if (!(o.time_scale >= 0) || !std::isfinite(o.time_scale) || o.max_requests < 0 ||
      o.max_output_tokens < 0) {
    return FlagError("--time-scale, --max-requests and --max-output-tokens",
                     "must be finite and >= 0");
  }
  return absl::OkStatus();
}

// The shapes to search: every combination of --split, --policy and --block-cache-bytes, each
// flag checked, and the prefill and decode nodes' rates they are priced at.
absl::StatusOr<std::vector<Shape>> ParseShapes(const CapacityOptions& o,
                                               kvstore::PrefillRates& rates_out,
                                               DecodeRates& decode_out) {
  absl::StatusOr<std::vector<RoutePolicy>> policies = ParseRoutePolicies(o.policy);
  if (!policies.ok()) return policies.status();
  std::string rates_text = o.rates, decode_text = o.decode_rates;
  if (absl::Status s = ResolveRatesFile(rates_text, decode_text); !s.ok()) return s;
  absl::StatusOr<kvstore::PrefillRates> rates = ParseRates(rates_text);
  if (!rates.ok()) return rates.status();
  absl::StatusOr<DecodeRates> decode = ParseDecodeRates(decode_text);
  if (!decode.ok()) return decode.status();
  absl::StatusOr<std::vector<std::optional<uint64_t>>> caches =
      ParseBudgets(o.block_cache_bytes, "--block-cache-bytes");
  if (!caches.ok()) return caches.status();
  std::vector<std::string> splits;
  for (absl::string_view split : absl::StrSplit(
           o.split.empty() ? (decode->replay_ms_per_gflop > 0 ? "replay-on-decode" : "prefill-all")
                           : o.split,
           ',')) {
    if (split != "prefill-all" && split != "replay-on-decode") {
      return FlagError("--split", absl::StrCat("'", split,
                                               "' is unknown; allowed: "
                                               "prefill-all, "
                                               "replay-on-decode"));
    }
    if (split == "replay-on-decode" && !(decode->replay_ms_per_gflop > 0)) {
      return FlagError("--split",
                       "replay-on-decode needs the decode nodes' replay rate: "
                       "--decode-rates replay_ms_per_gflop=.. (a decode node's "
                       "baton_decode_replay_ms_per_gflop; `batonctl rates` gives it)");
    }
    splits.emplace_back(split);
  }
  const std::vector<std::string> policy_names = absl::StrSplit(o.policy, ',');
  std::vector<Shape> shapes;
  for (const std::string& split : splits) {
    for (size_t p = 0; p < policies->size(); ++p) {
      for (const std::optional<uint64_t>& cache : *caches) {
        shapes.push_back({.split = split,
                          .policy = policy_names[p],
                          .route = (*policies)[p],
                          .block_cache_bytes = cache.value_or(0)});
      }
    }
  }
  rates_out = *rates;
  decode_out = *decode;
  return shapes;
}

// The explored points and the answer, as a table or (--json) one JSON object.
void PrintCapacity(const CapacityOptions& o, int64_t block_size,
                   const std::vector<ShapedPoint>& explored, const std::optional<ShapedPoint>& best,
                   size_t requests, double seconds) {
  if (o.json) {
    nlohmann::json points = nlohmann::json::array();
    for (const ShapedPoint& p : explored) points.push_back(PointJson(p));
    std::cout << nlohmann::json{{"kind", "capacity"},
                                {"requests", static_cast<int64_t>(requests)},
                                {"ttft_p99_ms", o.ttft_p99_ms},
                                {"itl_p99_ms", o.itl_p99_ms},
                                {"policy", o.policy},
                                {"block_size", block_size},
                                {"sample_one_in", o.sample_one_in},
                                {"best", best ? PointJson(*best) : nullptr},
                                {"explored", std::move(points)},
                                {"seconds", seconds}}
                     .dump()
              << "\n";
  } else {
    std::cout << absl::StrFormat("%16s %14s %12s %8s %7s %10s %10s %9s %9s %8s %6s %7s %6s\n",
                                 "split", "policy", "cache", "prefill", "decode", "ttft_p50",
                                 "ttft_p99", "itl_p50", "itl_p99", "req/s", "meets", "secs",
                                 "trace");
    for (const ShapedPoint& shaped : explored) {
      const CapacityPoint& p = shaped.point;
      std::cout << absl::StrFormat(
          "%16s %14s %12d %8d %7d %10.1f %10.1f %9.1f %9.1f %8.2f %6s %7.1f %6s\n",
          shaped.shape.split, shaped.shape.policy, shaped.shape.block_cache_bytes, p.prefill_nodes,
          p.decode_nodes, p.ttft_p50_ms, p.ttft_p99_ms, p.itl_p50_ms, p.itl_p99_ms,
          p.requests_per_s,
          p.meets     ? "yes"
          : p.stopped ? "no*"
                      : "no",
          p.seconds, p.sample_one_in > 1 ? absl::StrCat("1/", p.sample_one_in) : "all");
    }
    if (std::any_of(explored.begin(), explored.end(),
                    [](const ShapedPoint& shaped) { return shaped.point.stopped; })) {
      std::cout << "* stopped once its TTFT p99 was sure to miss the target: its figures are over "
                   "the requests placed by then\n";
    }
    if (o.sample_one_in > 1) {
      std::cout << absl::StrFormat(
          "trace 1/%d: run on one prefix group in %d at 1/%d of the nodes listed; the answer was "
          "then run on the whole trace, %d nodes a role more while it missed\n",
          o.sample_one_in, o.sample_one_in, o.sample_one_in, o.sample_one_in);
    }
    if (best) {
      std::cout << absl::StrFormat(
          "cheapest: %d prefill + %d decode nodes, %s, %s, block cache %d bytes (TTFT p99 %.1f "
          "ms <= %.1f, ITL p99 %.1f ms); %zu requests, %zu points in %.1f s\n",
          best->point.prefill_nodes, best->point.decode_nodes, best->shape.split,
          best->shape.policy, best->shape.block_cache_bytes, best->point.ttft_p99_ms, o.ttft_p99_ms,
          best->point.itl_p99_ms, requests, explored.size(), seconds);
    } else {
      std::cout << absl::StrFormat(
          "none: even %d prefill and %d decode nodes miss the targets (see the last row)\n",
          o.max_nodes, o.max_nodes);
    }
  }
}

int RunCapacity(const CapacityOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status s = CheckCapacityFlags(o); !s.ok()) return ReportError("capacity", s);
  kvstore::PrefillRates rates;
  DecodeRates decode_rates;
  absl::StatusOr<std::vector<Shape>> shapes = ParseShapes(o, rates, decode_rates);
  if (!shapes.ok()) return ReportError("capacity", shapes.status());
  absl::StatusOr<ModelConfig> config = LoadModelConfig(o.model_config);
  if (!config.ok()) {
    return ReportError("capacity", FlagError("--model-config", config.status().message()));
  }
  const TokenOptions tokens{.trace_block = o.trace_block,
                            .length_scale = o.length_scale,
                            .vocab_size = config->vocab_size};
  if (absl::Status s = ValidateTokenOptions(tokens); !s.ok()) {
    return ReportError("capacity", FlagError("--trace-block and --length-scale", s.message()));
  }
  // Checked before the trace is read: a million lines take seconds.
  const int64_t B = o.block_size == 0 ? config->kv_block_size : o.block_size;
  if (B < 1 || B % config->kv_block_size != 0 || B > kMaxSimulatedBlock) {
    return ReportError(
        "capacity", FlagError("--block-size",
                              absl::StrCat(B, " must be a multiple of the model's ",
                                           config->kv_block_size, " up to ", kMaxSimulatedBlock)));
  }
  absl::StatusOr<std::vector<TraceRequest>> trace = LoadTrace(o.trace, o.trace_block);
  if (!trace.ok()) {
    return ReportError("capacity", FlagError("--trace", trace.status().message()));
  }
  if (o.max_requests > 0 && static_cast<size_t>(o.max_requests) < trace->size()) {
    trace->resize(static_cast<size_t>(o.max_requests));
  }
  const int64_t C = config->ring_capacity();
  // The value sizes of a block of B positions (simulate_command.cc does the same).
  ModelConfig sized = *config;
  sized.kv_block_size = B;
  const std::vector<ClusterRequest> requests =
      ClusterRequestsFromTrace(*trace, tokens, B, o.time_scale, o.max_output_tokens);
  const std::vector<TraceRequest> sampled_trace = o.sample_one_in > 1
                                                      ? SamplePrefixGroups(*trace, o.sample_one_in)
                                                      : std::vector<TraceRequest>{};
  if (o.sample_one_in > 1 && sampled_trace.empty()) {
    return ReportError(
        "capacity",
        FlagError("--sample-one-in",
                  absl::StrCat(o.sample_one_in, " leaves none of the trace's ", trace->size(),
                               " requests; a smaller K samples more groups")));
  }
  const std::vector<ClusterRequest> sample =
      ClusterRequestsFromTrace(sampled_trace, tokens, B, o.time_scale, o.max_output_tokens);
  const ClusterOptions common{.slots = o.prefill_slots,
                              .hit = {.keep = C,
                                      .truncation_on = true,
                                      .ring_capacity = C,
                                      .window = config->sliding_window,
                                      .block_size = B,
                                      .cap = kvstore::HitCap::kRing},
                              .payload = kvstore::BlockPayloadBytes(sized),
                              .config = *config,
                              .rates = rates,
                              .decode_nodes = 1,
                              .decode_slots = o.decode_slots,
                              .decode = decode_rates,
                              .decode_step = o.decode_step};
  // Each shape's own search; the cheapest answer is the fewest nodes, then the smallest cache,
  // then the least TTFT p99.
  std::vector<ShapedPoint> explored;
  std::optional<ShapedPoint> best;
  for (const Shape& shape : *shapes) {
    ClusterOptions base = common;
    base.policy = shape.route;
    base.block_cache_bytes = shape.block_cache_bytes;
    if (shape.split == "prefill-all") base.decode.replay_ms_per_gflop = 0;
    const CapacityPlan plan = PlanCapacitySampled(requests, sample, o.sample_one_in, base,
                                                  {.ttft_p99_ms = o.ttft_p99_ms,
                                                   .itl_p99_ms = o.itl_p99_ms,
                                                   .max_nodes = o.max_nodes,
                                                   .threads = o.threads});
    for (const CapacityPoint& p : plan.explored) explored.push_back({shape, p});
    if (!plan.best) continue;
    const ShapedPoint candidate{shape, *plan.best};
    auto key = [](const ShapedPoint& s) {
      return std::make_tuple(s.point.prefill_nodes + s.point.decode_nodes,
                             s.shape.block_cache_bytes, s.point.ttft_p99_ms);
    };
    if (!best || key(candidate) < key(*best)) best = candidate;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  PrintCapacity(o, B, explored, best, requests.size(), seconds);
  return best ? kExitOk : kExitFailure;
}

}  // namespace

Command AddCapacityCommand(CLI::App& app) {
  auto o = std::make_shared<CapacityOptions>();
  CLI::App* command = app.add_subcommand(
      "capacity",
      "The fewest prefill and decode nodes whose simulated TTFT and ITL p99 on a trace meet "
      "the targets (the router's own placement and cost model)");
  command->add_option("--trace", o->trace, "Mooncake-style JSONL trace")->required();
  command->add_option("--model-config", o->model_config, "The served model's config.json")
      ->required();
  command->add_option("--ttft-p99-ms", o->ttft_p99_ms, "TTFT target at p99 (ms)")->required();
  command->add_option("--itl-p99-ms", o->itl_p99_ms,
                      "ITL target at p99 (ms; default 0: none, decode nodes still hold slots)");
  command->add_option("--max-nodes", o->max_nodes,
                      "The most nodes of each role to consider (default 64, at most 1024)");
  command->add_option("--threads", o->threads,
                      "Points simulated at once in a bisection, each on its own thread (default "
                      "1; 0: one per core)");
  command->add_option("--policy", o->policy,
                      "The router's --prefill-policy (least-loaded, longest-prefix, "
                      "predicted-ttft; default predicted-ttft), or several comma-separated: "
                      "each is searched and the cheapest answer wins");
  command->add_option("--prefill-slots", o->prefill_slots,
                      "The router's --prefill-slots (default 2)");
  command->add_option("--decode-slots", o->decode_slots, "Each decode node's --slots (default 64)");
  command->add_option("--block-cache-bytes", o->block_cache_bytes,
                      "Each prefill node's local block cache, as `batonctl simulate` takes it "
                      "(default 0: none); several comma-separated are each searched, and of "
                      "equally many nodes the smallest cache wins");
  command->add_option("--split", o->split,
                      "prefill-all, replay-on-decode, or both comma-separated (each searched); "
                      "replay-on-decode needs --decode-rates replay_ms_per_gflop=.. (default: "
                      "replay-on-decode when that is given, else prefill-all)");
  command->add_option("--rates", o->rates,
                      "The prefill nodes' rates, as `batonctl simulate --rates`: name=value,... or "
                      "a FILE of `batonctl rates --addr ROUTER` output (its decode rates too, "
                      "unless --decode-rates is given)");
  command->add_option("--decode-rates", o->decode_rates,
                      "The decode nodes' step cost, as `batonctl simulate --decode-rates`");
  AddDecodeStepFlags(*command, o->decode_step);
  command->add_option("--time-scale", o->time_scale,
                      "Arrivals at the trace's timestamps times this (default 1)");
  command->add_option("--max-requests", o->max_requests,
                      "Only the first N requests of the trace (default 0: all)");
  command->add_option("--max-output-tokens", o->max_output_tokens,
                      "Cap each request's completion tokens (default 0: the trace's)");
  command->add_option("--length-scale", o->length_scale,
                      "Scale prompt lengths and tokens per hash id (default 1)");
  command->add_option("--trace-block", o->trace_block,
                      "Tokens per hash id in the trace (default 512, Mooncake's)");
  command->add_option("--block-size", o->block_size,
                      "Tokens a simulated block holds: the unit the caches and the store track "
                      "and hits round to (default: the model's; a multiple of it). At the "
                      "trace's 512 tokens a hash id a simulation does an eighth of the cache "
                      "work of 64-token blocks, and each hit loses what lay past its last whole "
                      "512 tokens");
  command->add_option("--sample-one-in", o->sample_one_in,
                      "Search on one prefix group in K (requests grouped by their first hash "
                      "id) at 1/K of the nodes, then run the answer times K on the whole trace, "
                      "K nodes a role more while it misses (default 1: search on the whole "
                      "trace). For traces of a million requests");
  command->add_flag("--json", o->json,
                    "Print one JSON object {\"kind\": \"capacity\", \"best\", \"explored\"}");
  return {command, [o] { return RunCapacity(*o); }};
}

}  // namespace baton::tools
