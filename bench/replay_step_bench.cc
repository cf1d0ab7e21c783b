// What a replay piece adds to a decode node's step (the replay-on-decode split's
// --replay-rows-per-step): the step time of --streams decoding requests alone, and with R rows
// of an arriving prompt's replay in the same step, for each R of --rows; the ratio to R = 0 is
// the running streams' inter-token latency while prompts arrive, on the decode node's own cores
// (bench/run_split_bench.sh measures the whole cluster, whose prefill node shares them here).
//
//   baton_replay_step_bench --model DIR [--streams 8] [--rows 0,16,64,256,512]
//                           [--prompt-len 2048] [--steps 20]
#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <random>

#include "CLI/CLI.hpp"
#include "baton/common/parse.h"
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

int Fail(const absl::Status& status) {
  std::cerr << "baton_replay_step_bench: " << status << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"decode step time with replay pieces beside the running streams"};
  std::string model_dir, rows_text = "0,16,64,256,512";
  int64_t streams = 8, prompt_len = 2048, steps = 20;
  app.add_option("--model", model_dir, "Model directory")->required();
  app.add_option("--streams", streams, "Requests decoding in every step");
  app.add_option("--rows", rows_text, "Replay rows per step, a list");
  app.add_option("--prompt-len", prompt_len, "The arriving prompt's tokens (compact, K = C)");
  app.add_option("--steps", steps, "Steps timed per setting (the median is reported)");
  CLI11_PARSE(app, argc, argv);
  absl::StatusOr<std::vector<int64_t>> rows = baton::ParseIntList(rows_text, "--rows");
  if (!rows.ok()) return Fail(rows.status());

  auto full = LoadEngine(model_dir);
  if (!full.ok()) return Fail(full.status());
  auto producers = LoadEngine(model_dir, Device::kCpu, WeightType::kFp32, HeldLayers::kProducers);
  if (!producers.ok()) return Fail(producers.status());
  Engine& engine = **full;
  const baton::ModelConfig& c = engine.config();
  const int64_t V = c.vocab_size, d = c.hidden_size;

  // The running streams: 64-token prompts.
  std::vector<std::unique_ptr<SequenceState>> running;
  for (int64_t i = 0; i < streams; ++i) {
    running.push_back(std::make_unique<SequenceState>(engine.state_layout()));
    auto done = engine.Prefill(Tokens(64, V, i), {}, *running.back());
    if (!done.ok()) return Fail(done.status());
  }
  std::vector<std::vector<float>> logits(streams, std::vector<float>(V));
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
      std::vector<DecodeItem> items;
      for (int64_t i = 0; i < streams; ++i) {
        items.push_back({.state = running[i].get(), .token = 7, .logits = logits[i].data()});
      }
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
      if (absl::Status s = engine.Step(items, replay); !s.ok()) return Fail(s);
      if (step >= 2) {
        times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      }
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    if (r == 0) alone_ms = median;
    out.push_back({{"replay_rows", std::min(r, replay_rows)},
                   {"step_ms", median},
                   {"ratio_to_alone", alone_ms > 0 ? median / alone_ms : 0}});
  }
  std::cout << nlohmann::json{{"streams", streams},
                              {"prompt_len", prompt_len},
                              {"replay_range_rows", replay_rows},
                              {"steps", out}}
                   .dump()
            << "\n";
  return 0;
}
