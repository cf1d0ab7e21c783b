// `batonctl make-model` (deterministic generated models) and `batonctl forward` (one prompt
// through the CPU forward pass, or with --device cuda the CUDA one: the interface outside
// checks use, DESIGN section 3).
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "baton/common/parse.h"
#include "baton/model/ced_model.h"
#include "baton/model/model_factory.h"
#if BATON_HAS_CUDA
#include "baton/kernels/cuda/context.h"
#include "baton/model/cuda/cuda_ced_model.h"
#endif
#include "commands.h"
#include "nlohmann/json.hpp"

namespace baton::tools {
namespace {

struct MakeModelOptions {
  std::string preset = "tiny";
  uint64_t seed = 0;
  std::string out;
  std::string dtype = "f32";
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
  const model::Dtype dtype = o.dtype == "f32" ? model::Dtype::kF32 : model::Dtype::kBF16;
  if (absl::Status s = model::MakeModel(*config, o.seed, o.out, dtype); !s.ok()) {
    return ReportError("make-model", s);
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
  std::string device = "cpu";
  bool json = false;
};

// One backend's prefill and greedy decode steps over one request's state.
struct ForwardBackend {
  ModelConfig config;
  std::function<absl::StatusOr<model::PrefillResult>(std::span<const int32_t>,
                                                     const model::PrefillOptions&)>
      prefill;
  std::function<absl::Status(int32_t token, float* logits)> decode;
};

absl::StatusOr<ForwardBackend> CpuBackend(const std::string& model_dir) {
  absl::StatusOr<std::unique_ptr<model::CedModel>> loaded = model::CedModel::Load(model_dir);
  if (!loaded.ok()) return loaded.status();
  std::shared_ptr<const model::CedModel> ced = *std::move(loaded);
  auto state = std::make_shared<model::SequenceState>(ced->state_layout());
  return ForwardBackend{
      .config = ced->config(),
      .prefill =
          [ced, state](std::span<const int32_t> tokens, const model::PrefillOptions& options) {
            return ced->Prefill(tokens, options, *state);
          },
      .decode =
          [ced, state](int32_t token, float* logits) {
            const model::DecodeItem item{.state = state.get(), .token = token, .logits = logits};
            return ced->Decode({&item, 1});
          }};
}

// A machine or build without CUDA cannot honour the flag: INVALID_ARGUMENT, so exit status 2.
absl::StatusOr<ForwardBackend> CudaBackend(const std::string& model_dir) {
#if BATON_HAS_CUDA
  if (kernels::cuda::DeviceCount() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device cuda: no CUDA device: ", kernels::cuda::NoDeviceReason()));
  }
  absl::StatusOr<std::unique_ptr<model::cuda::CudaCedModel>> loaded =
      model::cuda::CudaCedModel::Load(model_dir);
  if (!loaded.ok()) return loaded.status();
  std::shared_ptr<model::cuda::CudaCedModel> ced = *std::move(loaded);
  absl::StatusOr<std::unique_ptr<model::cuda::CudaSequenceState>> made = ced->NewState();
  if (!made.ok()) return made.status();
  std::shared_ptr<model::cuda::CudaSequenceState> state = *std::move(made);
  return ForwardBackend{
      .config = ced->config(),
      // The state's destructor uses the model's context: it captures the model too.
      .prefill =
          [ced, state](std::span<const int32_t> tokens, const model::PrefillOptions& options) {
            return ced->Prefill(tokens, options, *state);
          },
      .decode =
          [ced, state](int32_t token, float* logits) {
            const model::cuda::CudaDecodeItem item{
                .state = state.get(), .token = token, .logits = logits};
            return ced->Decode({&item, 1});
          }};
#else
  return absl::InvalidArgumentError("--device cuda: this build has no CUDA kernels");
#endif
}

int RunForward(const ForwardOptions& o) {
  absl::StatusOr<std::vector<int64_t>> ids = ParseIntList(o.tokens, "--tokens");
  if (!ids.ok()) return ReportError("forward", ids.status());
  std::vector<int32_t> tokens;
  for (int64_t id : *ids) {
    if (id < 0 || id > INT32_MAX) {
      return ReportError("forward", absl::InvalidArgumentError(absl::StrCat(
                                        "--tokens: ", id, " is not a valid token id (>= 0)")));
    }
    tokens.push_back(static_cast<int32_t>(id));
  }
  absl::StatusOr<model::TruncationMode> mode = model::ParseTruncationMode(o.mode, "--mode");
  if (!mode.ok()) return ReportError("forward", mode.status());
  if (o.decode < 0) {
    return ReportError("forward", absl::InvalidArgumentError(
                                      absl::StrCat("--decode is ", o.decode, "; it must be >= 0")));
  }
  if (o.device != "cpu" && o.device != "cuda") {
    return ReportError(
        "forward", absl::InvalidArgumentError(
                       absl::StrCat("--device: '", o.device, "' is unknown; allowed: cpu, cuda")));
  }
  absl::StatusOr<ForwardBackend> backend =
      o.device == "cuda" ? CudaBackend(o.model_dir) : CpuBackend(o.model_dir);
  if (!backend.ok()) return ReportError("forward", backend.status());
  model::PrefillOptions options{.mode = *mode,
                                .keep = o.keep,
                                .s_valid = o.valid_start,
                                .chunk_size = o.chunk_size,
                                .result_logits = true};
  absl::StatusOr<model::PrefillResult> result = backend->prefill(tokens, options);
  if (!result.ok()) return ReportError("forward", result.status());

  const int64_t V = backend->config.vocab_size;
  std::vector<int32_t> generated;
  if (o.decode > 0) {
    std::vector<float> logits(result->logits.end() - V, result->logits.end());
    generated.push_back(model::Argmax(logits));
    for (int64_t step = 1; step < o.decode; ++step) {
      if (absl::Status s = backend->decode(generated.back(), logits.data()); !s.ok()) {
        return ReportError("forward", s);
      }
      generated.push_back(model::Argmax(logits));
    }
  }
  if (o.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (size_t r = 0; r < result->positions.size(); ++r) {
      rows.push_back(
          std::vector<float>(result->logits.begin() + r * V, result->logits.begin() + (r + 1) * V));
    }
    std::cout << nlohmann::json{{"positions", result->positions},
                                {"logits", std::move(rows)},
                                {"tokens", generated}}
                     .dump()
              << "\n";
    return kExitOk;
  }
  std::cout << "prompt " << tokens.size() << " tokens, mode " << o.mode << ", "
            << result->consumer_rows << " consumer rows per layer, " << result->positions.size()
            << " result rows\nlast row argmax "
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
  command->add_option("--preset", o->preset, "tiny (tests) or small (benchmarks)");
  command->add_option("--seed", o->seed, "Seed of the weight stream");
  command->add_option("--out", o->out, "Model directory to write")->required();
  command->add_option("--dtype", o->dtype, "Weight dtype in the file: f32 or bf16");
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
  command->add_option("--device", o->device,
                      "cpu (default) or cuda (needs a CUDA build and a device)");
  command->add_flag("--json", o->json, "Print one JSON object");
  return {command, [o] { return RunForward(*o); }};
}

}  // namespace baton::tools
