#include "baton/launcher/model_source.h"

#include <cstdint>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "baton/common/model_config.h"
#include "baton/model/model_factory.h"

namespace baton::launcher {

namespace {

namespace fs = std::filesystem;

constexpr char kTrainedDefault[] = "ced-brown-shared";

// The generated model takes text: the tokenizer scripts/setup.sh trains (4,096 pieces, the
// small preset's vocabulary). A preset of a smaller vocabulary (tiny) cannot take it and is
// served by token ids only.
constexpr int64_t kDefaultTokenizerPieces = 4096;

// The trained default's folder, or empty when it is not installed.
std::string FindTrainedDefault(const Layout& layout) {
  for (const fs::path& p : layout.ShippedPlaces("models")) {
    if (fs::exists(p / kTrainedDefault / "model.safetensors")) {
      return (p / kTrainedDefault).string();
    }
  }
  return "";
}

// The folder of the default tokenizer (its tokenizer.model), or empty when there is none.
std::string FindDefaultTokenizer(const Layout& layout) {
  for (const fs::path& p : layout.ShippedPlaces("tokenizer")) {
    if (fs::exists(p / "tokenizer.model")) return p.string();
  }
  return "";
}

// Copies --tokenizer's files, or the default tokenizer's, into the generated model at
// `model_dir`, unless it has a tokenizer already or its vocabulary is too small for one.
absl::Status GiveTokenizer(const ModelConfig& config, const std::string& preset,
                           const std::string& model_dir, std::string tokenizer_dir,
                           const Layout& layout) {
  if (config.vocab_size < kDefaultTokenizerPieces) {
    std::cout << "baton up: the " << preset << " preset's vocabulary (" << config.vocab_size
              << ") is smaller than the default tokenizer's " << kDefaultTokenizerPieces
              << " pieces; it is served by token ids only" << std::endl;
    return absl::OkStatus();
  }
  if (fs::exists(fs::path(model_dir) / "tokenizer.model")) return absl::OkStatus();
  if (tokenizer_dir.empty()) tokenizer_dir = FindDefaultTokenizer(layout);
  if (tokenizer_dir.empty()) {
    return absl::NotFoundError(
        "no tokenizer for the generated model (scripts/setup.sh builds one into "
        "<build>/tokenizer); pass --tokenizer DIR");
  }
  if (absl::Status s = model::CopyTokenizerFiles(tokenizer_dir, model_dir); !s.ok()) {
    return absl::AbortedError(s.message());
  }
  return absl::OkStatus();
}

// Generates `preset` into the data dir, unless an earlier run did, and gives it a tokenizer;
// the model's folder.
absl::StatusOr<std::string> GeneratePreset(const std::string& preset,
                                           const std::string& tokenizer_dir, const Layout& layout) {
  absl::StatusOr<ModelConfig> config = model::PresetConfig(preset);
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--preset: ", config.status().message()));
  }
  // <data-dir>/model holds the small preset, as before --preset existed.
  const std::string dir =
      (layout.data_dir / (preset == "small" ? "model" : "model-" + preset)).string();
  if (!fs::exists(fs::path(dir) / "model.safetensors")) {
    std::cout << "baton up: generating the " << preset << " model into " << dir << std::endl;
    if (absl::Status s = model::MakeModel(*config, 0, dir); !s.ok()) {
      return absl::AbortedError(s.message());
    }
  }
  if (absl::Status s = GiveTokenizer(*config, preset, dir, tokenizer_dir, layout); !s.ok()) {
    return s;
  }
  return dir;
}

// The default model keeps the name baton up has always served it under, whichever weights it
// is (the name is the API; a rollout changes weights behind it); a generated preset is
// baton-<preset> (the small preset is the default's old self, baton-small); --model keeps the
// name its config gives.
std::vector<std::string> ServedNameFlags(bool is_default, const std::string& preset) {
  if (is_default) return {"--served-model-name", "baton-small"};
  if (!preset.empty()) return {"--served-model-name", "baton-" + preset};
  return {};
}

// The router serves the OpenAI API when it is asked for and the model takes text.
bool ServesHttp(int http_port, const std::string& model_dir) {
  const bool http = http_port >= 0 && fs::exists(fs::path(model_dir) / "tokenizer.model");
  if (http_port >= 0 && !http) {
    std::cout << "baton up: no HTTP API: " << model_dir
              << " has no tokenizer.model (the OpenAI API takes text)" << std::endl;
  }
  return http;
}

}  // namespace

absl::StatusOr<ServedModel> ResolveModel(const LaunchOptions& options, const Layout& layout) {
  if (!options.model_dir.empty() && !options.preset.empty()) {
    return absl::InvalidArgumentError("--model and --preset: give one of them");
  }
  const bool is_default = options.model_dir.empty() && options.preset.empty();
  ServedModel served;
  served.dir = options.model_dir;
  std::string preset = options.preset;
  if (is_default) {
    served.dir = FindTrainedDefault(layout);
    if (!served.dir.empty()) {
      std::cout << "baton up: serving the trained model " << served.dir << std::endl;
    } else {
      std::cout << "baton up: the trained model " << kTrainedDefault << " is not installed beside "
                << layout.bin.string() << "; generating the small preset" << std::endl;
      preset = "small";
    }
  }
  if (!preset.empty()) {
    absl::StatusOr<std::string> dir = GeneratePreset(preset, options.tokenizer_dir, layout);
    if (!dir.ok()) return dir.status();
    served.dir = *dir;
  }
  served.name_flags = ServedNameFlags(is_default, preset);
  served.http = ServesHttp(options.http_port, served.dir);
  return served;
}

}  // namespace baton::launcher
