// `batonctl models`: what a router serves (baton.v1.Generation/ListModels), as one JSON object.
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "baton/v1/generation.grpc.pb.h"
#include "client.h"
#include "commands.h"
#include "nlohmann/json.hpp"

namespace baton::tools {
namespace {

struct ModelsOptions {
  ClientOptions client;
  int64_t timeout_ms = 10000;
};

int RunModels(const ModelsOptions& o) {
  v1::ListModelsResponse reply;
  if (const int failed = CallRouter(o.client, o.timeout_ms, "models",
                                    [&](v1::Generation::Stub& stub, grpc::ClientContext& context) {
                                      return stub.ListModels(&context, v1::ListModelsRequest(),
                                                             &reply);
                                    });
      failed != kExitOk) {
    return failed;
  }
  nlohmann::json models = nlohmann::json::array();
  for (const v1::ServedModel& model : reply.models()) {
    models.push_back({{"name", model.name()},
                      {"max_model_len", model.max_model_len()},
                      {"fingerprints", std::vector<std::string>(model.fingerprints().begin(),
                                                                model.fingerprints().end())},
                      {"serving", model.fingerprints_size() > 0},
                      {"split", model.split()},
                      {"prefill_weight_bytes", model.prefill_weight_bytes()},
                      {"decode_weight_bytes", model.decode_weight_bytes()}});
  }
  std::cout << nlohmann::json{{"models", models}}.dump() << "\n";
  return kExitOk;
}

}  // namespace

Command AddModelsCommand(CLI::App& app) {
  auto o = std::make_shared<ModelsOptions>();
  CLI::App* command = app.add_subcommand(
      "models",
      "List what a router serves: each model's name, and the weights (fingerprints) with a live "
      "prefill and decode node; prints {\"models\": [...]}");
  AddClientFlags(*command, o->client);
  command->add_option("--timeout-ms", o->timeout_ms, "Deadline of the call (default 10000)")
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  return {command, [o] { return RunModels(*o); }};
}

}  // namespace baton::tools
