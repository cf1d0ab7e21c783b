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
  // --default-mode, checked against the model and --default-keep (SetDefaultTruncation)
  v1::TruncationMode default_mode = v1::TRUNCATION_MODE_COMPACT;
  std::string stream_idle_timeout = "60s";         // common/stream_watch.h's syntax
  // gRPC MAX_CONNECTION_AGE and its grace on the client port (common/stream_watch.h's syntax),
  // and the HTTP front's keep-alive age. "0": no age (a single router: `baton up`; the Helm
  // chart sets 2m), and no limit on the grace (streams in flight run to their end).
  std::string client_max_connection_age = "0";
  std::string client_max_connection_age_grace = "0";
  std::vector<std::string> extra_models;           // NAME=DIR each
  // --max-model-len: prompt + max_tokens at most; 0 (unset): --model's positions
  // (ResolveMaxModelLen makes it RouterOptions::max_model_len).
  uint32_t max_model_len = 0;
  // The HTTP front's deadlines, in milliseconds (HttpLimits holds them as durations).
  int64_t http_request_timeout_ms = HttpLimits{}.request_timeout.count();
  int64_t http_head_timeout_ms = HttpLimits{}.head_timeout.count();
  int64_t http_idle_timeout_ms = HttpLimits{}.idle_timeout.count();
  int64_t http_write_timeout_ms = HttpLimits{}.write_timeout.count();
  std::vector<std::string> http_trusted_proxies;  // --http-trusted-proxies: networks
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

// Whether API keys would cross the network in plain text: keys configured, no TLS on the client
// ports (--client-cert), and a --host other than loopback (empty is every address). The
// router starts anyway (a proxy in front may terminate TLS) and warns, naming the host.
bool KeysInPlainTextOffLoopback(const std::string& host, bool keys, bool tls);

// --max-model-len against the served models' positions (config.json max_position_embeddings),
// `models` the --model first: 0 (unset) is the first model's positions; a value above any served
// model's positions is refused naming the flag, the value, the model and its positions.
absl::StatusOr<uint32_t> ResolveMaxModelLen(uint32_t configured,
                                            const std::vector<ServedModel>& models);

// What the client server (the Generation API's port) takes in: gRPC's receive limit, and the
// memory of the server's own resource quota. An API key is checked before any message is
// read (security.h ApiKeyCheck); these bound what a keyed caller can make the router hold.
struct ClientApiLimits {
  int max_receive_message_bytes;
  int64_t rpc_memory_bytes;
};
// The receive limit is the largest valid GenerateRequest at `max_model_len`:
//   kPromptTextBytesPerToken (64) * max_model_len      the prompt as text (prompt_text's bound;
//                                                      token ids take at most 6 bytes each)
//   + kClientRequestFieldsBytes (16 KiB)               every other field at its bound
//                                                      (request_id, cache_salt, model, stop...)
// at least kMinClientMessageBytes (1 MiB) and at most security::kMaxMessageBytes (64 MiB). The
// memory quota is 16 such messages, at least 64 MiB and at most `rpc_memory_bytes`
// (--rpc-memory-bytes): gRPC 1.51 reads a message whole before it checks its size, so without
// API keys (no check before the message) the quota is what bounds oversized calls.
inline constexpr int64_t kClientRequestFieldsBytes = int64_t{16} << 10;
inline constexpr int64_t kMinClientMessageBytes = int64_t{1} << 20;
ClientApiLimits ClientLimits(uint32_t max_model_len, int64_t rpc_memory_bytes);

// Starts the router and serves until SIGTERM or SIGINT (common/rpc.h ServeUntilShutdown);
// returns the process's exit status. Call once logging is set up (ParseServerFlags).
int RunRouter(const RouterFlags& flags);

}  // namespace baton::router
