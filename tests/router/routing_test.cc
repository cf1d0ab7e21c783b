// The router's decisions on their own: request validation and default truncation
// (RouterService::Validate), node selection (SelectNode) and what a failed prefill call means
// for the retry (ClassifyPrefillFailure).
#include "baton/router/routing.h"

#include <limits>

#include "baton/model/model_factory.h"
#include "baton/router/router_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::router {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Validation

class ValidateTest : public ::testing::Test {
 protected:
  ValidateTest() : config_(*model::PresetConfig("tiny")), router_(config_, Options()) {}
  static RouterOptions Options() {
    RouterOptions options;
    options.max_tokens_limit = 64;
    options.max_model_len = 256;
    return options;
  }
  v1::GenerateRequest Request(int prompt_len = 8, uint32_t max_tokens = 4) const {
    v1::GenerateRequest request;
    for (int i = 0; i < prompt_len; ++i) request.add_prompt_token_ids(3 + i);
    request.mutable_sampling()->set_max_tokens(max_tokens);
    return request;
  }
  // The refusal of `request`: INVALID_ARGUMENT whose message names `field`.
  void ExpectRefused(const v1::GenerateRequest& request, const std::string& field) {
    absl::StatusOr<RouterService::Effective> effective = router_.Validate(request);
    ASSERT_FALSE(effective.ok()) << "accepted; expected a refusal naming " << field;
    EXPECT_EQ(effective.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(effective.status().message(), HasSubstr(field));
  }

  ModelConfig config_;  // tiny: vocab 512, C = 22
  RouterService router_;
};

TEST_F(ValidateTest, AcceptsAPlainRequestWithTheDefaultTruncation) {
  absl::StatusOr<RouterService::Effective> effective = router_.Validate(Request());
  ASSERT_TRUE(effective.ok()) << effective.status();
  EXPECT_EQ(effective->mode, v1::TRUNCATION_MODE_COMPACT);
  EXPECT_EQ(effective->keep, config_.ring_capacity());  // the default keep 0 stands for C
}

TEST_F(ValidateTest, RefusesEachBadFieldByName) {
  ExpectRefused(Request(0), "prompt_token_ids");
  v1::GenerateRequest text = Request(0);
  text.set_prompt_text("hello");
  ExpectRefused(text, "prompt_text");
  ExpectRefused(Request(8, 0), "sampling.max_tokens");
  ExpectRefused(Request(8, 65), "sampling.max_tokens");
  v1::GenerateRequest token = Request();
  token.set_prompt_token_ids(3, 512);
  ExpectRefused(token, "prompt_token_ids[3]");
  token.set_prompt_token_ids(3, -1);
  ExpectRefused(token, "prompt_token_ids[3]");
  ExpectRefused(Request(250, 10), "exceeds the context limit 256");
  v1::GenerateRequest keep = Request();
  keep.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_MASK);
  keep.mutable_truncation()->set_keep(21);
  ExpectRefused(keep, "truncation.keep");
  v1::GenerateRequest mode = Request();
  mode.mutable_truncation()->set_mode(static_cast<v1::TruncationMode>(17));
  ExpectRefused(mode, "truncation.mode");
  v1::GenerateRequest logprobs = Request();
  logprobs.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_COMPACT);
  logprobs.mutable_truncation()->set_keep(22);
  logprobs.set_prompt_logprobs(true);
  ExpectRefused(logprobs, "prompt_logprobs");
}

TEST_F(ValidateTest, ARequestsTruncationOverridesTheDefault) {
  v1::GenerateRequest request = Request();
  request.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_MASK);
  request.mutable_truncation()->set_keep(30);
  absl::StatusOr<RouterService::Effective> effective = router_.Validate(request);
  ASSERT_TRUE(effective.ok()) << effective.status();
  EXPECT_EQ(effective->mode, v1::TRUNCATION_MODE_MASK);
  EXPECT_EQ(effective->keep, 30u);
  // Prompt logprobs without a truncation of its own: served untruncated.
  v1::GenerateRequest logprobs = Request();
  logprobs.set_prompt_logprobs(true);
  effective = router_.Validate(logprobs);
  ASSERT_TRUE(effective.ok()) << effective.status();
  EXPECT_EQ(effective->mode, v1::TRUNCATION_MODE_OFF);
}

// ---------------------------------------------------------------------------------------------
// Selection

TEST(SelectNodeTest, PicksTheLeastLoadedLiveNodeOfTheRole) {
  const auto now = Clock::now();
  const std::vector<NodeLoad> nodes = {
      {.id = "p0", .role = v1::NODE_ROLE_PREFILL, .last_seen = now, .inflight = 0},
      {.id = "d0", .role = v1::NODE_ROLE_DECODE, .last_seen = now, .inflight = 3, .queued = 1},
      {.id = "d1", .role = v1::NODE_ROLE_DECODE, .last_seen = now, .inflight = 1, .queued = 1},
      {.id = "d2", .role = v1::NODE_ROLE_DECODE, .last_seen = now, .inflight = 2, .queued = 1},
  };
  const auto ttl = std::chrono::milliseconds(2000);
  EXPECT_EQ(SelectNode(nodes, v1::NODE_ROLE_DECODE, {}, now, ttl), 2);
  EXPECT_EQ(SelectNode(nodes, v1::NODE_ROLE_PREFILL, {}, now, ttl), 0);
  EXPECT_EQ(SelectNode(nodes, v1::NODE_ROLE_KVSTORE, {}, now, ttl), -1);
  // Excluded nodes (lost ones of this request) are passed over.
  EXPECT_EQ(SelectNode(nodes, v1::NODE_ROLE_DECODE, {"d1"}, now, ttl), 3);
  EXPECT_EQ(SelectNode(nodes, v1::NODE_ROLE_DECODE, {"d0", "d1", "d2"}, now, ttl), -1);
}

TEST(SelectNodeTest, SkipsNodesNotHeardFromWithinTheTtl) {
  const auto now = Clock::now();
  const auto ttl = std::chrono::milliseconds(2000);
  const std::vector<NodeLoad> nodes = {
      {.id = "stale", .role = v1::NODE_ROLE_DECODE, .last_seen = now - std::chrono::seconds(3)},
      {.id = "busy", .role = v1::NODE_ROLE_DECODE, .last_seen = now, .inflight = 9},
  };
  EXPECT_EQ(SelectNode(nodes, v1::NODE_ROLE_DECODE, {}, now, ttl), 1);
  EXPECT_EQ(SelectNode({nodes.data(), 1}, v1::NODE_ROLE_DECODE, {}, now, ttl), -1);
}

TEST(SelectNodeTest, MoreFreePagesBreakATieThenTheEarlierNode) {
  const auto now = Clock::now();
  const auto ttl = std::chrono::milliseconds(2000);
  std::vector<NodeLoad> nodes = {
      {.id = "a", .role = v1::NODE_ROLE_DECODE, .last_seen = now, .inflight = 1, .free_pages = 10},
      {.id = "b", .role = v1::NODE_ROLE_DECODE, .last_seen = now, .queued = 1, .free_pages = 50},
      {.id = "c", .role = v1::NODE_ROLE_DECODE, .last_seen = now, .inflight = 1, .free_pages = 50},
  };
  EXPECT_EQ(SelectNode(nodes, v1::NODE_ROLE_DECODE, {}, now, ttl), 1);
  nodes[2].free_pages = 51;
  EXPECT_EQ(SelectNode(nodes, v1::NODE_ROLE_DECODE, {}, now, ttl), 2);
  // A reported count is taken whole (uint64 on the wire), never wrapped negative.
  nodes[1].free_pages = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(SelectNode(nodes, v1::NODE_ROLE_DECODE, {}, now, ttl), 1);
}

TEST(SelectNodeTest, PassesOverDrainingNodesAndOtherWeights) {
  const auto now = Clock::now();
  const auto ttl = std::chrono::milliseconds(2000);
  std::vector<NodeLoad> nodes = {
      {.id = "blue", .role = v1::NODE_ROLE_DECODE, .last_seen = now, .fingerprint = "b"},
      {.id = "green",
       .role = v1::NODE_ROLE_DECODE,
       .last_seen = now,
       .inflight = 5,
       .fingerprint = "g"},
  };
  EXPECT_EQ(SelectNode(nodes, v1::NODE_ROLE_DECODE, {}, now, ttl), 0);
  EXPECT_EQ(SelectNode(nodes, v1::NODE_ROLE_DECODE, {}, now, ttl, "g"), 1);
  EXPECT_EQ(SelectNode(nodes, v1::NODE_ROLE_DECODE, {}, now, ttl, "other"), -1);
  // A draining node gets nothing new, however idle.
  nodes[0].draining = true;
  EXPECT_EQ(SelectNode(nodes, v1::NODE_ROLE_DECODE, {}, now, ttl), 1);
  EXPECT_EQ(SelectNode(nodes, v1::NODE_ROLE_DECODE, {}, now, ttl, "b"), -1);
}

// ---------------------------------------------------------------------------------------------
// Served models

TEST(ServedModelsTest, ARequestIsCheckedAgainstTheModelItNames) {
  RouterOptions options;
  options.model_name = "small-model";
  options.more_models.push_back({"tiny-model", *model::PresetConfig("tiny"), nullptr});
  RouterService router(*model::PresetConfig("small"), options);
  ASSERT_EQ(router.Models().size(), 2u);
  EXPECT_EQ(router.Models()[0].name, "small-model");
  EXPECT_EQ(*router.ResolveModel(""), 0u);
  EXPECT_EQ(*router.ResolveModel("tiny-model"), 1u);
  // A model not served is NOT_FOUND, naming what is.
  absl::StatusOr<size_t> unknown = router.ResolveModel("large");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("'small-model', 'tiny-model'"));
  EXPECT_FALSE(router.ResolveModel(std::string(300, 'x')).ok());
  // Token 600 is in small's vocabulary and outside tiny's (512).
  v1::GenerateRequest request;
  request.add_prompt_token_ids(600);
  request.mutable_sampling()->set_max_tokens(4);
  EXPECT_TRUE(router.Validate(request).ok());
  request.set_model("tiny-model");
  absl::StatusOr<RouterService::Effective> refused = router.Validate(request);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("prompt_token_ids[0]"));
  // The default keep (0: C) is each model's own C.
  request.clear_prompt_token_ids();
  request.add_prompt_token_ids(5);
  EXPECT_EQ(router.Validate(request)->keep, model::PresetConfig("tiny")->ring_capacity());
  request.clear_model();
  EXPECT_EQ(router.Validate(request)->keep, model::PresetConfig("small")->ring_capacity());
}

// ---------------------------------------------------------------------------------------------
// Retry classification

TEST(ClassifyPrefillFailureTest, EachFailureGoesToItsRetry) {
  const grpc::Status unavailable(grpc::StatusCode::UNAVAILABLE, "gone");
  const grpc::Status aborted(grpc::StatusCode::ABORTED, "transfer failed");
  const grpc::Status invalid(grpc::StatusCode::INVALID_ARGUMENT, "s_valid");
  const grpc::Status deadline(grpc::StatusCode::DEADLINE_EXCEEDED, "late");
  // The decode node's read failed: the transfer again, twice at most.
  EXPECT_EQ(ClassifyPrefillFailure(aborted, "decode", true), AttemptFailure::kTransferFailed);
  EXPECT_EQ(RetryRuleFor(AttemptFailure::kTransferFailed).budget, 2);
  EXPECT_EQ(RetryRuleFor(AttemptFailure::kTransferFailed).avoid, Avoid::kNone);
  // The prefill node could not reach the decode node, nor could the router: that decode node is
  // lost.
  EXPECT_EQ(ClassifyPrefillFailure(unavailable, "decode", false),
            AttemptFailure::kDecodeLostBeforeCommit);
  EXPECT_EQ(RetryRuleFor(AttemptFailure::kDecodeLostBeforeCommit).avoid, Avoid::kDecodeNode);
  EXPECT_TRUE(RetryRuleFor(AttemptFailure::kDecodeLostBeforeCommit).mark_down);
  // The prefill node's word alone: this request does without the decode node, which stays up.
  EXPECT_EQ(ClassifyPrefillFailure(unavailable, "decode", true),
            AttemptFailure::kDecodeReportedLost);
  EXPECT_EQ(RetryRuleFor(AttemptFailure::kDecodeReportedLost).avoid, Avoid::kDecodeNode);
  EXPECT_FALSE(RetryRuleFor(AttemptFailure::kDecodeReportedLost).mark_down);
  // No attribution: the prefill node itself did not answer.
  EXPECT_EQ(ClassifyPrefillFailure(unavailable, "", true), AttemptFailure::kPrefillLost);
  EXPECT_EQ(RetryRuleFor(AttemptFailure::kPrefillLost).avoid, Avoid::kPrefillNode);
  // The request's own errors are not retried, attributed or not.
  EXPECT_EQ(ClassifyPrefillFailure(invalid, "", true), std::nullopt);
  EXPECT_EQ(ClassifyPrefillFailure(deadline, "decode", false), std::nullopt);
  EXPECT_EQ(ClassifyPrefillFailure(aborted, "", true), std::nullopt);
}

// The policy is a table with one rule per failure, each within the request's attempts.
TEST(RetryPolicyTest, OneRuleForEveryFailure) {
  for (AttemptFailure failure :
       {AttemptFailure::kDecodeUnreachable, AttemptFailure::kNoDecodeForWeights,
        AttemptFailure::kTransferFailed, AttemptFailure::kDecodeLostBeforeCommit,
        AttemptFailure::kDecodeReportedLost, AttemptFailure::kPrefillLost,
        AttemptFailure::kDecodeLostMidStream}) {
    int rules = 0;
    for (const RetryRule& rule : kRetryPolicy) rules += rule.failure == failure ? 1 : 0;
    EXPECT_EQ(rules, 1) << static_cast<int>(failure);
    EXPECT_GE(RetryRuleFor(failure).budget, 1);
    EXPECT_LE(RetryRuleFor(failure).budget, kMaxAttempts);
  }
}

}  // namespace
}  // namespace baton::router
