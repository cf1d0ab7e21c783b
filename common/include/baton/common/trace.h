// W3C Trace Context (https://www.w3.org/TR/trace-context/) for following one request across
// the router, the prefill and decode nodes and the prefix store.
//
// A request's trace starts at a front: the client's `traceparent` (an HTTP header, or gRPC
// metadata of the same name) is taken when it is well formed, and the router starts a new
// trace when it is absent or malformed (the receiver's rule in the specification: a bad
// header is never passed on). Each role serves its part of the request as one span, a child
// of the caller's: every call a role makes for the request carries
//
//   traceparent: 00-<trace id, 32 hex>-<this role's span id, 16 hex>-<flags, 01 = sampled>
//
// and each role's log lines about the request carry trace_id, span_id and parent_span_id,
// with the timings of its stages. The sampled flag follows the parent (a client may switch
// per-request logging off); the router samples the traces it starts at --trace-sample-ratio.
// Sampling decides whether the per-call lines that are not an access log (the store's) are
// written at info or at debug; the router's, prefill's and decode's request lines are always
// written.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "baton/common/log.h"

namespace grpc {
class ClientContext;
class ServerContextBase;
}  // namespace grpc

namespace baton::trace {

// The HTTP header and the gRPC metadata key.
inline constexpr char kTraceparent[] = "traceparent";

struct SpanContext {
  std::array<uint8_t, 16> trace_id{};
  std::array<uint8_t, 8> span_id{};
  bool sampled = false;

  std::string TraceId() const;  // 32 lowercase hex digits
  std::string SpanId() const;   // 16 lowercase hex digits
  // The traceparent value: "00-<trace id>-<span id>-<flags>".
  std::string Header() const;
};

// Parses a traceparent value. nullopt when it is not one: the version must be two lowercase
// hex digits other than "ff"; version 00 is exactly 55 characters; a later version may add
// fields after a '-' (they are ignored, as the specification asks); the trace and parent ids
// are lowercase hex and not all zeros. Only the sampled bit of the flags is kept.
std::optional<SpanContext> Parse(std::string_view value);

// One role's span of a request: its own context, and its parent's span id (empty for a
// trace this role started).
struct Span {
  SpanContext context;
  std::string trace_id, span_id;  // the context's, in hex
  std::string parent_span_id;     // empty for a trace this role started

  // The ids for a log line (views into this span).
  log::TraceIds Ids() const { return {trace_id, span_id, parent_span_id}; }
};

// A span under `parent` when there is one, else the root of a new trace, sampled with
// probability `root_sample_ratio` (in [0, 1]).
Span StartSpan(const std::optional<SpanContext>& parent, double root_sample_ratio = 1.0);

// The caller's context from a server call's metadata (nullopt when absent or malformed).
std::optional<SpanContext> FromCall(const grpc::ServerContextBase& context);

// An internal server call's span: a child of the caller's context, or, for a call that brings
// none (a peer that does not trace), a new unsampled root: only the router samples the traces
// it starts.
Span StartServerSpan(const grpc::ServerContextBase& context);

// Adds `span`'s traceparent to a call this role makes for the request.
void Inject(const Span& span, grpc::ClientContext& context);

}  // namespace baton::trace
