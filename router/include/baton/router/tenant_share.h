// A tenant's share of a pool that every tenant (API key) draws on: the router's admission
// queue, its decode streams and the HTTP front's request threads (issue 48, item 6). One rule
// for all three, so that no number of flooding tenants can shut out another:
//
// - Fair part: an active tenant (one holding or waiting for units of the pool) may hold
//   floor((pool - reserve) * weight / active_weight) units, where active_weight sums the
//   weights of the active tenants, its own included. A tenant alone may use the whole pool but
//   the reserve; each tenant that becomes active shrinks the others' shares, for any number of
//   tenants (a fixed half per tenant let two tenants hold everything).
// - Newcomer minimum: a share is never under kNewcomerMinimum, however many tenants are active.
// - Reserve: where a unit is held until its request ends (decode streams, HTTP threads), a full
//   pool refuses, and tenants keep units past a share that shrank when others arrived. So the
//   last `reserve` units go only to tenants under the minimum: up to `reserve` newcomers find
//   room at once even while the others hold more than their shares; more find it as the
//   others' units come back, which a tenant over its share cannot take again. The admission
//   queue keeps none: a waiting place holds nothing yet, so when it is full the tenant furthest
//   over its share gives one up to a tenant under its share (admission.h).
//
// The sum of the active tenants' shares is at most pool - reserve, plus one minimum for each
// tenant whose weighted part rounds below it. Pure functions; safe from any thread.
#pragma once

#include <cstdint>

namespace baton::router {

// Units every active tenant may hold, whatever the others hold.
inline constexpr int64_t kNewcomerMinimum = 1;

// How one tenant stands in one pool.
struct ShareInput {
  int64_t pool = 0;           // the pool's units (queue places, decode slots, threads)
  int64_t reserve = 0;        // the last units, for tenants under the minimum (NewcomerReserve)
  int64_t weight = 1;         // the tenant's weight (api_keys.h; 1 by default)
  int64_t active_weight = 1;  // the weights of every active tenant, this one's included
  int64_t cap = 0;            // the operator's ceiling on any one tenant's share (0: none)
};

// The units kept for newcomers in a pool of `pool`: a sixteenth, at least two (a tenant that
// floods first, then a second that takes a kept unit, still leave a third one), at most half
// (a pool of one keeps nothing, or its only tenant could never use it).
int64_t NewcomerReserve(int64_t pool);

// The most units the tenant may hold (see above); 0 only for an empty pool.
int64_t TenantShare(const ShareInput& input);

// Whether a tenant that holds `held` units may take one more, when `in_use` units of the pool
// are taken by all tenants together: under its share, and the pool has a unit free that is not
// in the reserve (or the tenant is under the minimum).
bool MayTake(const ShareInput& input, int64_t held, int64_t in_use);

}  // namespace baton::router
