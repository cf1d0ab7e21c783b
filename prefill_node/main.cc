// baton-prefill: a prefill node. Loads the model, serves PrefillNode plus grpc.health.v1,
// and registers with the router.
#include <cstdlib>
#include <iostream>

#include "CLI/CLI.hpp"
#include "baton/common/model_config.h"
#include "baton/common/rpc.h"
#include "baton/common/server_flags.h"
#include "baton/kernels/cpu_isa.h"
#include "baton/model/engine_factory.h"
#include "baton/transfer/ucx.h"
#include "baton/prefill_node/prefill_service.h"

namespace {

// The flags that set PrefillOptions, in --help's order; --no-ucx sets `no_ucx` (use_ucx is its
// negation).
void AddPrefillFlags(CLI::App& app, baton::prefill_node::PrefillOptions& options, bool& no_ucx) {
  app.add_option("--token-budget", options.token_budget, "Rows per prefill chunk")
      ->check(CLI::Range(1, 1 << 24));
  app.add_flag("--ucx-allow-unprotected-tcp", options.ucx_allow_unprotected_tcp,
               baton::transfer::kUcxAllowUnprotectedTcpHelp);
  app.add_flag("--no-ucx", no_ucx, "Use only the gRPC transport");
  app.add_option("--kvstore", options.kvstore_address, "Prefix store (baton-kvstore) address");
  app.add_option("--write-back-bytes", options.write_back_bytes,
                 "Block payload bytes waiting for the prefix store at most (default 256 MiB)")
      ->check(CLI::Range(uint64_t{1} << 20, uint64_t{1} << 40));
  app.add_option("--commit-timeout-ms", options.commit_timeout_ms,
                 "How long a commit, and so the decode node's read of the exposed regions, may "
                 "take (default 30000)")
      ->check(CLI::Range(1, 600000));
  app.add_option("--watchdog-ms", options.watchdog_ms,
                 "Liveness turns NOT_SERVING when a prefill has computed no chunk for this long "
                 "(default 30000)")
      ->check(CLI::Range(int64_t{10}, int64_t{3600000}));
  app.add_option("--max-staged-requests", options.max_staged_requests,
                 "Requests holding staging memory at once, from before the model through the "
                 "commit (default 4)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  app.add_option("--staging-cache-bytes", options.staging_cache_bytes,
                 "Idle staging memory kept for reuse, each buffer only for requests to the same "
                 "decode node (default 1 GiB; 0: register staging memory per request)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40));
}

}  // namespace

int main(int argc, char** argv) {
  baton::BlockShutdownSignals();
  CLI::App app{"baton-prefill: prefill node"};
  std::string model_dir, router, node_id = "prefill";
  baton::ServerFlags flags;
  baton::prefill_node::PrefillOptions options;
  bool no_ucx = false;
  std::string device = "cpu", weights = "fp32";
  app.add_option("--model", model_dir, "Model directory")->required();
  std::string served_model_name;
  app.add_option("--served-model-name", served_model_name,
                 "The model name registered with the router, which routes a request to nodes of "
                 "the name it asks for (default: the model directory's name)");
  app.add_option("--device", device,
                 "Where the model runs: cpu, or cuda (a CUDA build on a machine with a GPU; the "
                 "node exits 2 naming the reason otherwise)");
  app.add_option("--weights", weights,
                 "How the model's weight matrices are held: fp32, or bf16 (--device cpu only; "
                 "halves the bytes a decode step reads; give every node of a cluster the same)");
  baton::AddServerFlags(app, flags);
  app.add_option("--router", router, "Router address to register with");
  app.add_option("--node-id", node_id, "Name reported to the router");
  AddPrefillFlags(app, options, no_ucx);
  if (auto exit = baton::ParseServerFlags(app, argc, argv, "baton-prefill", "prefill", flags)) {
    return *exit;
  }
  options.use_ucx = !no_ucx;
  // Refused before anything starts: a worker on these transports could not be made safe.
  if (auto exit = options.use_ucx ? baton::transfer::RefuseUnsafeUcx(
                                        "baton-prefill", options.ucx_allow_unprotected_tcp)
                                  : std::nullopt) {
    return *exit;
  }
  // The CPU kernels' instruction-set level (BATON_CPU_ISA overrides it) is settled before the
  // model loads; a level that is unknown or that this CPU lacks is refused here.
  if (std::string error = baton::kernels::CheckCpuIsaEnvironment(); !error.empty()) {
    baton::log::Error("cannot start", {{"error", error}});
    return 2;
  }
  baton::log::Info("cpu kernels",
                   {{"isa", baton::kernels::CpuIsaName(baton::kernels::ActiveCpuIsa())}});
  auto model = baton::model::LoadEngineOnDevice(model_dir, device, weights);
  if (!model.ok()) {
    baton::log::Error("cannot start", {{"error", std::string(model.status().message())}});
    return 2;
  }
  baton::prefill_node::PrefillService service(**model, options);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  baton::Registration registration = baton::NodeRegistration(
      router, node_id, baton::v1::NODE_ROLE_PREFILL, (*model)->fingerprint(),
      [&] { return service.Load(); },
      served_model_name.empty() ? baton::DefaultServedModelName(model_dir) : served_model_name,
      baton::ConfigDigest((*model)->config()));
  // Decode nodes read this node's staging memory by UCX from this worker only.
  registration.node.set_ucx_worker_address(service.ucx_worker_address());
  return baton::ServeUntilShutdown(
      "baton-prefill", builder, flags.server, std::move(registration),
      [&](baton::HealthSetter health) { service.StartWatchdog(std::move(health)); },
      [&] { service.StopWatchdog(); }, {},
      [&](std::chrono::steady_clock::time_point deadline) { service.Drain(deadline); });
}
