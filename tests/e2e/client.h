// Client-side helpers of the multi-process tests: streaming a request, expected tokens from
// `batonctl forward`, and decode-node pool checks.
#pragma once

#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../tools/run_batonctl.h"
#include "cluster.h"
#include "nlohmann/json.hpp"
#include "testing/eventually.h"

namespace baton::testing {

struct Outcome {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<float> prompt_logprobs;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  v1::Usage usage;
};

// Streams one request; `on_message` may cancel (return false) after each message. An
// `api_key` goes as `authorization: Bearer <key>`.
inline Outcome Generate(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                        std::chrono::milliseconds deadline = std::chrono::seconds(120),
                        const std::function<bool(const Outcome&)>& on_message = nullptr,
                        const std::string& api_key = "") {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + deadline);
  if (!api_key.empty()) context.AddMetadata("authorization", "Bearer " + api_key);
  Outcome outcome;
  auto reader = stub.Generate(&context, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    outcome.tokens.insert(outcome.tokens.end(), response.token_ids().begin(),
                          response.token_ids().end());
    outcome.logprobs.insert(outcome.logprobs.end(), response.logprobs().begin(),
                            response.logprobs().end());
    outcome.prompt_logprobs.insert(outcome.prompt_logprobs.end(),
                                   response.prompt_logprobs().begin(),
                                   response.prompt_logprobs().end());
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      outcome.finish = response.finish_reason();
      outcome.usage = response.usage();
    }
    if (on_message && !on_message(outcome)) {
      context.TryCancel();
      break;
    }
  }
  outcome.status = reader->Finish();
  return outcome;
}

inline v1::GenerateRequest Request(const std::vector<int32_t>& prompt, uint32_t max_tokens) {
  v1::GenerateRequest request;
  for (int32_t t : prompt) request.add_prompt_token_ids(t);
  request.mutable_sampling()->set_max_tokens(max_tokens);
  request.mutable_sampling()->set_ignore_eos(true);
  return request;
}

inline std::string Join(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

// What `batonctl forward` says greedy decoding gives.
inline std::vector<int32_t> ForwardTokens(const std::string& model,
                                          const std::vector<int32_t>& prompt,
                                          const std::string& mode, int64_t keep, int n,
                                          int64_t valid_start = 0,
                                          const std::string& weights = "fp32") {
  const Result r = RunBatonctl("forward --model " + model + " --tokens " + Join(prompt) +
                               " --mode " + mode + " --keep " + std::to_string(keep) +
                               " --valid-start " + std::to_string(valid_start) + " --decode " +
                               std::to_string(n) + " --weights " + weights + " --json");
  EXPECT_EQ(r.exit_status, 0) << r.err;
  return nlohmann::json::parse(r.out)["tokens"].get<std::vector<int32_t>>();
}

inline std::vector<int32_t> RandomPrompt(std::mt19937_64& rng, int64_t length, int64_t vocab) {
  std::vector<int32_t> prompt(length);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % vocab);
  return prompt;
}

// Polls a decode node until it holds no request and every page is free (false if it has not
// within `timeout`).
inline bool DecodeDrained(Cluster& cluster, const std::string& decode,
                          std::chrono::seconds timeout = std::chrono::seconds(15)) {
  auto stub = cluster.Decode(decode);
  auto drained = [&] {
    grpc::ClientContext context;
    v1::StatsRequest request;
    v1::StatsResponse stats;
    return stub->Stats(&context, request, &stats).ok() && stats.reservations() == 0 &&
           stats.load().free_pages() == stats.load().total_pages() &&
           stats.load().free_slots() == stats.load().total_slots();
  };
  return static_cast<bool>(Eventually(drained, timeout, std::chrono::milliseconds(50)));
}

inline v1::StatsResponse DecodeStats(Cluster& cluster, const std::string& decode) {
  grpc::ClientContext context;
  v1::StatsRequest request;
  v1::StatsResponse stats;
  if (!cluster.Decode(decode)->Stats(&context, request, &stats).ok()) return {};
  return stats;
}

inline uint32_t Reservations(Cluster& cluster, const std::string& decode) {
  return DecodeStats(cluster, decode).reservations();
}

// Generate's on_message that, once `after` tokens have arrived, kills whichever decode node of
// decode-a and decode-b holds the request and names it in `killed`.
inline std::function<bool(const Outcome&)> KillTheHoldingDecodeNode(Cluster& cluster,
                                                                   std::string& killed,
                                                                   size_t after = 8) {
  return [&cluster, &killed, after](const Outcome& o) {
    if (killed.empty() && o.tokens.size() >= after) {
      for (const char* node : {"decode-a", "decode-b"}) {
        if (Reservations(cluster, node) > 0) {
          killed = node;
          cluster.Kill(node);
          break;
        }
      }
    }
    return true;
  };
}

// Reservations whose StateBlock the decode node is reading now.
inline uint32_t Transferring(Cluster& cluster, const std::string& decode) {
  return DecodeStats(cluster, decode).transferring();
}

}  // namespace baton::testing
