// `batonctl generate`: a streaming client of baton.v1.Generation.
#include <chrono>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "baton/common/ced_rules.h"
#include "baton/common/parse.h"
#include "baton/common/rpc.h"
#include "baton/v1/generation.grpc.pb.h"
#include "client.h"
#include "commands.h"
#include "nlohmann/json.hpp"

namespace baton::tools {
namespace {

struct GenerateOptions {
  ClientOptions client;
  std::string tokens;
  std::string prompt;
  uint32_t max_tokens = 16;
  float temperature = 0;
  uint32_t top_k = 0;
  float top_p = 1;
  uint64_t seed = 0;
  std::string stop;
  std::vector<std::string> stop_strings;
  bool ids = false;  // print token ids, not text
  bool ignore_eos = false;
  bool logprobs = false;
  bool prompt_logprobs = false;
  std::string mode;
  int64_t keep = 0;
  std::string cache_salt;
  std::string model;
  std::string request_id;
  int64_t timeout_ms = 0;
  bool json = false;
  std::string speculative;  // "": the decode nodes' default
  uint32_t speculative_tokens = 0;
};

std::string FinishName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_EOS:
      return "eos";
    default:
      return "unspecified";
  }
}

// The request the flags describe; an error names the flag. With `bytes_as_ids`, each byte
// of --prompt is a token id (a model without a tokenizer).
absl::StatusOr<v1::GenerateRequest> BuildRequest(const GenerateOptions& o, bool bytes_as_ids) {
  v1::GenerateRequest request;
  if (!o.tokens.empty()) {
    auto ids = ParseIntList(o.tokens, "--tokens");
    if (!ids.ok()) return ids.status();
    for (int64_t id : *ids) request.add_prompt_token_ids(static_cast<int32_t>(id));
  } else if (bytes_as_ids) {
    // A model without a tokenizer: each UTF-8 byte is one token id (0..255).
    for (unsigned char byte : o.prompt) request.add_prompt_token_ids(byte);
  } else {
    request.set_prompt_text(o.prompt);  // the router's tokenizer encodes it
  }
  for (const std::string& stop : o.stop_strings) request.mutable_sampling()->add_stop(stop);
  auto* sampling = request.mutable_sampling();
  sampling->set_max_tokens(o.max_tokens);
  sampling->set_temperature(o.temperature);
  sampling->set_top_k(o.top_k);
  sampling->set_top_p(o.top_p);
  sampling->set_seed(o.seed);
  sampling->set_ignore_eos(o.ignore_eos);
  if (!o.stop.empty()) {
    auto ids = ParseIntList(o.stop, "--stop");
    if (!ids.ok()) return ids.status();
    for (int64_t id : *ids) sampling->add_stop_token_ids(static_cast<int32_t>(id));
  }
  if (!o.mode.empty()) {
    absl::StatusOr<v1::TruncationMode> mode = ParseTruncationModeName(o.mode, "--mode");
    if (!mode.ok()) return mode.status();
    request.mutable_truncation()->set_mode(*mode);
    request.mutable_truncation()->set_keep(o.keep);
  }
  if (!o.speculative.empty()) {
    v1::Speculative method = v1::SPECULATIVE_DEFAULT;
    if (!v1::Speculative_Parse("SPECULATIVE_" + absl::AsciiStrToUpper(o.speculative), &method) ||
        method == v1::SPECULATIVE_DEFAULT) {
      return absl::InvalidArgumentError(absl::StrCat("--speculative: '", o.speculative,
                                                     "' is unknown; allowed: off, ngram, draft"));
    }
    sampling->set_speculative(method);
  }
  sampling->set_speculative_tokens(o.speculative_tokens);
  request.set_logprobs(o.logprobs);
  request.set_prompt_logprobs(o.prompt_logprobs);
  request.set_cache_salt(o.cache_salt);
  request.set_model(o.model);
  request.set_request_id(o.request_id);
  return request;
}

// The finished generation: --json's object, or the text's closing line.
void PrintGenerateResult(const GenerateOptions& o, const v1::GenerateResponse& last,
                         const std::vector<int32_t>& tokens, const std::string& text,
                         const std::vector<float>& logprobs,
                         const std::vector<float>& prompt_logprobs, double ttft_ms) {
  const v1::Usage& usage = last.usage();
  if (o.json) {
    nlohmann::json out = {{"tokens", tokens},
                          {"text", text},
                          {"finish_reason", FinishName(last.finish_reason())},
                          {"usage",
                           {{"prompt_tokens", usage.prompt_tokens()},
                            {"cached_tokens", usage.cached_tokens()},
                            {"replayed_rows", usage.replayed_rows()},
                            {"completion_tokens", usage.completion_tokens()},
                            {"accepted_draft_tokens", usage.accepted_draft_tokens()},
                            {"draft_tokens", usage.draft_tokens()}}},
                          {"ttft_ms", ttft_ms}};
    if (o.logprobs) out["logprobs"] = logprobs;
    if (o.prompt_logprobs) out["prompt_logprobs"] = prompt_logprobs;
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << "\nfinish " << FinishName(last.finish_reason()) << ", " << usage.prompt_tokens()
              << " prompt tokens (" << usage.cached_tokens() << " cached), "
              << usage.completion_tokens() << " completion tokens, ttft " << ttft_ms << " ms\n";
  }
}

int RunGenerate(const GenerateOptions& o, const CLI::App& command, bool bytes_as_ids = false) {
  absl::StatusOr<v1::GenerateRequest> built = BuildRequest(o, bytes_as_ids);
  if (!built.ok()) return ReportError("generate", built.status());
  const v1::GenerateRequest& request = *built;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = ClientChannel(o.client);
  if (!channel.ok()) return ReportError("generate", channel.status());
  auto stub = v1::Generation::NewStub(*channel);
  grpc::ClientContext context;
  Authenticate(o.client, context);
  if (o.timeout_ms > 0) {
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(o.timeout_ms));
  }
  const auto start = std::chrono::steady_clock::now();
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<float> logprobs, prompt_logprobs;
  // Text where the router has a tokenizer (it sends text for a text prompt), else ids.
  const bool print_text = !o.ids && !request.prompt_text().empty();
  double ttft_ms = -1;
  v1::GenerateResponse last;
  while (reader->Read(&response)) {
    if (ttft_ms < 0) {
      ttft_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count();
    }
    for (int i = 0; i < response.token_ids_size(); ++i) {
      tokens.push_back(response.token_ids(i));
      if (!o.json && !print_text) std::cout << response.token_ids(i) << " " << std::flush;
    }
    text += response.text();
    if (!o.json && print_text) std::cout << response.text() << std::flush;
    logprobs.insert(logprobs.end(), response.logprobs().begin(), response.logprobs().end());
    prompt_logprobs.insert(prompt_logprobs.end(), response.prompt_logprobs().begin(),
                           response.prompt_logprobs().end());
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) last = response;
  }
  const grpc::Status status = reader->Finish();
  if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT && !request.prompt_text().empty() &&
      tokens.empty() && status.error_message().rfind("prompt_text: no tokenizer", 0) == 0) {
    std::cerr << "batonctl generate: the router's model has no tokenizer; sending each byte of "
                 "--prompt as a token id\n";
    return RunGenerate(o, command, /*bytes_as_ids=*/true);
  }
  if (!status.ok()) {
    if (!o.json) std::cout << "\n";
    std::cerr << "batonctl generate: "
              << absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()))
              << ": " << status.error_message() << "\n";
    return status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? kExitBadInput : kExitFailure;
  }
  PrintGenerateResult(o, last, tokens, text, logprobs, prompt_logprobs, ttft_ms);
  return kExitOk;
}

}  // namespace

Command AddGenerateCommand(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* command = app.add_subcommand("generate", "Stream a generation from a baton router");
  AddClientFlags(*command, o->client);
  auto* tokens = command->add_option("--tokens", o->tokens, "Prompt token ids, comma-separated");
  auto* prompt = command->add_option(
      "--prompt", o->prompt,
      "Prompt text, encoded by the router's tokenizer; the text generated is printed (for a "
      "model without a tokenizer each UTF-8 byte is a token id, and ids are printed)");
  tokens->excludes(prompt);
  command->add_option("--max-tokens", o->max_tokens, "Completion tokens at most (default 16)");
  command->add_option("--temperature", o->temperature, "0: greedy");
  command->add_option("--top-k", o->top_k, "0: no top-k cut");
  command->add_option("--top-p", o->top_p, "1: no nucleus cut");
  command->add_option("--seed", o->seed, "Sampling seed");
  command->add_option("--stop", o->stop, "Stop token ids, comma-separated");
  command->add_option("--stop-string", o->stop_strings,
                      "A stop string (repeat for more): generation ends at the first, which the "
                      "text leaves out");
  command->add_flag("--ids", o->ids, "Print token ids instead of text");
  command->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the eos token");
  command->add_flag("--logprobs", o->logprobs, "Report each chosen token's log-probability");
  command->add_flag("--prompt-logprobs", o->prompt_logprobs,
                    "Report log P(prompt[i + 1] | prompt[..i]) (served with truncation off)");
  command->add_option("--mode", o->mode, "Truncation override: off, mask or compact");
  command->add_option("--keep", o->keep, "Keep K for --mode mask/compact");
  command->add_option("--cache-salt", o->cache_salt, "Prefix-cache isolation salt");
  command->add_option("--model", o->model,
                      "A served model's name (the router's --served-model-name or an "
                      "--extra-model; default: its first)");
  command->add_option("--request-id", o->request_id, "Request id (default: the router's)");
  command->add_option("--timeout-ms", o->timeout_ms, "Deadline for the whole stream");
  command->add_flag("--json", o->json, "Print one JSON object when the stream ends");
  command->add_option("--speculative", o->speculative,
                      "Speculative decoding for this request: off, ngram or draft (default: the "
                      "decode nodes' --speculative)");
  command->add_option("--speculative-tokens", o->speculative_tokens,
                      "Tokens drafted per step at most (0: the decode nodes' default)");
  return {command, [o, command] {
            if (o->tokens.empty() && o->prompt.empty()) {
              return ReportError("generate", absl::InvalidArgumentError(
                                                 "one of --tokens or --prompt is required"));
            }
            return RunGenerate(*o, *command);
          }};
}

}  // namespace baton::tools
