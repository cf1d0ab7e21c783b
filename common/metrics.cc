#include "baton/common/metrics.h"

#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "baton/common/parse.h"
#include "prometheus/exposer.h"

namespace baton::metrics {
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

MetricsServer::MetricsServer() = default;
MetricsServer::~MetricsServer() = default;
MetricsServer::MetricsServer(MetricsServer&&) = default;
MetricsServer& MetricsServer::operator=(MetricsServer&&) = default;

absl::StatusOr<MetricsServer> StartMetricsServer(const std::string& host, int port,
                                                 const std::string& binary) {
  Gauge("baton_build_info", "1, labelled with the binary and its version")
      .Add({{"binary", binary}, {"version", BATON_VERSION}})
      .Set(1);
  MetricsServer server;
  // civetweb spells every address, IPv6 and IPv4, "+port"; a kernel without IPv6 gets every
  // IPv4 address instead.
  std::vector<std::string> binds = {JoinHostPort(host, port)};
  if (host == "::") binds = {absl::StrCat("+", port), absl::StrCat("0.0.0.0:", port)};
  std::string error;
  for (const std::string& bind : binds) {
    try {
      server.exposer = std::make_unique<prometheus::Exposer>(bind, 1);
      break;
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (server.exposer == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", JoinHostPort(host, port), ": ", error));
  }
  const std::vector<int> ports = server.exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", JoinHostPort(host, port)));
  }
  server.exposer->RegisterCollectable(Process());
  server.address = JoinHostPort(host, ports.front());
  return server;
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
