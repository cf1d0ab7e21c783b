#include "baton/router/tenant_share.h"

#include <algorithm>

namespace baton::router {

int64_t NewcomerReserve(int64_t pool) {
  return std::min(pool / 2, std::max<int64_t>(2, pool / 16));
}

int64_t TenantShare(const ShareInput& input) {
  if (input.pool <= 0) return 0;
  const int64_t weight = std::max<int64_t>(1, input.weight);
  const int64_t active_weight = std::max(weight, input.active_weight);
  const int64_t shared = std::max<int64_t>(0, input.pool - std::max<int64_t>(0, input.reserve));
  // In 128 bits: a pool and a weight from the operator may multiply past 64.
  const auto part = static_cast<int64_t>(static_cast<__int128>(shared) * weight / active_weight);
  int64_t share = std::min(input.pool, std::max(kNewcomerMinimum, part));
  if (input.cap > 0) share = std::min(share, input.cap);
  return share;
}

bool MayTake(const ShareInput& input, int64_t held, int64_t in_use) {
  if (held >= TenantShare(input) || in_use >= input.pool) return false;
  return held < kNewcomerMinimum || in_use < input.pool - input.reserve;
}

}  // namespace baton::router
