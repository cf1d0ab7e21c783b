// gRPC glue shared by every baton binary: the one place where absl::Status becomes
// grpc::Status and back, server start-up (health service, reflection, a ready file that
// tests and `baton up` wait for), the registration heartbeat to the router, and waiting for
// SIGINT/SIGTERM.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "baton/v1/node.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace baton {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;               // 0: any free port
  std::string ready_file;     // when set, "host:port" is written there once serving
  std::string advertise_host;  // host registered with the router; empty: `host`
  std::string metrics_host;    // empty: `host`
  int metrics_port = 0;        // Prometheus /metrics; 0: any free port, -1: none
  std::string metrics_ready_file;  // when set, the metrics "host:port" is written there
};

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  std::string address;  // host:port actually bound
};

// Writes "address\n" to `path` (nothing when empty) so that a reader never sees half of it.
void WriteAddressFile(const std::string& path, const std::string& address);

// Adds grpc.health.v1 (the service "liveness" is SERVING for as long as the process serves;
// "" follows readiness) and reflection, binds, starts, writes the ready file.
absl::StatusOr<StartedServer> StartServer(grpc::ServerBuilder& builder,
                                          const ServerOptions& options);

// The routers a node registers with: `routers` is a comma-separated list of host:port, and
// each host is resolved (DNS) to every address it has, so one name of a headless Kubernetes
// Service stands for all its router pods. An entry that does not resolve is kept as written.
std::vector<std::string> ResolveRouters(const std::string& routers);

// Registers a node with every router (see ResolveRouters, resolved again at each beat, so
// routers that come and go are found) now and then every heartbeat, reporting its load,
// until destroyed. Failures are retried: a router may start later or restart.
class Heartbeat {
 public:
  using LoadFn = std::function<v1::LoadReport()>;
  Heartbeat(std::string routers, v1::RegisterRequest node, LoadFn load);
  ~Heartbeat();

 private:
  void Run();
  std::string routers_;
  v1::RegisterRequest node_;
  LoadFn load_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// The common life of a baton server binary: start (see StartServer) and its metrics server,
// print "<binary> serving on host:port", register with `router` (when set) as `node` reporting
// `load`, serve until SIGINT or SIGTERM, then stop the heartbeat and shut down. `on_started`
// runs once the server is up, `on_stopping` before it goes away. Returns the process exit
// status.
struct Registration {
  std::string router;  // comma-separated routers (see ResolveRouters); empty: do not register
  v1::RegisterRequest node;
  Heartbeat::LoadFn load;
};
// The registration of a node of `role` called `node_id`, serving the model `fingerprint`.
Registration NodeRegistration(std::string router, const std::string& node_id, v1::NodeRole role,
                              const std::string& fingerprint, Heartbeat::LoadFn load);

int ServeUntilShutdown(const std::string& binary, grpc::ServerBuilder& builder,
                       const ServerOptions& options, Registration registration,
                       const std::function<void(grpc::Server&)>& on_started = nullptr,
                       const std::function<void()>& on_stopping = nullptr);

// Blocks SIGINT and SIGTERM in this thread (call first in main, before starting threads, so
// they inherit the mask) ...
void BlockShutdownSignals();
// ... and waits for one of them; returns the signal number.
int WaitForShutdownSignal();

}  // namespace baton
