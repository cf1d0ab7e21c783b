// The router's start-up rules that bound what a client can send: --max-model-len against the
// served models' positions, and the client server's receive limit and memory quota derived
// from it (router_main.h).
#include "baton/router/router_main.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "baton/common/security.h"
#include "baton/common/wire_bounds.h"
#include "baton/router/router_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::router {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// router/prompt.h's kPromptTextBytesPerToken: the most text a prompt may hold per token.
constexpr uint64_t kTextBytesPerToken = 64;

ServedModel Model(const std::string& name, int64_t positions) {
  ServedModel model;
  model.name = name;
  model.config.max_position_embeddings = positions;
  return model;
}

// The largest request ValidateRequest and the prompt's byte bound let through at
// `max_model_len`: every field at its bound, the prompt as text or as token ids.
v1::GenerateRequest LargestRequest(uint32_t max_model_len, bool text) {
  v1::GenerateRequest r;
  r.set_request_id(std::string(kMaxRequestIdBytes, 'r'));
  r.set_cache_salt(std::string(kMaxCacheSaltBytes, 's'));
  r.set_model(std::string(kMaxModelNameBytes, 'm'));
  if (text) {
    r.set_prompt_text(std::string(kTextBytesPerToken * max_model_len, 'p'));
  } else {
    for (uint32_t i = 0; i < max_model_len; ++i) {
      r.add_prompt_token_ids(std::numeric_limits<int32_t>::max());
    }
  }
  v1::SamplingParams& s = *r.mutable_sampling();
  s.set_max_tokens(std::numeric_limits<uint32_t>::max());
  s.set_temperature(1e30f);
  s.set_top_k(std::numeric_limits<uint32_t>::max());
  s.set_top_p(0.5f);
  s.set_seed(std::numeric_limits<uint64_t>::max());
  for (int i = 0; i < kMaxStopTokenIds; ++i) {
    s.add_stop_token_ids(std::numeric_limits<int32_t>::max());
  }
  s.set_ignore_eos(true);
  for (int i = 0; i < kMaxStopStrings; ++i) s.add_stop(std::string(kMaxStopStringBytes, 'x'));
  s.set_speculative(v1::SPECULATIVE_DRAFT);
  s.set_speculative_tokens(std::numeric_limits<uint32_t>::max());
  r.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_COMPACT);
  r.mutable_truncation()->set_keep(std::numeric_limits<uint32_t>::max());
  r.set_logprobs(true);
  r.set_prompt_logprobs(true);
  return r;
}

TEST(ClientLimitsTest, TheLargestValidRequestFitsTheReceiveLimit) {
  for (const uint32_t max_model_len : {1u, 512u, 4096u, 32768u, 131072u}) {
    const ClientApiLimits limits = ClientLimits(max_model_len, int64_t{1} << 30);
    for (const bool text : {true, false}) {
      EXPECT_LE(LargestRequest(max_model_len, text).ByteSizeLong(),
                static_cast<size_t>(limits.max_receive_message_bytes))
          << "max_model_len " << max_model_len << (text ? " as text" : " as token ids");
    }
  }
}

TEST(ClientLimitsTest, TheReceiveLimitFollowsMaxModelLenBetweenItsFloorAndTheSharedBound) {
  // The builtin models' 512 positions: the 1 MiB floor, far below the 64 MiB every other
  // server takes.
  EXPECT_EQ(ClientLimits(512, int64_t{1} << 30).max_receive_message_bytes, 1 << 20);
  // 32768: the text prompt's 2 MiB and the other fields' 16 KiB.
  EXPECT_EQ(ClientLimits(32768, int64_t{1} << 30).max_receive_message_bytes,
            (2 << 20) + (16 << 10));
  // The largest positions a config may give: the shared bound.
  EXPECT_EQ(ClientLimits(uint32_t{1} << 24, int64_t{1} << 30).max_receive_message_bytes,
            security::kMaxMessageBytes);
  EXPECT_EQ(ClientLimits(std::numeric_limits<uint32_t>::max(), int64_t{1} << 30)
                .max_receive_message_bytes,
            security::kMaxMessageBytes);
}

TEST(ClientLimitsTest, TheMemoryQuotaHoldsSixteenMessagesWithinRpcMemoryBytes) {
  EXPECT_EQ(ClientLimits(512, int64_t{1} << 30).rpc_memory_bytes, int64_t{64} << 20);
  const ClientApiLimits large = ClientLimits(131072, int64_t{1} << 30);
  EXPECT_EQ(large.rpc_memory_bytes, int64_t{16} * large.max_receive_message_bytes);
  // --rpc-memory-bytes bounds it from above.
  EXPECT_EQ(ClientLimits(131072, int64_t{16} << 20).rpc_memory_bytes, int64_t{16} << 20);
}

TEST(ResolveMaxModelLenTest, UnsetIsTheModelsPositions) {
  EXPECT_EQ(*ResolveMaxModelLen(0, {Model("ced", 512)}), 512u);
  EXPECT_EQ(*ResolveMaxModelLen(0, {Model("big", 131072), Model("small", 512)}), 131072u);
}

TEST(ResolveMaxModelLenTest, AValueWithinEveryModelsPositionsIsKept) {
  EXPECT_EQ(*ResolveMaxModelLen(512, {Model("ced", 512)}), 512u);
  EXPECT_EQ(*ResolveMaxModelLen(200, {Model("ced", 512), Model("other", 256)}), 200u);
}

TEST(ResolveMaxModelLenTest, AValueAboveAModelsPositionsIsRefusedNamingBoth) {
  const absl::StatusOr<uint32_t> above = ResolveMaxModelLen(32768, {Model("ced", 512)});
  ASSERT_FALSE(above.ok());
  EXPECT_EQ(above.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(above.status().message(),
              AllOf(HasSubstr("--max-model-len: 32768"), HasSubstr("512 positions"),
                    HasSubstr("'ced'"), HasSubstr("max_position_embeddings")));
  // An extra model's positions bound it as well.
  const absl::StatusOr<uint32_t> extra =
      ResolveMaxModelLen(300, {Model("ced", 512), Model("other", 256)});
  ASSERT_FALSE(extra.ok());
  EXPECT_THAT(extra.status().message(),
              AllOf(HasSubstr("300"), HasSubstr("256 positions"), HasSubstr("'other'")));
}

// The forget time's default follows the expiry, so that no --node-expiry-ms the chart allows
// (up to 600 s) is refused at start for being above a fixed default.
TEST(ForgetAfterMsTest, UnsetIsFourExpiriesAndAtLeastThirtySeconds) {
  RouterOptions options;
  options.node_ttl_ms = 6500;
  EXPECT_EQ(ForgetAfterMs(options), 30000u);
  options.node_ttl_ms = 600000;
  EXPECT_EQ(ForgetAfterMs(options), 2400000u);
  options.node_forget_after_ms = 700000;
  EXPECT_EQ(ForgetAfterMs(options), 700000u);
}

// Bearer keys on a port beyond loopback without TLS are worth a warning at start; keys over
// TLS, a loopback host, or no keys at all are not.
TEST(KeysInPlainTextTest, OnlyKeysWithoutTlsBeyondLoopbackAreFlagged) {
  EXPECT_TRUE(KeysInPlainTextOffLoopback("", true, false));  // every address
  EXPECT_TRUE(KeysInPlainTextOffLoopback("0.0.0.0", true, false));
  EXPECT_TRUE(KeysInPlainTextOffLoopback("10.1.2.3", true, false));
  EXPECT_TRUE(KeysInPlainTextOffLoopback("::", true, false));
  EXPECT_FALSE(KeysInPlainTextOffLoopback("0.0.0.0", true, true));
  EXPECT_FALSE(KeysInPlainTextOffLoopback("0.0.0.0", false, false));
  for (const char* loopback : {"127.0.0.1", "127.0.0.7", "localhost", "::1", "[::1]"}) {
    EXPECT_FALSE(KeysInPlainTextOffLoopback(loopback, true, false)) << loopback;
  }
}

}  // namespace
}  // namespace baton::router
