// What every node binary (baton-prefill, baton-decode) does around its service, so that each
// main.cc only declares its role's flags: the flags all nodes share (the model and where it runs,
// the router registration, UCX, the server flags of server_flags.h), the start-up checks in the
// order that matters (unsafe UCX transports are refused and the CPU kernels' level is settled
// before the model loads, so that a refused node has touched nothing), and serving until a
// shutdown signal with the router registration and the service's watchdog and drain.
//
// Threading: everything here runs on main's thread; the hooks are called from the threads of
// ServeUntilShutdown (common/rpc.h), which documents when.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "baton/common/rpc.h"
#include "baton/common/server_flags.h"
#include "baton/model/engine.h"
#include "baton/model/engine_factory.h"
#include "baton/model/split.h"
#include "baton/v1/node.grpc.pb.h"

namespace baton::node {

// --device, --weights and --cuda-prefill-attention (model::DeviceFlags), for every binary that
// loads a model (the nodes and batonctl).
void AddDeviceFlags(CLI::App& app, model::DeviceFlags& flags);

struct NodeFlags {
  std::string model_dir;
  std::string served_model_name;  // "": the model directory's name
  std::string router;             // "": do not register
  std::string node_id;
  model::DeviceFlags device;
  bool no_ucx = false;
  bool ucx_allow_unprotected_tcp = false;
  ServerFlags server;
  // A prefill node's --split (AddSplitFlag); StartNode loads the layers it asks for.
  model::Split split = model::Split::kPrefillAll;
};
// The flags above; `node_id` keeps its value as the default of --node-id.
void AddNodeFlags(CLI::App& app, NodeFlags& flags);
// --split, for prefill nodes: replay-on-decode loads only the layers that split runs there.
void AddSplitFlag(CLI::App& app, NodeFlags& flags);

// Parses argv (ParseServerFlags, reading the config file's `section`), refuses unsafe UCX
// transports (unless --no-ucx), settles the CPU kernels' level and loads the model. `exit` is
// set when the process should end now with that status (help, --check-config, or a reason
// already printed or logged as "cannot start"); `engine` is set otherwise.
struct NodeStart {
  std::optional<int> exit;
  std::unique_ptr<model::Engine> engine;
  model::Split split = model::Split::kPrefillAll;
};
NodeStart StartNode(CLI::App& app, int argc, char** argv, const std::string& binary,
                    const std::string& section, NodeFlags& flags);

// A node service's part in the process's life (ServeUntilShutdown).
struct NodeHooks {
  Heartbeat::LoadFn load;                            // reported with each heartbeat
  std::function<void(HealthSetter)> start_watchdog;  // once serving
  std::function<void()> stop_watchdog;               // before the server stops
  std::function<void(std::chrono::steady_clock::time_point deadline)> drain;  // on SIGTERM
  std::string ucx_worker_address;  // registered for decode nodes to read from; "" for none
  Heartbeat::CacheFeed cache;      // a prefill node's block-cache events; empty for none
};

// The hooks of a node service that has Load, StartWatchdog, StopWatchdog and Drain (both node
// roles' services); the caller adds what only its role has.
template <typename Service>
NodeHooks HooksOf(Service& service) {
  return {
      .load = [&service] { return service.Load(); },
      .start_watchdog = [&service](HealthSetter health) { service.StartWatchdog(health); },
      .stop_watchdog = [&service] { service.StopWatchdog(); },
      .drain =
          [&service](std::chrono::steady_clock::time_point deadline) { service.Drain(deadline); }};
}

// Serves `service` (and grpc.health.v1) until SIGTERM or SIGINT, registered with the router as
// a node of `role` serving `engine`'s model; returns the process's exit status.
int ServeNode(const std::string& binary, const NodeFlags& flags, v1::NodeRole role,
              const model::Engine& engine, grpc::Service& service, NodeHooks hooks);

}  // namespace baton::node
