// Speculative decoding end to end, with the real binaries: greedy output with each drafter
// (prompt lookup, a draft model) equals the output without speculation token for token, on the
// tiny and small presets and on the trained model with its shipped draft; across prefix hits,
// truncation modes, stop ids and strings, max_tokens, and a decode node lost mid-stream; sampled
// output is a function of its seed; the override and its bounds are checked by name; and the
// accepted drafts reach the gRPC usage, `batonctl generate --json` and the OpenAI usage.
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <regex>

#include "baton/model/model_factory.h"
#include "baton_up.h"
#include "client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "test_dir.h"

namespace baton::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using json = nlohmann::json;

const std::string kTrained = std::string(BATON_MODELS_DIR) + "/ced-brown-shared";
const std::string kTrainedDraft = std::string(BATON_MODELS_DIR) + "/ced-brown-draft";

// A shell command's stdout (curl, as a user would run it).
std::string Shell(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  pclose(pipe);
  return out;
}

v1::GenerateRequest With(v1::GenerateRequest request, v1::Speculative method) {
  request.mutable_sampling()->set_speculative(method);
  return request;
}

// A prompt that repeats itself, so that prompt lookup has something to propose.
std::vector<int32_t> RepetitivePrompt(std::mt19937_64& rng, int64_t vocab, int64_t segment,
                                      int repeats) {
  const std::vector<int32_t> piece = RandomPrompt(rng, segment, vocab);
  std::vector<int32_t> prompt;
  for (int i = 0; i < repeats; ++i) prompt.insert(prompt.end(), piece.begin(), piece.end());
  return prompt;
}

// `request` without speculation, with prompt lookup and with the draft model: the same tokens,
// finish and (to float rounding) logprobs. Returns the three outcomes in that order.
std::vector<Outcome> ExpectSameWithEveryDrafter(v1::Generation::Stub& stub,
                                                const v1::GenerateRequest& request) {
  std::vector<Outcome> outcomes;
  for (const v1::Speculative method :
       {v1::SPECULATIVE_OFF, v1::SPECULATIVE_NGRAM, v1::SPECULATIVE_DRAFT}) {
    outcomes.push_back(Generate(stub, With(request, method)));
    const Outcome& o = outcomes.back();
    EXPECT_TRUE(o.status.ok()) << v1::Speculative_Name(method) << ": " << o.status.error_message();
  }
  const Outcome& off = outcomes[0];
  EXPECT_EQ(off.usage.draft_tokens(), 0u);
  EXPECT_EQ(off.usage.accepted_draft_tokens(), 0u);
  for (size_t i = 1; i < outcomes.size(); ++i) {
    const Outcome& o = outcomes[i];
    SCOPED_TRACE(i == 1 ? "ngram" : "draft");
    EXPECT_EQ(o.tokens, off.tokens);
    EXPECT_EQ(o.finish, off.finish);
    EXPECT_EQ(o.usage.completion_tokens(), off.usage.completion_tokens());
    EXPECT_LE(o.usage.accepted_draft_tokens(), o.usage.draft_tokens());
    EXPECT_LE(o.usage.accepted_draft_tokens(), o.usage.completion_tokens());
    EXPECT_EQ(o.logprobs.size(), off.logprobs.size());
    for (size_t t = 0; t < std::min(o.logprobs.size(), off.logprobs.size()); ++t) {
      EXPECT_NEAR(o.logprobs[t], off.logprobs[t], 1e-3) << "token " << t;
    }
  }
  return outcomes;
}

class SpeculativeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string tmp = ProcessTempDir();
    tiny_ = tmp + "/spec_e2e_tiny";
    tiny_draft_ = tmp + "/spec_e2e_tiny_draft";
    small_ = tmp + "/spec_e2e_small";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 5, tiny_).ok());
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 6, tiny_draft_).ok());
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("small"), 9, small_).ok());
  }
  // A router, a store, a prefill node and a decode node drafting with `draft` by default.
  static void StartCluster(Cluster& cluster, const std::string& draft,
                           std::vector<std::string> decode = {}) {
    ASSERT_FALSE(cluster.StartRouter().empty());
    ASSERT_FALSE(cluster.StartKvstore("kvstore", cluster.dir() + "/store").empty());
    // The acceptance policy drafts on every step, whatever the drafts cost here.
    decode.insert(decode.end(), {"--speculative", "draft:" + draft, "--speculative-policy",
                                 "acceptance", "--pages", "512"});
    ASSERT_FALSE(cluster.StartDecode("decode", decode).empty());
    ASSERT_FALSE(
        cluster.StartPrefill("prefill", {"--kvstore", cluster.Address("kvstore")}).empty());
    ASSERT_TRUE(cluster.WaitForHealth(true));
  }
  // Greedy requests of every kind on `model` drafted by `draft`: random and repetitive prompts,
  // truncation off, mask and compact, a prefix hit, a stop id inside the output and a max_tokens
  // that ends inside a run of drafts.
  static void GreedyCase(const std::string& model, const std::string& draft, int64_t vocab,
                         int64_t ring_capacity, bool self_draft);

  static std::string tiny_, tiny_draft_, small_;
};
std::string SpeculativeTest::tiny_, SpeculativeTest::tiny_draft_, SpeculativeTest::small_;

void SpeculativeTest::GreedyCase(const std::string& model, const std::string& draft, int64_t vocab,
                                 int64_t ring_capacity, bool self_draft) {
  Cluster cluster(model);
  StartCluster(cluster, draft);
  auto stub = cluster.Client();
  std::mt19937_64 rng(17);
  const int64_t C = ring_capacity;
  struct Case {
    std::string name;
    std::vector<int32_t> prompt;
    v1::TruncationMode mode;
    uint32_t keep;
  };
  const std::vector<Case> cases = {
      {"random off", RandomPrompt(rng, 2 * C + 9, vocab), v1::TRUNCATION_MODE_OFF, 0},
      {"repetitive off", RepetitivePrompt(rng, vocab, C / 2 + 3, 5), v1::TRUNCATION_MODE_OFF, 0},
      {"repetitive compact", RepetitivePrompt(rng, vocab, C / 2 + 3, 5),
       v1::TRUNCATION_MODE_COMPACT, static_cast<uint32_t>(C)},
      {"random mask", RandomPrompt(rng, 2 * C + 9, vocab), v1::TRUNCATION_MODE_MASK,
       static_cast<uint32_t>(C + 4)}};
  uint32_t accepted = 0, drafted = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::GenerateRequest request = Request(c.prompt, 40);
    request.set_logprobs(true);
    request.mutable_truncation()->set_mode(c.mode);
    request.mutable_truncation()->set_keep(c.keep);
    const std::vector<Outcome> outcomes = ExpectSameWithEveryDrafter(*stub, request);
    for (size_t i = 1; i < outcomes.size(); ++i) {
      drafted += outcomes[i].usage.draft_tokens();
      accepted += outcomes[i].usage.accepted_draft_tokens();
    }
    if (self_draft) {
      // The target drafting for itself: without truncation every draft stands (the draft
      // model's state is never truncated, so under mask or compact some may not).
      const v1::Usage& usage = outcomes[2].usage;
      if (c.mode == v1::TRUNCATION_MODE_OFF) {
        EXPECT_EQ(usage.accepted_draft_tokens(), usage.draft_tokens());
      }
      EXPECT_GT(usage.accepted_draft_tokens(), 20u);
    }
    // A stop id inside the output, and a max_tokens that ends inside a run of drafts.
    const std::vector<int32_t>& tokens = outcomes[0].tokens;
    v1::GenerateRequest stopped = request;
    stopped.mutable_sampling()->add_stop_token_ids(tokens[17]);
    ExpectSameWithEveryDrafter(*stub, stopped);
    v1::GenerateRequest shorter = request;
    shorter.mutable_sampling()->set_max_tokens(7);
    const std::vector<Outcome> cut = ExpectSameWithEveryDrafter(*stub, shorter);
    EXPECT_EQ(cut[0].tokens.size(), 7u);
  }
  EXPECT_GT(drafted, 0u) << "nothing was drafted";
  // A prefix hit (under the router's default truncation, compact with K = C): the same prompt
  // again until its state comes from the store.
  v1::GenerateRequest again = Request(cases[1].prompt, 40);
  uint32_t cached = 0;
  for (int i = 0; i < 20 && cached == 0; ++i) {
    const std::vector<Outcome> outcomes = ExpectSameWithEveryDrafter(*stub, again);
    cached = outcomes[0].usage.cached_tokens() + outcomes[1].usage.cached_tokens() +
             outcomes[2].usage.cached_tokens();
  }
  EXPECT_GT(cached, 0u) << "no request hit the prefix store";
}

TEST_F(SpeculativeTest, GreedyOutputIsUnchangedOnTinyWithAnotherModelAsTheDraft) {
  GreedyCase(tiny_, tiny_draft_, 512, model::PresetConfig("tiny")->ring_capacity(), false);
}

TEST_F(SpeculativeTest, GreedyOutputIsUnchangedOnSmallDraftingForItself) {
  GreedyCase(small_, small_, 4096, model::PresetConfig("small")->ring_capacity(), true);
}

// Seeded sampling: with prompt lookup the tokens are those of the same request without
// speculation (its drafts are verified with the ordinary draws); with a draft model they follow
// the seed too (under the acceptance policy, which drafts by the request's own history), and a
// model drafting for itself (untruncated, as the draft is) has every draft accepted (q = p).
TEST_F(SpeculativeTest, SampledOutputFollowsItsSeed) {
  Cluster cluster(small_);
  StartCluster(cluster, small_);
  auto stub = cluster.Client();
  std::mt19937_64 rng(3);
  v1::GenerateRequest request = Request(RepetitivePrompt(rng, 4096, 40, 4), 48);
  request.mutable_sampling()->set_temperature(0.8f);
  request.mutable_sampling()->set_top_k(50);
  request.mutable_sampling()->set_seed(1234);
  request.mutable_truncation()->set_mode(v1::TRUNCATION_MODE_OFF);
  // Close to greedy, so that the continuation repeats itself and lookups find matches.
  v1::GenerateRequest cool = request;
  cool.mutable_sampling()->set_temperature(0.3f);
  cool.mutable_sampling()->set_top_k(3);
  cool.mutable_sampling()->set_max_tokens(96);
  const Outcome off = Generate(*stub, With(cool, v1::SPECULATIVE_OFF));
  ASSERT_TRUE(off.status.ok()) << off.status.error_message();
  const Outcome ngram = Generate(*stub, With(cool, v1::SPECULATIVE_NGRAM));
  ASSERT_TRUE(ngram.status.ok()) << ngram.status.error_message();
  EXPECT_EQ(ngram.tokens, off.tokens);
  EXPECT_GT(ngram.usage.draft_tokens(), 0u);
  const Outcome a = Generate(*stub, With(request, v1::SPECULATIVE_DRAFT));
  const Outcome b = Generate(*stub, With(request, v1::SPECULATIVE_DRAFT));
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tokens.size(), 48u);
  EXPECT_EQ(a.usage.accepted_draft_tokens(), a.usage.draft_tokens());
  EXPECT_GT(a.usage.accepted_draft_tokens(), 20u);
}

// A decode node killed mid-stream while it drafts: the other node (drafting too) continues from
// the re-prefill, and the client gets the undisturbed, undrafted tokens, each once.
TEST_F(SpeculativeTest, LostDecodeNodeMidStreamLosesAndRepeatsNoToken) {
  Cluster cluster(small_);
  ASSERT_FALSE(cluster.StartRouter().empty());
  for (const char* name : {"decode-a", "decode-b"}) {
    ASSERT_FALSE(cluster
                     .StartDecode(name, {"--pages", "256", "--speculative", "draft:" + small_,
                                         "--speculative-policy", "acceptance"})
                     .empty());
  }
  ASSERT_FALSE(cluster.StartPrefill("prefill").empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  auto stub = cluster.Client();
  std::mt19937_64 rng(47);
  const v1::GenerateRequest request = Request(RandomPrompt(rng, 60, 4096), 120);
  const Outcome undisturbed = Generate(*stub, With(request, v1::SPECULATIVE_OFF));
  ASSERT_TRUE(undisturbed.status.ok()) << undisturbed.status.error_message();
  std::string killed;
  const Outcome disturbed = Generate(*stub, With(request, v1::SPECULATIVE_DRAFT),
                                     std::chrono::seconds(120),
                                     KillTheHoldingDecodeNode(cluster, killed));
  ASSERT_FALSE(killed.empty()) << "no decode node held the request";
  ASSERT_TRUE(disturbed.status.ok()) << disturbed.status.error_message();
  EXPECT_EQ(disturbed.tokens, undisturbed.tokens);
  EXPECT_EQ(disturbed.usage.completion_tokens(), 120u);
  // The surviving node drafted the rest; what the lost one accepted before it died counts too.
  EXPECT_GT(disturbed.usage.accepted_draft_tokens(), 0u);
  EXPECT_LE(disturbed.usage.accepted_draft_tokens(), 120u);
  EXPECT_THAT(cluster.Log("router"), HasSubstr("decode node " + killed + " lost after"));
}

// The override's bounds, a draft asked of a node without one, a stream cancelled while it drafts,
// and the decode node's flags.
TEST_F(SpeculativeTest, BadSettingsAreRefusedByName) {
  Cluster cluster(tiny_);
  ASSERT_FALSE(cluster.StartRouter().empty());
  ASSERT_FALSE(cluster
                   .StartDecode("decode", {"--speculative", "ngram", "--speculative-policy",
                                           "acceptance"})
                   .empty());
  ASSERT_FALSE(cluster.StartPrefill("prefill").empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  auto stub = cluster.Client();
  v1::GenerateRequest request = Request({1, 2, 3, 4}, 8);
  request.mutable_sampling()->set_speculative_tokens(6);  // tiny's max_backtrack is 5
  Outcome o = Generate(*stub, request);
  EXPECT_EQ(o.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(o.status.error_message(), HasSubstr("sampling.speculative_tokens"));
  request.mutable_sampling()->set_speculative_tokens(5);
  EXPECT_TRUE(Generate(*stub, request).status.ok());
  // A client that goes away mid-stream while the node drafts: its slot and pages come back.
  v1::GenerateRequest looping = Request(std::vector<int32_t>(24, 7), 200);
  const Outcome cancelled =
      Generate(*stub, With(looping, v1::SPECULATIVE_NGRAM), std::chrono::seconds(60),
               [](const Outcome& so_far) { return so_far.tokens.size() < 5; });
  EXPECT_EQ(cancelled.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_GE(cancelled.tokens.size(), 5u);
  EXPECT_TRUE(DecodeDrained(cluster, "decode"));
  o = Generate(*stub, With(request, v1::SPECULATIVE_DRAFT));
  EXPECT_EQ(o.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(o.status.error_message(), HasSubstr("sampling.speculative"));
  EXPECT_THAT(o.status.error_message(), HasSubstr("no draft model"));
  // Refused flags: the process exits 2 and says why.
  struct Bad {
    std::vector<std::string> flags;
    std::string why;
  };
  int index = 0;
  for (const Bad& bad :
       {Bad{{"--speculative", "medusa"}, "allowed: off, ngram, draft:DIR"},
        Bad{{"--speculative", "ngram", "--speculative-tokens", "6"}, "max_backtrack = 5"},
        Bad{{"--speculative", "draft:" + small_}, "vocabulary"},
        Bad{{"--speculative", "ngram", "--speculative-policy", "greedy"},
            "allowed: cost, acceptance"}}) {
    const std::string name = "refused-" + std::to_string(index++);
    EXPECT_TRUE(cluster.StartDecode(name, bad.flags).empty()) << name;
    EXPECT_THAT(cluster.Log(name), HasSubstr(bad.why));
  }
}

// The trained model with its shipped draft, through `baton up`: greedy text is the same with
// either drafter, with a stop string too; the accepted drafts reach `batonctl generate --json`
// and the OpenAI usage, and the node's metrics count them.
TEST_F(SpeculativeTest, TrainedModelWithItsDraftThroughBatonUp) {
  BatonUp up(fs::path(ProcessTempDir()) / "spec_up", kTrained,
             {"--speculative", "draft:" + kTrainedDraft, "--speculative-policy", "acceptance"});
  ASSERT_TRUE(up.WaitUntilUp()) << up.log();
  const std::string router = up.Address("router.addr");
  auto stub =
      v1::Generation::NewStub(grpc::CreateChannel(router, grpc::InsecureChannelCredentials()));
  uint32_t accepted_by_draft = 0;
  for (const char* text : {"The jury said that the", "He looked at her and said"}) {
    v1::GenerateRequest request;
    request.set_prompt_text(text);
    request.mutable_sampling()->set_max_tokens(48);
    request.mutable_sampling()->set_ignore_eos(true);
    const std::vector<Outcome> outcomes = ExpectSameWithEveryDrafter(*stub, request);
    accepted_by_draft += outcomes[2].usage.accepted_draft_tokens();
  }
  EXPECT_GT(accepted_by_draft, 0u) << "the trained draft never agreed with its target";
  // A stop string: the text ends at it with every drafter.
  const Result plain = RunBatonctl("generate --addr " + router +
                                   " --prompt 'The jury said' --max-tokens 32 --ignore-eos "
                                   "--speculative off --json");
  ASSERT_EQ(plain.exit_status, 0) << plain.err;
  const std::string plain_text = json::parse(plain.out)["text"];
  ASSERT_GT(plain_text.size(), 12u);
  const std::string stop = plain_text.substr(plain_text.size() / 2, 3);
  for (const char* method : {"off", "ngram", "draft"}) {
    const Result r = RunBatonctl("generate --addr " + router +
                                 " --prompt 'The jury said' --max-tokens 32 --ignore-eos "
                                 "--stop-string '" +
                                 stop + "' --speculative " + method + " --json");
    ASSERT_EQ(r.exit_status, 0) << r.err;
    const json out = json::parse(r.out);
    EXPECT_EQ(out["text"], plain_text.substr(0, plain_text.find(stop))) << method;
    EXPECT_EQ(out["finish_reason"], "stop") << method;
    ASSERT_TRUE(out["usage"].contains("accepted_draft_tokens")) << r.out;
    EXPECT_LE(out["usage"]["accepted_draft_tokens"].get<int>(),
              out["usage"]["completion_tokens"].get<int>());
  }
  // The OpenAI body's override and usage.
  std::smatch match;
  const std::string log = up.log();
  ASSERT_TRUE(std::regex_search(log, match, std::regex("OpenAI API at (http://[0-9.]+:[0-9]+/v1)")))
      << log;
  const json body = {{"prompt", "The jury said that the"},
                     {"max_tokens", 24},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"speculative", "draft"}};
  auto post = [&](const json& request) {
    return Shell("curl -sS -H 'Content-Type: application/json' -d '" + request.dump() + "' " +
                 std::string(match[1]) + "/completions");
  };
  const std::string answer = post(body);
  const json reply = json::parse(answer, nullptr, false);
  ASSERT_TRUE(reply.is_object() && reply.contains("usage")) << answer;
  EXPECT_EQ(reply["usage"]["completion_tokens"], 24);
  EXPECT_TRUE(reply["usage"].contains("accepted_draft_tokens")) << answer;
  EXPECT_EQ(reply["usage"]["completion_tokens_details"]["accepted_prediction_tokens"],
            reply["usage"]["accepted_draft_tokens"]);
  json bad = body;
  bad["speculative"] = "medusa";
  const std::string refused = post(bad);
  EXPECT_THAT(refused, HasSubstr("speculative"));
  EXPECT_THAT(refused, HasSubstr("invalid_request_error"));
}

}  // namespace
}  // namespace baton::testing
