// How batonctl reaches a router's client API: --addr, TLS when --ca is given (with a client
// certificate from --cert/--key when the router asks for one), and an API key from --api-key or
// the BATON_API_KEY environment variable, sent as `authorization: Bearer <key>`.
#pragma once

#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "baton/v1/generation.grpc.pb.h"
#include "commands.h"
#include "grpcpp/grpcpp.h"

namespace baton::tools {

struct ClientOptions {
  std::string addr;
  std::string ca, cert, key;  // PEM files; no --ca: plaintext
  std::string api_key;
};

void AddClientFlags(CLI::App& command, ClientOptions& options);

// The channel to the router (reads the PEM files; a missing one is an error naming its flag).
absl::StatusOr<std::shared_ptr<grpc::Channel>> ClientChannel(const ClientOptions& options);

// Adds the API key, if any, to a call's metadata.
void Authenticate(const ClientOptions& options, grpc::ClientContext& context);

// One unary call to the router's Generation service: `call(stub, context)` makes it, with the
// API key and a deadline `timeout_ms` away. kExitOk when it succeeded; otherwise what failed
// (the channel: a missing PEM file; or the call) is printed as `batonctl <command>: error: ...`
// and its exit code returned.
template <typename Call>
int CallRouter(const ClientOptions& options, int64_t timeout_ms, const char* command, Call&& call) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = ClientChannel(options);
  if (!channel.ok()) return ReportError(command, channel.status());
  auto stub = v1::Generation::NewStub(*channel);
  grpc::ClientContext context;
  Authenticate(options, context);
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  const grpc::Status status = call(*stub, context);
  if (status.ok()) return kExitOk;
  std::cerr << "batonctl " << command << ": error: " << status.error_message() << " ("
            << status.error_code() << ")\n";
  return kExitFailure;
}

}  // namespace baton::tools
