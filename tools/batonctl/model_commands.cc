// `batonctl make-model` (deterministic generated models) and `batonctl forward` (one prompt
// through the engine on the CPU backend, or with --device cuda on the CUDA one: the interface
// outside checks use, DESIGN section 3).
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "baton/common/options.h"
#include "baton/common/parse.h"
#include "baton/model/engine_factory.h"
#include "baton/model/model_factory.h"
#include "baton/model/split.h"
#include "baton/node/node_main.h"
#include "commands.h"
#include "nlohmann/json.hpp"

namespace baton::tools {
namespace {

struct MakeModelOptions {
  std::string preset = "tiny";
  uint64_t seed = 0;
  std::string out;
  std::string dtype = "f32";
  std::string tokenizer;  // a folder whose tokenizer files the model gets
};

int RunMakeModel(const MakeModelOptions& o) {
  absl::StatusOr<ModelConfig> config = model::PresetConfig(o.preset);
  if (!config.ok()) {
    return ReportError("make-model", absl::InvalidArgumentError(
                                         absl::StrCat("--preset: ", config.status().message())));
  }
  if (o.dtype != "f32" && o.dtype != "bf16") {
    return ReportError(
        "make-model", absl::InvalidArgumentError(
                          absl::StrCat("--dtype: '", o.dtype, "' is unknown; allowed: f32, bf16")));
  }
  if (!o.tokenizer.empty() &&
      !std::filesystem::exists(std::filesystem::path(o.tokenizer) / "tokenizer.model")) {
    return ReportError("make-model",
                       absl::NotFoundError(absl::StrCat("--tokenizer: ", o.tokenizer,
                                                        "/tokenizer.model does not exist")));
  }
  const model::Dtype dtype = o.dtype == "f32" ? model::Dtype::kF32 : model::Dtype::kBF16;
  if (absl::Status s = model::MakeModel(*config, o.seed, o.out, dtype); !s.ok()) {
    return ReportError("make-model", s);
  }
  if (!o.tokenizer.empty()) {
    if (absl::Status s = model::CopyTokenizerFiles(o.tokenizer, o.out); !s.ok()) {
      return ReportError("make-model", s);
    }
  }
  absl::StatusOr<model::CedWeights> loaded = model::LoadCedWeights(o.out);
  if (!loaded.ok()) return ReportError("make-model", loaded.status());
  std::cout << "wrote " << o.preset << " model (seed " << o.seed << ") to " << o.out
            << "\nfingerprint " << loaded->fingerprint << "\n";
  return kExitOk;
}

struct ForwardOptions {
  std::string model_dir;
  std::string tokens;
  std::string mode = "off";
  int64_t keep = 0;
  int64_t chunk_size = 0;
  int64_t valid_start = 0;
  int64_t decode = 0;
  model::Split split = model::Split::kPrefillAll;
  int64_t replay_rows_per_step = 0;
  model::DeviceFlags device;
  bool json = false;
};

// The prompt through the replay-on-decode split as its two nodes run it: an engine holding the
// producers only prefills into boundary rows; the state moves (block KV and producer rings, by
// way of host memory, as a transfer would); `full` replays the consumer layers over the rows,
// `rows_per_step` a step (0: all in one), into `state`. The result rows are the replayed rows,
// [replay_begin, L). `prefill_weight_bytes` receives the producers engine's weight bytes.
absl::StatusOr<model::PrefillResult> ForwardReplayOnDecode(
    const ForwardOptions& o, model::Engine& full, std::span<const int32_t> tokens,
    model::PrefillOptions options, model::SequenceState& state, int64_t& prefill_weight_bytes) {
  absl::StatusOr<std::unique_ptr<model::Engine>> producers =
      model::LoadEngineOnDevice(o.model_dir, o.device, model::HeldLayers::kProducers);
  if (!producers.ok()) return producers.status();
  prefill_weight_bytes = (*producers)->weight_bytes();
  const ModelConfig& c = full.config();
  const int64_t L = static_cast<int64_t>(tokens.size()), d = c.hidden_size, V = c.vocab_size;
  absl::StatusOr<model::TruncationSpec> spec =
      model::ReplaySpec(c, L, options.mode, options.keep, options.s_valid);
  if (!spec.ok()) return spec.status();
  std::vector<float> boundary(
      model::BoundaryRowCount(L, options.mode, options.keep, options.s_valid) * d);
  options.result_logits = false;
  options.boundary_rows = boundary;
  absl::StatusOr<std::unique_ptr<model::SequenceState>> prefill_state = (*producers)->NewState();
  if (!prefill_state.ok()) return prefill_state.status();
  absl::StatusOr<model::PrefillResult> prefilled =
      (*producers)->Prefill(tokens, options, **prefill_state);
  if (!prefilled.ok()) return prefilled.status();

  model::SequenceState host(full.state_layout());
  for (model::SequenceState* to : {&host, &state}) {
    if (absl::Status s = to->EnsurePages(L); !s.ok()) return s;
  }
  if (absl::Status s = (*producers)->StageOut(model::StateCopies(**prefill_state, host, L));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = full.StageIn(model::StateCopies(host, state, L)); !s.ok()) return s;
  state.length = L;
  state.s_valid = options.s_valid;

  model::PrefillResult result;
  result.consumer_rows = prefilled->consumer_rows;
  const int64_t begin = spec->s_valid;
  const int64_t step_rows = o.replay_rows_per_step > 0 ? o.replay_rows_per_step : L - begin;
  for (int64_t q = begin; q < L; q += step_rows) {
    model::ReplayItem item{.state = &state,
                           .spec = *spec,
                           .q_start = q,
                           .rows = std::min(step_rows, L - q),
                           .boundary = boundary.data() + (q - begin) * d,
                           .all_logits = true};
    const size_t old = result.logits.size();
    result.logits.resize(old + item.rows * V);
    item.logits = result.logits.data() + old;
    if (absl::Status s = full.Step({}, {&item, 1}); !s.ok()) return s;
    for (int64_t r = 0; r < item.rows; ++r) result.positions.push_back(static_cast<int32_t>(q + r));
  }
  return result;
}

// --tokens: comma-separated ids, each in [0, INT32_MAX].
absl::StatusOr<std::vector<int32_t>> ParseTokenIds(const std::string& text) {
  absl::StatusOr<std::vector<int64_t>> ids = ParseIntList(text, "--tokens");
  if (!ids.ok()) return ids.status();
  std::vector<int32_t> tokens;
  for (int64_t id : *ids) {
    if (id < 0 || id > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tokens: ", id, " is not a valid token id (>= 0)"));
    }
    tokens.push_back(static_cast<int32_t>(id));
  }
  return tokens;
}

// `n` greedy tokens after the prompt whose last row's logits are `logits`.
absl::StatusOr<std::vector<int32_t>> GreedyDecode(model::Engine& engine,
                                                  model::SequenceState& state,
                                                  std::vector<float> logits, int64_t n) {
  std::vector<int32_t> generated = {model::Argmax(logits)};
  for (int64_t step = 1; step < n; ++step) {
    const model::DecodeItem item{
        .state = &state, .token = generated.back(), .logits = logits.data()};
    if (absl::Status s = engine.Decode({&item, 1}); !s.ok()) return s;
    generated.push_back(model::Argmax(logits));
  }
  return generated;
}

int RunForward(const ForwardOptions& o) {
  absl::StatusOr<std::vector<int32_t>> ids = ParseTokenIds(o.tokens);
  if (!ids.ok()) return ReportError("forward", ids.status());
  const std::vector<int32_t>& tokens = *ids;
  absl::StatusOr<model::TruncationMode> mode = model::ParseTruncationMode(o.mode, "--mode");
  if (!mode.ok()) return ReportError("forward", mode.status());
  if (o.decode < 0) {
    return ReportError("forward", absl::InvalidArgumentError(
                                      absl::StrCat("--decode is ", o.decode, "; it must be >= 0")));
  }
  if (o.replay_rows_per_step < 0) {
    return ReportError("forward", absl::InvalidArgumentError(absl::StrCat(
                                      "--replay-rows-per-step is ", o.replay_rows_per_step,
                                      "; it must be >= 0 (0: the whole replay in one step)")));
  }
  absl::StatusOr<std::unique_ptr<model::Engine>> engine =
      model::LoadEngineOnDevice(o.model_dir, o.device);
  if (!engine.ok()) return ReportError("forward", engine.status());
  absl::StatusOr<std::unique_ptr<model::SequenceState>> state = (*engine)->NewState();
  if (!state.ok()) return ReportError("forward", state.status());
  model::PrefillOptions options{.mode = *mode,
                                .keep = o.keep,
                                .s_valid = o.valid_start,
                                .chunk_size = o.chunk_size,
                                .result_logits = true};
  int64_t prefill_weight_bytes = (*engine)->weight_bytes();
  absl::StatusOr<model::PrefillResult> result =
      o.split == model::Split::kReplayOnDecode
          ? ForwardReplayOnDecode(o, **engine, tokens, options, **state, prefill_weight_bytes)
          : (*engine)->Prefill(tokens, options, **state);
  if (!result.ok()) return ReportError("forward", result.status());

  const int64_t V = (*engine)->config().vocab_size;
  std::vector<int32_t> generated;
  if (o.decode > 0) {
    absl::StatusOr<std::vector<int32_t>> greedy =
        GreedyDecode(**engine, **state, {result->logits.end() - V, result->logits.end()}, o.decode);
    if (!greedy.ok()) return ReportError("forward", greedy.status());
    generated = *std::move(greedy);
  }
  if (o.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (size_t r = 0; r < result->positions.size(); ++r) {
      rows.push_back(
          std::vector<float>(result->logits.begin() + r * V, result->logits.begin() + (r + 1) * V));
    }
    std::cout << nlohmann::json{{"positions", result->positions},
                                {"logits", std::move(rows)},
                                {"tokens", generated},
                                {"split", model::SplitName(o.split)},
                                {"prefill_weight_bytes", prefill_weight_bytes},
                                {"weight_bytes", (*engine)->weight_bytes()}}
                     .dump()
              << "\n";
    return kExitOk;
  }
  std::cout << "prompt " << tokens.size() << " tokens, mode " << o.mode << ", split "
            << model::SplitName(o.split) << ", " << result->consumer_rows
            << " consumer rows per layer, " << result->positions.size()
            << " result rows, prefill weight bytes " << prefill_weight_bytes << " of "
            << (*engine)->weight_bytes() << "\nlast row argmax "
            << model::Argmax(
                   {result->logits.data() + result->logits.size() - V, static_cast<size_t>(V)})
            << "\n";
  if (!generated.empty()) {
    std::cout << "generated";
    for (int32_t t : generated) std::cout << " " << t;
    std::cout << "\n";
  }
  return kExitOk;
}

}  // namespace

Command AddMakeModelCommand(CLI::App& app) {
  auto o = std::make_shared<MakeModelOptions>();
  CLI::App* command = app.add_subcommand("make-model", "Write a deterministic generated model");
  command->add_option(
      "--preset", o->preset,
      "tiny (tests), small (benchmarks) or small-shared (small with one block-KV source)");
  command->add_option("--seed", o->seed, "Seed of the weight stream");
  command->add_option("--out", o->out, "Model directory to write")->required();
  command->add_option("--dtype", o->dtype, "Weight dtype in the file: f32 or bf16");
  command
      ->add_option("--tokenizer", o->tokenizer,
                   "Folder whose tokenizer.model (and tokenizer_config.json, "
                   "generation_config.json) the model gets, e.g. <build>/tokenizer for small")
      ->check(CLI::ExistingDirectory);
  return {command, [o] { return RunMakeModel(*o); }};
}

Command AddForwardCommand(CLI::App& app) {
  auto o = std::make_shared<ForwardOptions>();
  CLI::App* command = app.add_subcommand("forward", "Run one prompt through the forward pass");
  command->add_option("--model", o->model_dir, "Model directory")->required();
  command->add_option("--tokens", o->tokens, "Prompt token ids, comma-separated")->required();
  command->add_option("--mode", o->mode, "Truncation: off (default), mask or compact");
  command->add_option("--keep", o->keep, "Retained consumer rows K (>= C when truncated)");
  command->add_option("--chunk-size", o->chunk_size, "Prefill chunk size (0: one chunk)");
  command->add_option("--valid-start", o->valid_start,
                      "s_valid: consumers start here, as after a prefix hit of V tokens");
  command->add_option("--decode", o->decode, "Greedy tokens to generate after the prompt");
  AddEnumOption(*command, "--split", o->split,
                {model::Split::kPrefillAll, model::Split::kReplayOnDecode}, model::SplitName,
                "prefill-all (default) or replay-on-decode: the prompt's producers on an engine "
                "holding only them, the consumers replayed over its boundary rows");
  command->add_option("--replay-rows-per-step", o->replay_rows_per_step,
                      "replay-on-decode: boundary rows replayed per step (0: all in one)");
  node::AddDeviceFlags(*command, o->device);
  command->add_flag("--json", o->json, "Print one JSON object");
  return {command, [o] { return RunForward(*o); }, &o->device};
}

}  // namespace baton::tools
