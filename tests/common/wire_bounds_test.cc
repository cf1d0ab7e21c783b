// The wire bounds every node applies (the router, prefill and decode nodes share them): ids,
// stop lists and sequence lengths past their bounds are refused by name, in 64 bits.
#include "baton/common/wire_bounds.h"

#include <cmath>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

ModelConfig Config() {
  ModelConfig c;
  c.vocab_size = 512;
  c.max_position_embeddings = 4096;
  return c;
}

TEST(WireBoundsTest, RequestIdIsAtMost256Bytes) {
  EXPECT_TRUE(CheckRequestId("request_id", std::string(256, 'x')).ok());
  const absl::Status s = CheckRequestId("request.request_id", std::string(257, 'x'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("request.request_id: 257 bytes; it must be at most 256"));
}

TEST(WireBoundsTest, SaltsTenantsAndIdentitiesHaveTheirBounds) {
  for (const auto& [field, bound] :
       {std::pair<const char*, uint64_t>{"cache_salt", kMaxCacheSaltBytes},
        {"tenant", kMaxTenantBytes},
        {"prefill_identity", kMaxIdentityBytes}}) {
    EXPECT_TRUE(CheckBytes(field, std::string(bound, 'x'), bound).ok()) << field;
    const absl::Status s = CheckBytes(field, std::string(bound + 1, 'x'), bound);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(s.message(), HasSubstr(field));
  }
}

TEST(WireBoundsTest, SamplingBoundsStopIdsAndValues) {
  v1::SamplingParams sampling;
  for (int i = 0; i < 64; ++i) sampling.add_stop_token_ids(i);
  EXPECT_TRUE(CheckSampling("sampling", sampling, Config()).ok());
  sampling.add_stop_token_ids(64);
  EXPECT_THAT(CheckSampling("sampling", sampling, Config()).message(),
              HasSubstr("sampling.stop_token_ids: 65 ids; at most 64"));

  v1::SamplingParams outside;
  outside.add_stop_token_ids(512);
  EXPECT_THAT(CheckSampling("sampling", outside, Config()).message(),
              HasSubstr("sampling.stop_token_ids: 512 is outside the vocabulary [0, 512)"));
  v1::SamplingParams nan;
  nan.set_temperature(std::nanf(""));
  EXPECT_THAT(CheckSampling("sampling", nan, Config()).message(),
              HasSubstr("sampling.temperature"));
  v1::SamplingParams top_p;
  top_p.set_top_p(1.5f);
  EXPECT_THAT(CheckSampling("sampling", top_p, Config()).message(), HasSubstr("sampling.top_p"));

  // Speculative decoding: a known method, and at most max_backtrack drafted tokens.
  v1::SamplingParams speculative;
  speculative.set_speculative(v1::SPECULATIVE_DRAFT);
  speculative.set_speculative_tokens(static_cast<uint32_t>(Config().max_backtrack));
  EXPECT_TRUE(CheckSampling("sampling", speculative, Config()).ok());
  speculative.set_speculative_tokens(static_cast<uint32_t>(Config().max_backtrack) + 1);
  EXPECT_THAT(CheckSampling("sampling", speculative, Config()).message(),
              HasSubstr("sampling.speculative_tokens: 6 exceeds the model's max_backtrack (5)"));
  speculative.set_speculative_tokens(0xffffffffu);
  EXPECT_THAT(CheckSampling("sampling", speculative, Config()).message(),
              HasSubstr("sampling.speculative_tokens: 4294967295"));
  // An enum value this build does not know, as the wire carries it (field 9, varint 7).
  v1::SamplingParams unknown;
  ASSERT_TRUE(unknown.ParseFromString(std::string("\x48\x07", 2)));
  EXPECT_THAT(CheckSampling("sampling", unknown, Config()).message(),
              HasSubstr("sampling.speculative: 7 is unknown"));

  v1::SamplingParams stops;
  for (int i = 0; i < 16; ++i) stops.add_stop(std::string(256, 'a' + i));
  EXPECT_TRUE(CheckSampling("sampling", stops, Config()).ok());
  stops.add_stop("x");
  EXPECT_THAT(CheckSampling("sampling", stops, Config()).message(),
              HasSubstr("sampling.stop: 17 strings; at most 16"));
  v1::SamplingParams long_stop;
  long_stop.add_stop(std::string(257, 'a'));
  EXPECT_THAT(CheckSampling("sampling", long_stop, Config()).message(),
              HasSubstr("sampling.stop[0]: 257 bytes; it must be 1 to 256 bytes"));
  v1::SamplingParams empty_stop;
  empty_stop.add_stop("ok");
  empty_stop.add_stop("");
  EXPECT_THAT(CheckSampling("sampling", empty_stop, Config()).message(),
              HasSubstr("sampling.stop[1]: 0 bytes"));
}

TEST(WireBoundsTest, SequenceLengthIsBoundedByTheModelWithoutWrapping) {
  EXPECT_TRUE(CheckSequenceLength("prompt_tokens", 4000, 96, Config()).ok());
  EXPECT_THAT(CheckSequenceLength("prompt_tokens", 0, 1, Config()).message(),
              HasSubstr("prompt_tokens: 0 tokens; it must lie in [1, 4096]"));
  EXPECT_THAT(CheckSequenceLength("prompt_tokens", 4294967295u, 2, Config()).message(),
              HasSubstr("prompt_tokens: 4294967295 tokens; it must lie in [1, 4096]"));
  EXPECT_THAT(CheckSequenceLength("prompt_tokens", 4000, 97, Config()).message(),
              HasSubstr("prompt_tokens + tokens to generate: 4000 + 97 exceeds"));
  // A sum that would wrap 64 bits is still refused.
  EXPECT_FALSE(CheckSequenceLength("prompt_tokens", 1, ~uint64_t{0}, Config()).ok());
}

}  // namespace
}  // namespace baton
