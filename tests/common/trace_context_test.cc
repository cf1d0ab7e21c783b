// W3C trace context: what is taken from a caller, what is refused (so that a new trace starts
// instead), and what a span passes on.
#include <grpcpp/client_context.h>

#include <set>
#include <string>

#include "baton/common/trace.h"
#include "gtest/gtest.h"

namespace baton::trace {
namespace {

constexpr char kExample[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST(TraceContextTest, TheSpecificationsExampleIsTakenWhole) {
  const std::optional<SpanContext> parsed = Parse(kExample);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->TraceId(), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(parsed->SpanId(), "00f067aa0ba902b7");
  EXPECT_TRUE(parsed->sampled);
  EXPECT_EQ(parsed->Header(), kExample);
  const std::optional<SpanContext> unsampled =
      Parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
  ASSERT_TRUE(unsampled.has_value());
  EXPECT_FALSE(unsampled->sampled);
  // Flags other than sampled are not passed on.
  const std::optional<SpanContext> other_flags =
      Parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03");
  ASSERT_TRUE(other_flags.has_value());
  EXPECT_EQ(other_flags->Header(), kExample);
}

TEST(TraceContextTest, MalformedValuesAreRefusedSoANewTraceStarts) {
  for (const char* bad : {
           "", "00",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",    // short flags
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",  // 00 has no more fields
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",  // nor trailing bytes
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   // uppercase
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",   // zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   // zero parent id
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // the invalid version
           "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // not hex
           "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // separator
           "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",   // misplaced dash
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",   // flags not hex
           "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",  // later version, no dash
       }) {
    EXPECT_FALSE(Parse(bad).has_value()) << '"' << bad << '"';
  }
}

TEST(TraceContextTest, ALaterVersionKeepsTheFieldsItShares) {
  const std::optional<SpanContext> parsed =
      Parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-later");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->Header(), kExample);  // passed on as the version this node speaks
  EXPECT_TRUE(Parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").has_value());
}

TEST(TraceContextTest, AChildSpanKeepsTheTraceAndSampledFlagUnderANewId) {
  const SpanContext parent = *Parse(kExample);
  const Span child = StartSpan(parent, /*root_sample_ratio=*/0.0);
  EXPECT_EQ(child.trace_id, parent.TraceId());
  EXPECT_EQ(child.parent_span_id, parent.SpanId());
  EXPECT_NE(child.span_id, parent.SpanId());
  EXPECT_EQ(child.span_id.size(), 16u);
  EXPECT_TRUE(child.context.sampled);  // the parent's flag, not the root ratio
  EXPECT_EQ(child.Ids().trace_id, child.trace_id);
  EXPECT_EQ(child.Ids().parent_span_id, parent.SpanId());
  // What the child passes on parses back to its own ids.
  const std::optional<SpanContext> passed = Parse(child.context.Header());
  ASSERT_TRUE(passed.has_value());
  EXPECT_EQ(passed->TraceId(), child.trace_id);
  EXPECT_EQ(passed->SpanId(), child.span_id);
}

TEST(TraceContextTest, RootsAreNewTracesSampledAtTheRatio) {
  std::set<std::string> traces;
  int sampled = 0;
  for (int i = 0; i < 200; ++i) {
    const Span root = StartSpan(std::nullopt, 0.5);
    EXPECT_TRUE(root.parent_span_id.empty());
    EXPECT_TRUE(Parse(root.context.Header()).has_value()) << root.context.Header();
    traces.insert(root.trace_id);
    sampled += root.context.sampled ? 1 : 0;
  }
  EXPECT_EQ(traces.size(), 200u);
  // Binomial(200, 0.5): outside [50, 150] with probability below 1e-12.
  EXPECT_GT(sampled, 50);
  EXPECT_LT(sampled, 150);
  EXPECT_FALSE(StartSpan(std::nullopt, 0.0).context.sampled);
  EXPECT_TRUE(StartSpan(std::nullopt, 1.0).context.sampled);
}

}  // namespace
}  // namespace baton::trace
