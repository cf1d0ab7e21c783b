// The command-line flags every baton server shares (listen address, ready file).
#pragma once

#include "CLI/CLI.hpp"
#include "baton/common/rpc.h"

namespace baton {

inline void AddServerFlags(CLI::App& app, ServerOptions& server) {
  app.add_option("--host", server.host, "Address to listen on (default 127.0.0.1)");
  app.add_option("--port", server.port, "Port (0: any free port)");
  app.add_option("--ready-file", server.ready_file, "Write host:port here once serving");
}

}  // namespace baton
