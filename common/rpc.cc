#include "baton/common/rpc.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "baton/common/log.h"
#include "baton/common/metrics.h"
#include "baton/common/security.h"
#include "grpcpp/health_check_service_interface.h"

namespace baton {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

void WriteAddressFile(const std::string& path, const std::string& address) {
  if (path.empty()) return;
  // Write then rename, so a reader never sees half an address.
  const std::string partial = path + ".partial";
  std::ofstream(partial, std::ios::trunc) << address << "\n";
  std::rename(partial.c_str(), path.c_str());
}

absl::StatusOr<StartedServer> StartServer(grpc::ServerBuilder& builder,
                                          const ServerOptions& options,
                                          std::shared_ptr<grpc::ServerCredentials> credentials) {
  grpc::EnableDefaultHealthCheckService(true);
  builder.SetMaxReceiveMessageSize(security::kMaxMessageBytes);
  builder.SetMaxSendMessageSize(security::kMaxMessageBytes);
  grpc::ResourceQuota quota(absl::StrCat("baton:", options.port));
  quota.SetMaxThreads(options.max_rpc_threads);
  quota.Resize(static_cast<size_t>(options.rpc_memory_bytes));
  builder.SetResourceQuota(quota);
  // A peer that vanishes without closing its connection (a cut link, a frozen host) is found
  // by HTTP/2 pings: the server pings every 10 s and drops the connection after 10 s without
  // an answer, which cancels its calls and frees what they held. Clients ping as often
  // (security::ChannelArguments); this server accepts pings that often.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, security::kKeepaliveMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, security::kKeepaliveMs);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             security::kKeepaliveMs / 2);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  int port = 0;
  builder.AddListeningPort(
      absl::StrCat(options.host, ":", options.port),
      credentials != nullptr ? std::move(credentials) : security::InternalServerCredentials(),
      &port);
  StartedServer started;
  started.server = builder.BuildAndStart();
  if (started.server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.host, ":", options.port));
  }
  started.server->GetHealthCheckService()->SetServingStatus("liveness", true);
  started.address = absl::StrCat(options.host, ":", port);
  WriteAddressFile(options.ready_file, started.address);
  return started;
}

std::vector<std::string> ResolveRouters(const std::string& routers) {
  std::vector<std::string> out;
  for (absl::string_view entry : absl::StrSplit(routers, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    const size_t colon = entry.rfind(':');
    if (colon == absl::string_view::npos || entry.front() == '[') {
      out.emplace_back(entry);  // no port, or an IPv6 literal: gRPC takes it as it is
      continue;
    }
    const std::string host(entry.substr(0, colon)), port(entry.substr(colon + 1));
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
      out.emplace_back(entry);
      continue;
    }
    for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
      char ip[INET6_ADDRSTRLEN] = {};
      const void* bytes =
          a->ai_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
      if (inet_ntop(a->ai_family, bytes, ip, sizeof(ip)) == nullptr) continue;
      const std::string address = a->ai_family == AF_INET6 ? absl::StrCat("[", ip, "]:", port)
                                                           : absl::StrCat(ip, ":", port);
      if (std::find(out.begin(), out.end(), address) == out.end()) out.push_back(address);
    }
    freeaddrinfo(found);
  }
  return out;
}

Heartbeat::Heartbeat(std::string routers, v1::RegisterRequest node, LoadFn load)
    : routers_(std::move(routers)),
      node_(std::move(node)),
      load_(std::move(load)),
      thread_([this] { Run(); }) {}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Heartbeat::Run() {
  std::map<std::string, std::unique_ptr<v1::Registry::Stub>> stubs;  // by resolved address
  std::chrono::milliseconds period(200);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    lock.unlock();
    v1::RegisterRequest request = node_;
    *request.mutable_load() = load_();
    // Every router at once (the callback API), so that routers that do not answer delay
    // the others' heartbeats by one deadline at most, not one each.
    const std::vector<std::string> addresses = ResolveRouters(routers_);
    struct Call {
      grpc::ClientContext context;
      v1::RegisterResponse response;
      grpc::Status status;
    };
    std::vector<std::unique_ptr<Call>> calls;
    std::mutex done_mutex;
    std::condition_variable done;
    size_t pending = addresses.size();
    for (const std::string& address : addresses) {
      std::unique_ptr<v1::Registry::Stub>& stub = stubs[address];
      if (stub == nullptr) {
        stub = v1::Registry::NewStub(security::InternalChannel(address, security::Role::kRouter));
      }
      calls.push_back(std::make_unique<Call>());
      Call* call = calls.back().get();
      call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
      stub->async()->Register(&call->context, &request, &call->response,
                              [&, call](grpc::Status status) {
                                std::lock_guard<std::mutex> done_lock(done_mutex);
                                call->status = std::move(status);
                                if (--pending == 0) done.notify_all();
                              });
    }
    {
      std::unique_lock<std::mutex> done_lock(done_mutex);
      done.wait(done_lock, [&] { return pending == 0; });
    }
    for (const std::unique_ptr<Call>& call : calls) {
      if (call->status.ok() && call->response.heartbeat_ms() > 0) {
        period = std::chrono::milliseconds(call->response.heartbeat_ms());
      }
    }
    lock.lock();
    wake_.wait_for(lock, period, [this] { return stop_; });
  }
}

Registration NodeRegistration(std::string router, const std::string& node_id, v1::NodeRole role,
                              const std::string& fingerprint, Heartbeat::LoadFn load) {
  Registration registration{std::move(router), {}, std::move(load)};
  registration.node.set_node_id(node_id);
  registration.node.set_role(role);
  registration.node.set_model_fingerprint(fingerprint);
  return registration;
}

int ServeUntilShutdown(const std::string& binary, grpc::ServerBuilder& builder,
                       const ServerOptions& options, Registration registration,
                       const std::function<void(HealthSetter)>& on_started,
                       const std::function<void()>& on_stopping, ClientEndpoint client) {
  metrics::MetricsServer metrics_server;
  if (options.metrics_port >= 0) {
    absl::StatusOr<metrics::MetricsServer> metrics = metrics::StartMetricsServer(
        options.metrics_host.empty() ? options.host : options.metrics_host, options.metrics_port,
        binary);
    if (!metrics.ok()) {
      log::Error("cannot start", {{"error", std::string(metrics.status().message())}});
      return 1;
    }
    metrics_server = std::move(*metrics);
  }
  absl::StatusOr<StartedServer> started = StartServer(builder, options);
  if (!started.ok()) {
    log::Error("cannot start", {{"error", std::string(started.status().message())}});
    return 1;
  }
  absl::StatusOr<StartedServer> client_started;
  if (client.builder != nullptr) {
    client_started = StartServer(*client.builder, client.options, client.credentials);
    if (!client_started.ok()) {
      log::Error("cannot start", {{"error", std::string(client_started.status().message())}});
      return 1;
    }
    if (client.on_serving) {
      if (absl::Status s = client.on_serving(*client_started->server); !s.ok()) {
        log::Error("cannot start", {{"error", std::string(s.message())}});
        return 1;
      }
    }
  }
  absl::StatusOr<StartedServer> health_started;
  if (options.health_port >= 0) {
    grpc::ServerBuilder health_builder;
    ServerOptions health_options;
    health_options.host = options.host;
    health_options.port = options.health_port;
    health_options.ready_file = options.health_ready_file;
    health_options.max_rpc_threads = 16;  // health checks only
    health_started = StartServer(health_builder, health_options, grpc::InsecureServerCredentials());
    if (!health_started.ok()) {
      log::Error("cannot start", {{"error", std::string(health_started.status().message())}});
      return 1;
    }
  }
  std::vector<grpc::Server*> servers = {started->server.get()};
  if (client.builder != nullptr) servers.push_back(client_started->server.get());
  if (options.health_port >= 0) servers.push_back(health_started->server.get());
  const StartedServer& primary = client.builder != nullptr ? *client_started : *started;
  if (on_started) {
    on_started([servers](const std::string& service, bool serving) {
      for (grpc::Server* server : servers) {
        server->GetHealthCheckService()->SetServingStatus(service, serving);
      }
    });
  }
  WriteAddressFile(options.metrics_ready_file, metrics_server.address);
  std::cout << binary << " serving on " << primary.address << std::endl;
  log::Info("serving", {{"address", primary.address},
                        {"internal_address", started->address},
                        {"metrics", metrics_server.address},
                        {"mtls", security::Enabled()}});
  std::unique_ptr<Heartbeat> heartbeat;
  if (!registration.router.empty()) {
    const int port = std::stoi(started->address.substr(started->address.rfind(':') + 1));
    registration.node.set_address(options.advertise_host.empty()
                                      ? started->address
                                      : absl::StrCat(options.advertise_host, ":", port));
    heartbeat =
        std::make_unique<Heartbeat>(registration.router, registration.node, registration.load);
  }
  const int signal = WaitForShutdownSignal();
  log::Info("stopping", {{"signal", signal}});
  heartbeat.reset();
  if (on_stopping) on_stopping();
  const auto grace = std::chrono::system_clock::now() + std::chrono::seconds(2);
  if (options.health_port >= 0) health_started->server->Shutdown(grace);
  if (client.builder != nullptr) client_started->server->Shutdown(grace);
  started->server->Shutdown(grace);
  return 0;
}

void BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForShutdownSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int signal = 0;
  sigwait(&set, &signal);
  return signal;
}

}  // namespace baton
