// The trace library of batonctl: Mooncake JSONL parsing with errors that name the line and the
// field, and the deterministic prompt tokens of hash ids.
#include "trace.h"

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::tools {
namespace {

using ::testing::HasSubstr;

TEST(TraceParseTest, ReadsMooncakeLines) {
  const auto requests = ParseTrace(
      R"({"timestamp": 0, "input_length": 1000, "output_length": 6, "hash_ids": [0, 1]}

{"timestamp": 0, "input_length": 13, "output_length": 0, "hash_ids": [5], "extra": "x"}
{"timestamp": 27.5, "input_length": 1025, "output_length": 3, "hash_ids": [0, 1, 9]})");
  ASSERT_TRUE(requests.ok()) << requests.status();
  ASSERT_EQ(requests->size(), 3u);
  EXPECT_EQ((*requests)[0].input_length, 1000);
  EXPECT_EQ((*requests)[0].output_length, 6);
  EXPECT_EQ((*requests)[0].hash_ids, std::vector<int64_t>({0, 1}));
  EXPECT_EQ((*requests)[1].line, 3);  // the blank line is skipped but counted
  EXPECT_EQ((*requests)[2].timestamp_ms, 27.5);
  EXPECT_EQ((*requests)[2].hash_ids.size(), 3u);
}

TEST(TraceParseTest, ErrorsNameTheLineAndTheField) {
  const std::string good =
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]})";
  struct Case {
    std::string line;
    const char* message;
  };
  const Case cases[] = {
      {R"({"timestamp": 0, "output_length": 1, "hash_ids": [1]})", "line 2: input_length: missing"},
      {R"({"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": [1]})",
       "line 2: input_length: -5 is not allowed; it must lie in [1, 16777216]"},
      // ceil(input_length / trace_block) used to add first and overflow int64.
      {R"({"timestamp": 0, "input_length": 9223372036854775807, "output_length": 1, "hash_ids": [1]})",
       "line 2: input_length: 9223372036854775807 is not allowed; it must lie in [1, 16777216]"},
      {R"({"timestamp": 0, "input_length": 10, "output_length": 16777217, "hash_ids": [1]})",
       "line 2: output_length: 16777217 is not allowed"},
      {R"({"timestamp": 0, "input_length": 18446744073709551615, "output_length": 1, "hash_ids": [1]})",
       "line 2: input_length: expected an integer"},
      {R"({"timestamp": 0, "input_length": "10", "output_length": 1, "hash_ids": [1]})",
       "line 2: input_length: expected an integer"},
      {R"({"timestamp": 0, "input_length": 10.5, "output_length": 1, "hash_ids": [1]})",
       "line 2: input_length: expected an integer"},
      {R"({"timestamp": 0, "input_length": 10, "output_length": -1, "hash_ids": [1]})",
       "line 2: output_length: -1 is not allowed"},
      {R"({"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]})",
       "line 2: timestamp: -1 is not allowed; it must be >= 0"},
      {R"({"input_length": 10, "output_length": 1, "hash_ids": [1]})",
       "line 2: timestamp: missing"},
      {R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": "1"})",
       "line 2: hash_ids: expected an array of integers, got string"},
      {R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, "a"]})",
       "line 2: hash_ids: item 1 is \"a\"; expected an array of integers"},
      {R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1.5]})",
       "line 2: hash_ids: item 0 is 1.5"},
      {R"({"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]})",
       "line 2: hash_ids: 2 ids for input_length 1025; at 512 tokens per id it needs at least 3"},
      {R"({"timestamp": 0, "input_length": 10, "output_length": 1})", "line 2: hash_ids: missing"},
      {R"([1, 2])", "line 2: expected a JSON object, got array"},
      {R"({"timestamp": 0,)", "line 2: not valid JSON"},
  };
  for (const Case& c : cases) {
    const auto parsed = ParseTrace(good + "\n" + c.line + "\n");
    ASSERT_FALSE(parsed.ok()) << c.line;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.line;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.message)) << c.line;
  }
  // Timestamps may repeat or go back; only negative ones are refused.
  EXPECT_TRUE(ParseTrace(R"({"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [1]}
{"timestamp": 2, "input_length": 1, "output_length": 1, "hash_ids": [1]})")
                  .ok());
  EXPECT_THAT(ParseTrace("\n\n").status().message(), HasSubstr("no requests"));
  // The block size of the trace decides how many ids a prompt needs.
  EXPECT_TRUE(ParseTraceLine(good, 1, /*trace_block=*/10).ok());
  EXPECT_THAT(ParseTraceLine(good, 1, /*trace_block=*/4).status().message(),
              HasSubstr("at 4 tokens per id it needs at least 3"));
}

TEST(TraceParseTest, LoadTraceNamesTheFile) {
  const auto missing = LoadTrace("/nonexistent/trace.jsonl");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/trace.jsonl"));
}

TEST(TraceTokensTest, HashIdTokensAreSplitMix64OfTheId) {
  // splitmix64 seeded with 0 gives 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f
  // (the published reference stream); ids are 3 + value % (4096 - 3).
  EXPECT_EQ(HashIdTokens(0, 3, 4096), std::vector<int32_t>({3645, 3700, 1328}));
  // Seeded with 7 (computed by a separate Python splitmix64).
  EXPECT_EQ(HashIdTokens(7, 3, 4096), std::vector<int32_t>({1279, 3091, 643}));
}

TEST(TraceTokensTest, EqualIdsGiveEqualBlocksAndDifferentIdsDifferentOnes) {
  const TokenOptions options{.trace_block = 8, .length_scale = 1.0, .vocab_size = 4096};
  const TraceRequest a{.input_length = 20, .hash_ids = {1, 2, 3}};
  const TraceRequest b{.input_length = 24, .hash_ids = {1, 2, 4}};
  const std::vector<int32_t> ta = TraceTokens(a, options);
  const std::vector<int32_t> tb = TraceTokens(b, options);
  ASSERT_EQ(ta.size(), 20u);  // cut to input_length: the third id gives 4 of its 8 tokens
  ASSERT_EQ(tb.size(), 24u);
  EXPECT_EQ(std::vector<int32_t>(ta.begin(), ta.begin() + 16),
            std::vector<int32_t>(tb.begin(), tb.begin() + 16));
  EXPECT_NE(std::vector<int32_t>(ta.begin() + 16, ta.end()),
            std::vector<int32_t>(tb.begin() + 16, tb.begin() + 20));
  EXPECT_NE(std::vector<int32_t>(ta.begin(), ta.begin() + 8),
            std::vector<int32_t>(ta.begin() + 8, ta.begin() + 16));
  // The same id at another position gives the same block.
  const TraceRequest c{.input_length = 16, .hash_ids = {2, 1}};
  const std::vector<int32_t> tc = TraceTokens(c, options);
  EXPECT_EQ(std::vector<int32_t>(tc.begin(), tc.begin() + 8),
            std::vector<int32_t>(ta.begin() + 8, ta.begin() + 16));
  // Deterministic across calls, and within [3, vocab_size).
  EXPECT_EQ(TraceTokens(a, options), ta);
  for (int32_t t : ta) {
    EXPECT_GE(t, 3);
    EXPECT_LT(t, 4096);
  }
  // A small vocabulary still avoids the special ids.
  for (int32_t t : HashIdTokens(11, 200, 5)) {
    EXPECT_TRUE(t == 3 || t == 4) << t;
  }
}

TEST(TraceTokensTest, LengthScaleScalesTheBlockAndThePrompt) {
  const TraceRequest r{.input_length = 20, .hash_ids = {1, 2, 3}};
  const TokenOptions half{.trace_block = 8, .length_scale = 0.5, .vocab_size = 4096};
  EXPECT_EQ(TokensPerHashId(half), 4);
  EXPECT_EQ(ScaledPromptLength(r, half), 10);
  const std::vector<int32_t> t = TraceTokens(r, half);
  ASSERT_EQ(t.size(), 10u);
  // Blocks of 4 tokens per id: a shorter block is the prefix of the full one.
  const std::vector<int32_t> id1 = HashIdTokens(1, 8, 4096);
  const std::vector<int32_t> id2 = HashIdTokens(2, 8, 4096);
  const std::vector<int32_t> id3 = HashIdTokens(3, 8, 4096);
  std::vector<int32_t> expected(id1.begin(), id1.begin() + 4);
  expected.insert(expected.end(), id2.begin(), id2.begin() + 4);
  expected.insert(expected.end(), id3.begin(), id3.begin() + 2);
  EXPECT_EQ(t, expected);
  // At least one token per id and per prompt, however small the scale.
  const TokenOptions tiny{.trace_block = 8, .length_scale = 0.001, .vocab_size = 4096};
  EXPECT_EQ(TokensPerHashId(tiny), 1);
  EXPECT_EQ(TraceTokens(r, tiny).size(), 1u);
  // Rounding never asks for tokens past the last id: 3 ids x round(8 * 1.3) = 30 tokens, while
  // round(24 * 1.3) = 31.
  const TraceRequest full{.input_length = 24, .hash_ids = {1, 2, 3}};
  const TokenOptions up{.trace_block = 8, .length_scale = 1.3, .vocab_size = 4096};
  EXPECT_EQ(TokensPerHashId(up), 10);
  EXPECT_EQ(ScaledPromptLength(full, up), 30);
}

TEST(TraceTokensTest, OptionsAreValidated) {
  EXPECT_TRUE(ValidateTokenOptions({}).ok());
  EXPECT_THAT(ValidateTokenOptions({.trace_block = 0}).message(), HasSubstr("trace_block"));
  EXPECT_THAT(ValidateTokenOptions({.length_scale = 0}).message(), HasSubstr("length_scale"));
  EXPECT_THAT(ValidateTokenOptions({.vocab_size = 3}).message(), HasSubstr("vocab_size"));
  // Upper bounds: each of these sizes an allocation per request.
  EXPECT_THAT(ValidateTokenOptions({.trace_block = int64_t{1} << 40}).message(),
              HasSubstr("trace_block is 1099511627776; it must lie in [1, 1048576]"));
  EXPECT_THAT(ValidateTokenOptions({.length_scale = 1e30}).message(),
              HasSubstr("length_scale is 1e+30; it must lie in (0, 16]"));
  EXPECT_THAT(ValidateTokenOptions({.length_scale = std::nan("")}).message(),
              HasSubstr("length_scale"));
  EXPECT_THAT(ValidateTokenOptions({.vocab_size = int64_t{1} << 40}).message(),
              HasSubstr("vocab_size is 1099511627776"));
  EXPECT_THAT(ParseTraceLine("{}", 1, int64_t{1} << 40).status().message(),
              HasSubstr("trace_block is 1099511627776"));
}

// A sample keeps whole prefix groups (requests by their first hash id) in trace order, about
// one in K of them, and K = 1 keeps the trace as it is.
TEST(TraceSampleTest, SamplePrefixGroupsKeepsWholeGroupsOfOneInK) {
  std::vector<TraceRequest> trace;
  for (int64_t i = 0; i < 4000; ++i) {
    // 1,000 groups of four: each group's requests share their first id and differ after it.
    trace.push_back({.line = i + 1,
                     .timestamp_ms = static_cast<double>(i),
                     .input_length = 1024,
                     .output_length = 1,
                     .hash_ids = {i % 1000, 5000 + i}});
  }
  EXPECT_EQ(SamplePrefixGroups(trace, 1).size(), trace.size());
  const std::vector<TraceRequest> sample = SamplePrefixGroups(trace, 8);
  std::map<int64_t, int> per_group;
  int64_t last_line = 0;
  for (const TraceRequest& r : sample) {
    ++per_group[r.hash_ids[0]];
    EXPECT_GT(r.line, last_line);  // trace order
    last_line = r.line;
  }
  for (const auto& [group, n] : per_group) EXPECT_EQ(n, 4) << group;  // whole groups
  // About 125 of the 1,000 groups (a binomial's sd is about 10).
  EXPECT_GT(per_group.size(), 80u);
  EXPECT_LT(per_group.size(), 170u);
  // One in 3 keeps about a third of them.
  const std::vector<TraceRequest> third = SamplePrefixGroups(trace, 3);
  EXPECT_GT(third.size(), 4 * 250u);
  EXPECT_LT(third.size(), 4 * 420u);
}

// A trace long enough to be parsed in ranges on several threads comes back whole and in file
// order, and of two bad lines in different ranges the error names the first.
TEST(TraceParseTest, ALongTraceParsesInOrderAndReportsItsFirstBadLine) {
  std::string text;
  constexpr int kLines = 70000;
  for (int i = 0; i < kLines; ++i) {
    text += absl::StrCat(R"({"timestamp": )", i, R"(, "input_length": 10, "output_length": 1, )",
                         R"("hash_ids": [)", i, "]}\n");
  }
  const absl::StatusOr<std::vector<TraceRequest>> trace = ParseTrace(text);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), static_cast<size_t>(kLines));
  for (int i = 0; i < kLines; ++i) {
    ASSERT_EQ((*trace)[static_cast<size_t>(i)].hash_ids[0], i);
    ASSERT_EQ((*trace)[static_cast<size_t>(i)].line, i + 1);
  }
  // Lines 40,001 and 65,001 lose their hash ids.
  std::string bad = text;
  for (const int line : {65001, 40001}) {
    size_t at = 0;
    for (int l = 1; l < line; ++l) at = bad.find('\n', at) + 1;
    const size_t ids = bad.find("\"hash_ids\"", at);
    bad.replace(ids, 10, "\"hash_idz\"");
  }
  const absl::StatusOr<std::vector<TraceRequest>> refused = ParseTrace(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("line 40001: hash_ids: missing"));
}

}  // namespace
}  // namespace baton::tools
