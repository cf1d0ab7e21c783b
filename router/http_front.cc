#include "baton/router/http_front.h"

#include <httplib.h>

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "baton/common/log.h"
#include "baton/common/rpc.h"
#include "baton/v1/generation.grpc.pb.h"

namespace baton::router {
namespace {

using nlohmann::json;

void SendError(httplib::Response& res, const openai::Error& error) {
  res.status = error.http_status;
  res.set_content(error.body.dump(-1, ' ', false, json::error_handler_t::replace),
                  "application/json");
}

// The header's value, for the API key check and to pass on to the router.
std::optional<std::string> Authorization(const httplib::Request& req) {
  if (!req.has_header("Authorization")) return std::nullopt;
  return req.get_header_value("Authorization");
}

}  // namespace

// One Generate call on the router, open while its response is written; registered with the
// front (for Stop) for its life.
struct HttpFront::Call {
  explicit Call(HttpFront& front) : front(front) {}
  ~Call() { front.Untrack(&context); }
  HttpFront& front;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  openai::Request request;
  std::unique_ptr<openai::ResponseWriter> writer;
  bool finished = false;
};

namespace {

// The error for a finished call, with a retry hint for 429 (Retry-After, whole seconds).
template <typename Call>
openai::Error CallError(Call& call, const grpc::Status& status, httplib::Response& res) {
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    const auto& trailers = call.context.GetServerTrailingMetadata();
    if (auto it = trailers.find(kRetryAfterKey); it != trailers.end()) {
      const double ms = std::atof(std::string(it->second.data(), it->second.size()).c_str());
      res.set_header("Retry-After", std::to_string(std::max<int64_t>(
                                        1, static_cast<int64_t>(std::ceil(ms / 1000)))));
    }
  }
  return openai::ErrorFor(status.error_code(), status.error_message());
}

}  // namespace

HttpFront::HttpFront(HttpOptions options, std::shared_ptr<grpc::Channel> channel,
                     std::shared_ptr<const text::Tokenizer> tokenizer,
                     std::shared_ptr<const ApiKeys> api_keys, std::function<bool()> ready)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      api_keys_(std::move(api_keys)),
      ready_(std::move(ready)) {
  models_.push_back({options_.model, std::move(tokenizer)});
  models_.insert(models_.end(), options_.more_models.begin(), options_.more_models.end());
}

HttpFront::~HttpFront() {
  Stop();
}

absl::Status HttpFront::Start() {
  if (options_.tls_cert.empty()) {
    server_ = std::make_unique<httplib::Server>();
  } else {
    auto tls = std::make_unique<httplib::SSLServer>(
        options_.tls_cert.c_str(), options_.tls_key.c_str(),
        options_.tls_client_ca.empty() ? nullptr : options_.tls_client_ca.c_str());
    if (!tls->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat("--http-port: cannot serve HTTPS with ",
                                                     options_.tls_cert, " and ", options_.tls_key));
    }
    server_ = std::move(tls);
  }
  const int threads = options_.threads;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_payload_max_length(options_.max_body_bytes);
  Route();
  int port = options_.port;
  if (port == 0) {
    port = server_->bind_to_any_port(options_.host);
    if (port < 0) {
      return absl::UnavailableError(absl::StrCat("--http-port: cannot bind ", options_.host));
    }
  } else if (!server_->bind_to_port(options_.host, port)) {
    return absl::UnavailableError(
        absl::StrCat("--http-port: cannot bind ", options_.host, ":", port, " (in use?)"));
  }
  address_ = absl::StrCat(options_.host, ":", port);
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // Serving before Start returns, so that a Stop right after it finds a server to stop.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server_->is_running() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  WriteAddressFile(options_.ready_file, address_);
  log::Info(
      "HTTP front serving",
      {{"address", address_},
       {"url", absl::StrCat(options_.tls_cert.empty() ? "http" : "https", "://", address_, "/v1")},
       {"model", options_.model.name}});
  return absl::OkStatus();
}

void HttpFront::Stop() {
  {
    // Cancelled calls end their streams with an error event and [DONE]; the server stops
    // once they have (or after two seconds).
    std::unique_lock<std::mutex> lock(calls_mutex_);
    stopping_ = true;
    for (grpc::ClientContext* context : calls_) context->TryCancel();
    calls_done_.wait_for(lock, std::chrono::seconds(2), [this] { return calls_.empty(); });
  }
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

bool HttpFront::Track(grpc::ClientContext* context) {
  std::lock_guard<std::mutex> lock(calls_mutex_);
  if (stopping_) return false;
  calls_.insert(context);
  return true;
}

void HttpFront::Untrack(grpc::ClientContext* context) {
  std::lock_guard<std::mutex> lock(calls_mutex_);
  calls_.erase(context);
  if (calls_.empty()) calls_done_.notify_all();
}

void HttpFront::Route() {
  httplib::Server& server = *server_;
  server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (ready_()) {
      res.status = 200;
      res.set_content("{\"status\":\"serving\"}", "application/json");
    } else {
      SendError(res, openai::ErrorFor(static_cast<int>(grpc::StatusCode::UNAVAILABLE),
                                      "the router has no live prefill and decode node yet"));
    }
  });
  // /v1/*: the API key first (when keys are set), as the gRPC API does.
  auto authorized = [this](const httplib::Request& req, httplib::Response& res) {
    if (api_keys_ == nullptr) return true;
    const std::optional<std::string> header = Authorization(req);
    absl::StatusOr<std::string> tenant = api_keys_->Authenticate(
        header.has_value() ? std::optional<std::string_view>(*header) : std::nullopt);
    if (tenant.ok()) return true;
    SendError(res, openai::ErrorFor(tenant.status()));
    return false;
  };
  server.Get("/v1/models", [this, authorized](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    json data = json::array();
    for (const openai::ModelEntry& entry : models_) {
      data.push_back({{"id", entry.model.name},
                      {"object", "model"},
                      {"created", 0},
                      {"owned_by", "baton"},
                      {"max_model_len", entry.model.max_model_len}});
    }
    const json list = {{"object", "list"}, {"data", std::move(data)}};
    res.set_content(list.dump(), "application/json");
  });
  auto generate = [this, authorized](openai::Endpoint endpoint, const httplib::Request& req,
                                     httplib::Response& res) {
    if (!authorized(req, res)) return;
    absl::StatusOr<openai::Request> parsed = openai::ParseRequest(endpoint, req.body, models_);
    if (!parsed.ok()) {
      SendError(res, openai::ErrorFor(parsed.status()));
      return;
    }
    auto call = std::make_shared<Call>(*this);
    if (!Track(&call->context)) {
      SendError(res, openai::ErrorFor(static_cast<int>(grpc::StatusCode::UNAVAILABLE),
                                      "the router is shutting down"));
      return;
    }
    call->request = *std::move(parsed);
    // The router maps the key to its tenant (prefix-cache isolation). Only a header that
    // matched a key goes on: keys are printable ASCII, as gRPC metadata must be.
    if (std::optional<std::string> header = Authorization(req);
        api_keys_ != nullptr && header.has_value()) {
      call->context.AddMetadata("authorization", *header);
    }
    const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
    const openai::ModelEntry& model = models_[call->request.model];
    call->writer = std::make_unique<openai::ResponseWriter>(call->request, *model.tokenizer,
                                                            model.model.name, created);
    call->reader =
        v1::Generation::NewStub(channel_)->Generate(&call->context, call->request.generate);
    // The first message, or the error, decides the status line: a request refused before
    // its first token (bad field, queue full, no node) gets its HTTP error, streamed or not.
    v1::GenerateResponse message;
    if (!call->reader->Read(&message)) {
      const grpc::Status status = call->reader->Finish();
      SendError(res, CallError(*call, status, res));
      return;
    }
    if (!call->request.stream) {
      do {
        call->writer->Add(message);
      } while (call->reader->Read(&message));
      const grpc::Status status = call->reader->Finish();
      if (!status.ok()) {
        SendError(res, CallError(*call, status, res));
        return;
      }
      res.set_content(
          call->writer->Completion().dump(-1, ' ', false, json::error_handler_t::replace),
          "application/json");
      return;
    }
    auto first = std::make_shared<std::optional<v1::GenerateResponse>>(std::move(message));
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [call, first](size_t, httplib::DataSink& sink) {
          // One message per call: its chunks, then at the end [DONE] (after an error event
          // when the stream failed after its first token, as vLLM reports one).
          v1::GenerateResponse next;
          bool have = false;
          if (first->has_value()) {
            next = std::move(**first);
            first->reset();
            have = true;
          } else if (!call->finished) {
            have = call->reader->Read(&next);
          }
          if (have) {
            const std::string chunks = call->writer->Chunks(next);
            if (!chunks.empty() && !sink.write(chunks.data(), chunks.size())) {
              call->context.TryCancel();  // the client went away: free its decode slot
              return false;
            }
            return true;
          }
          call->finished = true;
          const grpc::Status status = call->reader->Finish();
          std::string tail;
          if (!status.ok()) {
            tail = "data: " +
                   openai::ErrorFor(status.error_code(), status.error_message())
                       .body.dump(-1, ' ', false, json::error_handler_t::replace) +
                   "\n\n";
          }
          tail += openai::ResponseWriter::Done();
          sink.write(tail.data(), tail.size());
          sink.done();
          return true;
        },
        [call](bool success) {
          if (!success && !call->finished) call->context.TryCancel();
        });
  };
  server.Post("/v1/completions", [generate](const httplib::Request& req, httplib::Response& res) {
    generate(openai::Endpoint::kCompletions, req, res);
  });
  server.Post("/v1/chat/completions",
              [generate](const httplib::Request& req, httplib::Response& res) {
                generate(openai::Endpoint::kChatCompletions, req, res);
              });
  server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler's own error
    const int status = res.status;
    openai::Error error = openai::ErrorFor(
        static_cast<int>(grpc::StatusCode::NOT_FOUND),
        status == 413   ? "body: larger than the server takes"
        : status >= 500 ? "internal error"
                        : absl::StrCat(req.method, " ", req.path, ": no such endpoint"));
    error.http_status = status;
    error.body["error"]["param"] = nullptr;
    error.body["error"]["code"] = nullptr;
    error.body["error"]["type"] = status >= 500 ? "server_error" : "invalid_request_error";
    SendError(res, error);
  });
}

}  // namespace baton::router
