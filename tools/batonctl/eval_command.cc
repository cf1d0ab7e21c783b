// batonctl eval: a text's negative log-likelihood per token under a truncation, through the
// serving path (prefill, then decode steps).
//
// Each non-empty line of --text is a document; its ids (bos first) are concatenated into one
// stream, which is cut into windows of --context tokens (a tail shorter than a window is left
// out). Per window, the first --prompt-len tokens are the prompt, prefilled with --mode, --keep
// and --chunk-size as a prefill node would; the rest of the window is fed token by token
// through Decode (teacher forcing). Every token after the prompt is scored: the first by the
// prompt's last row, the others by the decode steps. tools/train/train.py reports its
// validation figures over the same windows, so the two agree.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "baton/common/ced_rules.h"
#include "baton/model/engine_factory.h"
#include "baton/node/node_main.h"
#include "baton/text/tokenizer.h"
#include "commands.h"
#include "document_tokens.h"
#include "nlohmann/json.hpp"

namespace baton::tools {
namespace {

struct EvalOptions {
  std::string model_dir;
  std::string text_file;
  std::string mode = "off";
  int64_t keep = -1;  // -1: C when truncated, 0 in off
  int64_t chunk_size = 0;
  int64_t context = 512;
  int64_t prompt_len = -1;  // -1: half the context
  int64_t batch = 16;
  model::DeviceFlags device;
  bool json = false;
};

// -log softmax(logits)[target], in double.
double Nll(std::span<const float> logits, int32_t target) {
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(l - max);
  return std::log(sum) + max - logits[target];
}

// Scores `batch`, windows of `context` tokens one after another, into `nll` and `scored`: each
// window's prompt of `prompt_len` tokens is prefilled (its last row scores the next token),
// then the windows decode together along the text, position p scoring token p + 1.
absl::Status ScoreBatch(model::Engine& ced, std::span<const int32_t> batch, int64_t context,
                        int64_t prompt_len, const model::PrefillOptions& options, double& nll,
                        int64_t& scored) {
  const int64_t V = ced.config().vocab_size;
  const int64_t n = static_cast<int64_t>(batch.size()) / context;
  std::vector<std::unique_ptr<model::SequenceState>> states;
  std::vector<std::vector<float>> logits(n, std::vector<float>(V));
  auto token = [&](int64_t w, int64_t position) { return batch[w * context + position]; };
  for (int64_t w = 0; w < n; ++w) {
    absl::StatusOr<std::unique_ptr<model::SequenceState>> state = ced.NewState();
    if (!state.ok()) return state.status();
    absl::StatusOr<model::PrefillResult> result =
        ced.Prefill(batch.subspan(w * context, prompt_len), options, **state);
    if (!result.ok()) return result.status();
    nll += Nll(std::span<const float>(result->logits).last(V), token(w, prompt_len));
    ++scored;
    states.push_back(*std::move(state));
  }
  for (int64_t p = prompt_len; p + 1 < context; ++p) {
    std::vector<model::DecodeItem> items;
    for (int64_t w = 0; w < n; ++w) {
      items.push_back({.state = states[w].get(), .token = token(w, p), .logits = logits[w].data()});
    }
    if (absl::Status s = ced.Decode(items); !s.ok()) return s;
    for (int64_t w = 0; w < n; ++w) {
      nll += Nll(logits[w], token(w, p + 1));
      ++scored;
    }
  }
  return absl::OkStatus();
}

int RunEval(const EvalOptions& o) {
  absl::StatusOr<model::TruncationMode> mode = model::ParseTruncationMode(o.mode, "--mode");
  if (!mode.ok()) return ReportError("eval", mode.status());
  absl::StatusOr<std::unique_ptr<model::Engine>> loaded =
      model::LoadEngineOnDevice(o.model_dir, o.device);
  if (!loaded.ok()) return ReportError("eval", loaded.status());
  model::Engine& ced = **loaded;
  const ModelConfig& config = ced.config();
  const int64_t C = config.ring_capacity();
  const bool truncated = *mode != model::TruncationMode::kOff;
  const int64_t keep = o.keep >= 0 ? o.keep : (truncated ? C : 0);
  if (absl::Status st = CheckKeep(truncated, keep, C, "--keep"); !st.ok()) {
    return ReportError("eval", st);
  }
  if (o.context < 2 || o.context > config.max_position_embeddings) {
    return ReportError("eval", absl::InvalidArgumentError(absl::StrCat(
                                   "--context is ", o.context, "; it must be in [2, ",
                                   config.max_position_embeddings, "] (max_position_embeddings)")));
  }
  const int64_t prompt_len = o.prompt_len >= 0 ? o.prompt_len : o.context / 2;
  if (prompt_len < 1 || prompt_len >= o.context) {
    return ReportError("eval", absl::InvalidArgumentError(absl::StrCat(
                                   "--prompt-len is ", prompt_len, "; it must be in [1, ",
                                   o.context - 1, "] (below --context)")));
  }
  if (o.chunk_size < 0) {
    return ReportError("eval", absl::InvalidArgumentError(absl::StrCat(
                                   "--chunk-size is ", o.chunk_size, "; it must be >= 0")));
  }
  if (o.batch < 1 || o.batch > 256) {
    return ReportError("eval", absl::InvalidArgumentError(absl::StrCat(
                                   "--batch is ", o.batch, "; it must be in [1, 256]")));
  }
  absl::StatusOr<std::unique_ptr<text::Tokenizer>> tokenizer =
      text::Tokenizer::Load(o.model_dir, config.vocab_size);
  if (!tokenizer.ok()) return ReportError("eval", tokenizer.status());
  absl::StatusOr<std::vector<int32_t>> stream = ReadDocumentTokens(o.text_file, **tokenizer);
  if (!stream.ok()) return ReportError("eval", stream.status());
  const int64_t windows = static_cast<int64_t>(stream->size()) / o.context;
  if (windows == 0) {
    return ReportError("eval", absl::InvalidArgumentError(absl::StrCat(
                                   "--text: ", o.text_file, " gives ", stream->size(),
                                   " tokens, fewer than one window of --context ", o.context)));
  }

  const model::PrefillOptions options{.mode = *mode, .keep = keep, .chunk_size = o.chunk_size};
  double nll = 0;
  int64_t scored = 0;
  for (int64_t first = 0; first < windows; first += o.batch) {
    const int64_t n = std::min(o.batch, windows - first);
    const std::span<const int32_t> batch(stream->data() + first * o.context, n * o.context);
    if (absl::Status s = ScoreBatch(ced, batch, o.context, prompt_len, options, nll, scored);
        !s.ok()) {
      return ReportError("eval", s);
    }
  }
  const double mean = nll / scored;
  if (o.json) {
    std::cout << nlohmann::json{{"tokens", scored},
                                {"nll", mean},
                                {"perplexity", std::exp(mean)},
                                {"windows", windows},
                                {"context", o.context},
                                {"prompt_len", prompt_len},
                                {"mode", o.mode},
                                {"keep", keep},
                                {"chunk_size", o.chunk_size}}
                     .dump()
              << "\n";
  } else {
    std::cout << absl::StrFormat(
        "%d tokens scored in %d windows of %d (prompt %d, %s, keep %d): nll %.6f perplexity "
        "%.3f\n",
        scored, windows, o.context, prompt_len, o.mode, keep, mean, std::exp(mean));
  }
  return kExitOk;
}

}  // namespace

Command AddEvalCommand(CLI::App& app) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* command = app.add_subcommand(
      "eval", "A text's negative log-likelihood per token and perplexity under a truncation");
  command->add_option("--model", o->model_dir, "Model directory (with tokenizer.model)")
      ->required();
  command->add_option("--text", o->text_file, "Text file, one document a line")->required();
  command->add_option("--mode", o->mode, "Truncation of each window's prompt: off, mask, compact");
  command->add_option("--keep", o->keep, "Retained consumer rows K (default: C when truncated)");
  command->add_option("--chunk-size", o->chunk_size, "Prefill chunk size (0: one chunk)");
  command->add_option("--context", o->context, "Tokens per window (default 512)");
  command->add_option("--prompt-len", o->prompt_len,
                      "Prompt tokens per window; the rest are scored (default: half the window)");
  command->add_option("--batch", o->batch, "Windows decoded together (default 16)");
  node::AddDeviceFlags(*command, o->device);
  command->add_flag("--json", o->json, "Print one JSON object");
  return {command, [o] { return RunEval(*o); }, &o->device};
}

}  // namespace baton::tools
