// `batonctl fidelity`: a running cluster's shadow verification (docs/fidelity.md, "In
// production"), as the router's registry holds it from its decode nodes' registrations
// (baton.v1.Generation/ListRates): per model, truncation mode, keep bucket and hit, the
// positions compared, the mean KL(untruncated || served), the top-1 agreement and the largest
// logit difference, summed over the model's decode nodes, beside the shadows run, dropped and
// failed. The same columns as `batonctl approx-error`'s table of the offline figures, so the two
// read side by side (its K against this keep bucket: the power of two at or above K).
#include <iostream>
#include <map>
#include <string>
#include <tuple>

#include "absl/strings/str_format.h"
#include "baton/v1/generation.grpc.pb.h"
#include "client.h"
#include "commands.h"
#include "nlohmann/json.hpp"

namespace baton::tools {
namespace {

struct FidelityOptions {
  ClientOptions client;
  std::string model;
  bool json = false;
  int64_t timeout_ms = 10000;
};

struct Sum {
  uint64_t positions = 0, disagreements = 0;
  double kl_sum = 0, max_logit_diff = 0;
};

int RunFidelity(const FidelityOptions& o) {
  v1::ListRatesResponse reply;
  if (const int failed = CallRouter(o.client, o.timeout_ms, "fidelity",
                                    [&](v1::Generation::Stub& stub, grpc::ClientContext& context) {
                                      return stub.ListRates(&context, v1::ListRatesRequest(),
                                                            &reply);
                                    });
      failed != kExitOk) {
    return failed;
  }
  // (model, mode, keep, hit) -> sums over the decode nodes.
  std::map<std::tuple<std::string, std::string, uint32_t, bool>, Sum> rows;
  uint64_t run = 0, dropped = 0, failed = 0;
  double cpu_seconds = 0;
  int64_t nodes = 0;
  for (const v1::NodeRates& node : reply.nodes()) {
    if (node.role() != "decode" || (!o.model.empty() && node.model() != o.model)) continue;
    ++nodes;
    const v1::FidelityReport& r = node.fidelity();
    run += r.shadows_run();
    dropped += r.shadows_dropped();
    failed += r.shadows_failed();
    cpu_seconds += r.cpu_seconds();
    for (const v1::FidelityTally& t : r.tallies()) {
      Sum& sum = rows[{node.model(), t.mode(), t.keep(), t.hit()}];
      sum.positions += t.positions();
      sum.disagreements += t.top1_disagreements();
      sum.kl_sum += t.kl_sum();
      sum.max_logit_diff = std::max(sum.max_logit_diff, t.max_logit_diff());
    }
  }
  nlohmann::json results = nlohmann::json::array();
  for (const auto& [key, sum] : rows) {
    const auto& [model, mode, keep, hit] = key;
    const double n = static_cast<double>(sum.positions);
    results.push_back({{"model", model},
                       {"mode", mode},
                       {"keep_bucket", keep},
                       {"hit", hit},
                       {"positions", sum.positions},
                       {"top1_disagreements", sum.disagreements},
                       {"kl_mean", n > 0 ? sum.kl_sum / n : 0.0},
                       {"top1_agreement", n > 0 ? 1.0 - sum.disagreements / n : 1.0},
                       {"max_abs_logit_diff", sum.max_logit_diff}});
  }
  const nlohmann::json out = {{"kind", "fidelity"},       {"decode_nodes", nodes},
                              {"shadows_run", run},       {"shadows_dropped", dropped},
                              {"shadows_failed", failed}, {"shadow_cpu_seconds", cpu_seconds},
                              {"results", results}};
  if (o.json) {
    std::cout << out.dump() << "\n";
    return kExitOk;
  }
  std::cout << absl::StrFormat("%-10s %-8s %6s %5s %10s %11s %9s %13s\n", "model", "mode",
                               "keep<=", "hit", "positions", "KL mean", "top-1", "max |dlogit|");
  for (const nlohmann::json& r : results) {
    std::cout << absl::StrFormat("%-10s %-8s %6d %5s %10d %11.3e %9.5f %13.3e\n",
                                 r["model"].get<std::string>(), r["mode"].get<std::string>(),
                                 r["keep_bucket"].get<int64_t>(),
                                 r["hit"].get<bool>() ? "yes" : "no", r["positions"].get<int64_t>(),
                                 r["kl_mean"].get<double>(), r["top1_agreement"].get<double>(),
                                 r["max_abs_logit_diff"].get<double>());
  }
  std::cout << absl::StrFormat(
      "shadows over %d decode nodes: %d run, %d dropped, %d failed, %.1f CPU seconds\n", nodes, run,
      dropped, failed, cpu_seconds);
  return kExitOk;
}

}  // namespace

Command AddFidelityCommand(CLI::App& app) {
  auto o = std::make_shared<FidelityOptions>();
  CLI::App* command = app.add_subcommand(
      "fidelity",
      "Show a running cluster's shadow verification (the router's --fidelity-sample-rate): per "
      "model, mode, keep bucket and hit, the positions its decode nodes compared against the "
      "untruncated model, mean KL, top-1 agreement and the largest logit difference, as "
      "`batonctl approx-error` prints the offline figures");
  AddClientFlags(*command, o->client);
  command->add_option("--model", o->model, "Only the nodes of this served model (default: all)");
  command->add_flag("--json", o->json, "Print one JSON object instead of a table");
  command->add_option("--timeout-ms", o->timeout_ms, "Deadline of the call (default 10000)")
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  return {command, [o] { return RunFidelity(*o); }};
}

}  // namespace baton::tools
