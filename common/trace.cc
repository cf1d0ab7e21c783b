#include "baton/common/trace.h"

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/escaping.h"

namespace baton::trace {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // the specification allows lowercase only
}

// Reads 2 * N lowercase hex digits into `out`; false when any is not one, or all are zero.
template <size_t N>
bool ReadId(std::string_view hex, std::array<uint8_t, N>& out) {
  if (hex.size() != 2 * N) return false;
  bool zero = true;
  for (size_t i = 0; i < N; ++i) {
    const int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
    zero = zero && out[i] == 0;
  }
  return !zero;
}

template <size_t N>
std::string Hex(const std::array<uint8_t, N>& bytes) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

absl::BitGen& Random() {
  thread_local absl::BitGen gen;
  return gen;
}

template <size_t N>
void FillNonZero(std::array<uint8_t, N>& out) {
  do {
    for (uint8_t& b : out) b = absl::Uniform<uint8_t>(Random());
  } while (std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0; }));
}

}  // namespace

std::string SpanContext::TraceId() const {
  return Hex(trace_id);
}

std::string SpanContext::SpanId() const {
  return Hex(span_id);
}

std::string SpanContext::Header() const {
  return "00-" + TraceId() + "-" + SpanId() + (sampled ? "-01" : "-00");
}

std::optional<SpanContext> Parse(std::string_view value) {
  // version "-" trace-id "-" parent-id "-" trace-flags: 2 + 1 + 32 + 1 + 16 + 1 + 2.
  constexpr size_t kLength = 55;
  if (value.size() < kLength) return std::nullopt;
  const int v_hi = HexDigit(value[0]), v_lo = HexDigit(value[1]);
  if (v_hi < 0 || v_lo < 0 || (v_hi == 15 && v_lo == 15)) return std::nullopt;
  const bool version_00 = v_hi == 0 && v_lo == 0;
  if (version_00 ? value.size() != kLength : value.size() > kLength && value[kLength] != '-') {
    return std::nullopt;
  }
  if (value[2] != '-' || value[35] != '-' || value[52] != '-') return std::nullopt;
  SpanContext context;
  if (!ReadId(value.substr(3, 32), context.trace_id)) return std::nullopt;
  if (!ReadId(value.substr(36, 16), context.span_id)) return std::nullopt;
  const int f_hi = HexDigit(value[53]), f_lo = HexDigit(value[54]);
  if (f_hi < 0 || f_lo < 0) return std::nullopt;
  context.sampled = (f_lo & 1) != 0;
  return context;
}

Span StartSpan(const std::optional<SpanContext>& parent, double root_sample_ratio) {
  Span span;
  if (parent.has_value()) {
    span.context.trace_id = parent->trace_id;
    span.context.sampled = parent->sampled;
    span.parent_span_id = parent->SpanId();
  } else {
    FillNonZero(span.context.trace_id);
    span.context.sampled = root_sample_ratio >= 1.0 ||
                           (root_sample_ratio > 0 && absl::Bernoulli(Random(), root_sample_ratio));
  }
  FillNonZero(span.context.span_id);
  span.trace_id = span.context.TraceId();
  span.span_id = span.context.SpanId();
  return span;
}

std::optional<SpanContext> FromCall(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find(kTraceparent);
  if (it == metadata.end()) return std::nullopt;
  return Parse(std::string_view(it->second.data(), it->second.size()));
}

Span StartServerSpan(const grpc::ServerContextBase& context) {
  return StartSpan(FromCall(context), /*root_sample_ratio=*/0.0);
}

void Inject(const Span& span, grpc::ClientContext& context) {
  context.AddMetadata(kTraceparent, span.context.Header());
}

}  // namespace baton::trace
