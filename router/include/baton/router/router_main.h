// baton-router's start-up, behind its main (router/main.cc declares the flags, with their help
// text, and calls RunRouter): the flags' values are checked and made into the RouterService's
// and the HTTP front's options once, the model's config and tokenizers loaded, and then the
// servers run until shutdown. A value that cannot be used stops the start before any server
// is up, logged as "cannot start" with the error, and the process exits 2.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "baton/common/server_flags.h"
#include "baton/router/http_front.h"
#include "baton/router/router_service.h"

namespace baton::router {

// What baton-router's command line gives, as typed (the defaults are the flags').
struct RouterFlags {
  ServerFlags server_flags;  // those every baton server shares; the client API's port
  std::string model_dir;     // --model: its config.json and tokenizer
  int internal_port = 0;     // the Registry nodes register with (mutual TLS)
  std::string internal_ready_file;
  std::string client_cert, client_key, client_ca;  // the client API's TLS (HTTP's too)
  std::string api_keys_file;                       // empty: no API keys
  std::string default_mode = "compact";            // off, mask or compact
  std::string transport = "ucx";                   // ucx or grpc
  std::string hit_cap = "ring";                    // ring or keep
  std::string prefill_policy = "predicted-ttft";   // least-loaded, longest-prefix, predicted-ttft
  std::string split = "prefill-all";               // prefill-all or replay-on-decode
  std::string stream_idle_timeout = "60s";         // common/stream_watch.h's syntax
  // gRPC MAX_CONNECTION_AGE and its grace on the client port (common/stream_watch.h's syntax),
  // and the HTTP front's keep-alive age. "0": no age (a single router: `baton up`; the Helm
  // chart sets 2m), and no limit on the grace (streams in flight run to their end).
  std::string client_max_connection_age = "0";
  std::string client_max_connection_age_grace = "0";
  std::vector<std::string> extra_models;           // NAME=DIR each
  // The HTTP front's deadlines, in milliseconds (HttpLimits holds them as durations).
  int64_t http_request_timeout_ms = HttpLimits{}.request_timeout.count();
  int64_t http_idle_timeout_ms = HttpLimits{}.idle_timeout.count();
  int64_t http_write_timeout_ms = HttpLimits{}.write_timeout.count();
  RouterOptions options;         // the fields flags set as they are
  HttpOptions http{.port = -1};  // the fields flags set as they are; port -1: no HTTP front
};

// The shortest node expiry a heartbeat period allows: three heartbeats plus a resolver
// timeout (glibc's default, resolv.conf `timeout:5`), so that neither a late beat nor a node's
// slow DNS lookup drops a live node.
inline constexpr int64_t kResolverTimeoutMs = 5000;
inline int64_t MinNodeExpiryMs(int64_t heartbeat_ms) {
  return 3 * heartbeat_ms + kResolverTimeoutMs;
}

// Starts the router and serves until SIGTERM or SIGINT (common/rpc.h ServeUntilShutdown);
// returns the process's exit status. Call once logging is set up (ParseServerFlags).
int RunRouter(const RouterFlags& flags);

}  // namespace baton::router
