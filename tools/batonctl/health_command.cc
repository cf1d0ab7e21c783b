// `batonctl health`: a grpc.health.v1 check of any baton server (the plaintext --health-port
// the chart's probes use, or a TLS port with the client flags), polled until it answers
// SERVING or --wait-ms passes. Prints the last status seen; exits 0 on SERVING, 1 otherwise.
#include <chrono>
#include <iostream>
#include <string>
#include <thread>

#include "client.h"
#include "commands.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace baton::tools {
namespace {

struct HealthOptions {
  ClientOptions client;
  std::string service;
  int64_t wait_ms = 0;
  int64_t timeout_ms = 2000;
};

int RunHealth(const HealthOptions& o) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = ClientChannel(o.client);
  if (!channel.ok()) return ReportError("health", channel.status());
  auto stub = grpc::health::v1::Health::NewStub(*channel);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(o.wait_ms);
  std::string seen;
  while (true) {
    grpc::ClientContext context;
    Authenticate(o.client, context);
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(o.timeout_ms));
    // While there is time to ask again, a check waits for the connection (up to its deadline):
    // a call that waits drives the channel's connection attempts, so a server that starts
    // listening is seen at once. The last check fails fast, so that it says why.
    const bool last =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(o.timeout_ms) >= until;
    context.set_wait_for_ready(!last);
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(o.service);
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status status = stub->Check(&context, request, &response);
    if (status.ok()) {
      seen = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
      if (response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
        std::cout << seen << "\n";
        return kExitOk;
      }
    } else {
      seen = "unreachable: " + status.error_message();
    }
    if (std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::cout << seen << "\n";
  return kExitFailure;
}

}  // namespace

Command AddHealthCommand(CLI::App& app) {
  auto o = std::make_shared<HealthOptions>();
  CLI::App* command = app.add_subcommand(
      "health",
      "Check a baton server's grpc.health.v1 status (e.g. a --health-port); prints it, exits 0 "
      "on SERVING and 1 otherwise");
  AddClientFlags(*command, o->client);
  command->add_option("--service", o->service, "The service to ask about (default: the server)");
  command->add_option("--wait-ms", o->wait_ms,
                      "Ask again until SERVING or this long has passed (default 0: once)")
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}));
  command->add_option("--timeout-ms", o->timeout_ms, "Deadline of each check (default 2000)")
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  return {command, [o] { return RunHealth(*o); }};
}

}  // namespace baton::tools
