// The command-line flags every baton server shares (listen and advertised addresses, ready
// files, metrics, logs, internal mutual TLS, the config file) and the one way they are parsed.
#pragma once

#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "baton/common/log.h"
#include "baton/common/rpc.h"
#include "baton/common/security.h"

namespace baton {

struct ServerFlags {
  ServerOptions server;
  log::LogOptions log;
  security::TlsOptions tls;
};

void AddServerFlags(CLI::App& app, ServerFlags& flags);

// Adds `--config` (reading `section`) and `--check-config`, parses, sets up logging for
// `binary` and configures internal TLS (security::Configure; a server refuses to start without
// --tls-* files unless --insecure-internal is given). Returns the exit status when the binary
// should stop now (help; bad flags or config, with the message on stderr; or --check-config, which
// prints the settings given), nullopt to go on.
std::optional<int> ParseServerFlags(CLI::App& app, int argc, char** argv, const std::string& binary,
                                    const std::string& section, const ServerFlags& flags);

}  // namespace baton
