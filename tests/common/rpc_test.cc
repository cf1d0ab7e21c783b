// Router address lists: comma-separated entries, each host resolved to all its addresses.
#include "baton/common/rpc.h"

#include <chrono>

#include "baton/common/parse.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;

TEST(ResolveRouters, ListsEveryEntryAndEveryAddressOfAName) {
  EXPECT_THAT(ResolveRouters("127.0.0.1:50051"), ElementsAre("127.0.0.1:50051"));
  EXPECT_THAT(ResolveRouters(" 127.0.0.1:1, 127.0.0.2:2 ,"),
              ElementsAre("127.0.0.1:1", "127.0.0.2:2"));
  // A name stands for each of its addresses ("localhost": 127.0.0.1, and ::1 where present).
  EXPECT_THAT(ResolveRouters("localhost:7"), Contains("127.0.0.1:7"));
  // Duplicates collapse; what does not resolve stays as written for gRPC to report.
  EXPECT_THAT(ResolveRouters("127.0.0.1:7,127.0.0.1:7"), ElementsAre("127.0.0.1:7"));
  EXPECT_THAT(ResolveRouters("no-such-host.invalid:9"), ElementsAre("no-such-host.invalid:9"));
  EXPECT_THAT(ResolveRouters("[::1]:9"), ElementsAre("[::1]:9"));
  EXPECT_TRUE(ResolveRouters("").empty());
}

// The resolver's thread answers what ResolveRouters does; before its first answer, Addresses
// waits for it (here: loopback names, at once).
TEST(RouterResolver, GivesTheLatestResolution) {
  RouterResolver resolver(" 127.0.0.1:1, localhost:7,[::1]:9", std::chrono::milliseconds(100));
  const auto addresses =
      resolver.Addresses(std::chrono::steady_clock::now() + std::chrono::seconds(30));
  EXPECT_THAT(addresses, Contains("127.0.0.1:1"));
  EXPECT_THAT(addresses, Contains("127.0.0.1:7"));
  EXPECT_THAT(addresses, Contains("[::1]:9"));
  // A name that never resolved is kept as written, for gRPC's own resolver.
  RouterResolver unknown("no-such-host.invalid:9", std::chrono::milliseconds(100));
  EXPECT_THAT(unknown.Addresses(std::chrono::steady_clock::now() + std::chrono::seconds(30)),
              ElementsAre("no-such-host.invalid:9"));
}

TEST(JoinHostPort, BracketsIpv6Literals) {
  EXPECT_EQ(JoinHostPort("127.0.0.1", 80), "127.0.0.1:80");
  EXPECT_EQ(JoinHostPort("::", 80), "[::]:80");
  EXPECT_EQ(JoinHostPort("fd00::1", 8), "[fd00::1]:8");
  EXPECT_EQ(JoinHostPort("[::1]", 8), "[::1]:8");
  EXPECT_EQ(JoinHostPort("router.ns.svc.cluster.local.", 9), "router.ns.svc.cluster.local.:9");
}

}  // namespace
}  // namespace baton
