// The router's OpenAI-compatible HTTP front (--http-port): POST /v1/completions and
// /v1/chat/completions (streamed as server-sent events ending with `data: [DONE]`, or not),
// GET /v1/models and GET /health. Each request is translated (openai.h) into a Generate call
// on the router's own gRPC server through an in-process channel, so HTTP requests get exactly
// the gRPC path's validation, admission, fault handling, API keys and metrics.
//
// HTTP is served by HttpServer (http_server.h: Boost.Beast, event-driven), which bounds every
// resource before a request reaches a handler here: connections overall and per client, head
// and body sizes whatever the encoding, request bodies in memory, whole-request, idle and
// write deadlines. The API key of /v1/* is checked on the request's head (the server's
// authenticate hook), before any of its body is read. Health and model lists are answered on
// the I/O threads; a Generate call and its stream hold one of at most --http-threads handler
// threads for their life, and a client that closes its connection cancels its call.
//
// Start/Stop from one thread; the handlers run concurrently.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "baton/common/api_keys.h"
#include "baton/router/http_server.h"
#include "baton/router/openai.h"
#include "baton/text/tokenizer.h"
#include "grpcpp/grpcpp.h"


namespace baton::router {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;         // 0: any free port
  std::string ready_file;  // "host:port" once serving
  // HTTPS with these (PEM files); plaintext when empty. With `tls_client_ca`, clients must
  // present a certificate it signed.
  std::string tls_cert, tls_key, tls_client_ca;
  int threads = 512;                        // concurrent requests (each stream holds one)
  size_t max_body_bytes = size_t{8} << 20;  // larger bodies get 413
  // With API keys, each tenant with requests in flight may hold its weighted fair part of
  // `threads` (router/tenant_share.h), never under one, with a reserve for newcomers; past it,
  // 429 for that tenant while others are served. This ceiling bounds any one tenant's part
  // besides (0: none).
  int max_requests_per_tenant = 0;
  // Connection, head, memory and time bounds (HttpLimits; threads and max_body_bytes above
  // override its handler_threads and max_body_bytes).
  HttpLimits limits;
  openai::ServedModel model;
  std::vector<openai::ModelEntry> more_models;  // served beside `model` (router --extra-model)
};

class HttpFront {
 public:
  // `channel` reaches the router's Generation service (in-process); `ready` says whether the
  // router is SERVING; `api_keys` (null: none) gate /v1/*; the tokenizer must outlive this.
  HttpFront(HttpOptions options, std::shared_ptr<grpc::Channel> channel,
            std::shared_ptr<const text::Tokenizer> tokenizer,
            std::shared_ptr<const ApiKeys> api_keys, std::function<bool()> ready);
  ~HttpFront();

  // Binds and starts serving (writes the ready file); an error names the port or file.
  absl::Status Start();
  // Stops accepting, cancels the Generate calls in flight (their streams end with an error
  // event) and waits for the server's threads.
  void Stop();
  const std::string& address() const { return address_; }

 private:
  struct Call;
  std::vector<HttpRoute> Routes();
  // The API key check of /v1/* (when keys are set); false after answering 401.
  bool Authorized(const HttpRequest& request, HttpResponder& responder,
                  std::string* tenant = nullptr) const;
  // Takes one of `tenant`'s request threads; false (after answering 429) past its share
  // (tenant_share.h) among the tenants with requests in flight.
  bool TakeTenantShare(const std::string& tenant, HttpResponder& responder);
  void ReturnTenantShare(const std::string& tenant);
  // GET /health: 200 while the router is SERVING, else 503.
  void Health(HttpResponder& responder) const;
  // GET /v1/models: every model served (API key as /v1/*).
  void ListModels(const HttpRequest& request, HttpResponder& responder) const;
  // POST /v1/completions and /v1/chat/completions, in stages: the API key, the tenant's share
  // of the threads, the body (openai.h), the Generate call, then the response (whole or
  // streamed). Each stage that refuses answers the client itself.
  void Generate(openai::Endpoint endpoint, const HttpRequest& request, HttpResponder& responder);
  // Opens the Generate call for a parsed request; null (after answering 503) once stopping.
  std::unique_ptr<Call> StartCall(openai::Request request, const HttpRequest& http,
                                  HttpResponder& responder);
  // Answers a call that failed with `status` (429 with Retry-After: the router's hint).
  void SendCallError(Call& call, const grpc::Status& status, HttpResponder& responder);
  // The non-streamed response: `message` (the call's first) and those after it, as one
  // completion object. Reads the rest into `message`.
  void Complete(Call& call, v1::GenerateResponse& message, HttpResponder& responder);
  // The streamed response: the server-sent events of `message` (the call's first) and of those
  // after it, then [DONE].
  void Stream(Call& call, v1::GenerateResponse& message, HttpResponder& responder);
  // Tracks a call for Stop; false once stopping (the caller refuses the request).
  bool Track(grpc::ClientContext* context);
  void Untrack(grpc::ClientContext* context);

  HttpOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::vector<openai::ModelEntry> models_;  // options_.model with the tokenizer, then the more
  std::shared_ptr<const ApiKeys> api_keys_;
  std::function<bool()> ready_;
  std::unique_ptr<HttpServer> server_;
  std::mutex calls_mutex_;
  std::condition_variable calls_done_;    // calls_ became empty
  std::set<grpc::ClientContext*> calls_;  // Generate calls in flight, cancelled by Stop
  std::map<std::string, int> tenant_requests_;  // requests in flight per tenant (no zeros)
  bool stopping_ = false;
  std::string address_;
};

}  // namespace baton::router
