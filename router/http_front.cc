#include "baton/router/http_front.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "baton/common/log.h"
#include "baton/common/parse.h"
#include "baton/common/rpc.h"
#include "baton/common/trace.h"
#include "baton/router/tenant_share.h"
#include "baton/v1/generation.grpc.pb.h"

namespace baton::router {
namespace {

using nlohmann::json;

std::string Dump(const json& body) {
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

void SendError(HttpResponder& responder, const openai::Error& error,
               const HttpHeaders& headers = {}) {
  responder.Send(error.http_status, "application/json", Dump(error.body), headers);
}

// The body of an error the HTTP server answers itself, in OpenAI's shape.
std::string ServerErrorBody(int status, const std::string& message) {
  if (status == 503) {
    return Dump(openai::ErrorFor(static_cast<int>(grpc::StatusCode::UNAVAILABLE), message).body);
  }
  if (status == 401) {  // the API key, checked at the head (HttpFront::Start)
    return Dump(
        openai::ErrorFor(static_cast<int>(grpc::StatusCode::UNAUTHENTICATED), message).body);
  }
  openai::Error error = openai::ErrorFor(static_cast<int>(grpc::StatusCode::NOT_FOUND), message);
  error.body["error"]["param"] = status == 413 || status == 415 ? json("body")
                                 : status == 431                ? json("headers")
                                                                : json();
  error.body["error"]["code"] = nullptr;
  error.body["error"]["type"] = status >= 500 ? "server_error" : "invalid_request_error";
  return Dump(error.body);
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
};

namespace {

// The error for a finished call, with a retry hint for 429 (Retry-After, whole seconds).
template <typename Call>
openai::Error CallError(Call& call, const grpc::Status& status, HttpHeaders& headers) {
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    const auto& trailers = call.context.GetServerTrailingMetadata();
    if (auto it = trailers.find(kRetryAfterKey); it != trailers.end()) {
      const double ms = std::atof(std::string(it->second.data(), it->second.size()).c_str());
      headers.emplace_back("Retry-After", std::to_string(std::max<int64_t>(
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
  HttpServerOptions server;
  server.host = options_.host;
  server.port = options_.port;
  server.tls_cert = options_.tls_cert;
  server.tls_key = options_.tls_key;
  server.tls_client_ca = options_.tls_client_ca;
  server.limits = options_.limits;
  // Tenant shares hold the requests in flight to `threads`; the few more cover the moment
  // between a handler returning its share and its thread coming free.
  server.limits.handler_threads = options_.threads + std::max(2, options_.threads / 16);
  server.limits.max_body_bytes = options_.max_body_bytes;
  server.routes = Routes();
  server.error_body = ServerErrorBody;
  if (api_keys_ != nullptr) {
    server.authenticate = [keys = api_keys_](const HttpRequest& head) {
      const std::string* header = head.Header("authorization");
      return keys->Authenticate(header != nullptr ? std::optional<std::string_view>(*header)
                                                  : std::nullopt);
    };
  }
  server_ = std::make_unique<HttpServer>(std::move(server));
  if (absl::Status s = server_->Start(); !s.ok()) return s;
  address_ = JoinHostPort(options_.host, server_->port());
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
  if (server_ != nullptr) server_->Stop();
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

bool HttpFront::Authorized(const HttpRequest& request, HttpResponder& responder,
                           std::string* tenant_out) const {
  if (api_keys_ == nullptr) return true;
  // The server checked the key at the head (the route's needs_key) and refused it there.
  if (request.tenant.empty()) {
    SendError(responder, openai::ErrorFor(static_cast<int>(grpc::StatusCode::UNAUTHENTICATED),
                                          "no API key checked for this request"));
    return false;
  }
  if (tenant_out != nullptr) *tenant_out = request.tenant;
  return true;
}

bool HttpFront::TakeTenantShare(const std::string& tenant, HttpResponder& responder) {
  // The tenant's weighted fair part of the threads among the tenants with requests in flight
  // (tenant_share.h); without keys, every request is the one tenant "".
  auto weight = [this](const std::string& t) -> int64_t {
    if (api_keys_ == nullptr) return 1;
    return api_keys_->WeightOf(t);
  };
  ShareInput input{.pool = options_.threads,
                   .reserve = api_keys_ != nullptr ? NewcomerReserve(options_.threads) : 0,
                   .weight = weight(tenant),
                   .active_weight = 0,
                   .cap = options_.max_requests_per_tenant};
  int64_t held = 0, in_use = 0;
  size_t active = 0;
  {
    std::lock_guard<std::mutex> lock(calls_mutex_);
    const bool newcomer = !tenant_requests_.contains(tenant);
    active = tenant_requests_.size() + (newcomer ? 1 : 0);
    input.active_weight = newcomer ? input.weight : 0;
    for (const auto& [t, n] : tenant_requests_) {
      input.active_weight += weight(t);
      in_use += n;
      if (t == tenant) held = n;
    }
    if (MayTake(input, held, in_use)) {
      ++tenant_requests_[tenant];
      return true;
    }
  }
  const int64_t share = TenantShare(input);
  SendError(responder,
            openai::ErrorFor(static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED),
                             held >= share
                                 ? absl::StrCat("this tenant holds its share of the HTTP front's "
                                                "request threads (",
                                                share, " of ", options_.threads, ", shared by ",
                                                active, " active tenants); retry")
                                 : absl::StrCat("the HTTP front's request threads are taken but "
                                                "for the ",
                                                input.reserve,
                                                " kept for tenants with no request in flight; "
                                                "retry")),
            {{"Retry-After", "1"}});
  return false;
}

void HttpFront::ReturnTenantShare(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(calls_mutex_);
  if (auto it = tenant_requests_.find(tenant); it != tenant_requests_.end() && --it->second <= 0) {
    tenant_requests_.erase(it);
  }
}

std::vector<HttpRoute> HttpFront::Routes() {
  std::vector<HttpRoute> routes;
  routes.push_back({"GET", "/health", false,
                    [this](const HttpRequest&, HttpResponder& responder) { Health(responder); }});
  routes.push_back({"GET", "/v1/models", false,
                    [this](const HttpRequest& request, HttpResponder& responder) {
                      ListModels(request, responder);
                    },
                    /*needs_key=*/true});
  for (const auto& [path, endpoint] :
       {std::pair{"/v1/completions", openai::Endpoint::kCompletions},
        std::pair{"/v1/chat/completions", openai::Endpoint::kChatCompletions}}) {
    // A copy: clang 14 cannot capture a structured binding.
    const openai::Endpoint kind = endpoint;
    // The tenant's share of the handler threads is taken before a thread is asked for, so
    // that tenants over their share are refused (429) without holding one.
    routes.push_back({"POST", path, true,
                      [this, kind](const HttpRequest& request, HttpResponder& responder) {
                        Generate(kind, request, responder);
                      },
                      /*needs_key=*/true,
                      [this](const HttpRequest& request, HttpResponder& responder) {
                        return Authorized(request, responder) &&
                               TakeTenantShare(request.tenant, responder);
                      },
                      [this](const HttpRequest& request) { ReturnTenantShare(request.tenant); }});
  }
  return routes;
}

void HttpFront::Health(HttpResponder& responder) const {
  if (ready_()) {
    responder.Send(200, "application/json", "{\"status\":\"serving\"}");
    return;
  }
  SendError(responder, openai::ErrorFor(static_cast<int>(grpc::StatusCode::UNAVAILABLE),
                                        "the router has no live prefill and decode node yet"));
}

void HttpFront::ListModels(const HttpRequest& request, HttpResponder& responder) const {
  if (!Authorized(request, responder)) return;
  json data = json::array();
  for (const openai::ModelEntry& entry : models_) {
    data.push_back({{"id", entry.model.name},
                    {"object", "model"},
                    {"created", 0},
                    {"owned_by", "baton"},
                    {"max_model_len", entry.model.max_model_len}});
  }
  responder.Send(200, "application/json",
                 json{{"object", "list"}, {"data", std::move(data)}}.dump());
}

void HttpFront::Generate(openai::Endpoint endpoint, const HttpRequest& http,
                         HttpResponder& responder) {
  // The route's admit checked the key and took the tenant's share of the threads.
  if (!Authorized(http, responder)) return;
  absl::StatusOr<openai::Request> parsed = openai::ParseRequest(endpoint, http.body, models_);
  if (!parsed.ok()) {
    SendError(responder, openai::ErrorFor(parsed.status()));
    return;
  }
  std::unique_ptr<Call> call = StartCall(*std::move(parsed), http, responder);
  if (call == nullptr) return;
  // A client that goes before its answer cancels the call, as a stream's failed write does;
  // unregistered before the call goes.
  responder.OnClientGone([context = &call->context] { context->TryCancel(); });
  struct Unwatch {
    HttpResponder& responder;
    ~Unwatch() { responder.OnClientGone(nullptr); }
  } unwatch{responder};
  // The first message, or the error, decides the status line: a request refused before
  // its first token (bad field, queue full, no node) gets its HTTP error, streamed or not.
  v1::GenerateResponse message;
  if (!call->reader->Read(&message)) {
    SendCallError(*call, call->reader->Finish(), responder);
  } else if (call->request.stream) {
    Stream(*call, message, responder);
  } else {
    Complete(*call, message, responder);
  }
}

std::unique_ptr<HttpFront::Call> HttpFront::StartCall(openai::Request request,
                                                      const HttpRequest& http,
                                                      HttpResponder& responder) {
  auto call = std::make_unique<Call>(*this);
  if (!Track(&call->context)) {
    SendError(responder, openai::ErrorFor(static_cast<int>(grpc::StatusCode::UNAVAILABLE),
                                          "the router is shutting down"));
    return nullptr;
  }
  call->request = std::move(request);
  // The router maps the key to its tenant (prefix-cache isolation). Only a header that
  // matched a key goes on: keys are printable ASCII, as gRPC metadata must be.
  if (const std::string* header = http.Header("authorization");
      api_keys_ != nullptr && header != nullptr) {
    call->context.AddMetadata("authorization", *header);
  }
  // The client's trace goes on when its traceparent is well formed; the router starts one
  // otherwise (common/trace.h).
  if (const std::string* header = http.Header(trace::kTraceparent); header != nullptr) {
    if (std::optional<trace::SpanContext> parent = trace::Parse(*header)) {
      call->context.AddMetadata(trace::kTraceparent, parent->Header());
    }
  }
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  const openai::ModelEntry& model = models_[call->request.model];
  call->writer = std::make_unique<openai::ResponseWriter>(call->request, *model.tokenizer,
                                                          model.model.name, created);
  call->reader =
      v1::Generation::NewStub(channel_)->Generate(&call->context, call->request.generate);
  return call;
}

void HttpFront::SendCallError(Call& call, const grpc::Status& status, HttpResponder& responder) {
  HttpHeaders headers;
  const openai::Error error = CallError(call, status, headers);
  SendError(responder, error, headers);
}

void HttpFront::Complete(Call& call, v1::GenerateResponse& message, HttpResponder& responder) {
  do {
    call.writer->Add(message);
  } while (call.reader->Read(&message));
  const grpc::Status status = call.reader->Finish();
  if (!status.ok()) {
    SendCallError(call, status, responder);
    return;
  }
  responder.Send(200, "application/json", Dump(call.writer->Completion()));
}

void HttpFront::Stream(Call& call, v1::GenerateResponse& message, HttpResponder& responder) {
  if (!responder.Start(200, "text/event-stream", {{"Cache-Control", "no-cache"}})) {
    call.context.TryCancel();  // the client went away: free its decode slot
    (void)call.reader->Finish();
    return;
  }
  // Each message's chunks as they come, then [DONE] (after an error event when the stream
  // failed after its first token, as vLLM reports one).
  do {
    if (!responder.Write(call.writer->Chunks(message))) {
      call.context.TryCancel();
      (void)call.reader->Finish();
      responder.End();
      return;
    }
  } while (call.reader->Read(&message));
  const grpc::Status status = call.reader->Finish();
  std::string tail;
  if (!status.ok()) {
    tail = "data: " + Dump(openai::ErrorFor(status.error_code(), status.error_message()).body) +
           "\n\n";
  }
  tail += openai::ResponseWriter::Done();
  (void)responder.Write(tail);
  responder.End();
}

}  // namespace baton::router
