// The tenant share rule (tenant_share.h) that the admission queue, the decode streams and the
// HTTP front's threads all use: fair parts for any number of tenants and weights, the newcomer
// minimum, the reserve, and the bound on the sum of the shares.
#include <numeric>
#include <random>
#include <vector>

#include "baton/router/tenant_share.h"
#include "gtest/gtest.h"

namespace baton::router {
namespace {

// The share of each tenant of `weights`, all active.
std::vector<int64_t> Shares(int64_t pool, int64_t reserve, const std::vector<int64_t>& weights) {
  const int64_t active = std::accumulate(weights.begin(), weights.end(), int64_t{0});
  std::vector<int64_t> shares;
  for (int64_t w : weights) {
    shares.push_back(
        TenantShare({.pool = pool, .reserve = reserve, .weight = w, .active_weight = active}));
  }
  return shares;
}

TEST(TenantShareRuleTest, ATenantAloneMayUseThePoolButTheReserve) {
  EXPECT_EQ(TenantShare({.pool = 512, .reserve = 32}), 480);
  EXPECT_EQ(TenantShare({.pool = 8, .reserve = 0}), 8);
  EXPECT_EQ(TenantShare({.pool = 0}), 0);
}

TEST(TenantShareRuleTest, EachTenantThatBecomesActiveShrinksTheOthersShares) {
  // Two tenants used to hold half each, leaving nothing for a third.
  for (int n = 1; n <= 40; ++n) {
    const std::vector<int64_t> shares = Shares(1024, 64, std::vector<int64_t>(n, 1));
    for (int64_t s : shares) EXPECT_EQ(s, std::max<int64_t>(1, 960 / n)) << n << " tenants";
  }
  EXPECT_EQ(Shares(7, 0, {1, 1, 1}), (std::vector<int64_t>{2, 2, 2}));
}

TEST(TenantShareRuleTest, WeightsDivideThePoolInTheirRatio) {
  EXPECT_EQ(Shares(100, 0, {1, 3}), (std::vector<int64_t>{25, 75}));
  EXPECT_EQ(Shares(100, 10, {2, 1, 1, 5}), (std::vector<int64_t>{20, 10, 10, 50}));
  // A weight alone still gets the whole pool; weights below 1 count as 1.
  EXPECT_EQ(TenantShare({.pool = 100, .weight = 1000, .active_weight = 1000}), 100);
  EXPECT_EQ(TenantShare({.pool = 100, .weight = 0, .active_weight = 2}), 50);
  // No overflow with large pools and weights.
  EXPECT_EQ(TenantShare({.pool = int64_t{1} << 62, .weight = 1000, .active_weight = 2000}),
            int64_t{1} << 61);
}

TEST(TenantShareRuleTest, EveryTenantGetsTheNewcomerMinimumHoweverManyAreActive) {
  const std::vector<int64_t> shares = Shares(8, 1, std::vector<int64_t>(100, 1));
  for (int64_t s : shares) EXPECT_EQ(s, kNewcomerMinimum);
  // Beside a heavy tenant, a light one still gets the minimum.
  EXPECT_EQ(Shares(10, 0, {1000, 1}), (std::vector<int64_t>{9, 1}));
}

TEST(TenantShareRuleTest, TheOperatorsCapBoundsEveryShare) {
  EXPECT_EQ(TenantShare({.pool = 100, .cap = 7}), 7);
  EXPECT_EQ(TenantShare({.pool = 100, .active_weight = 50, .cap = 7}), 2);
}

// The sum of the shares exceeds pool - reserve by at most one minimum per tenant whose part
// rounds below it, for random pools, tenant counts and weights.
TEST(TenantShareRuleTest, TheSharesSumToThePoolButForTheMinimums) {
  std::mt19937_64 random(48);
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t pool = std::uniform_int_distribution<int64_t>(1, 5000)(random);
    const int64_t reserve = NewcomerReserve(pool);
    const int tenants = std::uniform_int_distribution<int>(1, 200)(random);
    std::vector<int64_t> weights;
    for (int i = 0; i < tenants; ++i) {
      weights.push_back(std::uniform_int_distribution<int64_t>(1, 20)(random));
    }
    const int64_t active = std::accumulate(weights.begin(), weights.end(), int64_t{0});
    const std::vector<int64_t> shares = Shares(pool, reserve, weights);
    int64_t sum = 0, minimums = 0;
    for (int i = 0; i < tenants; ++i) {
      sum += shares[i];
      ASSERT_GE(shares[i], kNewcomerMinimum);
      if ((pool - reserve) * weights[i] / active < kNewcomerMinimum) ++minimums;
    }
    ASSERT_LE(sum, pool - reserve + minimums * kNewcomerMinimum)
        << pool << " units, " << tenants << " tenants";
  }
}

TEST(TenantShareRuleTest, TheReserveIsASixteenthAtLeastTwoAtMostHalf) {
  EXPECT_EQ(NewcomerReserve(0), 0);
  EXPECT_EQ(NewcomerReserve(1), 0);
  EXPECT_EQ(NewcomerReserve(2), 1);
  EXPECT_EQ(NewcomerReserve(4), 2);
  EXPECT_EQ(NewcomerReserve(8), 2);
  EXPECT_EQ(NewcomerReserve(64), 4);
  EXPECT_EQ(NewcomerReserve(1024), 64);
}

// Two tenants that arrive one after the other, the first taking all it may, still leave a
// third a unit: the reserve holds two.
TEST(TenantShareRuleTest, AFloodThenASecondTenantLeaveAThirdItsMinimum) {
  for (int64_t pool : {4, 8, 16, 100, 512}) {
    const int64_t reserve = NewcomerReserve(pool);
    int64_t a = 0, b = 0;
    while (MayTake({.pool = pool, .reserve = reserve}, a, a)) ++a;
    const ShareInput two{.pool = pool, .reserve = reserve, .active_weight = 2};
    while (MayTake(two, b, a + b)) ++b;
    EXPECT_EQ(b, 1) << pool;
    EXPECT_TRUE(MayTake({.pool = pool, .reserve = reserve, .active_weight = 3}, 0, a + b)) << pool;
  }
}

// The shut-out of issue 48: two tenants flood a pool together; a third still takes a unit, and
// the two cannot take the reserve or grow back while it is active.
TEST(TenantShareRuleTest, TwoFloodingTenantsLeaveANewcomerItsMinimum) {
  const int64_t pool = 16, reserve = NewcomerReserve(pool);
  const ShareInput two{.pool = pool, .reserve = reserve, .active_weight = 2};
  int64_t a = 0, b = 0;
  for (bool took = true; took;) {
    took = false;
    for (int64_t* held : {&a, &b}) {
      if (MayTake(two, *held, a + b)) {
        ++*held;
        took = true;
      }
    }
  }
  EXPECT_EQ(a, 7);
  EXPECT_EQ(b, 7);
  // The third arrives: it may take its minimum; the others may take nothing more.
  const ShareInput three{.pool = pool, .reserve = reserve, .active_weight = 3};
  EXPECT_TRUE(MayTake(three, 0, a + b));
  EXPECT_FALSE(MayTake(three, a, a + b + 1));
  EXPECT_FALSE(MayTake(three, b, a + b + 1));
  // A tenant alone takes all but the reserve, which then goes to newcomers only.
  const ShareInput one{.pool = pool, .reserve = reserve};
  EXPECT_TRUE(MayTake(one, pool - reserve - 1, pool - reserve - 1));
  EXPECT_FALSE(MayTake(one, pool - reserve, pool - reserve));
  EXPECT_TRUE(MayTake(two, 0, pool - reserve));
  // A full pool refuses everyone.
  EXPECT_FALSE(MayTake(three, 0, pool));
}

}  // namespace
}  // namespace baton::router
