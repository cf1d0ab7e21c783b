#include "baton/common/rpc.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "baton/common/log.h"
#include "baton/common/metrics.h"
#include "baton/common/parse.h"
#include "baton/common/security.h"
#include "grpcpp/generic/async_generic_service.h"
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
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes > 0
                                       ? options.max_receive_message_bytes
                                       : security::kMaxMessageBytes);
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
  // gRPC binds a wildcard ("[::]" or "0.0.0.0") to every address it can, IPv6 and IPv4.
  builder.AddListeningPort(
      JoinHostPort(options.host, options.port),
      credentials != nullptr ? std::move(credentials) : security::InternalServerCredentials(),
      &port);
  StartedServer started;
  started.server = builder.BuildAndStart();
  if (started.server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.host, ":", options.port));
  }
  started.server->GetHealthCheckService()->SetServingStatus("liveness", true);
  started.address = JoinHostPort(options.host, port);
  WriteAddressFile(options.ready_file, started.address);
  return started;
}

namespace {

std::vector<std::string> Entries(const std::string& routers) {
  std::vector<std::string> out;
  for (absl::string_view entry : absl::StrSplit(routers, ',', absl::SkipWhitespace())) {
    out.emplace_back(absl::StripAsciiWhitespace(entry));
  }
  return out;
}

// What resolving one entry gave.
struct Resolved {
  std::vector<std::string> addresses;  // empty: it did not resolve
  bool temporary = false;              // ... for now (a timeout, a server failure)
};

// One entry's addresses. An entry without a port, or an IPv6 literal, is taken as it is (gRPC
// resolves it). Of a name with IPv4 and IPv6 addresses (a dual-stack Service), only those of
// the family getaddrinfo prefers: each router is registered with once a beat, not once per
// family (its cache-event sequence would see every batch twice).
Resolved ResolveEntry(const std::string& entry) {
  const size_t colon = entry.rfind(':');
  if (colon == std::string::npos || entry.front() == '[') return {.addresses = {entry}};
  const std::string host = entry.substr(0, colon), port = entry.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
      error != 0 || found == nullptr) {
    return {.temporary = error == EAI_AGAIN || error == EAI_FAIL || error == EAI_SYSTEM ||
                         error == EAI_MEMORY};
  }
  std::vector<std::string> out;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family != found->ai_family) continue;
    char ip[INET6_ADDRSTRLEN] = {};
    const void* bytes =
        a->ai_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    if (inet_ntop(a->ai_family, bytes, ip, sizeof(ip)) == nullptr) continue;
    // The port as written: getaddrinfo took it (a number, or a service name).
    const std::string address =
        a->ai_family == AF_INET6 ? absl::StrCat("[", ip, "]:", port) : absl::StrCat(ip, ":", port);
    if (std::find(out.begin(), out.end(), address) == out.end()) out.push_back(address);
  }
  freeaddrinfo(found);
  return {.addresses = std::move(out)};
}

void AppendNew(const std::vector<std::string>& addresses, std::vector<std::string>& out) {
  for (const std::string& address : addresses) {
    if (std::find(out.begin(), out.end(), address) == out.end()) out.push_back(address);
  }
}

}  // namespace

std::vector<std::string> ResolveRouters(const std::string& routers) {
  std::vector<std::string> out;
  for (const std::string& entry : Entries(routers)) {
    Resolved resolved = ResolveEntry(entry);
    AppendNew(resolved.addresses.empty() ? std::vector<std::string>{entry} : resolved.addresses,
              out);
  }
  return out;
}

struct RouterResolver::State {
  std::mutex mutex;
  std::condition_variable changed;
  bool stop = false;
  bool resolved = false;               // a first resolution has finished
  std::vector<std::string> addresses;  // of the latest one
};

RouterResolver::RouterResolver(std::string routers, std::chrono::milliseconds interval)
    : state_(std::make_shared<State>()) {
  std::thread([state = state_, routers = std::move(routers), interval] {
    std::map<std::string, std::vector<std::string>> last;  // each entry's last good answer
    std::set<std::string> unresolved;                      // entries logged as not resolving
    std::unique_lock<std::mutex> lock(state->mutex);
    while (!state->stop) {
      lock.unlock();
      std::vector<std::string> addresses;
      for (const std::string& entry : Entries(routers)) {
        Resolved resolved = ResolveEntry(entry);
        // Once stopped (a lookup may take a while), the process may be exiting: no more logs.
        if (std::lock_guard<std::mutex> stopping(state->mutex); state->stop) return;
        if (!resolved.addresses.empty()) {
          last[entry] = std::move(resolved.addresses);
          unresolved.erase(entry);
        } else {
          // A name that no longer exists (NXDOMAIN: the Service is gone, or has no ready
          // router) loses its addresses; one that only failed for now keeps its last.
          if (!resolved.temporary) last.erase(entry);
          if (unresolved.insert(entry).second) {
            log::Warn(
                "router name does not resolve",
                {{"router", entry},
                 {"using", last.contains(entry) ? "its last addresses" : "the name as written"}});
          }
        }
        auto known = last.find(entry);
        AppendNew(known != last.end() ? known->second : std::vector<std::string>{entry}, addresses);
      }
      lock.lock();
      state->addresses = std::move(addresses);
      state->resolved = true;
      state->changed.notify_all();
      state->changed.wait_for(lock, interval, [&] { return state->stop; });
    }
  }).detach();
}

RouterResolver::~RouterResolver() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->stop = true;
  state_->changed.notify_all();
}

std::vector<std::string> RouterResolver::Addresses(
    std::chrono::steady_clock::time_point until) const {
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->changed.wait_until(lock, until, [this] { return state_->resolved || state_->stop; });
  return state_->addresses;
}

Heartbeat::Heartbeat(std::string routers, v1::RegisterRequest node, LoadFn load, CacheFeed cache,
                     std::chrono::milliseconds resolve_interval,
                     std::function<void(bool accepted)> accepted)
    : resolver_(std::move(routers), resolve_interval),
      node_(std::move(node)),
      load_(std::move(load)),
      cache_(std::move(cache)),
      accepted_(std::move(accepted)),
      thread_([this] { Run(); }) {}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Heartbeat::Drain(std::chrono::steady_clock::time_point until) {
  std::unique_lock<std::mutex> lock(mutex_);
  draining_ = true;
  drain_until_ = until;
  wake_.notify_all();
  // A round that waits on a router's deadline may overrun `until` a little.
  wake_.wait_until(lock, until + std::chrono::seconds(2), [this] { return drain_sent_ || stop_; });
}

namespace {

// One registration with a router, answered or not.
struct RegisterCall {
  grpc::ClientContext context;
  v1::RegisterResponse response;
  grpc::Status status;
};

// `request` to every router at `addresses` at once, each within a second (the callback API: a
// router that does not answer delays the others by one deadline at most, not one each), and
// every call's outcome once all have ended. `stubs` keeps a stub per address.
std::vector<std::unique_ptr<RegisterCall>> RegisterWithAll(
    const std::vector<std::string>& addresses, const v1::RegisterRequest& request,
    std::map<std::string, std::unique_ptr<v1::Registry::Stub>>& stubs) {
  std::vector<std::unique_ptr<RegisterCall>> calls;
  std::mutex done_mutex;
  std::condition_variable done;
  size_t pending = addresses.size();
  for (const std::string& address : addresses) {
    std::unique_ptr<v1::Registry::Stub>& stub = stubs[address];
    if (stub == nullptr) {
      stub = v1::Registry::NewStub(security::InternalChannel(address, security::Role::kRouter));
    }
    calls.push_back(std::make_unique<RegisterCall>());
    RegisterCall* call = calls.back().get();
    call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    stub->async()->Register(&call->context, &request, &call->response,
                            [&, call](grpc::Status status) {
                              std::lock_guard<std::mutex> done_lock(done_mutex);
                              call->status = std::move(status);
                              if (--pending == 0) done.notify_all();
                            });
  }
  std::unique_lock<std::mutex> done_lock(done_mutex);
  done.wait(done_lock, [&] { return pending == 0; });
  return calls;
}

// A node's registration rounds, as /metrics shows them.
struct RoundMetrics {
  prometheus::Gauge& routers;
  prometheus::Counter& rounds;
};
RoundMetrics MakeRoundMetrics() {
  return {metrics::Gauge("baton_node_routers",
                         "Routers that took this node's last round of registrations (a prefill "
                         "node's slots are shared among them)")
              .Add({}),
          metrics::Counter("baton_node_registration_rounds_total",
                           "Rounds of registrations (heartbeats) this node has sent its routers, "
                           "each answered or timed out")
              .Add({})};
}

}  // namespace

void Heartbeat::Run() {
  std::map<std::string, std::unique_ptr<v1::Registry::Stub>> stubs;  // by resolved address
  std::chrono::milliseconds period(200);
  std::set<std::string> refusals_logged;  // routers whose refusal was logged
  bool taken = false;    // what `accepted_` was last told
  int untaken_rounds = 0;  // rounds in a row that no router accepted
  uint32_t routers = 0;    // routers that took the last round (reported with the load)
  const RoundMetrics metrics = MakeRoundMetrics();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_ && !drain_sent_) {
    const bool draining = draining_;
    lock.unlock();
    v1::RegisterRequest request = node_;
    request.set_draining(draining);
    *request.mutable_load() = load_();
    request.mutable_load()->set_routers(routers);
    if (cache_.take) *request.mutable_cache_events() = cache_.take();
    // Every router at once (the callback API), so that routers that do not answer delay
    // the others' heartbeats by one deadline at most, not one each. The addresses are the
    // resolver's latest; only the very first beat waits for a first answer (a period).
    const std::vector<std::string> addresses =
        resolver_.Addresses(std::chrono::steady_clock::now() + period);
    const std::vector<std::unique_ptr<RegisterCall>> calls =
        RegisterWithAll(addresses, request, stubs);
    // Routers that took the registration, refused it or are gone (no connection: they route
    // nothing) are done with; one that let the deadline pass may not have seen it yet.
    bool all_answered = true;
    bool resync = false;
    for (size_t i = 0; i < calls.size(); ++i) {
      const grpc::Status& status = calls[i]->status;
      // A router that missed a batch asks for a snapshot (it finds the gap itself).
      resync = resync || (status.ok() && calls[i]->response.cache_resync());
      all_answered = all_answered && status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED;
      if (status.ok() && calls[i]->response.heartbeat_ms() > 0) {
        period = std::chrono::milliseconds(calls[i]->response.heartbeat_ms());
      }
      // A router that refuses this node (a model it does not serve) says why, once.
      if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
          refusals_logged.insert(addresses[i]).second) {
        log::Warn("registration refused",
                  {{"router", addresses[i]}, {"error", status.error_message()}});
      }
    }
    if (resync && cache_.resync) cache_.resync();
    const bool any_ok = std::any_of(calls.begin(), calls.end(),
                                    [](const auto& call) { return call->status.ok(); });
    routers = static_cast<uint32_t>(std::count_if(
        calls.begin(), calls.end(), [](const auto& call) { return call->status.ok(); }));
    metrics.routers.Set(routers);
    metrics.rounds.Increment();
    untaken_rounds = any_ok ? 0 : untaken_rounds + 1;
    if (accepted_ && !draining && (any_ok ? !taken : taken && untaken_rounds >= 3)) {
      taken = any_ok;
      log::Info("readiness", {{"serving", taken},
                              {"message", taken ? "a router accepted this node"
                                                : "no router has accepted this node for three "
                                                  "heartbeats"}});
      accepted_(taken);
    }
    lock.lock();
    // The draining registration is sent again while a router let its deadline pass, until
    // Drain's bound: a router that missed it would keep sending work until the node's TTL.
    if (draining && (all_answered || std::chrono::steady_clock::now() >= drain_until_)) {
      drain_sent_ = true;
      wake_.notify_all();
      break;
    }
    if (draining) {
      wake_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; });
    } else {
      wake_.wait_for(lock, period, [this] { return stop_ || draining_; });
    }
  }
}

Registration NodeRegistration(std::string router, const std::string& node_id, v1::NodeRole role,
                              const std::string& fingerprint, Heartbeat::LoadFn load,
                              const std::string& model_name, const std::string& config_digest) {
  Registration registration{std::move(router), {}, std::move(load)};
  registration.node.set_node_id(node_id);
  registration.node.set_role(role);
  registration.node.set_model_fingerprint(fingerprint);
  registration.node.set_model_name(model_name);
  registration.node.set_config_digest(config_digest);
  registration.node.set_build_version(BATON_VERSION);
  return registration;
}

namespace {

// The client server (ClientEndpoint), with what rides on it started (on_serving). Its ready
// file is written later, with the others, once every listener is up.
absl::StatusOr<StartedServer> StartClientServer(ClientEndpoint& client) {
  ServerOptions client_options = client.options;
  client_options.ready_file.clear();
  absl::StatusOr<StartedServer> started =
      StartServer(*client.builder, client_options, client.credentials);
  if (!started.ok() || !client.on_serving) return started;
  if (absl::Status s = client.on_serving(*started->server); !s.ok()) return s;
  return started;
}

// The plaintext health server on --health-port, serving grpc.health.v1 alone (`health_only`
// answers every other method UNIMPLEMENTED).
absl::StatusOr<StartedServer> StartHealthServer(const ServerOptions& options,
                                                grpc::CallbackGenericService& health_only) {
  grpc::ServerBuilder health_builder;
  health_builder.RegisterCallbackGenericService(&health_only);
  ServerOptions health_options;
  health_options.host = options.host;
  health_options.port = options.health_port;
  health_options.ready_file = options.health_ready_file;
  health_options.max_rpc_threads = 16;  // health checks only
  return StartServer(health_builder, health_options, grpc::InsecureServerCredentials());
}

// Registration with the routers, at the advertised address of the server at `address`.
// Prefill and decode nodes are ready only while a router takes them (see the header): their
// `servers` report NOT_SERVING until then.
std::unique_ptr<Heartbeat> StartHeartbeat(Registration& registration, const ServerOptions& options,
                                          const std::string& address,
                                          const std::vector<grpc::Server*>& servers) {
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  registration.node.set_address(
      options.advertise_host.empty() ? address : JoinHostPort(options.advertise_host, port));
  const bool gated = registration.node.role() == v1::NODE_ROLE_PREFILL ||
                     registration.node.role() == v1::NODE_ROLE_DECODE;
  auto set_ready = [servers](bool serving) {
    for (grpc::Server* server : servers) {
      server->GetHealthCheckService()->SetServingStatus("", serving);
    }
  };
  if (gated) set_ready(false);
  return std::make_unique<Heartbeat>(
      registration.router, registration.node, registration.load, registration.cache,
      options.router_resolve_interval,
      gated ? std::function<void(bool)>(set_ready) : std::function<void(bool)>());
}

// After a shutdown signal: the routers told (the draining registration), readiness off
// ("liveness" stays on: the process is alive until it exits), `drain` until the drain timeout,
// then `on_stopping` and every server shut down, the last of `servers` first.
void DrainAndStop(const std::string& binary, const ServerOptions& options,
                  std::unique_ptr<Heartbeat> heartbeat, const std::vector<grpc::Server*>& servers,
                  const std::function<void(std::chrono::steady_clock::time_point)>& drain,
                  const std::function<void()>& on_stopping) {
  const int signal = WaitForShutdownSignal();
  const auto deadline = std::chrono::steady_clock::now() + options.drain_timeout;
  log::Info("draining", {{"signal", signal},
                         {"drain_timeout_ms", static_cast<int64_t>(options.drain_timeout.count())},
                         {"message", absl::StrCat(binary, " draining")}});
  if (heartbeat != nullptr) {
    heartbeat->Drain(
        std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(5)));
  }
  heartbeat.reset();
  for (grpc::Server* server : servers) server->GetHealthCheckService()->SetServingStatus("", false);
  if (drain) drain(deadline);
  log::Info("stopping",
            {{"signal", signal}, {"drained", std::chrono::steady_clock::now() < deadline}});
  if (on_stopping) on_stopping();
  const auto grace = std::chrono::system_clock::now() + std::chrono::seconds(2);
  for (auto it = servers.rbegin(); it != servers.rend(); ++it) (*it)->Shutdown(grace);
}

}  // namespace

int ServeUntilShutdown(const std::string& binary, grpc::ServerBuilder& builder,
                       const ServerOptions& options, Registration registration,
                       const std::function<void(HealthSetter)>& on_started,
                       const std::function<void()>& on_stopping, ClientEndpoint client,
                       const std::function<void(std::chrono::steady_clock::time_point)>& drain) {
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
  // The ready files are written last, once every listener of this process is up (the metrics,
  // the client and the health server), so that whoever waits for one finds them all.
  ServerOptions internal_options = options;
  internal_options.ready_file.clear();
  absl::StatusOr<StartedServer> started = StartServer(builder, internal_options);
  if (!started.ok()) {
    log::Error("cannot start", {{"error", std::string(started.status().message())}});
    return 1;
  }
  absl::StatusOr<StartedServer> client_started;
  if (client.builder != nullptr) {
    client_started = StartClientServer(client);
    if (!client_started.ok()) {
      log::Error("cannot start", {{"error", std::string(client_started.status().message())}});
      return 1;
    }
  }
  // The health server serves grpc.health.v1 and nothing else. gRPC refuses to start a server
  // with no service of its own ("at least one of the completion queues must be frequently
  // polled"): the default health service is only added at start, after that check. A generic
  // service that answers every other method UNIMPLEMENTED gives it one. It is declared before
  // the server so that it outlives it.
  grpc::CallbackGenericService health_only;
  absl::StatusOr<StartedServer> health_started;
  if (options.health_port >= 0) {
    health_started = StartHealthServer(options, health_only);
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
  // Every listener is up: the metrics file, then the internal server's, then the client
  // server's (the router's clients and `baton up` wait for that one and read the others).
  WriteAddressFile(options.metrics_ready_file, metrics_server.address);
  WriteAddressFile(options.ready_file, started->address);
  if (client.builder != nullptr)
    WriteAddressFile(client.options.ready_file, client_started->address);
  std::cout << binary << " serving on " << primary.address << std::endl;
  log::Info("serving", {{"address", primary.address},
                        {"internal_address", started->address},
                        {"metrics", metrics_server.address},
                        {"mtls", security::Enabled()}});
  std::unique_ptr<Heartbeat> heartbeat;
  if (!registration.router.empty()) {
    heartbeat = StartHeartbeat(registration, options, started->address, servers);
  }
  DrainAndStop(binary, options, std::move(heartbeat), servers, drain, on_stopping);
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
