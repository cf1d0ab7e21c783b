#include "cluster_sim.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <numeric>
#include <optional>
#include <queue>
#include <set>
#include <span>
#include <tuple>
#include <unordered_map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "baton/common/checksum.h"
#include "baton/kvstore/chain.h"
#include "baton/kvstore/fleet.h"
#include "baton/kvstore/placement.h"
#include "baton/kvstore/prefix_index.h"
#include "baton/kvstore/stored_value.h"
#include "decode_sim.h"
#include "nlohmann/json.hpp"

namespace baton::tools {
namespace {

using kvstore::Region;

struct Node {
  kvstore::PrefixIndex cache;
  uint64_t read_turn = 0;  // which owner its next store read starts from
  kvstore::OwnPrefills prefills;  // in flight, as the router prices them
  double busy_until = 0;  // one computes at a time (PrefillSharing::kArrivalOrder)
  // PrefillSharing::kShared: each prefill in flight and the service it has left at the node's
  // whole speed, as of `shared_at`; `version` names the node's one end event that still holds.
  std::vector<std::pair<size_t, double>> sharing;
  double shared_at = 0;
  uint64_t version = 0;
};

// The prefill nodes with a free slot, in the orders a placement can need them, so that one
// over a thousand nodes looks at a few and chooses as it would over all (PlacePrefill: the
// first in load order, fewest prefills then index, of the least rank; the runner-up likewise
// among the others). Every node whose cache lacks a request's first block has no local hit and
// the same rates (ClusterOptions::rates), so among those the rank is 0 (least-loaded), -0
// (longest-prefix) or a non-decreasing function of the node's queue (predicted-ttft: a sum
// with it), and ties fall to load order. So besides the nodes that hold the first block, the
// choice and runner-up lie among: the first two others in load order; and for predicted-ttft,
// in queue order, the first two of each queue until two are taken and every queue of the last
// one's rank is in (Candidates). The first in load order is always among them, as
// PlacePrefill's order needs.
//
// A node's queue at time t is max(0, busy_until - t) (kvstore::OwnPrefills), so the nodes
// still busy keep their order by busy_until as time passes; those whose busy_until has passed
// share queue 0 and are kept apart, in load order (Advance moves them there).
class OpenNodes {
 public:
  explicit OpenNodes(size_t nodes) : keys_(nodes) {}
  // Node `n` now has `prefilling` prefills whose work is predicted to run out at
  // `busy_until_ms`; the time is `now`.
  void Update(size_t n, int64_t prefilling, double busy_until_ms, bool open, double now) {
    if (keys_[n].has_value()) {
      const auto [busy_until, held, index] = *keys_[n];
      if (!by_queue_.erase(*keys_[n])) idle_.erase({held, n});
      by_load_.erase({held, n});
      keys_[n].reset();
    }
    if (!open) return;
    keys_[n] = Key{busy_until_ms, prefilling, n};
    if (busy_until_ms > now) {
      by_queue_.insert(*keys_[n]);
    } else {
      idle_.insert({prefilling, n});
    }
    by_load_.insert({prefilling, n});
  }
  // The time is `now` (it never goes back): the nodes whose work has run out have queue 0.
  void Advance(double now) {
    while (!by_queue_.empty() && std::get<0>(*by_queue_.begin()) <= now) {
      const auto [busy_until, prefilling, n] = *by_queue_.begin();
      by_queue_.erase(by_queue_.begin());
      idle_.insert({prefilling, n});
    }
  }
  bool empty() const { return by_load_.empty(); }
  // The candidates in index order at time `now` (after Advance(now)): `holders` (open ones
  // whose cache holds the first block), and the others above; `rank(queue_ms)` is a
  // non-holder's rank under predicted-ttft.
  template <typename Rank>
  void Candidates(const std::vector<size_t>& holders, bool by_queue, const Rank& rank, double now,
                  std::vector<size_t>& out) const {
    out = holders;
    auto held = [&](size_t n) {
      return std::find(holders.begin(), holders.end(), n) != holders.end();
    };
    int need = by_queue ? 1 : 2;
    for (const auto& [prefilling, n] : by_load_) {
      if (held(n)) continue;
      out.push_back(n);
      if (--need == 0) break;
    }
    if (by_queue) {
      // Of the nodes with one queue, in load order here, the first two are all that can be
      // chosen or runner-up: the rest of them are skipped at once. Queue 0 first.
      size_t taken = 0;
      double last = 0;
      for (const auto& [prefilling, n] : idle_) {
        if (held(n)) continue;
        out.push_back(n);
        if (++taken == 2) break;
      }
      if (taken > 0) last = rank(0.0);
      for (auto it = by_queue_.begin(); it != by_queue_.end();) {
        const double busy_until = std::get<0>(*it);
        const double r = rank(std::max(0.0, busy_until - now));
        if (taken >= 2 && r != last) break;
        int of_queue = 0;
        for (; it != by_queue_.end() && std::get<0>(*it) == busy_until && of_queue < 2; ++it) {
          if (held(std::get<2>(*it))) continue;
          out.push_back(std::get<2>(*it));
          ++of_queue;
        }
        taken += static_cast<size_t>(of_queue);
        if (of_queue > 0) last = r;
        it = by_queue_.upper_bound(Key{busy_until, std::numeric_limits<int64_t>::max(),
                                       std::numeric_limits<size_t>::max()});
      }
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }

 private:
  using Key = std::tuple<double, int64_t, size_t>;  // busy_until, prefilling, index
  std::set<Key> by_queue_;                          // those with work ahead
  std::set<std::pair<int64_t, size_t>> idle_;       // the others: prefilling, index
  std::set<std::pair<int64_t, size_t>> by_load_;  // prefilling, index
  std::vector<std::optional<Key>> keys_;
};

// At equal times a prefill ends first, then a replay on the decode node, then a decode step,
// then a request arrives: what frees a slot is seen before what waits for one.
enum EventKind { kPrefillEnds = 0, kReplayEnds = 1, kStepEnds = 2, kArrives = 3 };
struct Event {
  double time = 0;
  int kind = kPrefillEnds;
  size_t request = 0;    // kStepEnds: the decode node
  // kPrefillEnds of a shared node, kStepEnds of a decode node: stale once the node's version
  // moves.
  uint64_t version = 0;
  // A total order (ties by request or node, then version), so that which of two events at one
  // time goes first does not hang on the queue's shape: a simulation of fewer events (decode
  // cruises) orders them as one of more.
  bool operator>(const Event& other) const {
    return std::tie(time, kind, request, version) >
           std::tie(other.time, other.kind, other.request, other.version);
  }
};

}  // namespace

absl::StatusOr<std::vector<RoutePolicy>> ParseRoutePolicies(absl::string_view text) {
  std::vector<RoutePolicy> policies;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    absl::StatusOr<RoutePolicy> policy = kvstore::ParseRoutingPolicy(item, "--policy");
    if (!policy.ok()) return policy.status();
    policies.push_back(*policy);
  }
  return policies;
}

absl::StatusOr<PrefillSharing> ParsePrefillSharing(absl::string_view name) {
  if (name == "arrival-order") return PrefillSharing::kArrivalOrder;
  if (name == "shared") return PrefillSharing::kShared;
  return absl::InvalidArgumentError(
      absl::StrCat("--prefill-sharing: '", name, "' is unknown; allowed: arrival-order, shared"));
}

// "unlimited" or 0 (no budget, as baton-kvstore's --budget-bytes 0), or a byte count with an
// optional unit: K, M, G, T and KiB..TiB are powers of 1024, KB..TB powers of 1000.
absl::StatusOr<std::optional<uint64_t>> ParseBudget(absl::string_view item,
                                                    absl::string_view flag) {
  const absl::string_view text = absl::StripAsciiWhitespace(item);
  if (absl::AsciiStrToLower(text) == "unlimited") return std::optional<uint64_t>();
  size_t split = 0;
  while (split < text.size() && (absl::ascii_isdigit(text[split]) || text[split] == '.')) ++split;
  const std::string unit = absl::AsciiStrToLower(text.substr(split));
  const struct {
    const char* name;
    double scale;
  } units[] = {{"", 1},
               {"b", 1},
               {"k", 1024.0},
               {"kib", 1024.0},
               {"m", 1048576.0},
               {"mib", 1048576.0},
               {"g", 1073741824.0},
               {"gib", 1073741824.0},
               {"t", 1099511627776.0},
               {"tib", 1099511627776.0},
               {"kb", 1e3},
               {"mb", 1e6},
               {"gb", 1e9},
               {"tb", 1e12}};
  double number = 0;
  const double* scale = nullptr;
  for (const auto& u : units) {
    if (unit == u.name) scale = &u.scale;
  }
  if (split == 0 || scale == nullptr || !absl::SimpleAtod(text.substr(0, split), &number) ||
      number * *scale >= 1.8e19) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", text,
                     "' is not a byte count; allowed: unlimited, 0 (unlimited), or a number "
                     "with an optional unit (K/M/G/T or KiB..TiB: powers of 1024; KB..TB: "
                     "powers of 1000)"));
  }
  const uint64_t bytes = static_cast<uint64_t>(number * *scale);
  if (bytes == 0) return std::optional<uint64_t>();
  return std::optional<uint64_t>(bytes);
}

absl::StatusOr<std::vector<std::optional<uint64_t>>> ParseBudgets(absl::string_view text,
                                                                  absl::string_view flag) {
  std::vector<std::optional<uint64_t>> budgets;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    absl::StatusOr<std::optional<uint64_t>> budget = ParseBudget(item, flag);
    if (!budget.ok()) return budget.status();
    budgets.push_back(*budget);
  }
  return budgets;
}

double NearestRank(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(q / 100 * static_cast<double>(values.size())));
  return values[std::max<size_t>(rank, 1) - 1];
}

std::vector<Sha256Digest> TraceChainKeys(const TraceRequest& request, const TokenOptions& tokens,
                                         int64_t block_size) {
  const int64_t per_id = TokensPerHashId(tokens);
  const int64_t blocks = ScaledPromptLength(request, tokens) / block_size;
  std::vector<Sha256Digest> keys(static_cast<size_t>(blocks));
  Sha256Digest previous{};  // the root: a simulation has one model, tenant and salt
  std::vector<int64_t> pieces;
  for (int64_t b = 0; b < blocks; ++b) {
    pieces.clear();
    for (int64_t t = b * block_size; t < (b + 1) * block_size;) {
      const int64_t first = t % per_id;
      const int64_t end = std::min(per_id, first + (b + 1) * block_size - t);
      pieces.insert(pieces.end(), {request.hash_ids[static_cast<size_t>(t / per_id)], first, end});
      t += end - first;
    }
    const std::string_view before(reinterpret_cast<const char*>(previous.data()), previous.size());
    const std::string_view words(reinterpret_cast<const char*>(pieces.data()),
                                 pieces.size() * sizeof(int64_t));
    // 128 bits: two XXH3-64 of the same input, salted apart.
    const uint64_t halves[2] = {ChecksumParts({before, words, "0"}),
                                ChecksumParts({before, words, "1"})};
    Sha256Digest& key = keys[static_cast<size_t>(b)];
    std::memcpy(key.data(), halves, sizeof(halves));
    previous = key;
  }
  return keys;
}

std::vector<ClusterRequest> ClusterRequestsFromTrace(const std::vector<TraceRequest>& trace,
                                                     const TokenOptions& tokens, int64_t block_size,
                                                     double time_scale, int64_t max_output_tokens) {
  std::vector<ClusterRequest> cluster;
  if (trace.empty()) return cluster;
  int64_t keys = 0;
  for (const TraceRequest& r : trace) keys += ScaledPromptLength(r, tokens) / block_size;
  double first_ms = trace.front().timestamp_ms;
  for (const TraceRequest& r : trace) first_ms = std::min(first_ms, r.timestamp_ms);
  cluster.reserve(trace.size());
  for (const TraceRequest& r : trace) {
    // As `batonctl replay` asks: the trace's output length, capped by max_output_tokens, at
    // least one token.
    const int64_t output = std::max<int64_t>(
        1, max_output_tokens > 0 ? std::min(r.output_length, max_output_tokens) : r.output_length);
    cluster.push_back({.arrival_ms = (r.timestamp_ms - first_ms) * time_scale,
                       .prompt_len = ScaledPromptLength(r, tokens),
                       .output_len = output,
                       .from = &r,
                       .tokens = tokens});
    if (keys <= kChainKeysUpFront) {
      cluster.back().chain = TraceChainKeys(r, tokens, block_size);
      cluster.back().from = nullptr;
    }
  }
  return cluster;
}

double StretchAt(const std::array<double, 4>& quantiles, double u) {
  constexpr std::array<double, 4> kAt = {0.1, 0.5, 0.9, 0.99};
  if (u <= kAt[0]) return quantiles[0];
  for (size_t i = 1; i < kAt.size(); ++i) {
    if (u <= kAt[i]) {
      const double t = (u - kAt[i - 1]) / (kAt[i] - kAt[i - 1]);
      return quantiles[i - 1] + t * (quantiles[i] - quantiles[i - 1]);
    }
  }
  return quantiles.back();
}

double StretchMean(const std::array<double, 4>& q) {
  // The areas under StretchAt: flat to 0.1, trapezoids between the quantiles, flat from 0.99.
  return 0.1 * q[0] + 0.4 * (q[0] + q[1]) / 2 + 0.4 * (q[1] + q[2]) / 2 + 0.09 * (q[2] + q[3]) / 2 +
         0.01 * q[3];
}

absl::StatusOr<DecodeRates> ParseDecodeRates(absl::string_view text) {
  DecodeRates rates;
  if (text.empty()) return rates;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
    double value = 0;
    double* field = kv.first == "step_fixed_ms"           ? &rates.step_fixed_ms
                    : kv.first == "step_per_row_ms"       ? &rates.step_per_row_ms
                    : kv.first == "tokens_per_step"       ? &rates.tokens_per_step
                    : kv.first == "replay_ms_per_gflop"   ? &rates.replay_ms_per_gflop
                    : kv.first == "replay_piece_fixed_ms" ? &rates.replay_piece_fixed_ms
                    : kv.first == "replay_piece_row_ms"   ? &rates.replay_piece_row_ms
                    : kv.first == "step_stretch"          ? &rates.step_stretch
                    : kv.first == "step_stretch_p10"      ? &rates.step_stretch_quantiles[0]
                    : kv.first == "step_stretch_p50"      ? &rates.step_stretch_quantiles[1]
                    : kv.first == "step_stretch_p90"      ? &rates.step_stretch_quantiles[2]
                    : kv.first == "step_stretch_p99"      ? &rates.step_stretch_quantiles[3]
                                                          : nullptr;
    if (field == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--decode-rates: '", kv.first,
                       "' is unknown; allowed: step_fixed_ms, step_per_row_ms, tokens_per_step, "
                       "replay_ms_per_gflop, replay_piece_fixed_ms, replay_piece_row_ms, "
                       "step_stretch, step_stretch_p10, step_stretch_p50, step_stretch_p90, "
                       "step_stretch_p99"));
    }
    const double least = field == &rates.tokens_per_step ? 1 : 0;
    if (!absl::SimpleAtod(kv.second, &value) || !std::isfinite(value) || value < least ||
        value > 1e6) {
      return absl::InvalidArgumentError(
          absl::StrCat("--decode-rates: '", item, "' needs a finite value in [", least, ", 1e6]"));
    }
    *field = value;
  }
  // The quantiles come together, in order, or not at all.
  const std::array<double, 4>& q = rates.step_stretch_quantiles;
  const bool any = std::any_of(q.begin(), q.end(), [](double v) { return v > 0; });
  if (any && !(q[0] > 0 && q[0] <= q[1] && q[1] <= q[2] && q[2] <= q[3])) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--decode-rates: step_stretch_p10, step_stretch_p50, step_stretch_p90 and "
        "step_stretch_p99 go together, each > 0 and none below the one before (given: ",
        absl::StrJoin(q, ", "), ")"));
  }
  return rates;
}

absl::StatusOr<kvstore::PrefillRates> ParseRates(absl::string_view text) {
  kvstore::PrefillRates rates = kvstore::DefaultPrefillRates();
  if (text.empty()) return rates;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
    double value = 0;
    if (!absl::SimpleAtod(kv.second, &value) || !std::isfinite(value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rates: '", item, "' needs a finite value >= 0 (name=milliseconds)"));
    }
    double* field = kv.first == "compute_ms_per_gflop" ? &rates.compute_ms_per_gflop
                    : kv.first == "local_ms_per_mib"   ? &rates.local_ms_per_mib
                    : kv.first == "store_ms_per_mib"   ? &rates.store_ms_per_mib
                    : kv.first == "fixed_ms"           ? &rates.fixed_ms
                                                       : nullptr;
    if (field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rates: '", kv.first,
          "' is unknown; allowed: compute_ms_per_gflop, local_ms_per_mib, store_ms_per_mib, "
          "fixed_ms"));
    }
    *field = value;
  }
  return rates;
}

MeasuredRates MeanRates(const v1::ListRatesResponse& reply, absl::string_view model) {
  MeasuredRates measured;
  // name -> (weighted sum, weight) over the nodes that measured it, in the order the flags
  // list them.
  std::vector<std::pair<std::string, std::pair<double, double>>> prefill = {
      {"compute_ms_per_gflop", {}},
      {"local_ms_per_mib", {}},
      {"store_ms_per_mib", {}},
      {"fixed_ms", {}}};
  std::vector<std::pair<std::string, std::pair<double, double>>> decode = {
      {"step_fixed_ms", {}},       {"step_per_row_ms", {}},       {"tokens_per_step", {}},
      {"replay_ms_per_gflop", {}}, {"replay_piece_fixed_ms", {}}, {"replay_piece_row_ms", {}},
      {"step_stretch", {}},        {"step_stretch_p10", {}},      {"step_stretch_p50", {}},
      {"step_stretch_p90", {}},    {"step_stretch_p99", {}}};
  auto add = [](std::pair<double, double>& sum, double value, double weight = 1) {
    if (value > 0 && std::isfinite(value)) {
      sum.first += weight * value;
      sum.second += weight;
    }
  };
  for (const v1::NodeRates& node : reply.nodes()) {
    if (!model.empty() && node.model() != model) continue;
    if (node.role() == "prefill") {
      ++measured.prefill_nodes;
      measured.replay_on_decode |= node.producers_only();
      const v1::PrefillRates& r = node.prefill();
      const double values[4] = {r.compute_ms_per_gflop(), r.local_ms_per_mib(),
                                r.store_ms_per_mib(), r.fixed_ms()};
      // Each node weighs as many prefills as it measured its rates over (one when it does not
      // say): a node that the router kept from traffic after a slow first few prices the
      // cluster as little as it measured.
      const double weight = std::max<double>(1, r.samples());
      for (size_t i = 0; i < 4; ++i) add(prefill[i].second, values[i], weight);
    } else if (node.role() == "decode") {
      ++measured.decode_nodes;
      const v1::DecodeRates& r = node.decode();
      const double values[11] = {
          r.step_fixed_ms(),       r.step_per_row_ms(),       r.tokens_per_step(),
          r.replay_ms_per_gflop(), r.replay_piece_fixed_ms(), r.replay_piece_row_ms(),
          r.step_stretch(),        r.step_stretch_p10(),      r.step_stretch_p50(),
          r.step_stretch_p90(),    r.step_stretch_p99()};
      for (size_t i = 0; i < 11; ++i) add(decode[i].second, values[i]);
    }
  }
  auto join = [](const auto& sums) {
    std::vector<std::string> items;
    for (const auto& [name, sum] : sums) {
      if (sum.second > 0) {
        items.push_back(absl::StrCat(name, "=", sum.first / sum.second));
      }
    }
    return absl::StrJoin(items, ",");
  };
  measured.rates = join(prefill);
  measured.decode_rates = join(decode);
  return measured;
}

absl::Status ResolveRatesFile(std::string& rates, std::string& decode_rates) {
  if (rates.empty() || rates.find('=') != std::string::npos) return absl::OkStatus();
  const std::string path = rates;
  auto fail = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rates: '", path, "' ", what,
        " (a --rates value is name=value,... or a file of `batonctl rates --addr ROUTER` "
        "output)"));
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail("cannot be read");
  constexpr std::streamsize kMaxBytes = std::streamsize{64} << 20;
  std::string text(static_cast<size_t>(kMaxBytes) + 1, '\0');
  in.read(text.data(), kMaxBytes + 1);
  if (in.bad()) return fail("cannot be read");
  if (in.gcount() > kMaxBytes) return fail("is over 64 MiB");
  text.resize(static_cast<size_t>(in.gcount()));
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return fail("is not a JSON object");
  if (!doc.contains("rates") || !doc["rates"].is_string()) {
    return fail("has no string \"rates\"");
  }
  rates = doc["rates"].get<std::string>();
  if (decode_rates.empty() && doc.contains("decode_rates")) {
    if (!doc["decode_rates"].is_string()) return fail("has a \"decode_rates\" that is no string");
    decode_rates = doc["decode_rates"].get<std::string>();
  }
  return absl::OkStatus();
}

namespace {

// One simulation (SimulateCluster): the prefill side and its tiers here, the decode side in
// DecodeFleet, over one queue of events.
class ClusterRun {
 public:
  ClusterRun(const std::vector<ClusterRequest>& requests, const ClusterOptions& given);
  ClusterResult Run();

 private:
  const std::vector<Sha256Digest>& ChainOf(size_t r);
  void Put(kvstore::PrefixIndex& index, const std::vector<Sha256Digest>& chain,
           const std::vector<kvstore::WriteBackStep>& steps, uint64_t budget, int64_t cache_of);
  void Opened(size_t n, double now) {
    const kvstore::OwnPrefills& in_flight = nodes_[n].prefills;
    open_nodes_.Update(n, in_flight.count, in_flight.busy_until_ms, in_flight.count < o_.slots,
                       now);
  }
  std::vector<size_t> OpenFor(const std::vector<Sha256Digest>& chain,
                              const kvstore::ChainLookup& in_store,
                              const kvstore::PlacementRequest& place, double now);
  bool PlaceNext(double now);
  void ReadHit(size_t chosen, const std::vector<Sha256Digest>& chain, int64_t hit_blocks,
               const kvstore::ChainLookup& in_store);
  // A shared node's prefills in flight advanced to `now`, each at 1/n of the node's speed.
  void AdvanceShared(Node& node, double now);
  // The shared node's next end: the prefill with the least service left, at 1/n speed.
  void ScheduleShared(Node& node, double now);
  void PrefillEnds(size_t r, double now);
  // What a stopped simulation knows: the TTFT of the requests placed, in their order.
  ClusterResult Stopped() {
    std::vector<double> ttft;
    for (size_t r : placed_) ttft.push_back(result_.ttft_ms[r]);
    result_.ttft_ms = std::move(ttft);
    result_.stopped = true;
    return std::move(result_);
  }
  void Dispatch(double now) {
    while (!waiting_.empty() && PlaceNext(now)) {
    }
  }

  const std::vector<ClusterRequest>& requests_;
  ClusterOptions o_;
  ClusterResult result_;
  int64_t B_ = 0;
  uint64_t kv_value_ = 0, swa_value_ = 0;
  int replication_ = 1;
  kvstore::PrefixIndex store_;
  std::vector<Node> nodes_;
  std::vector<size_t> node_of_;
  std::vector<double> service_of_;
  std::vector<int64_t> hit_of_;
  std::vector<double> replay_of_;        // ms on the decode node, replay-on-decode as a delay
  std::vector<int64_t> replay_rows_of_;  // rows replayed on the decode node, in its steps
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::deque<size_t> waiting_;  // admission's queue, first come first served
  std::vector<size_t> placed_;  // in the order placed
  int64_t over_ = 0;            // placed requests known to miss ClusterOptions::stop_over_ttft_ms
  DecodeFleet decode_;
  // The chains made from trace lines (ClusterRequest::from), kept from a request's placement to
  // its prefill's end (a node-based map: a reference stays valid as others are added).
  std::unordered_map<size_t, std::vector<Sha256Digest>> made_;
  // The prefill nodes whose cache holds a chain's first block KV, by its key (OpenNodes: the
  // nodes a placement must price one by one; a node without the first block has no local hit).
  // Only first blocks are asked for: a block's key hashes its predecessor's, so a first
  // block's key names no later block, and the map stays as small as the distinct first blocks.
  absl::flat_hash_map<Sha256Digest, std::vector<size_t>> cached_by_;
  OpenNodes open_nodes_;
};

ClusterRun::ClusterRun(const std::vector<ClusterRequest>& requests, const ClusterOptions& given)
    : requests_(requests),
      o_(given),
      B_(given.hit.block_size),
      kv_value_(kvstore::StoredValueBytes(given.payload.block_kv)),
      swa_value_(kvstore::StoredValueBytes(given.payload.swa)),
      nodes_(static_cast<size_t>(std::max<int64_t>(0, given.prefill_nodes))),
      node_of_(requests.size()),
      service_of_(requests.size()),
      hit_of_(requests.size()),
      replay_of_(requests.size(), 0),
      replay_rows_of_(requests.size(), 0),
      decode_(requests, o_, result_,
              [this](double time, size_t node, uint64_t version) {
                events_.push({time, kStepEnds, node, version});
              }),
      open_nodes_(nodes_.size()) {
  // Replay-on-decode prices the replay at the decode node's rate, as the router does.
  o_.rates.replay_ms_per_gflop = o_.decode.replay_ms_per_gflop;
  result_.ttft_ms.assign(requests.size(), 0);
  if (o_.record_requests) result_.placed.assign(requests.size(), {});
  result_.requests_per_node.assign(nodes_.size(), 0);
  // The store fleet's node names, as `baton up` gives them.
  for (int64_t n = 0; n < std::max<int64_t>(1, o_.store_nodes); ++n) {
    result_.store_ids.push_back(n == 0 ? std::string("kvstore") : absl::StrCat("kvstore-", n));
  }
  result_.store_ops.assign(result_.store_ids.size(), {});
  replication_ = static_cast<int>(
      std::clamp<int64_t>(o_.store_replication, 1, static_cast<int64_t>(result_.store_ids.size())));
  for (size_t n = 0; n < nodes_.size(); ++n) open_nodes_.Update(n, 0, 0, o_.slots > 0, 0);
}

const std::vector<Sha256Digest>& ClusterRun::ChainOf(size_t r) {
  const ClusterRequest& request = requests_[r];
  if (request.from == nullptr) return request.chain;
  auto [it, added] = made_.try_emplace(r);
  if (added) it->second = TraceChainKeys(*request.from, request.tokens, B_);
  return it->second;
}

// `steps` of `chain` put in `index` (prefill node `cache_of`'s cache, or the store: -1): a value
// present is touched, a new one added.
void ClusterRun::Put(kvstore::PrefixIndex& index, const std::vector<Sha256Digest>& chain,
                     const std::vector<kvstore::WriteBackStep>& steps, uint64_t budget,
                     int64_t cache_of) {
  const kvstore::PrefixIndex::EvictFn evicted = [&](const Sha256Digest& key, Region region,
                                                    uint64_t) {
    if (cache_of < 0 || region != Region::kBlockKv) return;
    auto it = cached_by_.find(key);
    if (it == cached_by_.end()) return;
    std::erase(it->second, static_cast<size_t>(cache_of));
    if (it->second.empty()) cached_by_.erase(it);
  };
  for (const kvstore::WriteBackStep& step : steps) {
    const Sha256Digest& key = chain[step.block];
    if (index.TouchIfPresent(key, step.region)) continue;
    const std::optional<Sha256Digest> parent =
        step.parent >= 0 ? std::optional<Sha256Digest>(chain[step.parent]) : std::nullopt;
    index.Add(key, parent, step.region, step.region == Region::kBlockKv ? kv_value_ : swa_value_);
    if (cache_of >= 0 && step.region == Region::kBlockKv && step.block == 0) {
      cached_by_[key].push_back(static_cast<size_t>(cache_of));
    }
    index.EvictToBudget(budget, evicted);
  }
}

// The nodes with a free slot (or those of them that can be chosen), in index order, as the
// router's registry lists them.
std::vector<size_t> ClusterRun::OpenFor(const std::vector<Sha256Digest>& chain,
                                        const kvstore::ChainLookup& in_store,
                                        const kvstore::PlacementRequest& place, double now) {
  std::vector<size_t> open;
  if (o_.exhaustive_placement) {
    for (size_t n = 0; n < nodes_.size(); ++n) {
      if (nodes_[n].prefills.count < o_.slots) open.push_back(n);
    }
    return open;
  }
  std::vector<size_t> holders;
  auto it = chain.empty() ? cached_by_.end() : cached_by_.find(chain.front());
  if (it != cached_by_.end()) {
    for (size_t n : it->second) {
      if (nodes_[n].prefills.count < o_.slots) holders.push_back(n);
    }
  }
  // A node without a local hit: what PlacePrefill plans there, but for its queue.
  const kvstore::TieredHit no_local =
      kvstore::PlanTieredHit(place.hit, {.local = {}, .store = in_store}, o_.payload);
  open_nodes_.Advance(now);
  open_nodes_.Candidates(
      holders, o_.policy == RoutePolicy::kPredictedTtft,
      [&](double queue_ms) {
        return kvstore::PredictPrefill(o_.rates, queue_ms, place.hit, no_local, o_.config)
            .total_ms();
      },
      now, open);
  return open;
}

// The hit's reads on node `chosen`: the store's blocks are used (touched) and kept in the
// node's cache; the router's lookup probes each owner of some of the prompt's keys once; the
// values the node's cache lacks come from one owner each.
//
// The store's blocks of the hit are touched as its Lookup would (`in_store` is its Peek of the
// chain when the request was placed). The node's cache needs no Lookup: keeping the reads
// touches the same blocks, in the same order, before it adds any value that could evict one
// (block KV of [0, h) first, and those it holds are a prefix of it), so the recency order is
// what a Lookup and then the puts would leave.
void ClusterRun::ReadHit(size_t chosen, const std::vector<Sha256Digest>& chain, int64_t h,
                         const kvstore::ChainLookup& in_store) {
  Node& node = nodes_[chosen];
  for (int64_t b = 0; b < std::min(h, in_store.block_kv_blocks); ++b) {
    store_.Touch(chain[static_cast<size_t>(b)]);
  }
  const std::vector<std::vector<size_t>> owned =
      kvstore::KeysByOwner(chain, result_.store_ids, replication_);
  for (size_t s = 0; s < owned.size(); ++s) {
    if (owned[s].empty()) continue;
    ++result_.store_ops[s].lookups;
    result_.store_ops[s].probe_keys += static_cast<int64_t>(owned[s].size());
  }
  const std::vector<kvstore::WriteBackStep> kept = kvstore::CacheKeptReads(h, o_.hit.window, B_);
  const uint64_t turn = node.read_turn++;
  for (const kvstore::WriteBackStep& step : kept) {
    if (o_.block_cache_bytes > 0 && node.cache.Contains(chain[step.block], step.region)) continue;
    const size_t owner =
        kvstore::ReadOrder(chain[step.block], result_.store_ids, replication_, turn)[0];
    ++result_.store_ops[owner].reads;
    result_.store_ops[owner].read_bytes +=
        step.region == Region::kBlockKv ? o_.payload.block_kv : o_.payload.swa;
  }
  if (o_.block_cache_bytes > 0) {
    Put(node.cache, chain, kept, o_.block_cache_bytes, static_cast<int64_t>(chosen));
  }
}

// Places the first waiting request, as the router admits it: false when it must wait (no
// prefill node has a free slot, or no decode node a free slot).
bool ClusterRun::PlaceNext(double now) {
  const size_t r = waiting_.front();
  const ClusterRequest& request = requests_[r];
  const std::vector<Sha256Digest>& chain = ChainOf(r);
  if (open_nodes_.empty()) return false;
  const kvstore::ChainLookup in_store = store_.Peek(chain);
  kvstore::PlacementRequest place{
      .policy = o_.policy, .hit = o_.hit, .payload = o_.payload, .config = &o_.config};
  place.hit.prompt_len = request.prompt_len;
  const std::vector<size_t> open = OpenFor(chain, in_store, place, now);
  std::vector<kvstore::PrefillNodeView> views;
  for (size_t n : open) {
    const kvstore::OwnPrefills& in_flight = nodes_[n].prefills;
    views.push_back({.prefilling = in_flight.count,
                     .reported_queued = std::max<int64_t>(0, in_flight.count - 1),
                     .queue_ms = in_flight.Ahead(now),
                     .rates = o_.rates,
                     .tiers = {.local = nodes_[n].cache.Peek(chain), .store = in_store}});
  }
  // A decode slot is reserved at admission.
  const std::optional<size_t> decoder = decode_.Reservable();
  if (decode_.modelled() && !decoder.has_value()) return false;
  const kvstore::Placement placement = kvstore::PlacePrefill(views, place);
  const size_t chosen = open[static_cast<size_t>(placement.chosen)];
  const int64_t h = placement.plan.hit.hit_blocks;
  waiting_.pop_front();
  ReadHit(chosen, chain, h, in_store);
  result_.local_hit_tokens += placement.plan.hit.local_blocks * B_;
  result_.store_hit_tokens += (h - placement.plan.hit.local_blocks) * B_;
  // The prefill node's own part; a replay on the decode node follows it.
  Node& node = nodes_[chosen];
  const double service = placement.plan.cost.node_ms();
  // One at a time: the end is known now. Shared: it depends on what arrives later, so the
  // end event is the node's own, and `end` is what the prefill would take alone (a bound).
  double end = std::max(now, node.busy_until) + service;
  if (o_.sharing == PrefillSharing::kShared) {
    end = now + service;
    AdvanceShared(node, now);
    node.sharing.emplace_back(r, service);
    ScheduleShared(node, now);
  } else {
    node.busy_until = end;
  }
  node.prefills.Took(service, now);
  Opened(chosen, now);
  node_of_[r] = chosen;
  service_of_[r] = service;
  hit_of_[r] = h;
  if (placement.plan.cost.replay_elsewhere) {
    replay_of_[r] = decode_.replays_in_steps() ? 0 : placement.plan.cost.replay_ms;
    replay_rows_of_[r] = placement.plan.cost.replayed_rows;
  }
  ++result_.requests_per_node[chosen];
  result_.ttft_ms[r] = end + replay_of_[r] - request.arrival_ms;
  placed_.push_back(r);
  if (o_.stop_over_count > 0 && result_.ttft_ms[r] > o_.stop_over_ttft_ms) ++over_;
  if (decoder.has_value()) decode_.Reserve(r, *decoder);
  if (o_.record_requests) {
    result_.placed[r] = {.node = static_cast<int64_t>(chosen),
                         .cached_tokens = h * B_,
                         .local_cached_tokens = placement.plan.hit.local_blocks * B_,
                         .admitted_ms = now - request.arrival_ms,
                         .queue_ms = placement.plan.cost.queue_ms,
                         .service_ms = placement.plan.cost.service_ms()};
  }
  if (o_.record_steps) {
    result_.steps.push_back(
        {.kind = ClusterStep::kPlaced,
         .request = r,
         .node = static_cast<int64_t>(chosen),
         .hit_blocks = h,
         .store = in_store,
         .runner_up = placement.runner_up < 0
                          ? -1
                          : static_cast<int64_t>(open[static_cast<size_t>(placement.runner_up)]),
         .time_ms = now});
  }
  if (o_.sharing != PrefillSharing::kShared) events_.push({end, kPrefillEnds, r});
  return true;
}

void ClusterRun::AdvanceShared(Node& node, double now) {
  const double share = (now - node.shared_at) / static_cast<double>(node.sharing.size());
  for (auto& [request, left] : node.sharing) left = std::max(0.0, left - share);
  node.shared_at = now;
}

void ClusterRun::ScheduleShared(Node& node, double now) {
  ++node.version;
  if (node.sharing.empty()) return;
  const auto next =
      std::min_element(node.sharing.begin(), node.sharing.end(),
                       [](const auto& a, const auto& b) { return a.second < b.second; });
  const double n = static_cast<double>(node.sharing.size());
  events_.push({now + next->second * n, kPrefillEnds, next->first, node.version});
}

// Request `r`'s prefill ends: its node's slot is free, what it computed goes to the node's
// cache and the store, and its first token follows (or its replay, on the decode node).
void ClusterRun::PrefillEnds(size_t r, double now) {
  Node& node = nodes_[node_of_[r]];
  if (o_.sharing == PrefillSharing::kShared) {
    AdvanceShared(node, now);
    std::erase_if(node.sharing, [r](const auto& entry) { return entry.first == r; });
    ScheduleShared(node, now);
    result_.ttft_ms[r] = now + replay_of_[r] - requests_[r].arrival_ms;
  }
  node.prefills.Ended(service_of_[r], now);
  Opened(node_of_[r], now);
  const std::vector<Sha256Digest>& chain = ChainOf(r);
  const std::vector<kvstore::WriteBackStep> computed =
      kvstore::WriteBackSteps(hit_of_[r], static_cast<int64_t>(chain.size()));
  if (o_.block_cache_bytes > 0) {
    Put(node.cache, chain, computed, o_.block_cache_bytes, static_cast<int64_t>(node_of_[r]));
  }
  Put(store_, chain, computed, o_.store_budget.value_or(std::numeric_limits<uint64_t>::max()), -1);
  for (const kvstore::WriteBackStep& step : computed) {
    for (size_t owner : kvstore::Owners(chain[step.block], result_.store_ids, replication_)) {
      ++result_.store_ops[owner].writes;
      result_.store_ops[owner].write_bytes +=
          step.region == Region::kBlockKv ? o_.payload.block_kv : o_.payload.swa;
    }
  }
  made_.erase(r);
  if (replay_of_[r] > 0) {
    events_.push({now + replay_of_[r], kReplayEnds, r});
  } else if (decode_.modelled()) {
    decode_.PrefillEnded(r, replay_rows_of_[r], now);
  }
  if (o_.record_steps) {
    result_.steps.push_back({.kind = ClusterStep::kEnded,
                             .request = r,
                             .node = static_cast<int64_t>(node_of_[r]),
                             .hit_blocks = hit_of_[r],
                             .time_ms = now});
  }
}

ClusterResult ClusterRun::Run() {
  if (requests_.empty() || nodes_.empty()) return std::move(result_);
  // The arrivals in time order (trace order among equal times), beside the queue of what the
  // nodes do: a million arrivals need not wait in it.
  std::vector<size_t> arrivals(requests_.size());
  std::iota(arrivals.begin(), arrivals.end(), size_t{0});
  std::stable_sort(arrivals.begin(), arrivals.end(), [&](size_t a, size_t b) {
    return requests_[a].arrival_ms < requests_[b].arrival_ms;
  });
  size_t next_arrival = 0;
  double first_arrival = std::numeric_limits<double>::max(), last_end = 0;
  while (!events_.empty() || next_arrival < arrivals.size()) {
    if (o_.stop_over_count > 0 && over_ >= o_.stop_over_count) return Stopped();
    Event event;
    // At one time, what the nodes do comes before an arrival (EventKind).
    if (next_arrival < arrivals.size() &&
        (events_.empty() || events_.top().time > requests_[arrivals[next_arrival]].arrival_ms)) {
      const size_t r = arrivals[next_arrival++];
      event = {requests_[r].arrival_ms, kArrives, r};
    } else {
      event = events_.top();
      events_.pop();
    }
    if (event.kind == kArrives) {
      first_arrival = std::min(first_arrival, event.time);
      result_.prompt_tokens += requests_[event.request].prompt_len;
      waiting_.push_back(event.request);
    } else {
      last_end = std::max(last_end, event.time);
      if (event.kind == kStepEnds) {
        decode_.StepEnded(event.request, event.time, event.version);
      } else if (event.kind == kReplayEnds) {
        if (decode_.modelled()) decode_.FirstToken(event.request, event.time);
      } else if (o_.sharing != PrefillSharing::kShared ||
                 event.version == nodes_[node_of_[event.request]].version) {
        PrefillEnds(event.request, event.time);
      }
    }
    Dispatch(event.time);
  }
  result_.makespan_ms = last_end - first_arrival;
  return std::move(result_);
}

}  // namespace

ClusterResult SimulateCluster(const std::vector<ClusterRequest>& requests,
                              const ClusterOptions& options) {
  return ClusterRun(requests, options).Run();
}

}  // namespace baton::tools
