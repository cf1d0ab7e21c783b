#include "baton/router/http_server.h"

#include <poll.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cctype>
#include <optional>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "baton/common/connection_slots.h"
#include "baton/common/file_stamp.h"
#include "baton/common/listen.h"
#include "baton/common/log.h"
#include "baton/common/parse.h"

namespace baton::router {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

// Blocking handlers: threads started as requests need them, up to a bound; a request that
// would wait past it is refused instead (503), so nothing queues without limit.
class HandlerPool {
 public:
  explicit HandlerPool(int max) : max_(static_cast<size_t>(std::max(1, max))) {}
  ~HandlerPool() { Join(); }

  bool TrySubmit(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ || busy_ + queue_.size() >= max_) return false;
    queue_.push_back(std::move(task));
    if (queue_.size() > idle_ && threads_.size() < max_) {
      threads_.emplace_back([this] { Loop(); });
    }
    wake_.notify_one();
    return true;
  }
  // Waits up to `grace` for running handlers to return, then lets the threads go.
  void Stop(std::chrono::milliseconds grace) {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_done_.wait_for(lock, grace, [this] { return busy_ == 0 && queue_.empty(); });
    stopping_ = true;
    queue_.clear();
    wake_.notify_all();
  }
  void Join() {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      wake_.notify_all();
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      ++idle_;
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      --idle_;
      if (stopping_) return;
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      ++busy_;
      lock.unlock();
      task();
      lock.lock();
      --busy_;
      if (busy_ == 0 && queue_.empty()) idle_done_.notify_all();
    }
  }

  const size_t max_;
  std::mutex mutex_;
  std::condition_variable wake_, idle_done_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  size_t busy_ = 0, idle_ = 0;
  bool stopping_ = false;
};

class SessionBase {
 public:
  virtual ~SessionBase() = default;
  virtual void Close() = 0;
};

// One write's outcome, for a blocking handler waiting on it.
struct Completion {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  bool ok = false;
  void Set(bool result) {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
    ok = result;
    done_cv.notify_all();
  }
};

constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

// http::string_body without its reserve of the declared Content-Length: a body's memory grows
// only as its bytes arrive, and is charged as it does (BodyLedger), so a length declared and
// never sent costs nothing.
struct GrowingBody {
  using value_type = std::string;
  static std::uint64_t size(const value_type& body) { return body.size(); }
  class reader {
   public:
    template <bool isRequest, class Fields>
    reader(http::header<isRequest, Fields>&, value_type& body) : body_(body) {}
    void init(const boost::optional<std::uint64_t>& length, beast::error_code& ec) {
      if (length) length_ = *length;
      ec = {};
    }
    // Grows by doubling, but never past a declared length, so that a body's memory ends at its
    // Content-Length (and under twice its size when chunked).
    template <class ConstBufferSequence>
    size_t put(const ConstBufferSequence& buffers, beast::error_code& ec) {
      const size_t n = net::buffer_size(buffers);
      const size_t at = body_.size();
      if (at + n > body_.capacity()) {
        size_t want = std::max(at + n, 2 * body_.capacity());
        if (length_.has_value() && *length_ >= at + n) want = std::min<size_t>(want, *length_);
        body_.reserve(want);
      }
      body_.resize(at + n);
      net::buffer_copy(net::buffer(body_.data() + at, n), buffers);
      ec = {};
      return n;
    }
    void finish(beast::error_code& ec) { ec = {}; }

   private:
    value_type& body_;
    std::optional<uint64_t> length_;
  };
};

using Parser = http::request_parser<GrowingBody>;

// Request body memory, charged as the bytes arrive: in all, per tenant (requests with a key)
// and per client group. The tenant's and the client's bounds take at least one largest body
// (twice max_body_bytes: a chunked body's memory grows by doubling).
class BodyLedger {
 public:
  explicit BodyLedger(const HttpLimits& limits)
      : total_max_(limits.body_memory_bytes),
        tenant_max_(
            std::max<uint64_t>(limits.body_memory_per_tenant_bytes, 2 * limits.max_body_bytes)),
        client_max_(
            std::max<uint64_t>(limits.body_memory_per_client_bytes, 2 * limits.max_body_bytes)) {}

  // False (and nothing charged) when `bytes` more would pass a bound.
  bool Charge(const std::string& tenant, const std::string& group, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto room = [](uint64_t held, uint64_t max) { return max - std::min(held, max); };
    if (bytes > room(total_, total_max_) || bytes > room(Held(by_client_, group), client_max_) ||
        (!tenant.empty() && bytes > room(Held(by_tenant_, tenant), tenant_max_))) {
      return false;
    }
    total_ += bytes;
    by_client_[group] += bytes;
    if (!tenant.empty()) by_tenant_[tenant] += bytes;
    return true;
  }
  void Release(const std::string& tenant, const std::string& group, uint64_t bytes) {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    total_ -= bytes;
    Take(by_client_, group, bytes);
    if (!tenant.empty()) Take(by_tenant_, tenant, bytes);
  }

 private:
  static uint64_t Held(const std::map<std::string, uint64_t>& held, const std::string& key) {
    const auto it = held.find(key);
    return it == held.end() ? 0 : it->second;
  }
  static void Take(std::map<std::string, uint64_t>& held, const std::string& key, uint64_t bytes) {
    if (auto it = held.find(key); it != held.end() && (it->second -= bytes) == 0) held.erase(it);
  }

  const uint64_t total_max_, tenant_max_, client_max_;
  std::mutex mutex_;
  uint64_t total_ = 0;
  std::map<std::string, uint64_t> by_tenant_, by_client_;  // no zeros
};

ConnectionCaps CapsFor(const HttpLimits& limits) {
  return {.max_connections = limits.max_connections,
          .max_per_client = limits.max_connections_per_client,
          .reserved = limits.max_connections / 8,
          .ipv4_prefix_length = limits.ipv4_prefix_length};
}

// The server's bounds on one request's parser.
void Bound(Parser& parser, const HttpLimits& limits) {
  parser.header_limit(static_cast<std::uint32_t>(limits.max_header_bytes));
  parser.body_limit(limits.max_body_bytes);
}

// A refusal: the status the server answers with, and why (0: none).
struct Refusal {
  int status = 0;
  std::string message;
};

// What a parse error of a request's head or body is answered with (status 0: the connection
// just ends: the client went away or ran out of time).
Refusal RefusalFor(beast::error_code ec, const Parser& parser, const HttpLimits& limits) {
  if (!ec) return {};
  if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
      ec == net::error::operation_aborted || ec == net::error::eof ||
      ec == http::error::partial_message || ec == http::error::need_more) {
    return {};
  }
  if (ec == http::error::body_limit) {
    const auto length = parser.content_length();
    return {413, length.has_value() && *length > limits.max_body_bytes
                     ? absl::StrCat("body: ", *length, " bytes; at most ", limits.max_body_bytes,
                                    " are taken")
                     : absl::StrCat("body: more than ", limits.max_body_bytes,
                                    " bytes; at most that many are taken")};
  }
  if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
    return {431, absl::StrCat("request head: larger than ", limits.max_header_bytes,
                              " bytes (request line and headers together)")};
  }
  return {400, absl::StrCat("request: not HTTP/1.1 (", ec.message(), ")")};
}

// The checks of a parsed head, before its body is read: a route for it, no Content-Encoding, a
// Content-Length within the limit. `route` is set when one matches.
Refusal CheckHead(const Parser& parser, const HttpServerOptions& options, std::string* method,
                  std::string* path, const HttpRoute** route) {
  const auto& req = parser.get();
  *method = std::string(req.method_string());
  const std::string_view target = req.target();
  *path = std::string(target.substr(0, target.find('?')));
  *route = nullptr;
  for (const HttpRoute& r : options.routes) {
    if (r.path == *path && r.method == *method) *route = &r;
  }
  if (*route == nullptr) return {404, absl::StrCat(*method, " ", *path, ": no such endpoint")};
  if (auto encoding = req.find(http::field::content_encoding);
      encoding != req.end() && !beast::iequals(encoding->value(), "identity")) {
    return {415, absl::StrCat("Content-Encoding: ", std::string(encoding->value()),
                              ": request bodies are taken unencoded (identity) only")};
  }
  if (const auto length = parser.content_length();
      length.has_value() && *length > options.limits.max_body_bytes) {
    return {413, absl::StrCat("body: ", *length, " bytes; at most ", options.limits.max_body_bytes,
                              " are taken")};
  }
  return {};
}

// The headers of the request a handler sees, from a parser that read its head.
void TakeHead(Parser& parser, HttpRequest* request) {
  for (const auto& field : parser.get()) {
    request->headers[absl::AsciiStrToLower(std::string(field.name_string()))] =
        std::string(field.value());
  }
}

}  // namespace

ParsedHttpRequest ParseHttpRequest(std::string_view bytes, const HttpServerOptions& options) {
  ParsedHttpRequest out;
  Parser parser;
  Bound(parser, options.limits);
  beast::error_code ec;
  size_t used = 0;
  auto put = [&] {
    const size_t n = parser.put(net::buffer(bytes.data() + used, bytes.size() - used), ec);
    used += n;
    if (ec == http::error::need_more) ec = {};
    return n;
  };

  // The head, then (as a connection does) the checks of it, then the body.
  while (!ec && !parser.is_header_done() && used < bytes.size()) {
    if (put() == 0) break;
  }
  if (ec || !parser.is_header_done()) {
    const Refusal refusal = RefusalFor(ec, parser, options.limits);
    out.status = refusal.status;
    out.message = refusal.message;
    return out;
  }
  const HttpRoute* route = nullptr;
  if (Refusal r = CheckHead(parser, options, &out.request.method, &out.request.path, &route);
      r.status != 0) {
    out.status = r.status;
    out.message = r.message;
    return out;
  }
  while (!ec && !parser.is_done() && used < bytes.size()) {
    if (put() == 0) break;
  }
  if (!ec && !parser.is_done() && parser.need_eof()) parser.put_eof(ec);
  if (ec || !parser.is_done()) {
    const Refusal refusal = RefusalFor(ec, parser, options.limits);
    out.status = refusal.status;
    out.message = refusal.message;
    return out;
  }
  TakeHead(parser, &out.request);
  out.request.body = std::move(parser.get().body());
  out.complete = true;
  return out;
}

struct HttpServer::Impl {
  explicit Impl(HttpServerOptions o)
      : options(std::move(o)),
        slots(CapsFor(options.limits)),
        bodies(options.limits),
        pool(options.limits.handler_threads) {}

  void Leave(const std::string& group, SessionBase* session) {
    slots.Leave(group);
    std::lock_guard<std::mutex> lock(mutex);
    sessions.erase(session);
  }
  // Waits for a write a blocking handler started; false when it failed or the server stops.
  bool Wait(Completion& completion) {
    std::unique_lock<std::mutex> lock(completion.mutex);
    while (!completion.done) {
      if (stopping) return false;
      completion.done_cv.wait_for(lock, std::chrono::milliseconds(50));
    }
    return completion.ok;
  }
  void Accept();

  // Declared before the io_context, so that they outlive the sessions it may still hold when
  // it is destroyed.
  HttpServerOptions options;
  std::atomic<bool> stopping{false};
  std::mutex mutex;
  std::map<SessionBase*, std::weak_ptr<SessionBase>> sessions;
  ConnectionSlots slots;
  BodyLedger bodies;
  HandlerPool pool;
  // HTTPS: the context new connections get, made again from the files when they change
  // (a renewed certificate is served without a restart); TlsContext() checks at most once a
  // second. Connections keep the context they were accepted with.
  std::shared_ptr<ssl::context> TlsContext();
  bool https = false;
  std::mutex tls_mutex;
  std::shared_ptr<ssl::context> tls;
  std::string tls_stamp;
  std::chrono::steady_clock::time_point tls_checked;
  net::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> io_threads;
};

namespace {

template <class Stream>
class Session final : public SessionBase, public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(HttpServer::Impl& server, Stream stream, std::string client, std::string group,
          std::shared_ptr<ssl::context> tls = nullptr)
      : server_(server),
        tls_(std::move(tls)),
        stream_(std::move(stream)),
        client_(std::move(client)),
        group_(std::move(group)),
        proxy_(server.options.limits.trusted_proxies.Contains(client_)),
        body_group_(group_),
        buffer_(server.options.limits.max_header_bytes + 8192),
        watch_timer_(stream_.get_executor()) {}
  ~Session() override {
    server_.bodies.Release(tenant_, body_group_, charged_);
    server_.Leave(group_, this);
  }

  void Run() {
    if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
      ReadHeader();
    } else {
      Socket().expires_at(HeadDeadline());
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (!ec) self->ReadHeader();
                              });
    }
  }
  void Close() override {
    net::post(stream_.get_executor(), [self = this->shared_from_this()] {
      beast::error_code ignored;
      self->Socket().socket().shutdown(tcp::socket::shutdown_both, ignored);
      self->Socket().close();
    });
  }

  // The responder of the request being handled; its calls come from a handler thread
  // (blocking) or from this connection's strand (inline).
  class Responder final : public HttpResponder {
   public:
    Responder(std::shared_ptr<Session> session, bool blocking, bool keep_alive)
        : session_(std::move(session)), blocking_(blocking), keep_alive_(keep_alive) {}
    bool responded() const { return responded_; }

    void Send(int status, std::string_view content_type, std::string body,
              const HttpHeaders& headers) override {
      if (responded_) return;
      responded_ = true;
      auto res = std::make_shared<http::response<http::string_body>>(
          static_cast<http::status>(status), 11);
      res->set(http::field::content_type, content_type);
      for (const auto& [name, value] : headers) res->set(name, value);
      res->keep_alive(keep_alive_);
      res->body() = std::move(body);
      res->prepare_payload();
      auto completion = std::make_shared<Completion>();
      const bool keep = keep_alive_;
      net::post(session_->stream_.get_executor(), [session = session_, res, completion, keep] {
        session->Socket().expires_after(session->server_.options.limits.write_timeout);
        http::async_write(session->stream_, *res,
                          [session, res, completion, keep](beast::error_code ec, size_t) {
                            completion->Set(!ec);
                            session->Finish(keep && !ec);
                          });
      });
      if (blocking_) (void)session_->server_.Wait(*completion);
    }
    bool Start(int status, std::string_view content_type, const HttpHeaders& headers) override {
      if (responded_) return false;
      responded_ = true;
      streaming_ = true;
      auto res =
          std::make_shared<http::response<http::empty_body>>(static_cast<http::status>(status), 11);
      res->set(http::field::content_type, content_type);
      for (const auto& [name, value] : headers) res->set(name, value);
      res->keep_alive(keep_alive_);
      res->chunked(true);
      auto serializer = std::make_shared<http::response_serializer<http::empty_body>>(*res);
      return Run([res, serializer](Session& session, std::function<void(bool)> done) {
        http::async_write_header(
            session.stream_, *serializer,
            [res, serializer, done](beast::error_code ec, size_t) { done(!ec); });
      });
    }
    bool Write(std::string_view data) override {
      if (!streaming_ || failed_) return false;
      if (data.empty()) return true;
      auto held = std::make_shared<std::string>(data);
      return Run([held](Session& session, std::function<void(bool)> done) {
        net::async_write(session.stream_, http::make_chunk(net::buffer(*held)),
                         [held, done](beast::error_code ec, size_t) { done(!ec); });
      });
    }
    void End() override {
      if (!streaming_ || ended_) return;
      ended_ = true;
      if (failed_) {
        session_->Close();
        return;
      }
      auto completion = std::make_shared<Completion>();
      const bool keep = keep_alive_;
      net::post(session_->stream_.get_executor(), [session = session_, completion, keep] {
        session->Socket().expires_after(session->server_.options.limits.write_timeout);
        net::async_write(session->stream_, http::make_chunk_last(),
                         [session, completion, keep](beast::error_code ec, size_t) {
                           completion->Set(!ec);
                           session->Finish(keep && !ec);
                         });
      });
      if (blocking_) (void)session_->server_.Wait(*completion);
    }
    void OnClientGone(std::function<void()> cancel) override {
      if (blocking_) session_->SetOnClientGone(std::move(cancel));
    }
    // After the handler: a response it never finished is ended (or answered) here.
    void Conclude() {
      if (!responded_) {
        Send(500, "application/json",
             session_->server_.options.error_body(500, "internal error: no response"), {});
      } else if (streaming_ && !ended_) {
        failed_ = true;
        End();
      }
    }

   private:
    // Runs one write on the strand and waits for it (a streaming response is only written
    // from a blocking handler).
    bool Run(std::function<void(Session&, std::function<void(bool)>)> write) {
      auto completion = std::make_shared<Completion>();
      net::post(session_->stream_.get_executor(), [session = session_, write, completion] {
        session->Socket().expires_after(session->server_.options.limits.write_timeout);
        write(*session, [completion](bool ok) { completion->Set(ok); });
      });
      const bool ok = session_->server_.Wait(*completion);
      if (!ok) failed_ = true;
      return ok;
    }

    std::shared_ptr<Session> session_;
    const bool blocking_;
    const bool keep_alive_;
    bool responded_ = false, streaming_ = false, ended_ = false, failed_ = false;
  };

 private:
  beast::tcp_stream& Socket() { return beast::get_lowest_layer(stream_); }

  void ReadHeader() {
    const HttpLimits& limits = server_.options.limits;
    parser_.emplace();
    Bound(*parser_, limits);
    // The whole request must arrive by the deadline, a connection's first head by the
    // (shorter) head deadline; between requests a connection may idle only idle_timeout.
    const auto wait = first_ ? limits.request_timeout : limits.idle_timeout;
    deadline_ = Clock::now() + wait;
    Socket().expires_at(first_ ? std::min(deadline_, HeadDeadline()) : deadline_);
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    const HttpLimits& limits = server_.options.limits;
    if (ec) {
      const Refusal refusal = RefusalFor(ec, *parser_, limits);
      return refusal.status == 0 ? Drop() : Refuse(refusal.status, refusal.message);
    }
    if (!first_) deadline_ = Clock::now() + limits.request_timeout;
    request_ = std::make_shared<HttpRequest>();
    request_->client = client_;
    if (Refusal r =
            CheckHead(*parser_, server_.options, &request_->method, &request_->path, &route_);
        r.status != 0) {
      return Refuse(r.status, r.message);
    }
    if (Refusal r = Authenticate(); r.status != 0) return Refuse(r.status, r.message);
    const auto& req = parser_->get();
    if (auto expect = req.find(http::field::expect);
        expect != req.end() && beast::iequals(expect->value(), "100-continue")) {
      Socket().expires_at(deadline_);
      net::async_write(stream_, net::buffer(kContinue.data(), kContinue.size()),
                       [self = this->shared_from_this()](beast::error_code ec, size_t) {
                         if (ec) return self->Drop();
                         self->ReadBody();
                       });
      return;
    }
    ReadBody();
  }

  // The head's tenant, when its route needs a key, before any of its body is read or charged
  // (401 when the key is refused); a group that sent one becomes trusted (connection_slots.h).
  Refusal Authenticate() {
    TakeHead(*parser_, request_.get());
    // Behind a trusted proxy the request is its X-Forwarded-For client's (nothing is charged
    // yet: the previous request's body memory went back in Finish).
    if (proxy_) {
      request_->client = server_.options.limits.trusted_proxies.ClientOf(
          client_, request_->Header("x-forwarded-for"));
      body_group_ = ClientGroup(request_->client, server_.options.limits.ipv4_prefix_length);
    }
    tenant_.clear();
    if (!route_->needs_key) return {};
    if (const auto& authenticate = server_.options.authenticate; authenticate != nullptr) {
      absl::StatusOr<std::string> tenant = authenticate(*request_);
      if (!tenant.ok()) return {401, std::string(tenant.status().message())};
      tenant_ = *std::move(tenant);
    }
    request_->tenant = tenant_;
    server_.slots.Trust(group_);
    return {};
  }

  // The body a piece at a time, each piece charged as it arrives.
  void ReadBody() {
    if (parser_->is_done()) return OnBody({});
    Socket().expires_at(deadline_);
    http::async_read_some(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnBodyBytes(ec); });
  }
  void OnBodyBytes(beast::error_code ec) {
    if (ec) return OnBody(ec);
    // What the body holds (its capacity: the memory it took), beyond what is charged.
    const uint64_t held = parser_->get().body().capacity();
    if (held > charged_) {
      if (!server_.bodies.Charge(tenant_, body_group_, held - charged_)) {
        return Refuse(503,
                      "the server holds as many request bodies as it takes (in all, for this "
                      "tenant or from this client); retry",
                      {{"Retry-After", "1"}});
      }
      charged_ = held;
    }
    ReadBody();
  }

  void OnBody(beast::error_code ec) {
    if (ec) {
      const Refusal refusal = RefusalFor(ec, *parser_, server_.options.limits);
      return refusal.status == 0 ? Drop() : Refuse(refusal.status, refusal.message);
    }
    Socket().expires_never();  // the handler's writes set their own deadlines
    std::shared_ptr<HttpRequest> request = std::move(request_);
    request->body = std::move(parser_->get().body());
    const auto max_age = server_.options.limits.max_connection_age;
    const bool keep_alive = parser_->get().keep_alive() && !server_.stopping &&
                            (max_age.count() == 0 || Clock::now() - opened_ < max_age);
    auto self = this->shared_from_this();
    const HttpRoute* route = route_;
    if (!route->blocking) {
      Responder responder(self, false, keep_alive);
      route->handler(*request, responder);
      responder.Conclude();
      return;
    }
    if (route->admit) {
      Responder responder(self, false, keep_alive);
      if (!route->admit(*request, responder)) {
        responder.Conclude();
        return;
      }
    }
    StartWatch();
    const bool taken = server_.pool.TrySubmit([self, route, request, keep_alive] {
      Responder responder(self, true, keep_alive);
      route->handler(*request, responder);
      if (route->release) route->release(*request);
      self->StopWatch();
      responder.Conclude();
    });
    if (!taken) {
      if (route->release) route->release(*request);
      StopWatch();
      Refuse(503, "every request thread is busy; retry", {{"Retry-After", "1"}});
    }
  }

  // The response is written: the next request on this connection, or the end of it.
  void Finish(bool keep_alive) {
    server_.bodies.Release(tenant_, body_group_, charged_);
    charged_ = 0;
    if (!keep_alive || server_.stopping) {
      beast::error_code ignored;
      Socket().socket().shutdown(tcp::socket::shutdown_send, ignored);
      Linger();
      return;
    }
    first_ = false;
    ReadHeader();
  }
  // After a response that ends the connection, the rest of what the client sends is read and
  // dropped for a moment (at most a second and kLingerBytes), so that closing with unread
  // bytes does not reset the connection before the client has read the response.
  static constexpr size_t kLingerBytes = size_t{4} << 20;
  void Linger() {
    if (lingered_ == 0) Socket().expires_after(std::chrono::seconds(1));
    if (lingered_ >= kLingerBytes) return Drop();
    Socket().async_read_some(net::buffer(scratch_),
                             [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                               if (ec) return self->Drop();
                               self->lingered_ += n;
                               self->Linger();
                             });
  }

  // Answers an error the server found itself and closes the connection after it.
  void Refuse(int status, const std::string& message, const HttpHeaders& headers = {}) {
    Responder responder(this->shared_from_this(), false, false);
    responder.Send(status, "application/json", server_.options.error_body(status, message),
                   headers);
  }
  void Drop() {
    beast::error_code ignored;
    Socket().socket().shutdown(tcp::socket::shutdown_both, ignored);
    Socket().close();
  }
  Clock::time_point HeadDeadline() const {
    return opened_ +
           std::min(server_.options.limits.head_timeout, server_.options.limits.request_timeout);
  }

  // While a blocking handler runs nothing reads the connection: a client that closes it (FIN
  // or reset) is seen by a wait for readability, and the handler's OnClientGone callback runs.
  // Bytes that are no end (a pipelined request, TLS records) stay for the next read and are
  // looked at again after a moment. On the strand, but for SetOnClientGone and StopWatch.
  void StartWatch() {
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      watching_ = true;
      client_gone_ = false;
      on_gone_ = nullptr;
    }
    Watch(++watch_round_);
  }
  void Watch(uint64_t round) {
    Socket().socket().async_wait(
        tcp::socket::wait_read, [self = this->shared_from_this(), round](beast::error_code ec) {
          if (ec == net::error::operation_aborted || round != self->watch_round_) return;
          if (ec || self->PeerClosed()) return self->ClientGone();
          self->watch_timer_.expires_after(std::chrono::milliseconds(250));
          self->watch_timer_.async_wait([self, round](beast::error_code ec) {
            if (!ec && round == self->watch_round_ && self->Watching()) self->Watch(round);
          });
        });
  }
  bool PeerClosed() {
    pollfd p{Socket().socket().native_handle(), POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }
  bool Watching() {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    return watching_;
  }
  // The callback runs under the lock, so that StopWatch (from the handler thread) returns only
  // once it has finished, and it never runs after.
  void ClientGone() {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    client_gone_ = true;
    if (!watching_ || on_gone_ == nullptr) return;
    std::function<void()> cancel = std::move(on_gone_);
    on_gone_ = nullptr;
    cancel();
  }
  void SetOnClientGone(std::function<void()> cancel) {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    on_gone_ = nullptr;
    if (!watching_ || cancel == nullptr) return;
    if (client_gone_) return cancel();
    on_gone_ = std::move(cancel);
  }
  void StopWatch() {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    watching_ = false;
    on_gone_ = nullptr;
  }

  HttpServer::Impl& server_;
  std::shared_ptr<ssl::context> tls_;  // the context stream_ was made with, kept while it lives
  Stream stream_;
  const std::string client_;
  const std::string group_;  // ClientGroup of client_ ("proxy <address>" for a trusted proxy)
  const bool proxy_;         // client_ is a trusted proxy
  std::string body_group_;   // whose body memory the current request is: group_, or its
                             // X-Forwarded-For client's group behind a trusted proxy
  beast::flat_buffer buffer_;
  std::optional<Parser> parser_;
  const HttpRoute* route_ = nullptr;
  std::shared_ptr<HttpRequest> request_;  // the one being read
  std::string tenant_;                    // its tenant ("": no key needed, or no keys)
  uint64_t charged_ = 0;                  // its body's bytes charged to server_.bodies
  bool first_ = true;
  Clock::time_point deadline_;
  const Clock::time_point opened_ = Clock::now();
  size_t lingered_ = 0;
  char scratch_[16384];
  net::steady_timer watch_timer_;
  uint64_t watch_round_ = 0;  // the StartWatch whose waits count
  std::mutex watch_mutex_;
  bool watching_ = false, client_gone_ = false;
  std::function<void()> on_gone_;
};

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (stopping) return;
    if (!ec) {
      beast::error_code peer_error;
      const tcp::endpoint peer = socket.remote_endpoint(peer_error);
      const std::string client = peer_error ? "" : peer.address().to_string();
      // A trusted proxy's connection carries many clients: it is a group of its own, held to
      // the total alone (connection_slots.h).
      const bool proxy = options.limits.trusted_proxies.Contains(client);
      const std::string group =
          proxy ? "proxy " + client : ClientGroup(client, options.limits.ipv4_prefix_length);
      if (!slots.Admit(group, ConnectionSlots::Clock::now(), proxy)) {
        socket.close(peer_error);
      } else {
        std::shared_ptr<SessionBase> session;
        if (https) {
          std::shared_ptr<ssl::context> context = TlsContext();
          auto s = std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(
              *this, beast::ssl_stream<beast::tcp_stream>(std::move(socket), *context), client,
              group, context);
          session = s;
          s->Run();
        } else {
          auto s = std::make_shared<Session<beast::tcp_stream>>(
              *this, beast::tcp_stream(std::move(socket)), client, group);
          session = s;
          s->Run();
        }
        std::lock_guard<std::mutex> lock(mutex);
        sessions[session.get()] = session;
      }
    }
    Accept();
  });
}

namespace {

// The server's TLS context from its PEM files.
absl::StatusOr<std::shared_ptr<ssl::context>> MakeTlsContext(const HttpServerOptions& options) {
  beast::error_code ec;
  auto context = std::make_shared<ssl::context>(ssl::context::tls_server);
  context->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                       ssl::context::no_tlsv1_1);
  context->use_certificate_chain_file(options.tls_cert, ec);
  if (!ec) context->use_private_key_file(options.tls_key, ssl::context::pem, ec);
  if (!ec && !options.tls_client_ca.empty()) {
    context->load_verify_file(options.tls_client_ca, ec);
    context->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  }
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat("--http-port: cannot serve HTTPS with ",
                                                   options.tls_cert, " and ", options.tls_key,
                                                   ": ", ec.message()));
  }
  return context;
}

// The three TLS files' stamps together (file_stamp.h).
std::string TlsStamp(const HttpServerOptions& options) {
  return absl::StrCat(FileStamp(options.tls_cert), ";", FileStamp(options.tls_key), ";",
                      FileStamp(options.tls_client_ca));
}

}  // namespace

std::shared_ptr<ssl::context> HttpServer::Impl::TlsContext() {
  std::lock_guard<std::mutex> lock(tls_mutex);
  const auto now = std::chrono::steady_clock::now();
  if (now - tls_checked < std::chrono::seconds(1)) return tls;
  tls_checked = now;
  const std::string stamp = TlsStamp(options);
  if (stamp == tls_stamp) return tls;
  // A renewal may be caught half-written: keep serving the old context and try again later.
  absl::StatusOr<std::shared_ptr<ssl::context>> fresh = MakeTlsContext(options);
  if (!fresh.ok()) {
    log::Warn("HTTPS certificate not reloaded; serving the previous one",
              {{"error", std::string(fresh.status().message())}});
    return tls;
  }
  tls = *std::move(fresh);
  tls_stamp = stamp;
  log::Info("HTTPS certificate reloaded", {{"cert", options.tls_cert}});
  return tls;
}

HttpServer::HttpServer(HttpServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

HttpServer::~HttpServer() {
  Stop(std::chrono::milliseconds(0));
}

absl::Status HttpServer::Start() {
  Impl& impl = *impl_;
  const HttpServerOptions& options = impl.options;
  if (!options.tls_cert.empty()) {
    absl::StatusOr<std::shared_ptr<ssl::context>> context = MakeTlsContext(options);
    if (!context.ok()) return context.status();
    impl.https = true;
    impl.tls = *std::move(context);
    impl.tls_stamp = TlsStamp(options);
    impl.tls_checked = std::chrono::steady_clock::now();
  }
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(options.host, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--host: ", options.host, ": not an IP"));
  impl.acceptor.emplace(impl.ioc);
  if (ec = Listen(*impl.acceptor, address, static_cast<unsigned short>(options.port)); ec) {
    return absl::UnavailableError(absl::StrCat("--http-port: cannot bind ",
                                               JoinHostPort(options.host, options.port), " (",
                                               ec.message(), ")"));
  }
  port_ = impl.acceptor->local_endpoint().port();
  impl.Accept();
  for (int i = 0; i < std::max(1, options.limits.io_threads); ++i) {
    impl.io_threads.emplace_back([&impl] { impl.ioc.run(); });
  }
  return absl::OkStatus();
}

void HttpServer::Stop(std::chrono::milliseconds grace) {
  Impl& impl = *impl_;
  if (impl.stopping.exchange(true)) return;
  if (impl.acceptor.has_value()) {
    net::post(impl.ioc, [&impl] {
      beast::error_code ignored;
      impl.acceptor->close(ignored);
    });
  }
  impl.pool.Stop(grace);
  std::vector<std::shared_ptr<SessionBase>> open;
  {
    std::lock_guard<std::mutex> lock(impl.mutex);
    for (auto& [raw, weak] : impl.sessions) {
      if (auto session = weak.lock()) open.push_back(std::move(session));
    }
  }
  for (auto& session : open) session->Close();
  open.clear();  // a session's last reference may go here: it takes the lock to leave
  impl.pool.Join();
  impl.ioc.stop();
  for (std::thread& t : impl.io_threads) t.join();
  impl.io_threads.clear();
}

}  // namespace baton::router
