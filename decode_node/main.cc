// baton-decode: a decode node. Loads the model, maps its state pools (allocated through UCX),
// serves DecodeNode plus grpc.health.v1, and registers with the router.
#include <cstdlib>
#include <iostream>

#include "CLI/CLI.hpp"
#include "baton/common/model_config.h"
#include "baton/common/rpc.h"
#include "baton/common/server_flags.h"
#include "baton/common/stream_watch.h"
#include "baton/decode_node/decode_service.h"
#include "baton/kernels/cpu_isa.h"
#include "baton/model/engine_factory.h"
#include "baton/transfer/ucx.h"

int main(int argc, char** argv) {
  baton::BlockShutdownSignals();
  CLI::App app{"baton-decode: decode node"};
  std::string model_dir, router, node_id = "decode";
  baton::ServerFlags flags;
  baton::decode_node::DecodeOptions options;
  bool no_ucx = false;
  std::string transfer_faults;
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
  app.add_option("--slots", options.slots, "State slots (concurrent requests)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--pages", options.pages, "Block-KV pages in the pool")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--max-batch", options.max_batch, "Requests per decode step")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--max-waiting", options.max_waiting,
                 "Reservations that may wait for memory before RESOURCE_EXHAUSTED")
      ->check(CLI::Range(0, 1 << 20));
  app.add_flag("--ucx-allow-unprotected-tcp", options.ucx_allow_unprotected_tcp,
               baton::transfer::kUcxAllowUnprotectedTcpHelp);
  app.add_flag("--no-ucx", no_ucx, "Serve only the gRPC transport");
  app.add_flag("--ucx-peer-errors", options.ucx_peer_errors,
               "UCX endpoints with peer error handling: a dead prefill node fails its transfer "
               "instead of this process (network transports only: UCX 1.13 cannot use shared "
               "memory with it)");
  app.add_option("--watchdog-ms", options.watchdog_ms,
                 "Liveness turns NOT_SERVING when the decode loop has not advanced for this long "
                 "while it has requests (default 30000)")
      ->check(CLI::Range(int64_t{10}, int64_t{3600000}));
  app.add_option("--inject-step-stall-ms", options.inject_step_stall_ms,
                 "Tests: sleep this long before each decode step (a wedged worker)")
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}));
  app.add_flag("--poison-freed-memory", options.poison_freed_memory,
               "Fill freed pool memory with a poison pattern and count writes into it "
               "(baton_pool_poison_violations; for tests and debugging). It watches the host "
               "pool: with --device cuda, decode steps write the pool's device mirror instead");
  app.add_option("--inject-transfer-faults", transfer_faults,
                 "Faults in every StateBlock read, for tests: drop=P,corrupt=P,truncate=P,"
                 "delay_ms=N,seed=N");
  std::string stream_idle_timeout = "60s";
  app.add_option("--stream-idle-timeout", stream_idle_timeout,
                 "Cancel a stream, and free its slot and pages, once its reader (the router) has "
                 "taken no message for this long (30s, 500ms, 2m; a bare number is seconds; 0: "
                 "never)");
  if (auto exit = baton::ParseServerFlags(app, argc, argv, "baton-decode", "decode", flags)) {
    return *exit;
  }
  if (auto idle = baton::ParseStreamIdleTimeout(stream_idle_timeout); idle.ok()) {
    options.stream_idle_timeout = *idle;
  } else {
    std::cerr << idle.status().message() << "\n";
    return 2;
  }
  options.use_ucx = !no_ucx;
  // Refused before anything starts: a worker on these transports could not be made safe.
  if (auto exit = options.use_ucx ? baton::transfer::RefuseUnsafeUcx(
                                        "baton-decode", options.ucx_allow_unprotected_tcp)
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
  if (!transfer_faults.empty()) {
    auto spec = baton::transfer::ParseFaultSpec(transfer_faults);
    if (!spec.ok()) {
      std::cerr << "--inject-transfer-faults: " << spec.status().message() << "\n";
      return 2;
    }
    options.transfer_faults = *spec;
  }
  auto model = baton::model::LoadEngineOnDevice(model_dir, device, weights);
  if (!model.ok()) {
    baton::log::Error("cannot start", {{"error", std::string(model.status().message())}});
    return 2;
  }
  baton::decode_node::DecodeService service(**model, options);
  if (!service.status().ok()) {
    baton::log::Error("cannot start", {{"error", std::string(service.status().message())}});
    return 2;
  }
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  return baton::ServeUntilShutdown(
      "baton-decode", builder, flags.server,
      baton::NodeRegistration(
          router, node_id, baton::v1::NODE_ROLE_DECODE, (*model)->fingerprint(),
          [&] { return service.Load(); },
          served_model_name.empty() ? baton::DefaultServedModelName(model_dir) : served_model_name,
          baton::ConfigDigest((*model)->config())),
      [&](baton::HealthSetter health) { service.StartWatchdog(std::move(health)); },
      [&] { service.StopWatchdog(); }, {},
      [&](std::chrono::steady_clock::time_point deadline) { service.Drain(deadline); });
}
