// Router address lists: comma-separated entries, each host resolved to all its addresses.
#include "baton/common/rpc.h"

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

}  // namespace
}  // namespace baton
