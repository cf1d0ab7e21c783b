// The router's OpenAI-compatible HTTP front (--http-port): POST /v1/completions and
// /v1/chat/completions (streamed as server-sent events ending with `data: [DONE]`, or not),
// GET /v1/models and GET /health. Each request is translated (openai.h) into a Generate call
// on the router's own gRPC server through an in-process channel, so HTTP requests get exactly
// the gRPC path's validation, admission, fault handling, API keys and metrics.
//
// HTTP comes from cpp-httplib (Debian's libcpp-httplib): a maintained server whose handlers
// run on a thread pool. Its blocking model fits here: a stream's thread waits on the gRPC
// stream's next message and writes it, so a stream costs one pool thread for its life, and
// --http-threads bounds the concurrent streams (more connections wait in the pool's queue).
// Boost.Beast would save the threads at the price of an asynchronous gRPC bridge; at the
// concurrency one router serves (hundreds of streams) the threads cost little.
//
// Start/Stop from one thread; the handlers run concurrently on the pool.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "baton/common/api_keys.h"
#include "baton/router/openai.h"
#include "baton/text/tokenizer.h"
#include "grpcpp/grpcpp.h"

namespace httplib {
class Server;
}

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
  void Route();
  // Tracks a call for Stop; false once stopping (the caller refuses the request).
  bool Track(grpc::ClientContext* context);
  void Untrack(grpc::ClientContext* context);

  HttpOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::vector<openai::ModelEntry> models_;  // options_.model with the tokenizer, then the more
  std::shared_ptr<const ApiKeys> api_keys_;
  std::function<bool()> ready_;
  std::unique_ptr<httplib::Server> server_;
  std::mutex calls_mutex_;
  std::condition_variable calls_done_;    // calls_ became empty
  std::set<grpc::ClientContext*> calls_;  // Generate calls in flight, cancelled by Stop
  bool stopping_ = false;
  std::thread thread_;
  std::string address_;
};

}  // namespace baton::router
