// `baton up`: the embedded default (DESIGN section 7). Starts baton-router, baton-kvstore
// (RocksDB under <data-dir>/kvstore), one baton-prefill and one baton-decode on loopback
// (generating the small preset into the data dir when no model is given), prints the router address
// once it reports SERVING,
//
// Secure by default: a throwaway CA and one certificate per role (router, prefill, decode,
// kvstore, client) under <data-dir>/tls/, every internal surface on mutual TLS, the client
// port plaintext on loopback unless --client-tls (then TLS with the router's certificate), and
// --api-keys handed to the router. and on SIGINT or SIGTERM stops every child and exits only after
// all of them have exited. If a child dies on its own, the others are stopped too and `baton up`
// exits non-zero.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "baton/common/pki.h"
#include "baton/common/rpc.h"
#include "baton/model/model_factory.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Child {
  std::string name;
  pid_t pid = -1;
};

pid_t Spawn(const std::string& program, const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // Children start with the default signal mask so that they handle SIGINT/SIGTERM themselves.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int error = posix_spawn(&pid, program.c_str(), nullptr, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  return error == 0 ? pid : -1;
}

// Waits for `path` to hold an address; false if `pid` exits first or time runs out.
bool WaitForReadyFile(const std::string& path, pid_t pid, std::string* address) {
  const auto until = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < until) {
    std::ifstream in(path);
    if (in >> *address) return true;
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
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

void StopAll(std::vector<Child>& children) {
  for (Child& c : children) {
    if (c.pid > 0) kill(c.pid, SIGTERM);
  }
  const auto until = Clock::now() + std::chrono::seconds(10);
  for (Child& c : children) {
    while (c.pid > 0) {
      int status;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.pid = -1;
      } else if (Clock::now() > until) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &status, 0);
        c.pid = -1;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Block the shutdown signals (and SIGCHLD) in every thread; sigtimedwait picks them up.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  CLI::App app{"baton: run a whole baton cluster on this machine"};
  app.require_subcommand(1);
  CLI::App* up = app.add_subcommand("up", "Start router, prefill and decode on loopback");
  std::string model_dir, data_dir = "baton-data", transport = "ucx";
  int port = 50051;
  int64_t decode_pages = 2048;
  up->add_option("--model", model_dir, "Model directory (default: a small generated model)");
  up->add_option("--port", port, "Router port (0: any free port)");
  up->add_option("--data-dir", data_dir, "Where the generated model and run files go");
  up->add_option("--transport", transport, "StateBlock transport: ucx or grpc")
      ->check(CLI::IsMember({"ucx", "grpc"}));
  up->add_option("--decode-pages", decode_pages, "Block-KV pages of the decode node");
  uint64_t kvstore_budget = uint64_t{8} << 30;
  up->add_option("--kvstore-budget-bytes", kvstore_budget,
                 "Prefix-store budget under <data-dir>/kvstore (default 8 GiB)");
  std::string config_file, log_format = "text";
  up->add_option("--config", config_file,
                 "Config file handed to every component (each reads `common` and its own "
                 "section); the addresses, ports and paths baton up sets win")
      ->check(CLI::ExistingFile);
  up->add_option("--log-format", log_format, "Components log as text or json")
      ->check(CLI::IsMember({"text", "json"}));
  bool client_tls = false, insecure_internal = false;
  up->add_flag("--insecure-internal", insecure_internal,
               "Run the internal surfaces in plaintext (a baseline for benchmarks; trusted hosts "
               "only)");
  std::string api_keys;
  up->add_flag("--client-tls", client_tls,
               "Serve the client API over TLS with <data-dir>/tls/router.crt (clients trust "
               "<data-dir>/tls/ca.crt)");
  up->add_option("--api-keys", api_keys,
                 "YAML mapping API key -> tenant, handed to the router (clients send "
                 "'authorization: Bearer <key>')")
      ->check(CLI::ExistingFile);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  std::error_code error;
  fs::create_directories(fs::path(data_dir) / "run", error);
  if (error) {
    std::cerr << "baton up: cannot create " << data_dir << ": " << error.message() << "\n";
    return 2;
  }
  if (model_dir.empty()) {
    model_dir = (fs::path(data_dir) / "model").string();
    if (!fs::exists(fs::path(model_dir) / "model.safetensors")) {
      std::cout << "baton up: generating the small model into " << model_dir << std::endl;
      auto config = baton::model::PresetConfig("small");
      if (absl::Status s = baton::model::MakeModel(*config, 0, model_dir); !s.ok()) {
        std::cerr << "baton up: " << s.message() << "\n";
        return 1;
      }
    }
  }
  const fs::path tls = fs::path(data_dir) / "tls";
  if (absl::Status s = baton::pki::EnsureLocalPki(tls.string(), baton::pki::LocalRoles());
      !s.ok()) {
    std::cerr << "baton up: cannot make the certificates in " << tls.string() << ": " << s.message()
              << "\n";
    return 1;
  }
  // Every component: mutual TLS inside the cluster with its role's certificate.
  auto identity = [&](const std::string& role) {
    if (insecure_internal) return std::vector<std::string>{"--insecure-internal"};
    return std::vector<std::string>{"--tls-ca",   (tls / "ca.crt").string(),
                                    "--tls-cert", (tls / (role + ".crt")).string(),
                                    "--tls-key",  (tls / (role + ".key")).string()};
  };
  const fs::path bin = fs::canonical("/proc/self/exe").parent_path();
  auto program = [&](const char* name) {
    // Installed side by side, or in the build tree's folders.
    for (const fs::path& p :
         {bin / name, bin.parent_path() / "router" / name,
          bin.parent_path() / "prefill_node" / name, bin.parent_path() / "decode_node" / name,
          bin.parent_path() / "kvstore" / name}) {
      if (fs::exists(p)) return p.string();
    }
    return (bin / name).string();
  };
  const fs::path run = fs::path(data_dir) / "run";
  for (const char* name : {"router", "router-internal", "prefill", "decode", "kvstore"}) {
    fs::remove(run / (std::string(name) + ".addr"), error);
    fs::remove(run / (std::string(name) + ".metrics"), error);
  }

  std::vector<Child> children;
  // Every component: its metrics on any free port (written to run/<role>.metrics), the log
  // format, and the config file when given.
  auto start = [&](const std::string& name, std::vector<std::string> args, const fs::path& ready,
                   std::string* address) {
    const std::string role = name.substr(name.find('-') + 1);
    const std::vector<std::string> tls_flags = identity(role);
    args.insert(args.end(), tls_flags.begin(), tls_flags.end());
    args.insert(args.end(), {"--metrics-port", "0", "--metrics-ready-file",
                             (run / (role + ".metrics")).string(), "--log-format", log_format});
    if (!config_file.empty()) args.insert(args.end(), {"--config", config_file});
    const pid_t pid = Spawn(program(name.c_str()), args);
    if (pid < 0) return false;
    children.push_back({name, pid});
    return WaitForReadyFile(ready.string(), pid, address);
  };
  std::string router_address, internal_address, prefill_address, decode_address, kvstore_address;
  std::vector<std::string> router_args = {"--model",
                                          model_dir,
                                          "--port",
                                          std::to_string(port),
                                          "--transport",
                                          transport,
                                          "--require-kvstore",
                                          "--internal-ready-file",
                                          (run / "router-internal.addr").string(),
                                          "--ready-file",
                                          (run / "router.addr").string()};
  if (client_tls) {
    router_args.insert(router_args.end(), {"--client-tls-cert", (tls / "router.crt").string(),
                                           "--client-tls-key", (tls / "router.key").string()});
  }
  if (!api_keys.empty()) router_args.insert(router_args.end(), {"--api-keys", api_keys});
  bool ok = start("baton-router", router_args, run / "router.addr", &router_address) &&
            WaitForReadyFile((run / "router-internal.addr").string(), children.back().pid,
                             &internal_address);
  ok =
      ok && start("baton-kvstore",
                  {"--model", model_dir, "--router", internal_address, "--data-dir",
                   (fs::path(data_dir) / "kvstore").string(), "--budget-bytes",
                   std::to_string(kvstore_budget), "--ready-file", (run / "kvstore.addr").string()},
                  run / "kvstore.addr", &kvstore_address);
  ok = ok && start("baton-decode",
                   {"--model", model_dir, "--router", internal_address, "--pages",
                    std::to_string(decode_pages), "--ready-file", (run / "decode.addr").string()},
                   run / "decode.addr", &decode_address);
  ok = ok && start("baton-prefill",
                   {"--model", model_dir, "--router", internal_address, "--kvstore",
                    kvstore_address, "--ready-file", (run / "prefill.addr").string()},
                   run / "prefill.addr", &prefill_address);
  std::shared_ptr<grpc::ChannelCredentials> client_credentials = grpc::InsecureChannelCredentials();
  if (client_tls) {
    std::ifstream ca(tls / "ca.crt");
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs.assign(std::istreambuf_iterator<char>(ca), {});
    client_credentials = grpc::SslCredentials(ssl);
  }
  ok = ok && WaitForServing(router_address, client_credentials);
  if (!ok) {
    std::cerr << "baton up: a component failed to start; stopping the others\n";
    StopAll(children);
    return 1;
  }
  std::cout << "baton up: router at " << router_address << (client_tls ? " (TLS)" : "")
            << " (internal " << internal_address << ", prefill " << prefill_address << ", decode "
            << decode_address << ", kvstore " << kvstore_address << "); certificates in "
            << tls.string() << "; Ctrl-C to stop" << std::endl;
  std::cout << "baton up: metrics at";
  for (const char* role : {"router", "prefill", "decode", "kvstore"}) {
    std::string metrics;
    std::ifstream(run / (std::string(role) + ".metrics")) >> metrics;
    std::cout << " " << role << " http://" << metrics << "/metrics";
  }
  std::cout << std::endl;

  int exit_code = 0;
  while (true) {
    siginfo_t info;
    const int signal = sigwaitinfo(&signals, &info);
    if (signal == SIGINT || signal == SIGTERM) break;
    if (signal == SIGCHLD) {
      bool lost = false;
      for (Child& c : children) {
        int status;
        if (c.pid > 0 && waitpid(c.pid, &status, WNOHANG) == c.pid) {
          std::cerr << "baton up: " << c.name << " exited; stopping the others\n";
          c.pid = -1;
          lost = true;
        }
      }
      if (lost) {
        exit_code = 1;
        break;
      }
    }
  }
  StopAll(children);
  std::cout << "baton up: stopped" << std::endl;
  return exit_code;
}
