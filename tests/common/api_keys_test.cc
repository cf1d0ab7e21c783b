// The router's --api-keys file: keys to tenants, the optional weight of a tenant's share
// (router/tenant_share.h), and refusals that name the entry and the field, never the key.
#include "baton/common/api_keys.h"

#include <string>

#include "absl/strings/ascii.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(ApiKeysTest, KeysMapToTenantsWithOrWithoutAWeight) {
  absl::StatusOr<ApiKeys> keys = ApiKeys::Parse(
      "\"key-of-team-a-0123456789\": team-a\n"
      "\"key-of-team-b-0123456789\": {tenant: team-b, weight: 3}\n"
      "\"2nd-key-of-team-b-012345\": {tenant: team-b, weight: 3}\n"
      "\"key-of-team-c-0123456789\": {tenant: team-c}\n",
      "keys.yaml");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(keys->size(), 4u);
  EXPECT_EQ(*keys->Authenticate("Bearer key-of-team-b-0123456789"), "team-b");
  EXPECT_EQ(*keys->Authenticate("Bearer 2nd-key-of-team-b-012345"), "team-b");
  EXPECT_EQ(*keys->Authenticate("Bearer key-of-team-c-0123456789"), "team-c");
  // Only weights other than the default are listed.
  EXPECT_EQ(keys->weights(), (std::map<std::string, int64_t>{{"team-b", 3}}));
}

// A key given as its SHA-256 authenticates the key itself, and is not a key of its own text;
// a digest of the wrong length or with a non-hex digit is refused, naming the entry.
TEST(ApiKeysTest, AKeyMayBeGivenAsItsSha256) {
  const std::string digest = HexDigest(Sha256Of("hashed-key-0123456789", 21));
  absl::StatusOr<ApiKeys> keys = ApiKeys::Parse(
      "\"sha256:" + absl::AsciiStrToUpper(digest) + "\": team-h\nplain-key-0123456789: team-p\n",
      "keys.yaml");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(*keys->Authenticate("Bearer hashed-key-0123456789"), "team-h");
  EXPECT_FALSE(keys->Authenticate("Bearer sha256:" + digest).ok());
  EXPECT_EQ(*keys->Authenticate("Bearer plain-key-0123456789"), "team-p");
  for (const std::string bad : {"sha256:" + digest.substr(1), "sha256:" + digest.substr(1) + "g"}) {
    EXPECT_THAT(ApiKeys::Parse("ok-key-0123456789abc: a\n\"" + bad + "\": team-h\n", "keys.yaml")
                    .status()
                    .message(),
                AllOf(HasSubstr("entry 2"), HasSubstr("64 hex digits")))
        << bad;
  }
}

TEST(ApiKeysTest, BadWeightsAndFieldsAreRefusedByEntryAndName) {
  auto refusal = [](const std::string& value) {
    return std::string(
        ApiKeys::Parse(
            "\"key-of-team-a-0123456789\": team-a\n\"secret-key-0123456789\": " + value + "\n",
            "keys.yaml")
            .status()
            .message());
  };
  for (const std::string weight : {"0", "1001", "-2", "1.5", "heavy", "[1]"}) {
    EXPECT_THAT(refusal("{tenant: b, weight: " + weight + "}"),
                AllOf(HasSubstr("entry 2"),
                      HasSubstr("weight must be a whole number from 1 to "
                                "1000"),
                      Not(HasSubstr("secret-key"))))
        << weight;
  }
  EXPECT_THAT(refusal("{tenant: b, wieght: 2}"),
              AllOf(HasSubstr("entry 2"), HasSubstr("unknown field 'wieght'")));
  EXPECT_THAT(refusal("{weight: 2}"), HasSubstr("entry 2: tenant is missing"));
  EXPECT_THAT(refusal("{tenant: [b]}"), HasSubstr("entry 2: tenant must be a string"));
  EXPECT_THAT(refusal("[b]"), HasSubstr("entry 2 must map a key"));
  // A share is a tenant's: its keys must agree on the weight.
  EXPECT_THAT(refusal("{tenant: team-a, weight: 2}"),
              AllOf(HasSubstr("entry 2: weight 2 differs from the weight 1"),
                    HasSubstr("tenant 'team-a'")));
}

}  // namespace
}  // namespace baton
