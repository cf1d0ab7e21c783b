// How batonctl reaches a router's client API: --addr, TLS when --ca is given (with a client
// certificate from --cert/--key when the router asks for one), and an API key from --api-key or
// the BATON_API_KEY environment variable, sent as `authorization: Bearer <key>`.
#pragma once

#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
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

}  // namespace baton::tools
