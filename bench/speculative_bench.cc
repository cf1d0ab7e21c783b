// Speculative decoding through a running router (e.g. `baton up --speculative ...`): decode
// tokens/s per stream and inter-token latency p50/p99 with each method the request asks for
// (`sampling.speculative`), against off measured in the same run, at each batch size (that many
// streams at once). Two workloads from a text file of documents (one per line, e.g. a trained
// model's heldout.txt):
//   brown:      a passage of --prompt-words words; the model continues it;
//   repetitive: "repeat the passage" -- the passage, a blank line, then its first --echo-words
//               words again, so that a continuation that copies it is the likely one.
// Rounds alternate the methods (off, then the others, then off again in the next round's
// order reversed), so that a noisy machine weighs on each alike; a first round of each warms
// the node up and is not counted. Greedy, ignore_eos.
//
//   baton_speculative_bench --addr HOST:PORT --text FILE [--methods off,ngram,draft]
//                           [--batches 1,8] [--workloads repetitive,brown] [--rounds 3]
//                           [--max-tokens 128] [--prompt-words 60] [--echo-words 12]
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "baton/v1/generation.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "percentile.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Sample {
  bool ok = false;
  double decode_ms = 0;  // from the first token's arrival to the last's
  int tokens = 0;
  std::vector<double> itl_ms;  // per token after the first (a message's gap split over its tokens)
  uint32_t drafted = 0, accepted = 0;
};

Sample RunOne(const std::shared_ptr<grpc::Channel>& channel, const std::string& prompt,
              baton::v1::Speculative method, int max_tokens) {
  auto stub = baton::v1::Generation::NewStub(channel);
  baton::v1::GenerateRequest request;
  request.set_prompt_text(prompt);
  auto* sampling = request.mutable_sampling();
  sampling->set_max_tokens(max_tokens);
  sampling->set_ignore_eos(true);
  sampling->set_speculative(method);
  grpc::ClientContext context;
  auto reader = stub->Generate(&context, request);
  baton::v1::GenerateResponse response;
  Sample sample;
  std::optional<Clock::time_point> first, last;
  while (reader->Read(&response)) {
    const auto now = Clock::now();
    const int n = response.token_ids_size();
    if (response.has_usage()) {
      sample.drafted = response.usage().draft_tokens();
      sample.accepted = response.usage().accepted_draft_tokens();
    }
    if (n == 0) continue;
    if (!first.has_value()) {
      first = now;
      // The first message's tokens beyond the first came in the same gap as it.
    } else {
      const double gap = std::chrono::duration<double, std::milli>(now - *last).count();
      for (int i = 0; i < n; ++i) sample.itl_ms.push_back(gap / n);
    }
    last = now;
    sample.tokens += n;
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) std::cerr << "request failed: " << status.error_message() << "\n";
  sample.ok = status.ok() && first.has_value();
  if (sample.ok)
    sample.decode_ms = std::chrono::duration<double, std::milli>(*last - *first).count();
  return sample;
}

std::vector<std::string> Words(const std::string& line) {
  return absl::StrSplit(line, ' ', absl::SkipEmpty());
}

std::string Join(const std::vector<std::string>& words, size_t from, size_t count) {
  std::string out;
  for (size_t i = from; i < std::min(words.size(), from + count); ++i) {
    if (!out.empty()) out += ' ';
    out += words[i];
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"baton_speculative_bench: speculative decoding against off through a router"};
  std::string addr, text_file, methods_arg = "off,ngram,draft", batches_arg = "1,8",
                               workloads_arg = "repetitive,brown";
  int rounds = 3, max_tokens = 128, prompt_words = 60, echo_words = 12;
  app.add_option("--addr", addr, "Router client address")->required();
  app.add_option("--text", text_file, "Documents, one per line")->required();
  app.add_option("--methods", methods_arg, "off first, then the methods to compare");
  app.add_option("--batches", batches_arg, "Streams at once");
  app.add_option("--workloads", workloads_arg, "repetitive and/or brown");
  app.add_option("--rounds", rounds, "Rounds of every method");
  app.add_option("--max-tokens", max_tokens, "Completion tokens per request");
  app.add_option("--prompt-words", prompt_words, "Words of a passage");
  app.add_option("--echo-words", echo_words, "repetitive: words of the passage said again");
  CLI11_PARSE(app, argc, argv);

  std::vector<std::vector<std::string>> passages;
  std::ifstream in(text_file);
  for (std::string line; std::getline(in, line);) {
    const std::vector<std::string> words = Words(line);
    for (size_t from = 0; from + prompt_words <= words.size(); from += prompt_words) {
      passages.emplace_back(words.begin() + from, words.begin() + from + prompt_words);
    }
  }
  if (passages.empty()) {
    std::cerr << "--text: no passage of " << prompt_words << " words in " << text_file << "\n";
    return 2;
  }
  auto prompt_of = [&](const std::string& workload, size_t index) {
    const std::vector<std::string>& p = passages[index % passages.size()];
    const std::string passage = Join(p, 0, p.size());
    if (workload == "brown") return passage;
    return passage + "\n\n" + Join(p, 0, echo_words);
  };
  std::vector<baton::v1::Speculative> methods;
  std::vector<std::string> method_names = absl::StrSplit(methods_arg, ',');
  for (const std::string& name : method_names) {
    baton::v1::Speculative m;
    if (!baton::v1::Speculative_Parse("SPECULATIVE_" + absl::AsciiStrToUpper(name), &m)) {
      std::cerr << "--methods: unknown " << name << "\n";
      return 2;
    }
    methods.push_back(m);
  }
  std::vector<int> batches;
  for (absl::string_view b : absl::StrSplit(batches_arg, ','))
    batches.push_back(std::stoi(std::string(b)));
  std::vector<std::string> workloads = absl::StrSplit(workloads_arg, ',');

  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  nlohmann::json rows = nlohmann::json::array();
  size_t next_passage = 0;
  for (const std::string& workload : workloads) {
    for (int batch : batches) {
      std::map<std::string, std::vector<Sample>> samples;
      // Round -1 warms the node up (first allocations, the cost fits) and is not counted.
      for (int round = -1; round < rounds; ++round) {
        // The same passages for every method of a round; the order reverses each round.
        const size_t first_passage = next_passage;
        next_passage += batch;
        std::vector<size_t> order(methods.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = round % 2 != 0 ? order.size() - 1 - i : i;
        for (size_t m : order) {
          std::vector<Sample> got(batch);
          std::vector<std::thread> streams;
          for (int s = 0; s < batch; ++s) {
            streams.emplace_back([&, s] {
              got[s] =
                  RunOne(channel, prompt_of(workload, first_passage + s), methods[m], max_tokens);
            });
          }
          for (auto& t : streams) t.join();
          for (Sample& s : got) {
            if (!s.ok) {
              std::cerr << "a request failed\n";
              return 1;
            }
            if (round >= 0) samples[method_names[m]].push_back(std::move(s));
          }
        }
      }
      double off_rate = 0;
      for (const std::string& name : method_names) {
        const std::vector<Sample>& all = samples[name];
        double ms = 0, tokens = 0, drafted = 0, accepted = 0;
        std::vector<double> itl;
        for (const Sample& s : all) {
          ms += s.decode_ms;
          tokens += s.tokens - 1;
          drafted += s.drafted;
          accepted += s.accepted;
          itl.insert(itl.end(), s.itl_ms.begin(), s.itl_ms.end());
        }
        const double rate = ms > 0 ? tokens / (ms / 1000) : 0;  // per stream
        if (name == method_names[0]) off_rate = rate;
        rows.push_back({{"workload", workload},
                        {"batch", batch},
                        {"method", name},
                        {"requests", all.size()},
                        {"tokens_per_s_per_stream", rate},
                        {"ratio_to_" + method_names[0], off_rate > 0 ? rate / off_rate : 0},
                        {"itl_p50_ms", Percentile(itl, 0.5)},
                        {"itl_p99_ms", Percentile(itl, 0.99)},
                        {"acceptance", drafted > 0 ? accepted / drafted : 0},
                        {"drafted_per_token", tokens > 0 ? drafted / tokens : 0},
                        {"tokens_per_step", tokens > 0 ? tokens / (tokens - accepted) : 0}});
        std::cerr << workload << " batch " << batch << " " << name << ": " << rate
                  << " tok/s/stream, x" << (off_rate > 0 ? rate / off_rate : 0) << ", ITL p50 "
                  << Percentile(itl, 0.5) << " ms p99 " << Percentile(itl, 0.99)
                  << " ms, acceptance " << (drafted > 0 ? accepted / drafted : 0)
                  << ", drafted per token " << (tokens > 0 ? drafted / tokens : 0) << "\n";
      }
    }
  }
  std::cout << rows.dump(1) << "\n";
  return 0;
}
