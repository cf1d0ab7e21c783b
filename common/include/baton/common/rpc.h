// gRPC glue shared by every baton binary: the one place where absl::Status becomes
// grpc::Status and back, server start-up (health service, a ready file that
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

// Trailing metadata by which a node says that a failure it reports is another node's: the
// prefill node names "decode" when its commit to the decode node failed, so the router retries
// on another decode node instead of taking the prefill node for lost.
inline constexpr char kFailedNodeKey[] = "baton-failed-node";
// Trailing metadata of a RESOURCE_EXHAUSTED refusal: milliseconds after which a retry may
// find room.
inline constexpr char kRetryAfterKey[] = "retry-after-ms";

struct ServerOptions {
  // An IP to listen on; "::" is every address, IPv4 and IPv6 (only IPv4's where the kernel has
  // no IPv6), "0.0.0.0" every IPv4 one.
  std::string host = "127.0.0.1";
  int port = 0;                    // 0: any free port
  std::string ready_file;          // when set, "host:port" is written there once serving,
                                   // after the process's other ready files
  std::string advertise_host;      // host registered with the router; empty: `host`
  std::string metrics_host;        // empty: `host`
  int metrics_port = 0;            // Prometheus /metrics; 0: any free port, -1: none
  std::string metrics_ready_file;  // when set, the metrics "host:port" is written there
  // A plaintext port that serves grpc.health.v1 alone, mirroring the process's health, for
  // probes that cannot speak mutual TLS (the kubelet's); -1: none, 0: any free port.
  int health_port = -1;
  std::string health_ready_file;  // when set, the health "host:port" is written there
  // gRPC resource quota of each server: threads serving calls at once (a call beyond it is
  // refused with RESOURCE_EXHAUSTED, never queued without bound) and buffer memory.
  int max_rpc_threads = 2048;
  int64_t rpc_memory_bytes = int64_t{1} << 30;
  // The largest message a caller may send; 0: the bound every server shares
  // (security::kMaxMessageBytes). The router's client server takes one derived from
  // --max-model-len (router_main.h ClientApiLimits).
  int max_receive_message_bytes = 0;
  // On SIGTERM or SIGINT the process drains (see ServeUntilShutdown) for at most this long.
  std::chrono::milliseconds drain_timeout{30000};
  // A node resolves the router names it registers with again this often, in the background
  // (RouterResolver): the heartbeat never waits on DNS.
  std::chrono::milliseconds router_resolve_interval{5000};
};

// Sets a grpc.health.v1 service's status on every server of the process.
using HealthSetter = std::function<void(const std::string& service, bool serving)>;

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  std::string address;  // host:port actually bound
};

// Writes "address\n" to `path` (nothing when empty) so that a reader never sees half of it.
void WriteAddressFile(const std::string& path, const std::string& address);

// Adds grpc.health.v1 (the service "liveness" is SERVING for as long as the process serves;
// "" follows readiness), sets the message bounds, binds with `credentials` (the internal
// mutual TLS of security.h when null), starts, writes the ready file. No server reflection:
// a client certificate may call health on an internal port and nothing else.
absl::StatusOr<StartedServer> StartServer(
    grpc::ServerBuilder& builder, const ServerOptions& options,
    std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);

// A second server of the same process on its own port: the router's client API, which never
// shares a port with the internal Registry.
struct ClientEndpoint {
  grpc::ServerBuilder* builder = nullptr;  // null: none
  ServerOptions options;                   // host, port and ready file
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Runs once the client server is up, before the process reports itself serving (the
  // router's HTTP front starts here, calling the server in-process) and before the ready file
  // is written; an error stops the start.
  std::function<absl::Status(grpc::Server&)> on_serving;
};

// The routers a node registers with: `routers` is a comma-separated list of host:port, and
// each host is resolved (DNS) to every address it has, so one name of a headless Kubernetes
// Service stands for all its router pods. An entry that does not resolve is kept as written.
std::vector<std::string> ResolveRouters(const std::string& routers);

// ResolveRouters on a thread of its own, again every `interval`, so that a slow resolver (a
// lookup under ndots:5 tries every search domain, each up to resolv.conf's timeout) delays no
// heartbeat: the heartbeat takes the last answer. An entry whose name stops resolving keeps
// the addresses it last resolved to. The thread is detached: destroying the resolver does not
// wait for a lookup in progress.
class RouterResolver {
 public:
  RouterResolver(std::string routers, std::chrono::milliseconds interval);
  ~RouterResolver();
  RouterResolver(const RouterResolver&) = delete;
  RouterResolver& operator=(const RouterResolver&) = delete;

  // The addresses of the latest resolution; before the first has finished, waits for it until
  // `until` (then empty).
  std::vector<std::string> Addresses(std::chrono::steady_clock::time_point until) const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// Registers a node with every router (see RouterResolver: the names are resolved again in the
// background, so routers that come and go are found) now and then every heartbeat, reporting its
// load, until destroyed. Failures are retried: a router may start later or restart. With `cache`,
// each registration carries the node's cache events since the last (CacheFeed::take), and a
// router's cache_resync answer calls CacheFeed::resync. Each load report says how many routers took
// the last round (LoadReport.routers: a router's share of a prefill node's slots depends on it).
class Heartbeat {
 public:
  using LoadFn = std::function<v1::LoadReport()>;
  struct CacheFeed {
    std::function<v1::CacheEventBatch()> take;
    std::function<void()> resync;
  };
  // `accepted`, when given, is told whether some router takes this node: true once one
  // accepts a registration, false again after three rounds in a row that none accepted
  // (refused, unreachable or silent); never called after Drain.
  Heartbeat(std::string routers, v1::RegisterRequest node, LoadFn load, CacheFeed cache = {},
            std::chrono::milliseconds resolve_interval = std::chrono::milliseconds(5000),
            std::function<void(bool accepted)> accepted = nullptr);
  ~Heartbeat();

  // Sends the routers a registration marked draining (again, until each has taken it or
  // `until` has passed), then stops registering. Returns once that is done.
  void Drain(std::chrono::steady_clock::time_point until);

 private:
  void Run();
  RouterResolver resolver_;
  v1::RegisterRequest node_;
  LoadFn load_;
  CacheFeed cache_;
  std::function<void(bool)> accepted_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool draining_ = false;  // Drain was called
  std::chrono::steady_clock::time_point drain_until_;
  bool drain_sent_ = false;  // the draining registration went out; the loop has ended
  std::thread thread_;
};

// The common life of a baton server binary: start (see StartServer) and its metrics server,
// print "<binary> serving on host:port", register with `router` (when set) as `node` reporting
// `load`, and serve until SIGINT or SIGTERM. Then drain: send the routers one registration
// marked draining and stop registering (the routers send nothing new from then on), turn
// readiness ("" in grpc.health.v1) NOT_SERVING, and call `drain` with a deadline
// options.drain_timeout away; it refuses new work and returns once what the process holds is
// finished or the deadline has passed. Then `on_stopping` runs and the servers shut down
// (cancelling whatever is left). With a `client` endpoint, that server starts too and is the
// one printed. A prefill or decode node is ready only while a router takes it: readiness is
// NOT_SERVING from the start until a router accepts its registration, and again once none has
// for three heartbeats (Heartbeat's `accepted`), so that a pod every router refuses (another
// model, config digest, split or CA; a port the network blocks) never counts as available
// in a rollout. `on_started` runs once the servers are up, with a setter of health statuses on
// all of them (the health port included). Returns the process exit status.
struct Registration {
  std::string router;  // comma-separated routers (see ResolveRouters); empty: do not register
  v1::RegisterRequest node;
  Heartbeat::LoadFn load;
  Heartbeat::CacheFeed cache;  // a prefill node's block-cache events
};
// The registration of a node of `role` called `node_id`, serving the model `fingerprint` under
// `model_name` with the config of `config_digest` (ConfigDigest; both "" for a store), and this
// build's version.
Registration NodeRegistration(std::string router, const std::string& node_id, v1::NodeRole role,
                              const std::string& fingerprint, Heartbeat::LoadFn load,
                              const std::string& model_name = "",
                              const std::string& config_digest = "");

int ServeUntilShutdown(
    const std::string& binary, grpc::ServerBuilder& builder, const ServerOptions& options,
    Registration registration, const std::function<void(HealthSetter)>& on_started = nullptr,
    const std::function<void()>& on_stopping = nullptr, ClientEndpoint client = {},
    const std::function<void(std::chrono::steady_clock::time_point deadline)>& drain = nullptr);

// Blocks SIGINT and SIGTERM in this thread (call first in main, before starting threads, so
// they inherit the mask) ...
void BlockShutdownSignals();
// ... and waits for one of them; returns the signal number.
int WaitForShutdownSignal();

}  // namespace baton
