// The prefill node's own check of a PrefillRequest's wire values (it does not rely on the
// router's): each bad value is refused with its field named.
#include "baton/model/model_factory.h"
#include "baton/prefill_node/prefill_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::prefill_node {
namespace {

using ::testing::HasSubstr;

v1::PrefillRequest Request(int prompt_len, uint32_t s_valid) {
  v1::PrefillRequest request;
  for (int i = 0; i < prompt_len; ++i) request.mutable_request()->add_prompt_token_ids(i + 1);
  request.mutable_request()->mutable_sampling()->set_max_tokens(4);
  request.mutable_reservation()->set_reservation_id("0123456789abcdef0123456789abcdef");
  request.set_mode(v1::TRUNCATION_MODE_COMPACT);
  request.set_s_valid(s_valid);
  return request;
}

TEST(PrefillValidateTest, APrefixHitIsWholeBlocksWithinThePrompt) {
  const ModelConfig config = *model::PresetConfig("tiny");  // B = 16
  ASSERT_EQ(config.kv_block_size, 16);
  EXPECT_TRUE(ValidatePrefillRequest(Request(40, 0), config).ok());
  EXPECT_TRUE(ValidatePrefillRequest(Request(40, 32), config).ok());

  const absl::Status past = ValidatePrefillRequest(Request(40, 48), config);
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(past.message()), HasSubstr("s_valid: 48 exceeds the prompt's 40"));

  const absl::Status partial = ValidatePrefillRequest(Request(40, 21), config);
  EXPECT_EQ(partial.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(partial.message()),
              HasSubstr("s_valid: 21 is not a multiple of the block size B = 16"));
}

}  // namespace
}  // namespace baton::prefill_node
