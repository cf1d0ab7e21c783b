// ClientGroup's grouping of peer addresses (IPv4 by a configurable prefix, IPv6 by /64) and
// ConnectionSlots' caps: per group, in all, and the reserved slots only trusted groups get.
#include "baton/common/connection_slots.h"

#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(ClientGroupTest, Ipv4AddressesAreGroupedByTheConfiguredPrefix) {
  EXPECT_EQ(ClientGroup("192.0.2.77", 32), "192.0.2.77/32");
  EXPECT_EQ(ClientGroup("192.0.2.77", 24), "192.0.2.0/24");
  EXPECT_EQ(ClientGroup("192.0.2.200", 24), ClientGroup("192.0.2.1", 24));
  EXPECT_NE(ClientGroup("192.0.3.1", 24), ClientGroup("192.0.2.1", 24));
  EXPECT_EQ(ClientGroup("10.1.255.3", 16), "10.1.0.0/16");
  EXPECT_EQ(ClientGroup("10.1.255.3", 0), "0.0.0.0/0");
}

TEST(ClientGroupTest, Ipv6AddressesAreGroupedByTheirSlash64) {
  EXPECT_EQ(ClientGroup("2001:db8:1:2:aaaa:bbbb:cccc:dddd", 32), "2001:db8:1:2::/64");
  EXPECT_EQ(ClientGroup("2001:db8:1:2::1", 32), ClientGroup("2001:db8:1:2:ffff::9", 32));
  EXPECT_NE(ClientGroup("2001:db8:1:3::1", 32), ClientGroup("2001:db8:1:2::1", 32));
  // The IPv4 prefix does not apply to IPv6.
  EXPECT_EQ(ClientGroup("2001:db8:1:2::1", 8), "2001:db8:1:2::/64");
}

TEST(ClientGroupTest, MappedIpv4CountsAsIpv4AndBadAddressesAreTheirOwnGroup) {
  EXPECT_EQ(ClientGroup("::ffff:192.0.2.77", 24), "192.0.2.0/24");
  EXPECT_EQ(ClientGroup("::ffff:192.0.2.77", 32), ClientGroup("192.0.2.77", 32));
  EXPECT_EQ(ClientGroup("not-an-address", 24), "not-an-address");
  EXPECT_EQ(ClientGroup("", 24), "");
}

TEST(ConnectionSlotsTest, OneGroupGetsAtMostItsShare) {
  ConnectionSlots slots({.max_connections = 10, .max_per_client = 3, .reserved = 0});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(slots.Admit("a"));
  EXPECT_FALSE(slots.Admit("a"));
  EXPECT_TRUE(slots.Admit("b"));
  slots.Leave("a");
  EXPECT_TRUE(slots.Admit("a"));
  EXPECT_EQ(slots.open(), 4);
}

TEST(ConnectionSlotsTest, TheReservedSlotsGoOnlyToTrustedGroups) {
  ConnectionSlots slots({.max_connections = 6, .max_per_client = 6, .reserved = 2});
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(slots.Admit("stranger"));
  EXPECT_FALSE(slots.Admit("stranger"));
  EXPECT_FALSE(slots.Admit("known"));
  slots.Trust("known");
  EXPECT_TRUE(slots.Admit("known"));
  EXPECT_TRUE(slots.Admit("known"));
  EXPECT_FALSE(slots.Admit("known"));  // every slot is taken
  // A stranger's freed slot is not the stranger's again while the open part is full.
  slots.Leave("stranger");
  EXPECT_FALSE(slots.Admit("stranger"));
  slots.Leave("known");
  slots.Leave("known");
  EXPECT_TRUE(slots.Admit("stranger"));
}

TEST(ConnectionSlotsTest, TrustExpires) {
  using Clock = ConnectionSlots::Clock;
  ConnectionSlots slots({.max_connections = 2,
                         .max_per_client = 2,
                         .reserved = 1,
                         .trust_for = std::chrono::seconds(60)});
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(slots.Admit("stranger", t0));
  slots.Trust("known", t0);
  EXPECT_TRUE(slots.Admit("known", t0 + std::chrono::seconds(59)));
  slots.Leave("known");
  EXPECT_FALSE(slots.Admit("known", t0 + std::chrono::seconds(61)));
}

// Issue 49 item 7: the proxies in front of the HTTP port. Networks parse in both families (a
// bad one is refused naming the flag); a dual-stack listener's IPv4-mapped peers match IPv4
// networks; the client of a forwarded request is the rightmost X-Forwarded-For address that is
// not a proxy, so addresses a client prepends are never taken; no header, only proxies or
// garbage in the header leave the proxy itself.
TEST(TrustedProxiesTest, TheClientIsTheRightmostAddressThatIsNotAProxy) {
  const absl::StatusOr<TrustedProxies> proxies =
      TrustedProxies::Parse({"10.244.0.0/16", "192.0.2.7", "fd00::/8"}, "--http-trusted-proxies");
  ASSERT_TRUE(proxies.ok()) << proxies.status();
  EXPECT_TRUE(proxies->Contains("10.244.3.9"));
  EXPECT_TRUE(proxies->Contains("::ffff:10.244.3.9"));
  EXPECT_TRUE(proxies->Contains("192.0.2.7"));
  EXPECT_FALSE(proxies->Contains("192.0.2.8"));
  EXPECT_FALSE(proxies->Contains("10.245.0.1"));
  EXPECT_TRUE(proxies->Contains("fd12::1"));
  EXPECT_FALSE(proxies->Contains("2001:db8::1"));
  EXPECT_FALSE(proxies->Contains("not an address"));

  const std::string peer = "10.244.3.9";
  auto client = [&](const std::string& header) { return proxies->ClientOf(peer, &header); };
  EXPECT_EQ(proxies->ClientOf(peer, nullptr), peer);
  EXPECT_EQ(client("203.0.113.5"), "203.0.113.5");
  // A client that writes its own header cannot pick its address: the proxy appends the real one.
  EXPECT_EQ(client("198.51.100.1, 203.0.113.5"), "203.0.113.5");
  // Through two proxies (an external load balancer, then the Ingress controller).
  EXPECT_EQ(client("203.0.113.5, 10.244.1.1"), "203.0.113.5");
  EXPECT_EQ(client(" 2001:db8::7 , fd00::3"), "2001:db8::7");
  EXPECT_EQ(client("[2001:db8::7]:443"), "2001:db8::7");
  EXPECT_EQ(client("203.0.113.5:5123"), "203.0.113.5");
  EXPECT_EQ(client("10.244.1.1, 192.0.2.7"), peer);  // only proxies
  EXPECT_EQ(client("unknown"), peer);
  EXPECT_EQ(client("203.0.113.5, garbage"), peer);
  EXPECT_EQ(client(""), peer);

  for (const std::string bad : {"10.0.0.0/33", "fd00::/129", "10.0.0.0/x", "example.com", ""}) {
    const absl::StatusOr<TrustedProxies> refused =
        TrustedProxies::Parse({bad}, "--http-trusted-proxies");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("--http-trusted-proxies"), std::string::npos);
  }
  EXPECT_TRUE(TrustedProxies::Parse({}, "--http-trusted-proxies")->empty());
}

TEST(ConnectionSlotsTest, AProxysConnectionsAreHeldToTheTotalAlone) {
  ConnectionSlots slots({.max_connections = 6, .max_per_client = 2, .reserved = 2});
  EXPECT_TRUE(slots.Admit("a"));
  EXPECT_TRUE(slots.Admit("a"));
  EXPECT_FALSE(slots.Admit("a"));
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(slots.Admit("proxy p", ConnectionSlots::Clock::now(), true));
  EXPECT_FALSE(slots.Admit("proxy p", ConnectionSlots::Clock::now(), true));  // the total
  EXPECT_EQ(slots.open(), 6);
}

}  // namespace
}  // namespace baton
