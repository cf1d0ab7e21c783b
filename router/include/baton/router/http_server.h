// The HTTP/1.1 server under the router's OpenAI-compatible front: Boost.Beast on Boost.Asio,
// event-driven (a few I/O threads serve every connection), with every resource bounded before
// a request reaches a handler, and nothing at all spent on a request's body before its API key
// is checked:
//
// - connections: at most `max_connections` in all and `max_connections_per_client` from one
//   client group (an IPv4 address's /`ipv4_prefix_length`, an IPv6 address's /64:
//   common/connection_slots.h); the last eighth of `max_connections` goes only to groups that
//   have sent a complete request with a valid key (any complete /v1 request without keys)
//   in the last ten minutes; more are closed as they are accepted;
// - a request's head (request line and headers together) at most `max_header_bytes` (431),
//   and a connection's first head must be complete within `head_timeout` of its accept;
// - the key: a route that needs one has its request's head passed to `authenticate` before
//   any of its body is read or charged; a refusal is answered 401 and the connection closed;
// - its body at most `max_body_bytes` whatever its transfer encoding, counted as it arrives
//   (413 as soon as the length says so, or the chunks pass it); request bodies with a
//   Content-Encoding are refused (415), so nothing is ever decompressed;
// - request body memory, charged as the bytes arrive (the declared length is never
//   reserved), at most `body_memory_bytes` in all, `body_memory_per_tenant_bytes` per tenant
//   (with keys) and `body_memory_per_client_bytes` per client group; past any of them the
//   request gets 503 with Retry-After. What a request was charged is given back once its
//   response is written;
// - the whole request (head and body) must arrive within `request_timeout` of its first byte
//   being awaited, a kept-alive connection may sit idle `idle_timeout` between requests, and a
//   client must take each piece of a response within `write_timeout`; past any of them the
//   connection is closed;
// - handlers that block (a Generate call and its stream) run on at most `handler_threads`
//   threads; a request that finds them all busy gets 503 with Retry-After. While one runs,
//   the connection is watched: a client that closes it (FIN or reset) has the handler's
//   OnClientGone callback run, which cancels the work.
//
// Slow clients therefore hold a socket and a few KiB each, never a thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "baton/common/connection_slots.h"

namespace baton::router {

struct HttpLimits {
  size_t max_body_bytes = size_t{8} << 20;
  size_t max_header_bytes = size_t{16} << 10;
  std::chrono::milliseconds request_timeout{10000};
  // From accept (and TLS handshake) to a complete first request head; the shorter of this
  // and request_timeout applies.
  std::chrono::milliseconds head_timeout{2000};
  std::chrono::milliseconds idle_timeout{5000};
  std::chrono::milliseconds write_timeout{60000};
  int max_connections = 4096;
  int max_connections_per_client = 256;  // per client group
  int ipv4_prefix_length = 32;           // IPv4 clients are grouped by this prefix (IPv6: /64)
  uint64_t body_memory_bytes = uint64_t{256} << 20;
  // Each at least twice max_body_bytes in effect, so that one largest body always fits (a
  // chunked body's memory grows by doubling).
  uint64_t body_memory_per_tenant_bytes = uint64_t{64} << 20;
  uint64_t body_memory_per_client_bytes = uint64_t{32} << 20;
  int handler_threads = 512;
  int io_threads = 2;
  // A kept-alive connection older than this is closed after its current response
  // ("Connection: close"), so that clients spread over routers added since they connected;
  // 0: never.
  std::chrono::milliseconds max_connection_age{0};
  // Proxies whose X-Forwarded-For names the client (connection_slots.h): their connections
  // count against max_connections alone, and each request's body memory is its client's.
  TrustedProxies trusted_proxies;
};

struct HttpRequest {
  std::string method;
  std::string path;                            // the target without its query
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::string client;  // the peer's address, or the client a trusted proxy forwarded for
  std::string tenant;  // what `authenticate` returned for a route that needs a key ("": none)
  const std::string* Header(const std::string& lower_case_name) const {
    auto it = headers.find(lower_case_name);
    return it == headers.end() ? nullptr : &it->second;
  }
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// How a handler answers: one whole response (Send), or a chunked one (Start, Write..., End).
// From a blocking handler each call waits until the client has taken the bytes (or the
// connection failed); from an inline one Send only queues them.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  virtual void Send(int status, std::string_view content_type, std::string body,
                    const HttpHeaders& headers = {}) = 0;
  // False when the client is gone: stop producing.
  virtual bool Start(int status, std::string_view content_type, const HttpHeaders& headers) = 0;
  virtual bool Write(std::string_view data) = 0;
  virtual void End() = 0;
  // From a blocking handler: `cancel` runs (on an I/O thread, at most once, at once if the
  // client has already gone) when the client closes the connection while the handler runs;
  // null unregisters it, after which it never runs. Used to stop work nobody will read.
  virtual void OnClientGone(std::function<void()> cancel) {}
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponder&)>;

struct HttpRoute {
  std::string method, path;
  // Runs on the handler threads (it may block); otherwise on the connection's I/O thread, for
  // answers that cost nothing (health, model lists, refusals).
  bool blocking = false;
  HttpHandler handler;
  // Needs HttpServerOptions::authenticate's approval of its head before the body is read.
  bool needs_key = false;
  // For blocking routes: run on the I/O thread once the body is in, before a handler thread is
  // asked for; false when it answered the request itself (a refusal that costs nothing), and
  // then nothing else runs. `release` runs once the handler of an admitted request returns
  // (or when no thread took it).
  std::function<bool(const HttpRequest&, HttpResponder&)> admit;
  std::function<void(const HttpRequest&)> release;
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  // HTTPS with these PEM files; plaintext when empty. With `tls_client_ca`, clients must
  // present a certificate it signed.
  std::string tls_cert, tls_key, tls_client_ca;
  HttpLimits limits;
  std::vector<HttpRoute> routes;
  // The body of an error the server answers itself (404, 405, 413, 415, 431, 503), in the
  // front's format, from the status and a message naming what was wrong.
  std::function<std::string(int status, const std::string& message)> error_body;
  // For routes with needs_key: the tenant of a request's head (its Authorization header), or
  // the error answered with 401 (its message is the body's). Null: every request is let in
  // with tenant "".
  std::function<absl::StatusOr<std::string>(const HttpRequest& head)> authenticate;
};

// What a connection makes of the bytes of one request before any handler runs, without a
// socket: parsed under the same bounds and checked the same way (route, Content-Encoding,
// lengths). `status` is the refusal the server would answer with (0: none; with `complete`
// false and no status, the bytes end before the request does). For the fuzzer and tests.
struct ParsedHttpRequest {
  int status = 0;
  std::string message;
  bool complete = false;
  HttpRequest request;
};
ParsedHttpRequest ParseHttpRequest(std::string_view bytes, const HttpServerOptions& options);

class HttpServer {
 public:
  explicit HttpServer(HttpServerOptions options);
  ~HttpServer();
  // Binds and starts the I/O threads; an error names the address or the TLS files.
  absl::Status Start();
  // Stops accepting and closes every connection; waits up to `grace` for blocking handlers to
  // return first (they should be told to finish before: their writes then fail fast).
  void Stop(std::chrono::milliseconds grace = std::chrono::milliseconds(2000));
  int port() const { return port_; }

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace baton::router
