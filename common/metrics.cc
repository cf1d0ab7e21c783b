#include "baton/common/metrics.h"

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <mutex>
#include <string_view>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "baton/common/connection_slots.h"
#include "baton/common/hash.h"
#include "baton/common/listen.h"
#include "baton/common/parse.h"
#include "prometheus/text_serializer.h"

namespace baton::metrics {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
namespace {

// The registry and every collector, gathered at each scrape.
class Exposition : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families = registry_->Collect();
    std::lock_guard<std::mutex> lock(mutex_);
    for (const std::weak_ptr<Collector>& weak : collectors_) {
      const std::shared_ptr<Collector> collector = weak.lock();
      if (collector == nullptr) continue;
      for (prometheus::MetricFamily& family : collector->Collect()) {
        families.push_back(std::move(family));
      }
    }
    return families;
  }
  void Add(const std::shared_ptr<Collector>& collector) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(collectors_, [](const std::weak_ptr<Collector>& c) { return c.expired(); });
    collectors_.push_back(collector);
  }
  prometheus::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  mutable std::mutex mutex_;
  std::vector<std::weak_ptr<Collector>> collectors_;
};

const std::shared_ptr<Exposition>& Process() {
  static const auto* exposition = new std::shared_ptr<Exposition>(std::make_shared<Exposition>());
  return *exposition;
}

prometheus::MetricFamily Family(
    const std::string& name, const std::string& help, prometheus::MetricType type,
    const std::vector<std::pair<std::map<std::string, std::string>, double>>& samples) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  for (const auto& [labels, value] : samples) {
    prometheus::ClientMetric metric;
    for (const auto& [key, label] : labels) metric.label.push_back({key, label});
    if (type == prometheus::MetricType::Counter) {
      metric.counter.value = value;
    } else {
      metric.gauge.value = value;
    }
    family.metric.push_back(std::move(metric));
  }
  return family;
}

}  // namespace

prometheus::Registry& Registry() { return Process()->registry(); }

prometheus::Family<prometheus::Counter>& Counter(const std::string& name,
                                                 const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(Registry());
}

prometheus::Family<prometheus::Gauge>& Gauge(const std::string& name, const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(Registry());
}

prometheus::Family<prometheus::Histogram>& Histogram(const std::string& name,
                                                     const std::string& help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(Registry());
}

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const prometheus::Histogram::BucketBoundaries buckets = {
      0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
      0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0};
  return buckets;
}

const prometheus::Histogram::BucketBoundaries& TokenLatencyBuckets() {
  static const prometheus::Histogram::BucketBoundaries buckets = {
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
      0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1.0,   2.5};
  return buckets;
}

prometheus::MetricFamily GaugeFamily(
    const std::string& name, const std::string& help,
    const std::vector<std::pair<std::map<std::string, std::string>, double>>& samples) {
  return Family(name, help, prometheus::MetricType::Gauge, samples);
}

prometheus::MetricFamily CounterFamily(
    const std::string& name, const std::string& help,
    const std::vector<std::pair<std::map<std::string, std::string>, double>>& samples) {
  return Family(name, help, prometheus::MetricType::Counter, samples);
}

std::shared_ptr<Collector> AddCollector(Collector::Fn fn) {
  auto collector = std::make_shared<Collector>(std::move(fn));
  Process()->Add(collector);
  return collector;
}

namespace {

// One scrape: read the request (bounded), answer it, close.
class MetricsSession : public std::enable_shared_from_this<MetricsSession> {
 public:
  MetricsSession(tcp::socket socket, std::shared_ptr<ConnectionSlots> slots, std::string group)
      : stream_(std::move(socket)), slots_(std::move(slots)), group_(std::move(group)) {}
  ~MetricsSession() { slots_->Leave(group_); }
  void Run() {
    parser_.header_limit(8 << 10);
    parser_.body_limit(8 << 10);
    stream_.expires_after(std::chrono::seconds(2));
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (!ec) self->Answer();
                     });
  }

 private:
  void Answer() {
    const auto& request = parser_.get();
    response_.version(request.version());
    response_.keep_alive(false);
    response_.set(http::field::server, "baton");
    const std::string_view target(request.target().data(), request.target().size());
    if (request.method() != http::verb::get && request.method() != http::verb::head) {
      response_.result(http::status::method_not_allowed);
      response_.set(http::field::allow, "GET, HEAD");
    } else if (target != "/metrics" && !target.starts_with("/metrics?")) {
      response_.result(http::status::not_found);
      response_.body() = "only /metrics is served here\n";
    } else {
      slots_->Trust(group_);
      response_.result(http::status::ok);
      response_.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      if (request.method() == http::verb::get) {
        response_.body() = prometheus::TextSerializer().Serialize(Process()->Collect());
      }
    }
    response_.prepare_payload();
    // The short deadline is for the request; a large page to a slow scraper gets longer.
    stream_.expires_after(std::chrono::seconds(10));
    http::async_write(stream_, response_, [self = shared_from_this()](beast::error_code, size_t) {
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request_parser<http::string_body> parser_;
  http::response<http::string_body> response_;
  std::shared_ptr<ConnectionSlots> slots_;
  std::string group_;
};

}  // namespace

struct MetricsServer::Impl {
  net::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  // Connections served at once; more are closed as they come (metrics.h).
  std::shared_ptr<ConnectionSlots> slots = std::make_shared<ConnectionSlots>(
      ConnectionCaps{.max_connections = 64, .max_per_client = 8, .reserved = 16});
  std::thread thread;

  ~Impl() {
    ioc.stop();
    if (thread.joinable()) thread.join();
  }
  void Accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted) return;
      if (!ec) {
        beast::error_code peer_error;
        const tcp::endpoint peer = socket.remote_endpoint(peer_error);
        std::string group = ClientGroup(peer_error ? "" : peer.address().to_string(),
                                        ConnectionCaps{}.ipv4_prefix_length);
        if (slots->Admit(group)) {
          std::make_shared<MetricsSession>(std::move(socket), slots, std::move(group))->Run();
        }
      }
      Accept();
    });
  }
};

MetricsServer::MetricsServer() = default;
MetricsServer::~MetricsServer() = default;
MetricsServer::MetricsServer(MetricsServer&&) = default;
MetricsServer& MetricsServer::operator=(MetricsServer&&) = default;

absl::StatusOr<MetricsServer> StartMetricsServer(const std::string& host, int port,
                                                 const std::string& binary) {
  Gauge("baton_build_info", "1, labelled with the binary and its version")
      .Add({{"binary", binary}, {"version", BATON_VERSION}})
      .Set(1);
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-host: '", host, "' is not an IP address"));
  }
  MetricsServer server;
  server.impl = std::make_unique<MetricsServer::Impl>();
  if (ec = Listen(server.impl->acceptor, address, static_cast<unsigned short>(port)); ec) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", JoinHostPort(host, port), ": ", ec.message()));
  }
  server.impl->Accept();
  MetricsServer::Impl* impl = server.impl.get();
  impl->thread = std::thread([impl] { impl->ioc.run(); });
  server.address = JoinHostPort(host, impl->acceptor.local_endpoint().port());
  return server;
}

std::string TenantLabel(const std::string& tenant, bool names) {
  if (names || tenant.empty()) return tenant;
  const std::string tag = "baton tenant label\n" + tenant;
  return "t-" + HexDigest(Sha256Of(tag.data(), tag.size())).substr(0, 12);
}

std::string OutcomeLabel(int grpc_code) {
  static const char* const kNames[] = {
      "ok",          "cancelled",          "unknown",        "invalid_argument",
      "deadline_exceeded", "not_found",    "already_exists", "permission_denied",
      "resource_exhausted", "failed_precondition", "aborted", "out_of_range",
      "unimplemented", "internal",         "unavailable",    "data_loss",
      "unauthenticated"};
  if (grpc_code < 0 || grpc_code > 16) return "unknown";
  return kNames[grpc_code];
}

}  // namespace baton::metrics
