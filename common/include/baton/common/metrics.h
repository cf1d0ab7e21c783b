// Prometheus metrics (prometheus-cpp). Each process has one registry; its components add
// their families there, and the server binaries expose it over HTTP at /metrics
// (`--metrics-port`). Names use the `baton_` prefix and carry their unit (`_seconds`,
// `_bytes`, `_total` for counters), as vLLM's do.
//
// Values that a component already keeps (pool occupancy, store counters) are read when
// Prometheus scrapes, through a Collector, rather than copied into gauges as they change.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}

namespace baton::metrics {

// The process's registry.
prometheus::Registry& Registry();

prometheus::Family<prometheus::Counter>& Counter(const std::string& name, const std::string& help);
prometheus::Family<prometheus::Gauge>& Gauge(const std::string& name, const std::string& help);
prometheus::Family<prometheus::Histogram>& Histogram(const std::string& name,
                                                     const std::string& help);

// Bucket bounds in seconds for request latencies (time to first token, end to end) and
// for per-token or per-step times; both as in vLLM.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets();
const prometheus::Histogram::BucketBoundaries& TokenLatencyBuckets();

// Families computed at scrape time.
class Collector : public prometheus::Collectable {
 public:
  using Fn = std::function<std::vector<prometheus::MetricFamily>()>;
  explicit Collector(Fn fn) : fn_(std::move(fn)) {}
  std::vector<prometheus::MetricFamily> Collect() const override { return fn_(); }

 private:
  Fn fn_;
};

// A gauge or counter family with one sample per label set, for Collectors.
prometheus::MetricFamily GaugeFamily(
    const std::string& name, const std::string& help,
    const std::vector<std::pair<std::map<std::string, std::string>, double>>& samples);
prometheus::MetricFamily CounterFamily(
    const std::string& name, const std::string& help,
    const std::vector<std::pair<std::map<std::string, std::string>, double>>& samples);

// Adds a collector to the process's exposition for as long as the returned pointer (which the
// component owning `fn`'s captures should hold) lives.
std::shared_ptr<Collector> AddCollector(Collector::Fn fn);

// Serves the registry and the collectors on http://host:port/metrics (port 0: any free port;
// host "::" every IPv6 and IPv4 address, IPv4's alone where the kernel has no IPv6) and sets
// baton_build_info{binary, version} to 1. The server (Boost.Beast: Debian's civetweb, which
// prometheus-cpp's exposer serves on, is built without IPv6) answers each scrape on its own
// connection and serves until destroyed. Anyone who reaches the port may connect, so its
// slots are shared out as the HTTP front's are (connection_slots.h): 64 in all, 8 per client
// (an IPv4 address, an IPv6 /64), the last 16 for clients that have scraped in the last ten
// minutes, and a request must be complete within 2 s of the accept.
struct MetricsServer {
  struct Impl;
  std::unique_ptr<Impl> impl;
  std::string address;  // host:port
  ~MetricsServer();
  MetricsServer();
  MetricsServer(MetricsServer&&);
  MetricsServer& operator=(MetricsServer&&);
};
absl::StatusOr<MetricsServer> StartMetricsServer(const std::string& host, int port,
                                                 const std::string& binary);

// The value of a `tenant` label: with `names` the tenant's name, else (the default: the page
// is open to whoever reaches the port) "t-" and the first 12 hex digits of the SHA-256 of the
// name, the same in every process and across restarts. It hides the names from readers of the
// page; it does not keep a guessed name from being checked.
std::string TenantLabel(const std::string& tenant, bool names);

// The lower-case name of a gRPC status code ("ok", "cancelled", "resource_exhausted", ...),
// the `outcome` label of request counters.
std::string OutcomeLabel(int grpc_code);

}  // namespace baton::metrics
