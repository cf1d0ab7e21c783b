// `batonctl simulate`: runs a workload trace through baton's own prefix-cache code without
// running the model, to size a store and choose a hit policy (DESIGN section 5).
//
// Per request, in trace order, it does what a request does in serving: the router computes
// the chain keys of the prompt's full blocks (kvstore::ChainKeys) and looks them up (which
// touches them), the hit policy gives h (kvstore::HitBlocks, truncation on in compact mode);
// the prefill node reads block KV of [0, h) and the producer SWA rows the hit needs (touching
// them again), then writes the prompt's full blocks from h on, block KV then producer SWA per
// block, each write touching a present value or adding a new one and evicting to the budget
// (kvstore::PrefixIndex, the index PrefixStore itself keeps). A request's writes land before
// the next request is looked up. The work estimate (model::EstimateWork) turns each H = h * B
// into producer rows, replayed consumer rows and, with a model config, FLOPs.
//
// Sweeps: every list-valued option multiplies the settings; each setting starts from an empty
// store. Loop order, outermost first: block size, keep, hit cap, store budget, window,
// max_backtrack.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "baton/common/ced_rules.h"
#include "baton/common/model_config.h"
#include "baton/common/parse.h"
#include "baton/kvstore/chain.h"
#include "baton/kvstore/fleet.h"
#include "baton/kvstore/hit_policy.h"
#include "baton/kvstore/prefix_index.h"
#include "baton/kvstore/prefix_store.h"
#include "baton/kvstore/ttft_model.h"
#include "baton/model/plan.h"
#include "baton/model/state.h"
#include "baton/model/work_estimator.h"
#include "cluster_sim.h"
#include "commands.h"
#include "nlohmann/json.hpp"
#include "trace.h"

namespace baton::tools {
namespace {

using kvstore::HitCap;
using kvstore::Region;

// Chain keys need a model fingerprint; any fixed string gives the same sharing structure.
constexpr char kSimulatedFingerprint[] = "batonctl-simulate";
// Defaults when no model config is given: the small preset's block size and window.
constexpr int64_t kDefaultBlockSize = 64;
constexpr int64_t kDefaultWindow = 128;
constexpr int64_t kDefaultMaxBacktrack = 5;

struct SimulateOptions {
  std::string trace;
  std::string model_config;
  std::string block_sizes;
  std::string keeps = "0";
  std::string windows;
  std::string max_backtracks;
  std::string hit_caps = "ring";
  std::string store_budgets;
  int64_t max_requests = 0;
  int64_t token_budget = 512;
  double length_scale = 1.0;
  int64_t trace_block = kMooncakeTraceBlock;
  bool json = false;
  bool per_request = false;  // the cluster simulation's JSON lists each request (PlacedRequest)
  // The cluster simulation (cluster_sim.h), run when policies are given.
  std::string policies;
  int64_t prefill_nodes = 2;
  int64_t prefill_slots = 2;
  std::string prefill_sharing = "arrival-order";
  std::string block_cache_bytes = "0";
  std::string rates;
  double time_scale = 1.0;
  int64_t store_nodes = 1;
  int64_t store_replication = 1;
  int64_t decode_nodes = 0;
  int64_t decode_slots = 64;
  std::string decode_rates;
  decode_node::StepPolicy decode_step = ClusterOptions{}.decode_step;
  int64_t max_output_tokens = 0;
  double ttft_slo_ms = 0;
  double itl_slo_ms = 0;
};

struct Setting {
  int64_t block_size = 0;  // B
  int64_t keep = 0;        // K, resolved (0 on the command line means C)
  HitCap hit_cap = HitCap::kRing;
  std::optional<uint64_t> store_budget;  // bytes; nullopt: unlimited
  int64_t window = 0;                    // W
  int64_t max_backtrack = 0;
  int64_t ring_capacity() const { return RingCapacity(window, max_backtrack); }
};

// Sizes of the two values a block writes, as the store counts them (header included).
struct ValueSizes {
  uint64_t block_kv = 1;
  uint64_t producer_swa = 1;
};

// The prompts of the trace at one block size: lengths and chain keys of the full blocks.
struct Prompts {
  std::vector<int64_t> lengths;
  std::vector<std::vector<Sha256Digest>> chains;
};

struct SettingResult {
  int64_t requests = 0;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t cached_tokens_uncapped = 0;
  int64_t hit_requests = 0;
  uint64_t evicted_block_kv = 0;
  uint64_t evicted_producer_swa = 0;
  uint64_t stored_bytes_peak = 0;
  int64_t prefill_rows = 0;
  int64_t prefill_rows_no_cache = 0;
  int64_t prefill_rows_uncapped = 0;
  int64_t replayed_rows = 0;
  double flops = 0;
  double flops_no_cache = 0;
  double flops_uncapped = 0;
  double seconds = 0;
};

absl::Status FlagError(absl::string_view flag, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", what));
}

// A list of integers, each at least `min`.
absl::StatusOr<std::vector<int64_t>> ParseBoundedList(const std::string& text,
                                                      absl::string_view flag, int64_t min,
                                                      absl::string_view meaning) {
  absl::StatusOr<std::vector<int64_t>> values = ParseIntList(text, flag);
  if (!values.ok()) return values.status();
  for (int64_t v : *values) {
    if (v < min) {
      return FlagError(flag, absl::StrCat(v, " is not allowed; ", meaning, " must be >= ", min));
    }
  }
  return values;
}

absl::StatusOr<std::vector<HitCap>> ParseHitCaps(const std::string& text) {
  std::vector<HitCap> caps;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    const absl::string_view name = absl::StripAsciiWhitespace(item);
    absl::StatusOr<HitCap> cap = kvstore::ParseHitCap(name, "--hit-cap");
    if (!cap.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(cap.status().message(), " (a comma-separated list)"));
    }
    caps.push_back(*cap);
  }
  return caps;
}

// Every setting of the sweep, in the documented loop order; checks K >= C for each.
absl::StatusOr<std::vector<Setting>> BuildSettings(const SimulateOptions& o,
                                                   const ModelConfig* config) {
  const auto list_or = [](const std::string& text, int64_t fallback) {
    return text.empty() ? absl::StrCat(fallback) : text;
  };
  absl::StatusOr<std::vector<int64_t>> blocks =
      ParseBoundedList(list_or(o.block_sizes, config ? config->kv_block_size : kDefaultBlockSize),
                       "--block-size", 1, "a block size (tokens)");
  if (!blocks.ok()) return blocks.status();
  absl::StatusOr<std::vector<int64_t>> keeps =
      ParseBoundedList(o.keeps, "--keep", 0, "keep (0 means C)");
  if (!keeps.ok()) return keeps.status();
  absl::StatusOr<std::vector<HitCap>> caps = ParseHitCaps(o.hit_caps);
  if (!caps.ok()) return caps.status();
  std::vector<std::optional<uint64_t>> budgets = {std::nullopt};
  if (!o.store_budgets.empty()) {
    absl::StatusOr<std::vector<std::optional<uint64_t>>> parsed =
        ParseBudgets(o.store_budgets, "--store-budget");
    if (!parsed.ok()) return parsed.status();
    budgets = *std::move(parsed);
  }
  absl::StatusOr<std::vector<int64_t>> windows =
      ParseBoundedList(list_or(o.windows, config ? config->sliding_window : kDefaultWindow),
                       "--window", 1, "the window");
  if (!windows.ok()) return windows.status();
  absl::StatusOr<std::vector<int64_t>> backtracks = ParseBoundedList(
      list_or(o.max_backtracks, config ? config->max_backtrack : kDefaultMaxBacktrack),
      "--max-backtrack", 0, "max_backtrack");
  if (!backtracks.ok()) return backtracks.status();

  std::vector<Setting> settings;
  for (int64_t block : *blocks) {
    for (int64_t keep : *keeps) {
      for (HitCap cap : *caps) {
        for (const std::optional<uint64_t>& budget : budgets) {
          for (int64_t window : *windows) {
            for (int64_t backtrack : *backtracks) {
              Setting s{.block_size = block,
                        .keep = keep,
                        .hit_cap = cap,
                        .store_budget = budget,
                        .window = window,
                        .max_backtrack = backtrack};
              s.keep = EffectiveKeep(keep, s.ring_capacity());
              if (absl::Status st = CheckKeep(true, s.keep, s.ring_capacity(), "--keep");
                  !st.ok()) {
                return absl::InvalidArgumentError(absl::StrCat(st.message(), " (window ", window,
                                                               ", max_backtrack ", backtrack,
                                                               "; 0 means C)"));
              }
              settings.push_back(s);
            }
          }
        }
      }
    }
  }
  return settings;
}

Prompts MakePrompts(const std::vector<TraceRequest>& requests, const TokenOptions& tokens,
                    int64_t block_size) {
  Prompts prompts;
  prompts.lengths.reserve(requests.size());
  prompts.chains.reserve(requests.size());
  for (const TraceRequest& request : requests) {
    const std::vector<int32_t> prompt = TraceTokens(request, tokens);
    prompts.lengths.push_back(static_cast<int64_t>(prompt.size()));
    prompts.chains.push_back(kvstore::ChainKeys(kSimulatedFingerprint, "", "", prompt, block_size));
  }
  return prompts;
}

// Rows and FLOPs of one prefill with s_valid = H, in chunks of `token_budget` rows as the
// prefill node cuts [H, L) (0: one chunk).
model::WorkEstimate Estimate(const Setting& s, int64_t prompt_len, int64_t cached,
                             int64_t token_budget, const ModelConfig* config) {
  const model::TruncationSpec spec{.prompt_len = prompt_len,
                                   .keep = s.keep,
                                   .mode = model::TruncationMode::kCompact,
                                   .window = s.window,
                                   .max_backtrack = s.max_backtrack,
                                   .s_valid = cached};
  std::vector<int64_t> chunks = {prompt_len - cached};
  if (token_budget > 0) chunks = *model::EvenChunks(prompt_len - cached, token_budget);
  return model::EstimateWork(spec, chunks, config);
}

SettingResult RunSetting(const Setting& s, const Prompts& prompts, const ValueSizes& sizes,
                         int64_t token_budget, const ModelConfig* config) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t B = s.block_size;
  SettingResult r;
  kvstore::PrefixIndex index;
  const auto count_eviction = [&r](const Sha256Digest&, Region region, uint64_t) {
    ++(region == Region::kBlockKv ? r.evicted_block_kv : r.evicted_producer_swa);
  };
  // PrefixStore::Write: a present value is touched; a new one is added, then the budget holds.
  const auto write = [&](const Sha256Digest& key, const std::optional<Sha256Digest>& parent,
                         Region region, uint64_t bytes) {
    if (index.Contains(key, region)) {
      index.Touch(key);
      return;
    }
    index.Add(key, parent, region, bytes);
    if (s.store_budget.has_value()) index.EvictToBudget(*s.store_budget, count_eviction);
    r.stored_bytes_peak = std::max(r.stored_bytes_peak, index.stored_bytes());
  };

  for (size_t i = 0; i < prompts.lengths.size(); ++i) {
    const int64_t L = prompts.lengths[i];
    const std::vector<Sha256Digest>& keys = prompts.chains[i];
    // The router: lookup (touches) and the hit policy.
    const kvstore::ChainLookup lookup = index.Lookup(keys);
    kvstore::HitPolicyInput policy{.prompt_len = L,
                                   .keep = s.keep,
                                   .truncation_on = true,
                                   .ring_capacity = s.ring_capacity(),
                                   .window = s.window,
                                   .block_size = B,
                                   .cap = s.hit_cap};
    const int64_t h = kvstore::HitBlocks(policy, lookup);
    // Without the cap (producer SWA still qualifies the hit).
    policy.cap = HitCap::kNone;
    const int64_t h_uncapped = kvstore::HitBlocks(policy, lookup);

    // The prefill node: the store reads of the hit (each touches its block), then the
    // write-back of the full blocks it computed, by the same functions the node uses.
    const kvstore::HitReads reads = kvstore::ReadsForHit(h, s.window, B);
    for (int64_t b = 0; b < reads.block_kv_end; ++b) index.Touch(keys[b]);
    for (int64_t b = reads.producer_swa_begin; b < reads.producer_swa_end; ++b) {
      index.Touch(keys[b]);
    }
    for (const kvstore::WriteBackStep& step :
         kvstore::WriteBackSteps(h, static_cast<int64_t>(keys.size()))) {
      const std::optional<Sha256Digest> parent =
          step.parent >= 0 ? std::optional<Sha256Digest>(keys[step.parent]) : std::nullopt;
      write(keys[step.block], parent, step.region,
            step.region == Region::kBlockKv ? sizes.block_kv : sizes.producer_swa);
    }

    const model::WorkEstimate with_cache = Estimate(s, L, h * B, token_budget, config);
    const model::WorkEstimate no_cache = Estimate(s, L, 0, token_budget, config);
    const model::WorkEstimate uncapped = Estimate(s, L, h_uncapped * B, token_budget, config);
    ++r.requests;
    r.prompt_tokens += L;
    r.cached_tokens += h * B;
    r.cached_tokens_uncapped += h_uncapped * B;
    if (h > 0) ++r.hit_requests;
    r.prefill_rows += with_cache.full_rows;
    r.prefill_rows_no_cache += no_cache.full_rows;
    r.prefill_rows_uncapped += uncapped.full_rows;
    r.replayed_rows += with_cache.consumer_rows;
    if (config != nullptr) {
      r.flops += with_cache.flops->total();
      r.flops_no_cache += no_cache.flops->total();
      r.flops_uncapped += uncapped.flops->total();
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

ValueSizes SizesFor(const ModelConfig& config, int64_t block_size) {
  // Block KV payload: one page of B positions (prefill_service.cc page_bytes); producer SWA
  // payload: P layers x (K, V) x B rows x kv_dim; both as float32, plus the value header.
  model::StateLayout layout = model::StateLayout::For(config);
  layout.block_size = block_size;
  const uint64_t page_bytes = sizeof(float) * layout.page_floats();
  const uint64_t swa_bytes =
      sizeof(float) * layout.producer_layers * 2 * block_size * layout.kv_dim;
  return {.block_kv = kvstore::StoredValueBytes(page_bytes),
          .producer_swa = kvstore::StoredValueBytes(swa_bytes)};
}

double Ratio(double numerator, double denominator) {
  return denominator > 0 ? numerator / denominator : 0.0;
}

nlohmann::json ResultToJson(const Setting& s, const SettingResult& r, bool with_config) {
  const auto null_or = [with_config](auto value) {
    return with_config ? nlohmann::json(value) : nlohmann::json(nullptr);
  };
  return {
      {"block_size", s.block_size},
      {"keep", s.keep},
      {"window", s.window},
      {"max_backtrack", s.max_backtrack},
      {"ring_capacity", s.ring_capacity()},
      {"hit_cap", HitCapName(s.hit_cap)},
      {"store_budget", s.store_budget ? nlohmann::json(*s.store_budget) : nlohmann::json(nullptr)},
      {"requests", r.requests},
      {"prompt_tokens", r.prompt_tokens},
      {"cached_tokens", r.cached_tokens},
      {"cached_tokens_uncapped", r.cached_tokens_uncapped},
      {"token_hit_ratio", Ratio(r.cached_tokens, r.prompt_tokens)},
      {"request_hit_ratio", Ratio(r.hit_requests, r.requests)},
      {"evicted_blocks", r.evicted_block_kv + r.evicted_producer_swa},
      {"evicted_block_kv", r.evicted_block_kv},
      {"evicted_producer_swa", r.evicted_producer_swa},
      {"stored_bytes_peak", null_or(r.stored_bytes_peak)},
      {"prefill_rows", r.prefill_rows},
      {"prefill_rows_no_cache", r.prefill_rows_no_cache},
      {"prefill_rows_uncapped", r.prefill_rows_uncapped},
      {"replayed_rows", r.replayed_rows},
      {"flops", null_or(r.flops)},
      {"flops_no_cache", null_or(r.flops_no_cache)},
      {"flops_uncapped", null_or(r.flops_uncapped)},
      {"flops_vs_no_cache", null_or(Ratio(r.flops, r.flops_no_cache))},
      {"flops_vs_uncapped", null_or(Ratio(r.flops, r.flops_uncapped))},
  };
}

// Bytes in the largest binary unit that keeps the number >= 1.
std::string HumanBytes(uint64_t bytes) {
  const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrCat(bytes, "B") : absl::StrFormat("%.2f%s", value, units[unit]);
}

void PrintTable(const std::vector<std::pair<Setting, SettingResult>>& rows, bool with_config) {
  std::cout << absl::StrFormat(
      "%6s %6s %6s %9s %7s %12s %8s %9s %9s %9s %11s %14s %14s %10s %10s %7s\n", "block", "keep",
      "window", "backtrack", "hit_cap", "budget", "requests", "token_hit", "req_hit", "evicted",
      "peak", "prefill_rows", "replayed_rows", "flops/cold", "flops/unc", "time_s");
  for (const auto& [s, r] : rows) {
    const std::string peak = with_config ? HumanBytes(r.stored_bytes_peak) : "-";
    const std::string vs_cold =
        with_config ? absl::StrFormat("%.4f", Ratio(r.flops, r.flops_no_cache)) : "-";
    const std::string vs_uncapped =
        with_config ? absl::StrFormat("%.4f", Ratio(r.flops, r.flops_uncapped)) : "-";
    std::cout << absl::StrFormat(
        "%6d %6d %6d %9d %7s %12s %8d %9.4f %9.4f %9d %11s %14d %14d %10s %10s %7.2f\n",
        s.block_size, s.keep, s.window, s.max_backtrack, std::string(HitCapName(s.hit_cap)).c_str(),
        s.store_budget ? HumanBytes(*s.store_budget) : "unlimited", r.requests,
        Ratio(r.cached_tokens, r.prompt_tokens), Ratio(r.hit_requests, r.requests),
        r.evicted_block_kv + r.evicted_producer_swa, peak, r.prefill_rows, r.replayed_rows, vs_cold,
        vs_uncapped, r.seconds);
  }
}

// p50, p90, p99 and mean, as `batonctl replay` reports its measured ones.
nlohmann::json Percentiles(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return {{"p50", NearestRank(values, 50)},
          {"p90", NearestRank(values, 90)},
          {"p99", NearestRank(values, 99)},
          {"mean", values.empty() ? 0 : sum / static_cast<double>(values.size())}};
}

// The share of requests that met the SLOs given (TTFT, and with decode the request's mean
// token gap), and the requests per second that did; null when no SLO was given.
nlohmann::json Goodput(const ClusterResult& r, const SimulateOptions& o) {
  if (o.ttft_slo_ms <= 0 && o.itl_slo_ms <= 0) return nullptr;
  int64_t met = 0;
  std::vector<bool> itl_ok(r.ttft_ms.size(), true);
  for (size_t i = 0; i < r.tpot_ms.size() && o.itl_slo_ms > 0; ++i) {
    itl_ok[i] = r.tpot_ms[i] <= o.itl_slo_ms;  // -1 for a request of one token
  }
  for (size_t i = 0; i < r.ttft_ms.size(); ++i) {
    if ((o.ttft_slo_ms <= 0 || r.ttft_ms[i] <= o.ttft_slo_ms) && itl_ok[i]) ++met;
  }
  const double share = Ratio(static_cast<double>(met), static_cast<double>(r.ttft_ms.size()));
  return {{"ttft_slo_ms", o.ttft_slo_ms},
          {"itl_slo_ms", o.itl_slo_ms},
          {"requests_met", met},
          {"share", share},
          {"requests_per_s",
           r.makespan_ms > 0 ? static_cast<double>(met) / (r.makespan_ms / 1000) : 0}};
}

// Each store node's operations per second over the run (its makespan), and the busiest node's
// of each, so that an SRE sees what one store pod must serve.
nlohmann::json StoreJson(const ClusterResult& r, int64_t replication) {
  const double seconds = r.makespan_ms / 1000;
  const auto per_s = [seconds](double count) { return seconds > 0 ? count / seconds : 0.0; };
  constexpr double kMiB = 1024.0 * 1024.0;
  nlohmann::json nodes = nlohmann::json::array();
  nlohmann::json busiest = {{"lookups_per_s", 0.0},   {"probe_keys_per_s", 0.0},
                            {"reads_per_s", 0.0},     {"read_mib_per_s", 0.0},
                            {"writes_per_s", 0.0},    {"write_mib_per_s", 0.0},
                            {"operations_per_s", 0.0}};
  for (size_t n = 0; n < r.store_ops.size(); ++n) {
    const StoreNodeOps& ops = r.store_ops[n];
    const nlohmann::json node = {
        {"node", r.store_ids[n]},
        {"lookups_per_s", per_s(static_cast<double>(ops.lookups))},
        {"probe_keys_per_s", per_s(static_cast<double>(ops.probe_keys))},
        {"reads_per_s", per_s(static_cast<double>(ops.reads))},
        {"read_mib_per_s", per_s(static_cast<double>(ops.read_bytes) / kMiB)},
        {"writes_per_s", per_s(static_cast<double>(ops.writes))},
        {"write_mib_per_s", per_s(static_cast<double>(ops.write_bytes) / kMiB)},
        {"operations_per_s", per_s(static_cast<double>(ops.lookups + ops.reads + ops.writes))}};
    for (auto& [key, value] : busiest.items()) {
      value = std::max(value.get<double>(), node[key].get<double>());
    }
    nodes.push_back(node);
  }
  return {{"nodes", static_cast<int64_t>(r.store_ops.size())},
          {"replication", replication},
          {"per_node", std::move(nodes)},
          {"busiest", std::move(busiest)}};
}

// `batonctl simulate --policy ...`: every setting x cache budget x policy through the cluster
// simulation, one row each.
// The cluster flags' numbers, each in its range.
absl::Status CheckClusterFlags(const SimulateOptions& o) {
  if (o.prefill_nodes < 1 || o.prefill_nodes > 1024) {
    return FlagError("--prefill-nodes", absl::StrCat(o.prefill_nodes, " must lie in [1, 1024]"));
  }
  if (o.prefill_slots < 1 || o.prefill_slots > 1024) {
    return FlagError("--prefill-slots", absl::StrCat(o.prefill_slots, " must lie in [1, 1024]"));
  }
  if (o.store_nodes < 1 || o.store_nodes > static_cast<int64_t>(kvstore::kMaxStoreNodes)) {
    return FlagError("--store-nodes", absl::StrCat(o.store_nodes, " must lie in [1, ",
                                                   kvstore::kMaxStoreNodes, "]"));
  }
  if (o.store_replication < 1 || o.store_replication > o.store_nodes) {
    return FlagError(
        "--store-replication",
        absl::StrCat(o.store_replication, " must lie in [1, --store-nodes ", o.store_nodes, "]"));
  }
  if (o.decode_nodes < 0 || o.decode_nodes > 1024) {
    return FlagError("--decode-nodes", absl::StrCat(o.decode_nodes,
                                                    " must lie in [0, 1024] (0: decode "
                                                    "is not modelled)"));
  }
  if (o.decode_slots < 1 || o.decode_slots > 65536) {
    return FlagError("--decode-slots", absl::StrCat(o.decode_slots, " must lie in [1, 65536]"));
  }
  if (o.max_output_tokens < 0) {
    return FlagError("--max-output-tokens",
                     absl::StrCat(o.max_output_tokens, " must be >= 0 (0: the trace's)"));
  }
  for (const auto& [flag, value] :
       {std::pair{"--ttft-slo-ms", o.ttft_slo_ms}, std::pair{"--itl-slo-ms", o.itl_slo_ms}}) {
    if (!(value >= 0) || !std::isfinite(value)) {
      return FlagError(flag, "must be finite and >= 0 (0: none)");
    }
  }
  if (!(o.time_scale >= 0) || !std::isfinite(o.time_scale)) {
    return FlagError("--time-scale", "must be finite and >= 0");
  }
  return absl::OkStatus();
}

// One simulation's result row: the setting, the policy and cache it ran with, and what it
// predicted (TTFT, with decode ITL, TPOT, end-to-end and the decode nodes' load, goodput).
nlohmann::json ClusterRow(const ClusterResult& r, const SimulateOptions& o, const Setting& s,
                          RoutePolicy policy, const std::optional<uint64_t>& cache,
                          const DecodeRates& decode_rates) {
  nlohmann::json row = {
      {"itl_ms", nullptr}, {"tpot_ms", nullptr}, {"e2e_ms", nullptr}, {"decode", nullptr}};
  if (o.decode_nodes > 0) {
    row["itl_ms"] = {{"p50", r.itl.Percentile(50)},
                     {"p90", r.itl.Percentile(90)},
                     {"p99", r.itl.Percentile(99)},
                     {"mean", r.itl.Mean()}};
    std::vector<double> tpot;  // of the requests of more than one token
    for (double t : r.tpot_ms) {
      if (t >= 0) tpot.push_back(t);
    }
    row["tpot_ms"] = Percentiles(tpot);
    row["e2e_ms"] = Percentiles(r.e2e_ms);
    nlohmann::json busy = nlohmann::json::array();
    for (double ms : r.decode_busy_ms) busy.push_back(Ratio(ms, r.makespan_ms));
    row["decode"] = {{"nodes", o.decode_nodes},
                     {"slots", o.decode_slots},
                     {"max_batch", o.decode_step.max_batch},
                     {"replay", !(decode_rates.replay_ms_per_gflop > 0) ? "none"
                                : decode_rates.replays_in_steps()       ? "steps"
                                                                        : "delay"},
                     {"replay_rows_per_step", o.decode_step.replay_rows},
                     {"replay_step_budget", o.decode_step.replay_step_budget},
                     {"busy_fraction", std::move(busy)},
                     {"requests_per_node", r.requests_per_decode_node}};
  }
  row["goodput"] = Goodput(r, o);
  nlohmann::json result = {
      {"policy", kvstore::RoutingPolicyName(policy)},
      {"prefill_nodes", o.prefill_nodes},
      {"prefill_sharing", o.prefill_sharing},
      {"block_cache_bytes", cache.value_or(0)},
      {"store_budget",
       s.store_budget.has_value() ? nlohmann::json(*s.store_budget) : nlohmann::json(nullptr)},
      {"block_size", s.block_size},
      {"keep", s.keep},
      {"hit_cap", std::string(kvstore::HitCapName(s.hit_cap))},
      {"requests", static_cast<int64_t>(r.ttft_ms.size())},
      {"prompt_tokens", r.prompt_tokens},
      {"local_cached_tokens", r.local_hit_tokens},
      {"store_cached_tokens", r.store_hit_tokens},
      {"requests_per_node", r.requests_per_node},
      {"ttft_ms", Percentiles(r.ttft_ms)},
      {"store", StoreJson(r, o.store_replication)},
      {"makespan_ms", r.makespan_ms},
      {"requests_per_s",
       r.makespan_ms > 0 ? static_cast<double>(r.ttft_ms.size()) / (r.makespan_ms / 1000) : 0}};
  result.update(row);
  if (!r.placed.empty()) {
    nlohmann::json per_request = nlohmann::json::array();
    for (size_t i = 0; i < r.placed.size(); ++i) {
      const PlacedRequest& p = r.placed[i];
      per_request.push_back(
          {{"index", i},
           {"node", p.node},
           {"cached_tokens", p.cached_tokens},
           {"local_cached_tokens", p.local_cached_tokens},
           {"admitted_ms", p.admitted_ms},
           {"queue_ms", p.queue_ms},
           {"service_ms", p.service_ms},
           {"ttft_ms", r.stopped ? nlohmann::json(nullptr) : nlohmann::json(r.ttft_ms[i])}});
    }
    result["per_request"] = std::move(per_request);
  }
  return result;
}

// The results as a table, one row each.
void PrintClusterTable(const nlohmann::json& results) {
  std::cout << absl::StrFormat(
      "%-15s %6s %12s %10s %10s %10s %10s %9s %9s %12s %12s %8s %14s %14s %14s\n", "policy",
      "nodes", "cache", "ttft_p50", "ttft_p90", "ttft_p99", "ttft_mean", "itl_p50", "itl_p99",
      "local_tok", "store_tok", "req/s", "store_lookup/s", "store_read/s", "store_write/s");
  for (const nlohmann::json& row : results) {
    // The busiest store node's rates (the store's JSON has every node's); ITL with decode.
    const nlohmann::json& busiest = row["store"]["busiest"];
    const auto itl = [&](const char* q) {
      return row["itl_ms"].is_null() ? std::string("-")
                                     : absl::StrFormat("%.1f", row["itl_ms"][q].get<double>());
    };
    std::cout << absl::StrFormat(
        "%-15s %6d %12s %10.1f %10.1f %10.1f %10.1f %9s %9s %12d %12d %8.2f %14.1f %14.1f "
        "%14.1f\n",
        row["policy"].get<std::string>(), row["prefill_nodes"].get<int64_t>(),
        HumanBytes(row["block_cache_bytes"].get<uint64_t>()), row["ttft_ms"]["p50"].get<double>(),
        row["ttft_ms"]["p90"].get<double>(), row["ttft_ms"]["p99"].get<double>(),
        row["ttft_ms"]["mean"].get<double>(), itl("p50"), itl("p99"),
        row["local_cached_tokens"].get<int64_t>(), row["store_cached_tokens"].get<int64_t>(),
        row["requests_per_s"].get<double>(), busiest["lookups_per_s"].get<double>(),
        busiest["reads_per_s"].get<double>(), busiest["writes_per_s"].get<double>());
  }
}

int RunCluster(const SimulateOptions& o, const std::vector<Setting>& settings,
               const std::vector<TraceRequest>& requests, const TokenOptions& tokens,
               const ModelConfig& config) {
  absl::StatusOr<std::vector<RoutePolicy>> policies = ParseRoutePolicies(o.policies);
  if (!policies.ok()) return ReportError("simulate", policies.status());
  std::string rates_text = o.rates, decode_text = o.decode_rates;
  if (absl::Status s = ResolveRatesFile(rates_text, decode_text); !s.ok()) {
    return ReportError("simulate", s);
  }
  absl::StatusOr<kvstore::PrefillRates> rates = ParseRates(rates_text);
  if (!rates.ok()) return ReportError("simulate", rates.status());
  absl::StatusOr<std::vector<std::optional<uint64_t>>> caches =
      ParseBudgets(o.block_cache_bytes, "--block-cache-bytes");
  if (!caches.ok()) return ReportError("simulate", caches.status());
  if (absl::Status s = CheckClusterFlags(o); !s.ok()) return ReportError("simulate", s);
  absl::StatusOr<DecodeRates> decode_rates = ParseDecodeRates(decode_text);
  if (!decode_rates.ok()) return ReportError("simulate", decode_rates.status());
  absl::StatusOr<PrefillSharing> sharing = ParsePrefillSharing(o.prefill_sharing);
  if (!sharing.ok()) return ReportError("simulate", sharing.status());
  nlohmann::json results = nlohmann::json::array();
  for (const Setting& s : settings) {
    const std::vector<ClusterRequest> cluster =
        ClusterRequestsFromTrace(requests, tokens, s.block_size, o.time_scale, o.max_output_tokens);
    ModelConfig sized = config;
    sized.kv_block_size = s.block_size;
    for (const std::optional<uint64_t>& cache : *caches) {
      for (RoutePolicy policy : *policies) {
        const ClusterOptions options{.policy = policy,
                                     .prefill_nodes = o.prefill_nodes,
                                     .slots = o.prefill_slots,
                                     .sharing = *sharing,
                                     .block_cache_bytes = cache.value_or(0),
                                     .store_budget = s.store_budget,
                                     .hit = {.keep = s.keep,
                                             .truncation_on = true,
                                             .ring_capacity = s.ring_capacity(),
                                             .window = s.window,
                                             .block_size = s.block_size,
                                             .cap = s.hit_cap},
                                     .payload = kvstore::BlockPayloadBytes(sized),
                                     .config = sized,
                                     .rates = *rates,
                                     .record_requests = o.per_request,
                                     .store_nodes = o.store_nodes,
                                     .store_replication = o.store_replication,
                                     .decode_nodes = o.decode_nodes,
                                     .decode_slots = o.decode_slots,
                                     .decode = *decode_rates,
                                     .decode_step = o.decode_step,
                                     .itl_samples = false};
        const ClusterResult r = SimulateCluster(cluster, options);
        results.push_back(ClusterRow(r, o, s, policy, cache, *decode_rates));
      }
    }
  }
  if (o.json) {
    std::cout << nlohmann::json{{"kind", "simulate-cluster"},
                                {"rates",
                                 {{"compute_ms_per_gflop", rates->compute_ms_per_gflop},
                                  {"local_ms_per_mib", rates->local_ms_per_mib},
                                  {"store_ms_per_mib", rates->store_ms_per_mib},
                                  {"fixed_ms", rates->fixed_ms}}},
                                {"results", std::move(results)}}
                     .dump()
              << "\n";
    return kExitOk;
  }
  PrintClusterTable(results);
  return kExitOk;
}

// The trace flags' numbers, each in its range.
absl::Status CheckTraceFlags(const SimulateOptions& o) {
  if (o.max_requests < 0) {
    return FlagError("--max-requests", absl::StrCat(o.max_requests,
                                                    " is not allowed; it must be >= 0 "
                                                    "(0: the whole trace)"));
  }
  if (o.token_budget < 0) {
    return FlagError("--token-budget", absl::StrCat(o.token_budget,
                                                    " is not allowed; it must be >= 0 "
                                                    "(0: one chunk per prompt)"));
  }
  if (o.trace_block < 1 || o.trace_block > kMaxTraceBlock) {
    return FlagError(
        "--trace-block",
        absl::StrCat(o.trace_block, " is not allowed; it must lie in [1, ", kMaxTraceBlock, "]"));
  }
  if (!(o.length_scale > 0 && o.length_scale <= kMaxLengthScale)) {
    return FlagError(
        "--length-scale",
        absl::StrCat(o.length_scale, " is not allowed; it must lie in (0, ", kMaxLengthScale, "]"));
  }
  return absl::OkStatus();
}

int RunSimulate(const SimulateOptions& o) {
  std::optional<ModelConfig> config;
  if (!o.model_config.empty()) {
    absl::StatusOr<ModelConfig> loaded = LoadModelConfig(o.model_config);
    if (!loaded.ok()) {
      return ReportError("simulate",
                         absl::Status(loaded.status().code(),
                                      absl::StrCat("--model-config: ", loaded.status().message())));
    }
    config = *loaded;
  } else if (!o.store_budgets.empty()) {
    return ReportError("simulate",
                       FlagError("--store-budget",
                                 "needs --model-config (the value sizes, hence the "
                                 "bytes a budget holds, come from the model's shapes)"));
  }
  const ModelConfig* config_ptr = config ? &*config : nullptr;
  if (absl::Status s = CheckTraceFlags(o); !s.ok()) return ReportError("simulate", s);
  const TokenOptions tokens{.trace_block = o.trace_block,
                            .length_scale = o.length_scale,
                            .vocab_size = config ? config->vocab_size : TokenOptions{}.vocab_size};
  if (absl::Status s = ValidateTokenOptions(tokens); !s.ok()) {
    return ReportError("simulate", FlagError("--model-config", s.message()));
  }
  absl::StatusOr<std::vector<Setting>> settings = BuildSettings(o, config_ptr);
  if (!settings.ok()) return ReportError("simulate", settings.status());
  absl::StatusOr<std::vector<TraceRequest>> requests = LoadTrace(o.trace, o.trace_block);
  if (!requests.ok()) {
    return ReportError("simulate",
                       absl::Status(requests.status().code(),
                                    absl::StrCat("--trace: ", requests.status().message())));
  }
  if (o.max_requests > 0 && static_cast<size_t>(o.max_requests) < requests->size()) {
    requests->resize(static_cast<size_t>(o.max_requests));
  }
  if (!o.policies.empty()) {
    if (!config.has_value()) {
      return ReportError("simulate", FlagError("--policy",
                                               "needs --model-config (block sizes, hence load "
                                               "times, come from the model's shapes)"));
    }
    return RunCluster(o, *settings, *requests, tokens, *config);
  }

  std::vector<std::pair<Setting, SettingResult>> rows;
  std::optional<Prompts> prompts;
  int64_t prompts_block = 0;
  for (const Setting& s : *settings) {
    // Settings come grouped by block size (the outer loop): chain keys are made once per size.
    if (!prompts.has_value() || prompts_block != s.block_size) {
      prompts = MakePrompts(*requests, tokens, s.block_size);
      prompts_block = s.block_size;
    }
    const ValueSizes sizes = config ? SizesFor(*config, s.block_size) : ValueSizes{};
    rows.emplace_back(s, RunSetting(s, *prompts, sizes, o.token_budget, config_ptr));
  }

  if (o.json) {
    nlohmann::json results = nlohmann::json::array();
    for (const auto& [s, r] : rows) results.push_back(ResultToJson(s, r, config.has_value()));
    std::cout << nlohmann::json{{"kind", "simulate"}, {"results", std::move(results)}}.dump()
              << "\n";
  } else {
    PrintTable(rows, config.has_value());
  }
  return kExitOk;
}

}  // namespace

namespace {

// The flags of a simulated cluster (--policy and what it needs).
void AddClusterFlags(CLI::App* command, SimulateOptions* o) {
  command->add_option("--policy", o->policies,
                      "Simulate a cluster instead: its routing policies, comma-separated "
                      "(least-loaded, longest-prefix, predicted-ttft); needs --model-config");
  command->add_option("--prefill-nodes", o->prefill_nodes,
                      "Prefill nodes of the simulated cluster (default 2)");
  command->add_option("--prefill-slots", o->prefill_slots,
                      "Prefills in flight per node, as the router's --prefill-slots (default 2)");
  command->add_option("--prefill-sharing", o->prefill_sharing,
                      "How a node computes its prefills in flight: arrival-order (one at a time "
                      "on all its cores, as baton-prefill does; the default) or shared (all at "
                      "once, each at an equal share of the node)");
  command->add_option("--block-cache-bytes", o->block_cache_bytes,
                      "Each prefill node's local block cache, as baton-prefill's; sizes as "
                      "--store-budget, comma-separated (default 0: none)");
  command->add_option("--rates", o->rates,
                      "The nodes' rates in ms, name=value comma-separated (compute_ms_per_gflop, "
                      "local_ms_per_mib, store_ms_per_mib, fixed_ms), e.g. "
                      "from a run's baton_prefill_rate_ms; the rest take the router's priors. Or a "
                      "FILE holding `batonctl rates --addr ROUTER` output: its rates, and its "
                      "decode rates unless --decode-rates is given");
  command->add_option("--store-nodes", o->store_nodes,
                      "Store nodes of the simulated cluster, as baton up's --kvstore-nodes "
                      "(default 1); the results give each one's operations per second");
  command->add_option("--store-replication", o->store_replication,
                      "Owners of each stored value, as the router's --kvstore-replication "
                      "(default 1; at most --store-nodes)");
  command->add_option("--decode-nodes", o->decode_nodes,
                      "Decode nodes of the simulated cluster (default 0: decode not modelled); "
                      "the results then give ITL, TPOT and end-to-end percentiles");
  command->add_option("--decode-slots", o->decode_slots,
                      "Requests a decode node holds at once, as baton-decode's --slots "
                      "(default 64)");
  command->add_option("--decode-rates", o->decode_rates,
                      "A decode node's costs, name=value comma-separated: step_fixed_ms, "
                      "step_per_row_ms (baton_decode_step_cost_ms), tokens_per_step (>= 1), "
                      "default 20, 1, 1; replay_ms_per_gflop > 0 replays on decode at that rate "
                      "(default 0: prefill-all), in the decode steps with replay_piece_fixed_ms "
                      "and replay_piece_row_ms (baton_decode_replay_piece_cost_ms), else as a "
                      "delay; step_stretch (baton_decode_step_stretch) multiplies each step, "
                      "or step_stretch_p10, _p50, _p90 and _p99 together "
                      "(baton_decode_step_stretch_quantile) give each step a factor drawn "
                      "from them. "
                      "`batonctl rates --addr ROUTER` gives a running cluster's");
  AddDecodeStepFlags(*command, o->decode_step);
  command->add_option("--max-output-tokens", o->max_output_tokens,
                      "Cap each request's completion tokens, as `batonctl replay` does "
                      "(default 0: the trace's)");
  command->add_option("--ttft-slo-ms", o->ttft_slo_ms,
                      "A TTFT target: the results give the share of requests that met it "
                      "(goodput; default 0: none)");
  command->add_option("--itl-slo-ms", o->itl_slo_ms,
                      "A target for each request's mean token gap (TPOT), with --decode-nodes "
                      "(default 0: none)");
  command->add_option("--time-scale", o->time_scale,
                      "Arrivals at the trace's timestamps times this, as `batonctl replay` sends "
                      "them (default 1)");
}

}  // namespace

Command AddSimulateCommand(CLI::App& app) {
  auto o = std::make_shared<SimulateOptions>();
  CLI::App* command = app.add_subcommand(
      "simulate", "Run a workload trace through the prefix store and hit policy (no model)");
  command->add_option("--trace", o->trace, "Mooncake-style JSONL trace")->required();
  command->add_option("--model-config", o->model_config,
                      "config.json: value sizes (store budgets, bytes) and FLOPs; its block "
                      "size, window and max_backtrack become the defaults");
  command->add_option("--block-size", o->block_sizes,
                      "Block sizes B, comma-separated (default: the config's, else 64)");
  command->add_option("--keep", o->keeps, "Keeps K >= C, comma-separated; 0 means C (default 0)");
  command->add_option("--window", o->windows,
                      "SWA windows W, comma-separated (default: the config's, else 128)");
  command->add_option("--max-backtrack", o->max_backtracks,
                      "C = W + max_backtrack + 1, comma-separated (default: the config's, else 5)");
  command->add_option("--hit-cap", o->hit_caps,
                      "Hit caps: ring (floor((L - C) / B) blocks) and/or keep (floor((L - K) / "
                      "B)), comma-separated (default ring)");
  command->add_option("--store-budget", o->store_budgets,
                      "Store budgets in bytes (units K/M/G/T, KiB..TiB, KB..TB; unlimited or 0: "
                      "none), comma-separated; needs --model-config (default unlimited)");
  command->add_option("--max-requests", o->max_requests,
                      "Only the first N requests of the trace (default 0: all)");
  command->add_option("--token-budget", o->token_budget,
                      "Rows per prefill chunk for the work estimate, as baton-prefill's "
                      "--token-budget (default 512; 0: one chunk)");
  command->add_option("--length-scale", o->length_scale,
                      "Scale prompt lengths and tokens per hash id (default 1)");
  command->add_option("--trace-block", o->trace_block,
                      "Tokens per hash id in the trace (default 512, Mooncake's)");
  command->add_flag("--json", o->json, "Print one JSON object {\"kind\", \"results\": [...]}");
  command->add_flag("--per-request", o->per_request,
                    "With --policy and --json: each result lists its requests in trace order "
                    "(\"per_request\": node, cached tokens, admission wait, queue, service, TTFT), "
                    "as batonctl replay --json lists what each measured");
  AddClusterFlags(command, o.get());
  return {command, [o] { return RunSimulate(*o); }};
}

void AddDecodeStepFlags(CLI::App& command, decode_node::StepPolicy& policy) {
  command
      .add_option("--decode-max-batch", policy.max_batch,
                  "Requests per decode step, as baton-decode's --max-batch (default 64)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  command
      .add_option("--replay-rows-per-step", policy.replay_rows,
                  "Replay in the decode steps: boundary rows a step replays beside decoding "
                  "streams, as baton-decode's flag (default 8; up to 512 with none decoding)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  command
      .add_option("--replay-step-budget", policy.replay_step_budget,
                  "Replay in the decode steps: the share of the streams' step time a step's "
                  "replay rows may add, as baton-decode's flag (default 1; 0: the row bound "
                  "alone)")
      ->check(CLI::Range(0.0, 100.0));
}

}  // namespace baton::tools
