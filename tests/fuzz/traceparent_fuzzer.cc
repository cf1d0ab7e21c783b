// W3C traceparent values, as clients send them in an HTTP header or gRPC metadata: any bytes
// are taken or refused, never crash; a taken value's context re-encodes to a value that parses
// back to the same ids and flag (what the router passes on is well formed).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "baton/common/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view value(reinterpret_cast<const char*>(data), size);
  const std::optional<baton::trace::SpanContext> parsed = baton::trace::Parse(value);
  if (!parsed.has_value()) return 0;
  const std::optional<baton::trace::SpanContext> again = baton::trace::Parse(parsed->Header());
  if (!again.has_value() || again->trace_id != parsed->trace_id ||
      again->span_id != parsed->span_id || again->sampled != parsed->sampled) {
    std::abort();
  }
  const baton::trace::Span child = baton::trace::StartSpan(parsed);
  if (child.trace_id != parsed->TraceId() || child.parent_span_id != parsed->SpanId()) std::abort();
  return 0;
}
