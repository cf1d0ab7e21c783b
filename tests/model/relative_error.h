// How the model tests compare a logits row with another (or with the double-precision
// reference's): max |a - b| / max |b|.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

namespace baton::model {

inline double RelativeError(std::span<const float> a, std::span<const double> b) {
  double diff = 0, scale = 1e-12;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

inline double RelativeError(std::span<const float> a, std::span<const float> b) {
  const std::vector<double> wide(b.begin(), b.end());
  return RelativeError(a, wide);
}

}  // namespace baton::model
