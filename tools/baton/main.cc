// `baton up`: the embedded default (DESIGN section 7). Starts baton-router, baton-kvstore
// (RocksDB under <data-dir>/kvstore), --prefill-nodes baton-prefill and --decode-nodes
// baton-decode on loopback (serving the trained replay-aware model models/ced-brown-replay when
// no model is given, or generating --preset into the data dir) and prints the router address
// once it reports SERVING.
//
// Secure by default: a throwaway CA and one certificate per role (router, prefill, decode,
// kvstore, client) under <data-dir>/tls/, every internal surface on mutual TLS, the client
// port plaintext on loopback unless --client-tls (then TLS with the router's certificate), and
// --api-keys handed to the router.
//
// A component that exits on its own is started again on the same port (after 0.5 s, doubling
// to 10 s while it keeps failing within 30 s of its start), so faults can be tried by hand:
// kill -9 a decode node and its streams move to another and it comes back. Five quick
// failures in a row of one component stop everything (exit 1); --no-restart stops
// everything at the first exit instead. On SIGINT or SIGTERM every child is stopped and
// `baton up` exits only after all of them have exited.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "baton/common/pki.h"
#include "baton/common/rpc.h"
#include "baton/model/engine_factory.h"
#include "baton/model/model_factory.h"
#include "baton/transfer/ucx.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Child {
  std::string name;     // file stem under <data-dir>/run and the node id ("prefill-1")
  std::string program;  // the binary
  std::vector<std::string> args;
  pid_t pid = -1;
  Clock::time_point started;
  std::optional<Clock::time_point> restart_at;  // set while it waits to be started again
  int quick_failures = 0;                       // exits within 30 s of a start, in a row
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

// The port of a "host:port" address (the ready files' format).
std::string PortOf(const std::string& address) {
  return address.substr(address.rfind(':') + 1);
}

// Replaces the value after `flag` in `args` (or appends both).
void SetFlag(std::vector<std::string>& args, const std::string& flag, const std::string& value) {
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == flag) {
      args[i + 1] = value;
      return;
    }
  }
  args.insert(args.end(), {flag, value});
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
  up->add_option("--model", model_dir,
                 "Model directory (default: the trained model ced-brown-replay that ships with "
                 "baton)");
  std::string preset;
  up->add_option("--preset", preset,
                 "Generate this preset (tiny, small, ...) into the data dir and serve it, instead "
                 "of the trained default");
  up->add_option("--port", port, "Router port (0: any free port)");
  up->add_option("--data-dir", data_dir, "Where the generated model and run files go");
  up->add_option("--transport", transport, "StateBlock transport: ucx or grpc")
      ->check(CLI::IsMember({"ucx", "grpc"}));
  up->add_option("--decode-pages", decode_pages, "Block-KV pages of each decode node");
  int http_port = 8000;
  up->add_option("--http-port", http_port,
                 "The router's OpenAI-compatible HTTP API (0: any free port; -1: off); served "
                 "when the model has a tokenizer")
      ->check(CLI::Range(-1, 65535));
  std::string tokenizer_dir;
  up->add_option("--tokenizer", tokenizer_dir,
                 "Folder whose tokenizer.model (and tokenizer_config.json, "
                 "generation_config.json) the generated model gets (default: the one "
                 "scripts/setup.sh builds)")
      ->check(CLI::ExistingDirectory);
  std::string device = "cpu", weights = "fp32";
  up->add_option("--device", device,
                 "Where prefill and decode nodes run the model: cpu, or cuda (a CUDA build on a "
                 "machine with a GPU; exits 2 naming the reason otherwise)");
  up->add_option("--weights", weights,
                 "How the nodes hold the model's weight matrices: fp32, or bf16 (--device cpu "
                 "only)");
  int prefill_nodes = 1, decode_nodes = 1;
  bool no_restart = false;
  up->add_option("--prefill-nodes", prefill_nodes, "baton-prefill processes to run (1 to 16)")
      ->check(CLI::Range(1, 16));
  up->add_option("--decode-nodes", decode_nodes, "baton-decode processes to run (1 to 16)")
      ->check(CLI::Range(1, 16));
  up->add_flag("--no-restart", no_restart,
               "Stop everything when a component exits, instead of starting it again");
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
  std::string host = "127.0.0.1";
  up->add_option("--host", host,
                 "Address the router's client API and HTTP API listen on (default 127.0.0.1; "
                 "the nodes stay on loopback)");
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

  // Checked before anything starts: a node that cannot honour it would only exit later.
  if (absl::StatusOr<baton::model::Device> parsed = baton::model::ParseDevice(device, "--device");
      !parsed.ok()) {
    std::cerr << "baton up: " << parsed.status().message() << "\n";
    return 2;
  } else if (absl::StatusOr<std::unique_ptr<baton::model::Backend>> backend =
                 baton::model::MakeBackend(*parsed);
             !backend.ok()) {
    std::cerr << "baton up: --device " << device << ": " << backend.status().message() << "\n";
    return 2;
  }
  if (absl::StatusOr<baton::model::WeightType> parsed =
          baton::model::ParseWeightType(weights, "--weights");
      !parsed.ok()) {
    std::cerr << "baton up: " << parsed.status().message() << "\n";
    return 2;
  } else if (*parsed == baton::model::WeightType::kBf16 && device != "cpu") {
    std::cerr << "baton up: --weights bf16 is for --device cpu\n";
    return 2;
  }
  // The nodes would refuse a UCX_TLS that serves RMA over TCP (transfer/ucx.h); say so once.
  if (transport == "ucx") {
    if (auto transports = baton::transfer::UcxTransports(std::getenv("UCX_TLS"), false);
        !transports.ok()) {
      std::cerr << "baton up: " << transports.status().message() << "\n";
      return 2;
    }
  }
  std::error_code error;
  fs::create_directories(fs::path(data_dir) / "run", error);
  if (error) {
    std::cerr << "baton up: cannot create " << data_dir << ": " << error.message() << "\n";
    return 2;
  }
  const fs::path bin = fs::canonical("/proc/self/exe").parent_path();
  if (!model_dir.empty() && !preset.empty()) {
    std::cerr << "baton up: --model and --preset: give one of them\n";
    return 2;
  }
  const bool is_default = model_dir.empty() && preset.empty();  // neither --model nor --preset
  if (model_dir.empty() && preset.empty()) {
    // The trained default: the build tree (build/models links to the source's models/), an
    // installed layout (bin/../share/baton/models), or beside the binary.
    for (const fs::path& p : {bin.parent_path() / "models",
                              bin.parent_path() / "share" / "baton" / "models", bin / "models"}) {
      if (fs::exists(p / "ced-brown-replay" / "model.safetensors")) {
        model_dir = (p / "ced-brown-replay").string();
        std::cout << "baton up: serving the trained model " << model_dir << std::endl;
        break;
      }
    }
    if (model_dir.empty()) {
      std::cout << "baton up: the trained model ced-brown-replay is not installed beside "
                << bin.string() << "; generating the small preset" << std::endl;
      preset = "small";
    }
  }
  const bool generated = !preset.empty();
  if (generated) {
    auto config = baton::model::PresetConfig(preset);
    if (!config.ok()) {
      std::cerr << "baton up: --preset: " << config.status().message() << "\n";
      return 2;
    }
    // <data-dir>/model holds the small preset, as before --preset existed.
    model_dir = (fs::path(data_dir) / (preset == "small" ? "model" : "model-" + preset)).string();
    if (!fs::exists(fs::path(model_dir) / "model.safetensors")) {
      std::cout << "baton up: generating the " << preset << " model into " << model_dir
                << std::endl;
      if (absl::Status s = baton::model::MakeModel(*config, 0, model_dir); !s.ok()) {
        std::cerr << "baton up: " << s.message() << "\n";
        return 1;
      }
    }
    // The generated model takes text: the tokenizer scripts/setup.sh trains (4,096 pieces,
    // the small preset's vocabulary), found beside the binaries or in the build tree. A
    // preset of a smaller vocabulary (tiny) cannot take it and is served by token ids only.
    constexpr int64_t kDefaultTokenizerPieces = 4096;
    if (config->vocab_size < kDefaultTokenizerPieces) {
      std::cout << "baton up: the " << preset << " preset's vocabulary (" << config->vocab_size
                << ") is smaller than the default tokenizer's " << kDefaultTokenizerPieces
                << " pieces; it is served by token ids only" << std::endl;
    } else if (!fs::exists(fs::path(model_dir) / "tokenizer.model")) {
      if (tokenizer_dir.empty()) {
        // The build tree (build/tools/baton finds build/tokenizer), an installed layout
        // (bin/../share/baton/tokenizer), or beside the binary.
        for (const fs::path& p :
             {bin.parent_path() / "tokenizer", bin.parent_path() / "share" / "baton" / "tokenizer",
              bin / "tokenizer"}) {
          if (fs::exists(p / "tokenizer.model")) {
            tokenizer_dir = p.string();
            break;
          }
        }
      }
      if (tokenizer_dir.empty()) {
        std::cerr << "baton up: no tokenizer for the generated model (scripts/setup.sh builds "
                     "one into <build>/tokenizer); pass --tokenizer DIR\n";
        return 1;
      }
      if (absl::Status s = baton::model::CopyTokenizerFiles(tokenizer_dir, model_dir); !s.ok()) {
        std::cerr << "baton up: " << s.message() << "\n";
        return 1;
      }
    }
  }
  const bool http = http_port >= 0 && fs::exists(fs::path(model_dir) / "tokenizer.model");
  if (http_port >= 0 && !http) {
    std::cout << "baton up: no HTTP API: " << model_dir
              << " has no tokenizer.model (the OpenAI API takes text)" << std::endl;
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
  // The first prefill and decode node keep the plain names ("prefill", "decode"); the others
  // are numbered ("prefill-1", ...). Each name is the node id and the stem of its run files.
  auto instance = [](const std::string& role, int i) {
    return i == 0 ? role : role + "-" + std::to_string(i);
  };
  for (const fs::directory_entry& entry : fs::directory_iterator(run, error)) {
    const std::string ext = entry.path().extension().string();
    if (ext == ".addr" || ext == ".metrics") fs::remove(entry.path(), error);
  }

  std::vector<Child> children;
  // Every component: its metrics on any free port (written to run/<name>.metrics), the log
  // format, and the config file when given.
  auto start = [&](const std::string& name, const std::string& binary,
                   std::vector<std::string> args, std::string* address) {
    const std::string role = binary.substr(binary.find('-') + 1);
    const std::vector<std::string> tls_flags = identity(role);
    args.insert(args.end(), tls_flags.begin(), tls_flags.end());
    args.insert(args.end(), {"--metrics-port", "0", "--metrics-ready-file",
                             (run / (name + ".metrics")).string(), "--log-format", log_format,
                             "--ready-file", (run / (name + ".addr")).string()});
    if (!config_file.empty()) args.insert(args.end(), {"--config", config_file});
    const std::string path = program(binary.c_str());
    const pid_t pid = Spawn(path, args);
    if (pid < 0) return false;
    children.push_back({name, path, args, pid, Clock::now()});
    if (!WaitForReadyFile((run / (name + ".addr")).string(), pid, address)) return false;
    // A restart serves on the same port, so the others' addresses for it stay right.
    SetFlag(children.back().args, "--port", PortOf(*address));
    return true;
  };
  std::string router_address, internal_address, kvstore_address;
  std::vector<std::string> prefill_addresses, decode_addresses;
  std::vector<std::string> router_args = {"--model",
                                          model_dir,
                                          "--port",
                                          std::to_string(port),
                                          "--transport",
                                          transport,
                                          "--require-kvstore",
                                          "--internal-ready-file",
                                          (run / "router-internal.addr").string()};
  if (client_tls) {
    router_args.insert(router_args.end(), {"--client-tls-cert", (tls / "router.crt").string(),
                                           "--client-tls-key", (tls / "router.key").string()});
  }
  if (!api_keys.empty()) router_args.insert(router_args.end(), {"--api-keys", api_keys});
  if (host != "127.0.0.1") router_args.insert(router_args.end(), {"--host", host});
  // Without keys every caller is one tenant: usage.cached_tokens tells anyone who can reach the
  // API whether a prefix was sent recently (docs/deploy.md, "Prefix cache and tenants").
  const bool loopback = host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
  if (!loopback && api_keys.empty()) {
    std::cerr << "baton up: warning: serving " << host
              << " without --api-keys: every client shares one prefix cache, and "
                 "usage.cached_tokens tells any of them whether a prompt was sent recently\n";
  }
  // The router and its nodes serve the model under one name (a node of another is refused).
  std::vector<std::string> served_name;
  // The default model keeps the name baton up has always served it under, whichever weights
  // it is (the name is the API; a rollout changes weights behind it); a generated preset is
  // baton-<preset> (the small preset is the default's old self, baton-small).
  if (is_default) {
    served_name = {"--served-model-name", "baton-small"};
  } else if (generated) {
    served_name = {"--served-model-name", "baton-" + preset};
  }
  router_args.insert(router_args.end(), served_name.begin(), served_name.end());
  if (http) {
    router_args.insert(router_args.end(),
                       {"--http-port", std::to_string(http_port), "--http-ready-file",
                        (run / "router-http.addr").string()});
  }
  std::string http_address;
  bool ok = start("router", "baton-router", router_args, &router_address) &&
            WaitForReadyFile((run / "router-internal.addr").string(), children.back().pid,
                             &internal_address) &&
            (!http || WaitForReadyFile((run / "router-http.addr").string(), children.back().pid,
                                       &http_address));
  if (ok) SetFlag(children.back().args, "--internal-port", PortOf(internal_address));
  if (ok && http) SetFlag(children.back().args, "--http-port", PortOf(http_address));
  ok = ok && start("kvstore", "baton-kvstore",
                   {"--model", model_dir, "--router", internal_address, "--data-dir",
                    (fs::path(data_dir) / "kvstore").string(), "--budget-bytes",
                    std::to_string(kvstore_budget)},
                   &kvstore_address);
  for (int i = 0; ok && i < decode_nodes; ++i) {
    std::string address;
    std::vector<std::string> args = {"--model",   model_dir,
                                     "--router",  internal_address,
                                     "--node-id", instance("decode", i),
                                     "--pages",   std::to_string(decode_pages),
                                     "--device",  device,
                                     "--weights", weights};
    args.insert(args.end(), served_name.begin(), served_name.end());
    ok = start(instance("decode", i), "baton-decode", args, &address);
    decode_addresses.push_back(address);
  }
  for (int i = 0; ok && i < prefill_nodes; ++i) {
    std::string address;
    std::vector<std::string> args = {"--model",        model_dir,       "--router",
                                     internal_address, "--node-id",     instance("prefill", i),
                                     "--kvstore",      kvstore_address, "--device",
                                     device,           "--weights",     weights};
    args.insert(args.end(), served_name.begin(), served_name.end());
    ok = start(instance("prefill", i), "baton-prefill", args, &address);
    prefill_addresses.push_back(address);
  }
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
  auto list = [](const std::vector<std::string>& addresses) {
    std::string out;
    for (const std::string& a : addresses) out += (out.empty() ? "" : " ") + a;
    return out;
  };
  std::cout << "baton up: router at " << router_address << (client_tls ? " (TLS)" : "")
            << " (internal " << internal_address << ", prefill " << list(prefill_addresses)
            << ", decode " << list(decode_addresses) << ", kvstore " << kvstore_address << ")";
  if (http) {
    std::cout << "; OpenAI API at " << (client_tls ? "https://" : "http://") << http_address
              << "/v1";
  }
  std::cout << "; certificates in " << tls.string() << "; Ctrl-C to stop" << std::endl;
  std::cout << "baton up: metrics at";
  for (const Child& c : children) {
    std::string metrics;
    std::ifstream(run / (c.name + ".metrics")) >> metrics;
    std::cout << " " << c.name << " http://" << metrics << "/metrics";
  }
  std::cout << std::endl;

  int exit_code = 0;
  bool running = true;
  while (running) {
    // Wake for a signal, or when the next restart is due.
    auto wait = std::chrono::milliseconds(1000);
    for (const Child& c : children) {
      if (c.restart_at.has_value()) {
        wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(*c.restart_at -
                                                                                    Clock::now()));
      }
    }
    wait = std::max(wait, std::chrono::milliseconds(1));
    const timespec timeout{static_cast<time_t>(wait.count() / 1000),
                           static_cast<long>(wait.count() % 1000) * 1000000};
    siginfo_t info;
    const int signal = sigtimedwait(&signals, &info, &timeout);
    if (signal == SIGINT || signal == SIGTERM) break;
    for (Child& c : children) {
      int status;
      if (c.pid > 0 && waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.pid = -1;
        const std::string how = WIFSIGNALED(status)
                                    ? "killed by signal " + std::to_string(WTERMSIG(status))
                                    : "status " + std::to_string(WEXITSTATUS(status));
        if (no_restart) {
          std::cerr << "baton up: " << c.name << " exited (" << how << "); stopping the others\n";
          exit_code = 1;
          running = false;
          break;
        }
        const bool quick = Clock::now() - c.started < std::chrono::seconds(30);
        c.quick_failures = quick ? c.quick_failures + 1 : 1;
        if (c.quick_failures > 5) {
          std::cerr << "baton up: " << c.name << " exited (" << how
                    << ") five times in a row within 30 s of starting; stopping the others\n";
          exit_code = 1;
          running = false;
          break;
        }
        const auto delay = std::chrono::milliseconds(
            std::min<int64_t>(10000, int64_t{500} << (c.quick_failures - 1)));
        std::cerr << "baton up: " << c.name << " exited (" << how << "); restarting in "
                  << delay.count() << " ms\n";
        c.restart_at = Clock::now() + delay;
      }
    }
    for (Child& c : children) {
      if (!running) break;
      if (!c.restart_at.has_value() || Clock::now() < *c.restart_at) continue;
      c.restart_at.reset();
      std::error_code ignored;
      fs::remove(run / (c.name + ".addr"), ignored);
      c.pid = Spawn(c.program, c.args);
      c.started = Clock::now();
      if (c.pid < 0) {
        std::cerr << "baton up: cannot start " << c.name << " again; stopping the others\n";
        exit_code = 1;
        running = false;
        break;
      }
      std::cerr << "baton up: " << c.name << " restarted (pid " << c.pid << ")\n";
    }
  }
  StopAll(children);
  std::cout << "baton up: stopped" << std::endl;
  return exit_code;
}
