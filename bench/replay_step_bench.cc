// What a replay piece adds to a decode node's step (the replay-on-decode split's
// --replay-rows-per-step): the step time of --streams decoding requests alone, and with R rows
// of an arriving prompt's replay in the same step, for each R of --rows; the ratio to R = 0 is
// the running streams' inter-token latency while prompts arrive, on the decode node's own cores
// (bench/run_split_bench.sh measures the whole cluster, whose prefill node shares them here).
//
// With --budgets, it then replays the whole prompt beside the streams once per budget, its rows
// each step chosen by the decode node's planner (decode_step.h) at that share of the streams' step
// time within --budget-rows, and once at the fixed --bound-rows (the planner's row bound alone):
// each run's step time against the streams alone (median and largest) and the replay's time.
//
//   baton_replay_step_bench --model DIR [--streams 8] [--rows 0,16,64,256,512]
//                           [--prompt-len 2048] [--steps 20]
//                           [--budgets 0.5] [--budget-rows 64] [--bound-rows 8]
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "baton/common/parse.h"
#include "baton/decode_node/decode_step.h"
#include "baton/kernels/cpu_team.h"
#include "baton/model/engine_factory.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace baton::model;

std::vector<int32_t> Tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> tokens(n);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % vocab);
  return tokens;
}

// The running streams' step inputs, and their step alone.
struct Streams {
  std::vector<std::unique_ptr<SequenceState>> states;
  std::vector<std::vector<float>> logits;
  std::vector<DecodeItem> Items(int64_t n) {
    std::vector<DecodeItem> items;
    for (int64_t i = 0; i < n; ++i) {
      items.push_back({.state = states[i].get(), .token = 7, .logits = logits[i].data()});
    }
    return items;
  }
};

// The arriving prompt: its state after the producers' prefill, boundary rows and replay plan.
struct Arriving {
  SequenceState* state = nullptr;
  TruncationSpec spec;
  const float* boundary = nullptr;
  int64_t hidden = 0;
};

double Ms(Clock::time_point since) {
  return std::chrono::duration<double, std::milli>(Clock::now() - since).count();
}

// One whole replay of `arriving` beside the streams, planned step by step as the decode node
// plans (PlanStep, FoldStepTime) at `budget` within `bound` rows (budget 0: the bound alone).
// The planner's streams fit is warmed first with steps of 1..n streams, as a node's changing
// batch warms it.
absl::StatusOr<nlohmann::json> PlannedReplay(Engine& engine, Streams& streams,
                                             const Arriving& arriving, double budget, int64_t bound,
                                             double alone_ms) {
  const int64_t n = static_cast<int64_t>(streams.states.size()), V = engine.config().vocab_size;
  baton::decode_node::DraftCosts costs;
  baton::decode_node::ReplayCosts replay_costs;
  for (int64_t step = 0; step < 4 * n; ++step) {
    const int64_t batch = 1 + step % n;
    const auto start = Clock::now();
    if (absl::Status s = engine.Step(streams.Items(batch), {}); !s.ok()) return s;
    baton::decode_node::FoldStepTime(costs, replay_costs, batch, batch, {}, Ms(start) / 1e3);
  }
  std::vector<baton::decode_node::Generation> generations(static_cast<size_t>(n) + 1);
  std::vector<baton::decode_node::StepCandidate> candidates;
  for (auto& g : generations) candidates.push_back({.generation = &g});
  baton::decode_node::Generation& replaying = generations.back();
  replaying.replay = arriving.spec;
  replaying.replay_next = arriving.spec.s_valid;
  candidates.back().work = baton::decode_node::StepCandidate::Work::kReplay;
  const baton::decode_node::StepPolicy policy{
      .max_batch = n, .replay_rows = bound, .replay_step_budget = budget};
  std::vector<double> ratios;
  std::vector<int64_t> pieces;
  const auto replay_start = Clock::now();
  while (replaying.replay_rows_left() > 0) {
    const baton::decode_node::DecodePlan plan =
        baton::decode_node::PlanStep(candidates, policy, costs, replay_costs);
    const int64_t rows = plan.replay_rows(), q = replaying.replay_next;
    ReplayItem piece{.state = arriving.state,
                     .spec = arriving.spec,
                     .q_start = q,
                     .rows = rows,
                     .boundary = arriving.boundary + (q - arriving.spec.s_valid) * arriving.hidden};
    std::vector<float> logits(ReplayLogitRows(piece) * V);
    piece.logits = logits.data();
    const auto start = Clock::now();
    if (absl::Status s = engine.Step(streams.Items(n), {&piece, 1}); !s.ok()) return s;
    const double ms = Ms(start);
    ratios.push_back(ms / alone_ms);
    pieces.push_back(rows);
    const baton::decode_node::PieceSize size{.prompt_len = arriving.spec.prompt_len, .rows = rows};
    baton::decode_node::FoldStepTime(costs, replay_costs, n, n, {&size, 1}, ms / 1e3);
    replaying.replay_next += rows;
  }
  const double replay_ms = Ms(replay_start);
  std::vector<double> sorted = ratios;
  std::sort(sorted.begin(), sorted.end());
  return nlohmann::json{{"budget", budget},
                        {"row_bound", bound},
                        {"steps", ratios.size()},
                        {"ratio_median", sorted[sorted.size() / 2]},
                        {"ratio_max", sorted.back()},
                        {"replay_ms", replay_ms},
                        {"rows", pieces}};
}

int Fail(const absl::Status& status) {
  std::cerr << "baton_replay_step_bench: " << status << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"decode step time with replay pieces beside the running streams"};
  std::string model_dir, rows_text = "0,16,64,256,512", budgets_text;
  int64_t streams = 8, prompt_len = 2048, steps = 20, budget_rows = 64, bound_rows = 8;
  app.add_option("--model", model_dir, "Model directory")->required();
  app.add_option("--streams", streams, "Requests decoding in every step");
  app.add_option("--rows", rows_text, "Replay rows per step, a list");
  app.add_option("--prompt-len", prompt_len, "The arriving prompt's tokens (compact, K = C)");
  app.add_option("--steps", steps, "Steps timed per setting (the median is reported)");
  app.add_option("--budgets", budgets_text,
                 "Replay the whole prompt planned at each of these --replay-step-budget shares");
  app.add_option("--budget-rows", budget_rows, "The row bound of the budgeted replays");
  app.add_option("--bound-rows", bound_rows, "The fixed row bound replayed for comparison");
  CLI11_PARSE(app, argc, argv);
  // The kernels' level and wait policy from the environment (BATON_CPU_ISA, OMP_WAIT_POLICY).
  if (std::string error = baton::kernels::ConfigureCpuKernels(std::getenv("BATON_CPU_ISA"),
                                                              std::getenv("OMP_WAIT_POLICY"));
      !error.empty()) {
    std::cerr << error << "\n";
    return 2;
  }
  absl::StatusOr<std::vector<int64_t>> rows = baton::ParseIntList(rows_text, "--rows");
  if (!rows.ok()) return Fail(rows.status());
  std::vector<double> budgets;
  for (absl::string_view item : absl::StrSplit(budgets_text, ',', absl::SkipEmpty())) {
    double budget = 0;
    if (!absl::SimpleAtod(item, &budget) || budget < 0) {
      return Fail(absl::InvalidArgumentError("--budgets: a list of shares >= 0"));
    }
    budgets.push_back(budget);
  }

  auto full = LoadEngine(model_dir);
  if (!full.ok()) return Fail(full.status());
  auto producers = LoadEngine(model_dir, Device::kCpu, WeightType::kFp32, HeldLayers::kProducers);
  if (!producers.ok()) return Fail(producers.status());
  Engine& engine = **full;
  const baton::ModelConfig& c = engine.config();
  const int64_t V = c.vocab_size, d = c.hidden_size;

  // The running streams: 64-token prompts.
  Streams running;
  for (int64_t i = 0; i < streams; ++i) {
    running.states.push_back(std::make_unique<SequenceState>(engine.state_layout()));
    auto done = engine.Prefill(Tokens(64, V, i), {}, *running.states.back());
    if (!done.ok()) return Fail(done.status());
    running.logits.emplace_back(V);
  }
  // The arriving prompt, prefilled by the producers' engine: its boundary rows and state.
  const int64_t C = c.ring_capacity();
  const TruncationMode mode = prompt_len > C ? TruncationMode::kCompact : TruncationMode::kOff;
  const int64_t keep = mode == TruncationMode::kOff ? 0 : C;
  std::vector<float> boundary(BoundaryRowCount(prompt_len, mode, keep, 0) * d);
  SequenceState arriving(engine.state_layout());
  auto prefilled = (*producers)
                       ->Prefill(Tokens(prompt_len, V, 99),
                                 {.mode = mode, .keep = keep, .boundary_rows = boundary}, arriving);
  if (!prefilled.ok()) return Fail(prefilled.status());
  const TruncationSpec spec = *ReplaySpec(c, prompt_len, mode, keep, 0);
  const int64_t replay_rows = prompt_len - spec.s_valid;

  nlohmann::json out = nlohmann::json::array();
  double alone_ms = 0;
  std::vector<float> replay_logits(V);
  for (int64_t r : *rows) {
    std::vector<double> times;
    for (int64_t step = 0; step < steps + 2; ++step) {  // two warm-up steps
      std::vector<ReplayItem> replay;
      const int64_t n = std::min(r, replay_rows);
      if (n > 0) {
        // The same rows each step: the work is what a piece of n rows costs.
        replay.push_back({.state = &arriving,
                          .spec = spec,
                          .q_start = spec.s_valid,
                          .rows = n,
                          .boundary = boundary.data(),
                          .logits = replay_logits.data()});
      }
      const auto start = Clock::now();
      if (absl::Status s = engine.Step(running.Items(streams), replay); !s.ok()) return Fail(s);
      if (step >= 2) times.push_back(Ms(start));
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    if (r == 0) alone_ms = median;
    out.push_back({{"replay_rows", std::min(r, replay_rows)},
                   {"step_ms", median},
                   {"ratio_to_alone", alone_ms > 0 ? median / alone_ms : 0}});
  }
  nlohmann::json planned = nlohmann::json::array();
  if (!budgets.empty() && alone_ms > 0) {
    const Arriving from{.state = &arriving, .spec = spec, .boundary = boundary.data(), .hidden = d};
    // The fixed bound, then each budget, then the bound again: the machine's drift shows.
    std::vector<std::pair<double, int64_t>> runs = {{0.0, bound_rows}};
    for (double budget : budgets) runs.push_back({budget, budget_rows});
    runs.push_back({0.0, bound_rows});
    for (const auto& [budget, bound] : runs) {
      absl::StatusOr<nlohmann::json> run =
          PlannedReplay(engine, running, from, budget, bound, alone_ms);
      if (!run.ok()) return Fail(run.status());
      planned.push_back(*run);
    }
  }
  std::cout << nlohmann::json{{"streams", streams},
                              {"prompt_len", prompt_len},
                              {"replay_range_rows", replay_rows},
                              {"steps", out},
                              {"planned", planned}}
                   .dump()
            << "\n";
  return 0;
}
