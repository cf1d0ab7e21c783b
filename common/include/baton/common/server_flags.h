// The command-line flags every baton server shares (listen and advertised addresses, ready
// files, metrics, logs, internal mutual TLS, the config file) and the one way they are parsed.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "baton/common/log.h"
#include "baton/common/rpc.h"
#include "baton/common/security.h"

namespace baton {

struct ServerFlags {
  ServerOptions server;
  // --model-file NAME=SHA256: the files the release expects in the binary's --model directory
  // (model_files.h), checked at start.
  std::vector<std::string> model_files;
  log::LogOptions log;
  security::TlsOptions tls;
};

void AddServerFlags(CLI::App& app, ServerFlags& flags);

// Adds `--config` (reading `section`) and `--check-config`, parses, sets up logging for
// `binary`, checks the --model directory against --model-file (not under --check-config, which
// runs where the model may not be) and configures internal TLS (security::Configure; a server refuses to start without
// --tls-* files unless --insecure-internal is given). Returns the exit status when the binary
// should stop now (help; bad flags or config, with the message on stderr; or --check-config, which
// prints the settings given), nullopt to go on.
std::optional<int> ParseServerFlags(CLI::App& app, int argc, char** argv, const std::string& binary,
                                    const std::string& section, const ServerFlags& flags);

}  // namespace baton
