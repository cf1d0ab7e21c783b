#include "latency_histogram.h"

#include <algorithm>
#include <cmath>

#include "boost/histogram.hpp"

namespace baton::tools {

namespace bh = boost::histogram;

// 1e-4 ms to 1e8 ms in bins 0.1% wide; below (0 included) and above go to the axis's underflow
// and overflow bins, which keep their samples' means like the others.
struct LatencyHistogram::Bins {
  using Axis = bh::axis::regular<double, bh::axis::transform::log>;
  static constexpr double kLow = 1e-4, kHigh = 1e8;
  static unsigned BinCount() {
    return static_cast<unsigned>(std::ceil(std::log(kHigh / kLow) / std::log(1.001)));
  }
  bh::histogram<std::tuple<Axis>, bh::dense_storage<bh::accumulators::weighted_mean<>>> h =
      bh::make_histogram_with(bh::dense_storage<bh::accumulators::weighted_mean<>>(),
                              Axis(BinCount(), kLow, kHigh));
  int64_t count = 0;
  double sum = 0;
};

LatencyHistogram::LatencyHistogram() : bins_(std::make_unique<Bins>()) {}
LatencyHistogram::~LatencyHistogram() = default;
LatencyHistogram::LatencyHistogram(LatencyHistogram&&) noexcept = default;
LatencyHistogram& LatencyHistogram::operator=(LatencyHistogram&&) noexcept = default;

void LatencyHistogram::Add(double ms, int64_t count) {
  if (count <= 0) return;
  ms = std::max(0.0, ms);
  if (run_count_ > 0 && ms != run_ms_) Flush();
  run_ms_ = ms;
  run_count_ += count;
}

void LatencyHistogram::Flush() const {
  if (run_count_ == 0) return;
  const double w = static_cast<double>(run_count_);
  bins_->h(run_ms_, bh::weight(w), bh::sample(run_ms_));
  bins_->count += run_count_;
  bins_->sum += w * run_ms_;
  run_count_ = 0;
}

int64_t LatencyHistogram::count() const {
  Flush();
  return bins_->count;
}

double LatencyHistogram::Mean() const {
  Flush();
  return bins_->count == 0 ? 0 : bins_->sum / static_cast<double>(bins_->count);
}

double LatencyHistogram::Percentile(double q) const {
  Flush();
  if (bins_->count == 0) return 0;
  // NearestRank's rank: ceil(q / 100 x n), at least 1.
  const double n = static_cast<double>(bins_->count);
  const double rank = std::max(1.0, std::ceil(q / 100 * n));
  double seen = 0;
  for (auto&& bin : bh::indexed(bins_->h, bh::coverage::all)) {
    seen += bin->sum_of_weights();
    if (bin->sum_of_weights() > 0 && seen >= rank) return bin->value();
  }
  return 0;
}

}  // namespace baton::tools
