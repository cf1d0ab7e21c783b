// Latencies in ms of many samples (a simulation's token gaps: a million requests of a few
// hundred tokens each), held in constant memory as a log-binned histogram (Boost.Histogram):
// each bin keeps the count and mean of its samples, so a percentile is exact wherever its bin's
// samples are equal (the gaps of identical decode steps) and within a bin's width (0.1% of the
// value) otherwise. Samples added one after another with the same value are counted together
// before they reach a bin, so a run of identical steps costs one fill.
//
// Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>

namespace baton::tools {

class LatencyHistogram {
 public:
  LatencyHistogram();
  ~LatencyHistogram();
  LatencyHistogram(LatencyHistogram&&) noexcept;
  LatencyHistogram& operator=(LatencyHistogram&&) noexcept;

  // `count` samples of `ms` (negative values count as 0).
  void Add(double ms, int64_t count = 1);
  // The nearest-rank percentile q in [0, 100] (0 when empty), as NearestRank over the samples
  // (cluster_sim.h): the mean of the bin that holds that rank.
  double Percentile(double q) const;
  double Mean() const;
  int64_t count() const;

 private:
  void Flush() const;
  struct Bins;
  mutable std::unique_ptr<Bins> bins_;
  mutable double run_ms_ = 0;
  mutable int64_t run_count_ = 0;
};

}  // namespace baton::tools
