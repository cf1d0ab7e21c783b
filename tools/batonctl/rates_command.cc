// `batonctl rates`: what a running cluster's nodes measured of their own costs, as the router's
// registry holds them from their registrations (baton.v1.Generation/ListRates): each prefill
// node's rates and each decode node's step fit, replay rate and tokens per step, and their
// means in the form `batonctl simulate --rates/--decode-rates` and `batonctl capacity` take.
#include <chrono>
#include <iostream>
#include <string>

#include "baton/v1/generation.grpc.pb.h"
#include "client.h"
#include "cluster_sim.h"
#include "commands.h"
#include "nlohmann/json.hpp"

namespace baton::tools {
namespace {

struct RatesOptions {
  ClientOptions client;
  std::string model;
  bool flags = false;
  int64_t timeout_ms = 10000;
};

int RunRates(const RatesOptions& o) {
  v1::ListRatesResponse reply;
  if (const int failed = CallRouter(o.client, o.timeout_ms, "rates",
                                    [&](v1::Generation::Stub& stub, grpc::ClientContext& context) {
                                      return stub.ListRates(&context, v1::ListRatesRequest(),
                                                            &reply);
                                    });
      failed != kExitOk) {
    return failed;
  }
  const MeasuredRates measured = MeanRates(reply, o.model);
  if (o.flags) {
    // For a shell: batonctl simulate ... $(batonctl rates --addr ROUTER --flags)
    if (!measured.rates.empty()) std::cout << "--rates " << measured.rates;
    if (!measured.decode_rates.empty()) {
      std::cout << (measured.rates.empty() ? "" : " ") << "--decode-rates "
                << measured.decode_rates;
    }
    std::cout << "\n";
    return kExitOk;
  }
  nlohmann::json nodes = nlohmann::json::array();
  for (const v1::NodeRates& node : reply.nodes()) {
    if (!o.model.empty() && node.model() != o.model) continue;
    nlohmann::json entry = {
        {"node_id", node.node_id()}, {"role", node.role()}, {"model", node.model()}};
    if (node.role() == "prefill") {
      const v1::PrefillRates& r = node.prefill();
      entry.update({{"producers_only", node.producers_only()},
                    {"compute_ms_per_gflop", r.compute_ms_per_gflop()},
                    {"local_ms_per_mib", r.local_ms_per_mib()},
                    {"store_ms_per_mib", r.store_ms_per_mib()},
                    {"fixed_ms", r.fixed_ms()},
                    {"samples", r.samples()}});
    } else {
      const v1::DecodeRates& r = node.decode();
      entry.update({{"step_fixed_ms", r.step_fixed_ms()},
                    {"step_per_row_ms", r.step_per_row_ms()},
                    {"tokens_per_step", r.tokens_per_step()},
                    {"replay_ms_per_gflop", r.replay_ms_per_gflop()},
                    {"replay_piece_fixed_ms", r.replay_piece_fixed_ms()},
                    {"replay_piece_row_ms", r.replay_piece_row_ms()},
                    {"step_stretch", r.step_stretch()},
                    {"step_stretch_p10", r.step_stretch_p10()},
                    {"step_stretch_p50", r.step_stretch_p50()},
                    {"step_stretch_p90", r.step_stretch_p90()},
                    {"step_stretch_p99", r.step_stretch_p99()},
                    {"replay_samples", r.replay_samples()}});
    }
    nodes.push_back(std::move(entry));
  }
  std::cout << nlohmann::json{{"prefill_nodes", measured.prefill_nodes},
                              {"decode_nodes", measured.decode_nodes},
                              {"split",
                               measured.replay_on_decode ? "replay-on-decode" : "prefill-all"},
                              {"rates", measured.rates},
                              {"decode_rates", measured.decode_rates},
                              {"nodes", nodes}}
                   .dump()
            << "\n";
  return kExitOk;
}

}  // namespace

Command AddRatesCommand(CLI::App& app) {
  auto o = std::make_shared<RatesOptions>();
  CLI::App* command = app.add_subcommand(
      "rates",
      "List what a running cluster's prefill and decode nodes measured of their costs, as the "
      "router holds them, with their means as `batonctl simulate --rates` and --decode-rates "
      "take them; prints {\"rates\": ..., \"decode_rates\": ..., \"nodes\": [...]}");
  AddClientFlags(*command, o->client);
  command->add_option("--model", o->model, "Only the nodes of this served model (default: all)");
  command->add_flag("--flags", o->flags,
                    "Print only the simulator's flags: --rates ... --decode-rates ...");
  command->add_option("--timeout-ms", o->timeout_ms, "Deadline of the call (default 10000)")
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  return {command, [o] { return RunRates(*o); }};
}

}  // namespace baton::tools
