#include "baton/common/parse.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseIntListTest, ParsesCommaSeparatedIntegers) {
  auto values = ParseIntList("1, 2,-3,40", "--tokens");
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre(1, 2, -3, 40));
}

TEST(ParseIntListTest, RejectsEmptyAndNonNumericItemsNamingTheField) {
  for (const char* bad : {"", "1,,2", "1,x", "3.5", "99999999999999999999"}) {
    auto values = ParseIntList(bad, "--chunks");
    ASSERT_FALSE(values.ok()) << bad;
    EXPECT_EQ(values.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(values.status().message(), HasSubstr("--chunks")) << bad;
  }
}

}  // namespace
}  // namespace baton
