#include "baton/common/server_flags.h"

#include <iostream>

#include "absl/synchronization/mutex.h"
#include "baton/common/cert_expiry.h"
#include "baton/common/config_file.h"
#include "baton/common/model_files.h"
#include "baton/common/options.h"
#include "baton/common/stream_watch.h"

namespace baton {

void AddServerFlags(CLI::App& app, ServerFlags& flags) {
  ServerOptions& server = flags.server;
  app.add_option("--host", server.host,
                 "IP to listen on (default 127.0.0.1; \"::\" every address, IPv4 and IPv6; "
                 "0.0.0.0 every IPv4 one)");
  app.add_option("--port", server.port, "Port (0: any free port)")->check(baton::InRange(0, 65535));
  app.add_option("--advertise-host", server.advertise_host,
                 "Host other nodes reach this one at (default: --host)");
  app.add_option("--ready-file", server.ready_file,
                 "Write host:port here once serving (after the metrics and health ready files, so "
                 "that a reader of this one finds them)");
  app.add_option("--metrics-host", server.metrics_host,
                 "Address of the Prometheus endpoint (default: --host)");
  app.add_option("--metrics-port", server.metrics_port,
                 "Port of http://host:port/metrics (0: any free port, -1: no metrics)")
      ->check(baton::InRange(-1, 65535));
  app.add_option("--metrics-ready-file", server.metrics_ready_file,
                 "Write the metrics host:port here once serving");
  app.add_option("--health-port", server.health_port,
                 "Plaintext port serving grpc.health.v1 alone, for kubelet probes (-1: none, 0: "
                 "any free port)")
      ->check(baton::InRange(-1, 65535));
  app.add_option("--health-ready-file", server.health_ready_file,
                 "Write the health host:port here once serving");
  app.add_option("--max-rpc-threads", server.max_rpc_threads,
                 "Calls a server serves at once; more are refused with RESOURCE_EXHAUSTED")
      ->check(baton::InRange(4, 1 << 16));
  app.add_option("--rpc-memory-bytes", server.rpc_memory_bytes,
                 "Buffer memory of a server's calls (gRPC resource quota)")
      ->check(baton::InRange(int64_t{16} << 20, int64_t{1} << 40));
  app.add_option_function<std::string>(
         "--drain-timeout",
         [&server](const std::string& text) {
           absl::StatusOr<std::chrono::milliseconds> timeout =
               ParseDurationFlag("--drain-timeout", text);
           if (!timeout.ok()) throw CLI::ValidationError(std::string(timeout.status().message()));
           server.drain_timeout = *timeout;
         },
         "On SIGTERM: turn readiness NOT_SERVING, tell the routers, take no new work, and "
         "finish what the process holds for at most this long before exiting (30s, 500ms, 2m; "
         "a bare number is seconds; default 30s)")
      ->default_str("30s");
  app.add_option_function<int64_t>(
         "--router-resolve-ms",
         [&server](int64_t ms) { server.router_resolve_interval = std::chrono::milliseconds(ms); },
         "Nodes: resolve the --router names again this often, in the background (heartbeats "
         "use the latest answer and never wait on DNS; default 5000)")
      ->check(baton::InRange(int64_t{500}, int64_t{600000}))
      ->default_str("5000");
  AddModelFileFlag(app, flags.model_files);
  log::AddLogFlags(app, flags.log);
  security::AddTlsFlags(app, flags.tls);
}

std::optional<int> ParseServerFlags(CLI::App& app, int argc, char** argv, const std::string& binary,
                                    const std::string& section, const ServerFlags& flags) {
  // Abseil's mutexes (gRPC's locks are absl::Mutex) check every acquisition against a global
  // lock-order graph, under one global lock, unless abseil was built with NDEBUG, as Debian's
  // is not: 2.5% of a router's CPU at a thousand nodes, and a lock every gRPC thread takes. A
  // server turns it off before it starts a thread; the sanitizers and tests find lock-order
  // faults instead.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  bool check_only = false;
  app.add_flag("--check-config", check_only,
               "Check the flags and the config file, print the settings they give, and exit");
  bool print_options = false;  // read from argv before parsing, below
  app.add_flag("--print-options", print_options,
               "Print this binary's options (name, type, default, range or allowed values, help; "
               "each name is also its config-file key) as JSON, and exit");
  AddConfigFile(app, section, argc, argv);
  // Before parsing: the table needs no --model or other required flag.
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--print-options") {
      std::cout << DescribeOptions(app, binary, section) << "\n";
      return 0;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << binary << ": error: " << e.what() << "\n";
    return 2;
  }
  if (absl::Status s = security::Configure(flags.tls); !s.ok()) {
    std::cerr << binary << ": error: " << s.message() << "\n";
    return 2;
  }
  for (const std::string& file : flags.model_files) {
    if (absl::StatusOr<ModelFile> parsed = ParseModelFile(file, "--model-file"); !parsed.ok()) {
      std::cerr << binary << ": error: " << parsed.status().message() << "\n";
      return 2;
    }
  }
  if (check_only) {
    std::cout << "# " << binary << ": configuration ok\n" << app.config_to_str(false, false);
    return 0;
  }
  log::Init(binary, flags.log);
  // The expiry of the internal certificate, for as long as the process runs.
  if (!flags.tls.insecure && !flags.tls.cert_file.empty()) {
    static const std::shared_ptr<metrics::Collector> expiry =
        ExportCertificateExpiry({{"internal", flags.tls.cert_file}});
  }
  // Every server takes --model; the weights it names must be the release's before anything
  // loads them.
  if (const CLI::Option* model = app.get_option_no_throw("--model");
      model != nullptr && model->count() > 0) {
    if (absl::Status s = CheckModelFiles(model->as<std::string>(), flags.model_files); !s.ok()) {
      log::Error("cannot start", {{"error", std::string(s.message())}});
      return 2;
    }
  } else if (!flags.model_files.empty()) {
    log::Error("cannot start", {{"error", "--model-file: this binary reads no --model directory"}});
    return 2;
  }
  return std::nullopt;
}

}  // namespace baton
