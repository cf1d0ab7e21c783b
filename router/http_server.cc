#include "baton/router/http_server.h"

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
#include "baton/common/listen.h"
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

using Parser = http::request_parser<http::string_body>;

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

// The request a handler sees, from a parser that read it whole.
void TakeRequest(Parser& parser, HttpRequest* request) {
  auto& req = parser.get();
  for (const auto& field : req) {
    request->headers[absl::AsciiStrToLower(std::string(field.name_string()))] =
        std::string(field.value());
  }
  request->body = std::move(req.body());
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
  TakeRequest(parser, &out.request);
  out.complete = true;
  return out;
}

struct HttpServer::Impl {
  explicit Impl(HttpServerOptions o)
      : options(std::move(o)), pool(options.limits.handler_threads) {}

  // Takes a connection from `client` if the bounds allow it.
  bool Admit(const std::string& client) {
    std::lock_guard<std::mutex> lock(mutex);
    int& from_client = per_client[client];
    if (connections >= options.limits.max_connections ||
        from_client >= options.limits.max_connections_per_client) {
      if (from_client == 0) per_client.erase(client);
      return false;
    }
    ++connections;
    ++from_client;
    return true;
  }
  void Leave(const std::string& client, SessionBase* session) {
    std::lock_guard<std::mutex> lock(mutex);
    --connections;
    if (auto it = per_client.find(client); it != per_client.end() && --it->second == 0) {
      per_client.erase(it);
    }
    sessions.erase(session);
  }
  bool Reserve(uint64_t bytes) {
    uint64_t held = body_bytes.load();
    do {
      if (bytes > options.limits.body_memory_bytes - std::min(held, options.limits.body_memory_bytes)) {
        return false;
      }
    } while (!body_bytes.compare_exchange_weak(held, held + bytes));
    return true;
  }
  void Unreserve(uint64_t bytes) { body_bytes -= bytes; }
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
  int connections = 0;
  std::map<std::string, int> per_client;
  std::map<SessionBase*, std::weak_ptr<SessionBase>> sessions;
  std::atomic<uint64_t> body_bytes{0};
  HandlerPool pool;
  std::optional<ssl::context> tls;
  net::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> io_threads;
};

namespace {

template <class Stream>
class Session final : public SessionBase, public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(HttpServer::Impl& server, Stream stream, std::string client)
      : server_(server),
        stream_(std::move(stream)),
        client_(std::move(client)),
        buffer_(server.options.limits.max_header_bytes + 8192) {}
  ~Session() override {
    server_.Unreserve(reserved_);
    server_.Leave(client_, this);
  }

  void Run() {
    if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
      ReadHeader();
    } else {
      Socket().expires_after(server_.options.limits.request_timeout);
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
      auto res = std::make_shared<http::response<http::empty_body>>(
          static_cast<http::status>(status), 11);
      res->set(http::field::content_type, content_type);
      for (const auto& [name, value] : headers) res->set(name, value);
      res->keep_alive(keep_alive_);
      res->chunked(true);
      auto serializer = std::make_shared<http::response_serializer<http::empty_body>>(*res);
      return Run([res, serializer](Session& session, std::function<void(bool)> done) {
        http::async_write_header(session.stream_, *serializer,
                                 [res, serializer, done](beast::error_code ec, size_t) {
                                   done(!ec);
                                 });
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
    // The whole request must arrive by the deadline; between requests a connection may idle
    // only idle_timeout.
    const auto wait = first_ ? limits.request_timeout : limits.idle_timeout;
    deadline_ = Clock::now() + wait;
    Socket().expires_after(wait);
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = this->shared_from_this()](beast::error_code ec, size_t) {
                              self->OnHeader(ec);
                            });
  }

  void OnHeader(beast::error_code ec) {
    const HttpLimits& limits = server_.options.limits;
    if (ec) {
      const Refusal refusal = RefusalFor(ec, *parser_, limits);
      return refusal.status == 0 ? Drop() : Refuse(refusal.status, refusal.message);
    }
    if (!first_) deadline_ = Clock::now() + limits.request_timeout;
    if (Refusal r = CheckHead(*parser_, server_.options, &method_, &path_, &route_);
        r.status != 0) {
      return Refuse(r.status, r.message);
    }
    const auto& req = parser_->get();
    uint64_t need = 0;
    if (const auto length = parser_->content_length(); length.has_value()) {
      need = *length;
    } else if (parser_->chunked()) {
      need = limits.max_body_bytes;
    }
    if (!server_.Reserve(need)) {
      return Refuse(503, "the server is reading as many request bodies as it takes; retry",
                    {{"Retry-After", "1"}});
    }
    reserved_ = need;
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

  void ReadBody() {
    if (parser_->is_done()) return OnBody({});
    Socket().expires_at(deadline_);
    http::async_read(stream_, buffer_, *parser_,
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       self->OnBody(ec);
                     });
  }

  void OnBody(beast::error_code ec) {
    if (ec) {
      const Refusal refusal = RefusalFor(ec, *parser_, server_.options.limits);
      return refusal.status == 0 ? Drop() : Refuse(refusal.status, refusal.message);
    }
    Socket().expires_never();  // the handler's writes set their own deadlines
    auto request = std::make_shared<HttpRequest>();
    request->method = method_;
    request->path = path_;
    request->client = client_;
    const auto max_age = server_.options.limits.max_connection_age;
    const bool keep_alive = parser_->get().keep_alive() && !server_.stopping &&
                            (max_age.count() == 0 || Clock::now() - opened_ < max_age);
    TakeRequest(*parser_, request.get());
    auto self = this->shared_from_this();
    const HttpRoute* route = route_;
    if (!route->blocking) {
      Responder responder(self, false, keep_alive);
      route->handler(*request, responder);
      responder.Conclude();
      return;
    }
    const bool taken = server_.pool.TrySubmit([self, route, request, keep_alive] {
      Responder responder(self, true, keep_alive);
      route->handler(*request, responder);
      responder.Conclude();
    });
    if (!taken) {
      Refuse(503, "every request thread is busy; retry", {{"Retry-After", "1"}});
    }
  }

  // The response is written: the next request on this connection, or the end of it.
  void Finish(bool keep_alive) {
    server_.Unreserve(reserved_);
    reserved_ = 0;
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

  HttpServer::Impl& server_;
  Stream stream_;
  std::string client_;
  beast::flat_buffer buffer_;
  std::optional<Parser> parser_;
  const HttpRoute* route_ = nullptr;
  std::string method_, path_;
  uint64_t reserved_ = 0;
  bool first_ = true;
  Clock::time_point deadline_;
  const Clock::time_point opened_ = Clock::now();
  size_t lingered_ = 0;
  char scratch_[16384];
};

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (stopping) return;
    if (!ec) {
      beast::error_code peer_error;
      const tcp::endpoint peer = socket.remote_endpoint(peer_error);
      const std::string client = peer_error ? "" : peer.address().to_string();
      if (!Admit(client)) {
        socket.close(peer_error);
      } else {
        std::shared_ptr<SessionBase> session;
        if (tls.has_value()) {
          auto s = std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(
              *this, beast::ssl_stream<beast::tcp_stream>(std::move(socket), *tls), client);
          session = s;
          s->Run();
        } else {
          auto s = std::make_shared<Session<beast::tcp_stream>>(
              *this, beast::tcp_stream(std::move(socket)), client);
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

HttpServer::HttpServer(HttpServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

HttpServer::~HttpServer() { Stop(std::chrono::milliseconds(0)); }

absl::Status HttpServer::Start() {
  Impl& impl = *impl_;
  const HttpServerOptions& options = impl.options;
  if (!options.tls_cert.empty()) {
    beast::error_code ec;
    impl.tls.emplace(ssl::context::tls_server);
    impl.tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                          ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                          ssl::context::no_tlsv1_1);
    impl.tls->use_certificate_chain_file(options.tls_cert, ec);
    if (!ec) impl.tls->use_private_key_file(options.tls_key, ssl::context::pem, ec);
    if (!ec && !options.tls_client_ca.empty()) {
      impl.tls->load_verify_file(options.tls_client_ca, ec);
      impl.tls->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    }
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat("--http-port: cannot serve HTTPS with ",
                                                     options.tls_cert, " and ", options.tls_key,
                                                     ": ", ec.message()));
    }
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
