#include "baton/launcher/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "baton/launcher/child_commands.h"
#include "baton/launcher/layout.h"
#include "baton/launcher/model_source.h"
#include "baton/launcher/preflight.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace baton::launcher {

namespace {

using Clock = std::chrono::steady_clock;

// The "host:port" each child wrote to its ready file.
struct Addresses {
  std::string router;    // the client API
  std::string internal;  // the router's internal API
  std::string http;      // the router's OpenAI API; empty when it serves none
  std::vector<std::string> kvstore, decode, prefill;  // in node order: "decode", "decode-1", ...
};

// Stores the address of a child that started in `out`.
absl::Status Keep(absl::StatusOr<std::string> address, std::string& out) {
  if (!address.ok()) return address.status();
  out = *std::move(address);
  return absl::OkStatus();
}

// The router, and its internal and HTTP addresses, which its restarts keep.
absl::Status StartRouter(const ChildCommands& commands, const Layout& layout, bool http,
                         Supervisor& children, Addresses& a) {
  if (absl::Status s = Keep(children.Start(commands.Router()), a.router); !s.ok()) return s;
  if (absl::Status s =
          Keep(children.AwaitLastChild(layout.ReadyFile(kRouterInternal), "--internal-port"),
               a.internal);
      !s.ok()) {
    return s;
  }
  if (!http) return absl::OkStatus();
  return Keep(children.AwaitLastChild(layout.ReadyFile(kRouterHttp), "--http-port"), a.http);
}

// The store nodes, then the decode nodes, then the prefill nodes (which name the first store
// node for requests that carry no store set; the router sends the live set with each one).
absl::Status StartNodes(const ChildCommands& commands, const LaunchOptions& options,
                        Supervisor& children, Addresses& a) {
  for (int i = 0; i < options.kvstore_nodes; ++i) {
    if (absl::Status s =
            Keep(children.Start(commands.Kvstore(i, a.internal)), a.kvstore.emplace_back());
        !s.ok()) {
      return s;
    }
  }
  for (int i = 0; i < options.decode_nodes; ++i) {
    if (absl::Status s =
            Keep(children.Start(commands.Decode(i, a.internal)), a.decode.emplace_back());
        !s.ok()) {
      return s;
    }
  }
  for (int i = 0; i < options.prefill_nodes; ++i) {
    if (absl::Status s = Keep(children.Start(commands.Prefill(i, a.internal, a.kvstore.front())),
                              a.prefill.emplace_back());
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// The nodes StartNodes starts, each with a certificate of its own.
std::vector<NodeName> NodeNames(const LaunchOptions& options) {
  std::vector<NodeName> nodes;
  for (int i = 0; i < options.kvstore_nodes; ++i) {
    nodes.push_back({"kvstore", InstanceName("kvstore", i)});
  }
  for (int i = 0; i < options.decode_nodes; ++i) {
    nodes.push_back({"decode", InstanceName("decode", i)});
  }
  for (int i = 0; i < options.prefill_nodes; ++i) {
    nodes.push_back({"prefill", InstanceName("prefill", i)});
  }
  return nodes;
}

// How `baton up` reaches the router's client API: plaintext, or TLS trusting the cluster's CA.
std::shared_ptr<grpc::ChannelCredentials> ClientCredentials(const LaunchOptions& options,
                                                            const Layout& layout) {
  if (!options.client_tls) return grpc::InsecureChannelCredentials();
  std::ifstream ca(layout.tls() / "ca.crt");
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs.assign(std::istreambuf_iterator<char>(ca), {});
  return grpc::SslCredentials(ssl);
}

bool WaitForServing(const std::string& address,
                    const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  auto channel = grpc::CreateChannel(address, credentials);
  auto stub = grpc::health::v1::Health::NewStub(channel);
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < until) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    if (stub->Check(&context, request, &response).ok() &&
        response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// Without keys every caller is one tenant: usage.cached_tokens tells anyone who can reach the
// API whether a prefix was sent recently (docs/deploy.md, "Prefix cache and tenants").
void WarnIfTheCacheIsShared(const LaunchOptions& options) {
  const std::string& host = options.host;
  const bool loopback = host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
  if (!loopback && options.api_keys.empty()) {
    std::cerr << "baton up: warning: serving " << host
              << " without --api-keys: every client shares one prefix cache, and "
                 "usage.cached_tokens tells any of them whether a prompt was sent recently\n";
  }
}

// The ready lines: the router's addresses, then every child's metrics address (tests and the
// bench scripts wait for "router at" and "metrics at").
void PrintReady(const LaunchOptions& options, const Layout& layout, const Addresses& a,
                const Supervisor& children) {
  std::cout << "baton up: router at " << a.router << (options.client_tls ? " (TLS)" : "")
            << " (internal " << a.internal << ", prefill " << absl::StrJoin(a.prefill, " ")
            << ", decode " << absl::StrJoin(a.decode, " ") << ", kvstore "
            << absl::StrJoin(a.kvstore, " ") << ")";
  if (!a.http.empty()) {
    std::cout << "; OpenAI API at " << (options.client_tls ? "https://" : "http://") << a.http
              << "/v1";
  }
  std::cout << "; certificates in " << layout.tls().string() << "; Ctrl-C to stop" << std::endl;
  std::cout << "baton up: metrics at";
  for (const std::string& name : children.Names()) {
    std::string metrics;
    std::ifstream(layout.MetricsFile(name)) >> metrics;
    std::cout << " " << name << " http://" << metrics << "/metrics";
  }
  std::cout << std::endl;
}

// Runs `program args` with its stdout and stderr in `out`, for at most 60 s; its exit status
// (-1 when it could not start, was killed or ran out of time).
int RunToFile(const std::string& program, const std::vector<std::string>& args,
              const std::filesystem::path& out) {
  std::vector<char*> argv = {const_cast<char*>(program.c_str())};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&files, 1, 2);
  pid_t pid = -1;
  const int error = posix_spawn(&pid, program.c_str(), &files, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  if (error != 0) return -1;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The --set settings, checked before anything starts: none names a flag baton up sets for its
// role itself, and each role's binary accepts its whole command line (its own table of
// options: names, types, ranges and allowed values; `--check-config`, which loads nothing).
absl::Status CheckSettings(const LaunchOptions& options, const ChildCommands& commands,
                           const Layout& layout) {
  if (options.settings.empty()) return absl::OkStatus();
  for (const ChildCommand& command :
       {commands.Router(), commands.Kvstore(0, "127.0.0.1:1"), commands.Decode(0, "127.0.0.1:1"),
        commands.Prefill(0, "127.0.0.1:1", "127.0.0.1:1")}) {
    const std::string role = command.name;
    for (const Setting& setting : options.settings) {
      if (setting.role != role) continue;
      const std::string flag = "--" + setting.name;
      if (std::count(command.args.begin(), command.args.end(), flag) > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--set ", role, ".", setting.name, ": baton up sets ", flag, " for the ",
                         role, " itself (see baton up --help for its own flag, if any)"));
      }
    }
    std::vector<std::string> args = command.args;
    args.push_back("--check-config");
    const std::filesystem::path out = layout.run() / (role + ".check-config");
    const int status = RunToFile(command.program, args, out);
    if (status != 0) {
      std::ifstream in(out);
      std::string line, error;
      while (std::getline(in, line)) {
        if (!line.empty()) error = line;
      }
      return absl::InvalidArgumentError(
          absl::StrCat("--set: baton-", role, " refuses its command line: ", error));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status StartCluster(const LaunchOptions& options, Supervisor& children) {
  if (absl::Status s = CheckDevice(options); !s.ok()) return s;
  if (options.kvstore_replication > options.kvstore_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kvstore-replication: ", options.kvstore_replication, " owners per value need at least ",
        options.kvstore_replication, " store nodes; --kvstore-nodes is ", options.kvstore_nodes));
  }
  absl::StatusOr<Layout> layout = MakeLayout(options.data_dir);
  if (!layout.ok()) return layout.status();
  absl::StatusOr<ServedModel> model = ResolveModel(options, *layout);
  if (!model.ok()) return model.status();
  if (absl::Status s = MakeClusterPki(*layout, NodeNames(options)); !s.ok()) return s;
  ClearRunFiles(*layout);
  WarnIfTheCacheIsShared(options);

  const ChildCommands commands(options, *layout, *model);
  if (absl::Status s = CheckSettings(options, commands, *layout); !s.ok()) return s;
  Addresses addresses;
  const bool up = StartRouter(commands, *layout, model->http, children, addresses).ok() &&
                  StartNodes(commands, options, children, addresses).ok() &&
                  WaitForServing(addresses.router, ClientCredentials(options, *layout));
  if (!up) return absl::AbortedError("a component failed to start; stopping the others");
  PrintReady(options, *layout, addresses, children);
  return absl::OkStatus();
}

int ExitCode(const absl::Status& status) {
  if (status.ok()) return 0;
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace baton::launcher
