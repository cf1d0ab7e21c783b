// The HTTP front's request path before any handler, on any bytes: the parse a connection does
// (Boost.Beast under the server's bounds, then the head's checks: route, Content-Encoding,
// lengths; router/http_server.h ParseHttpRequest) and, for a complete request, the bounded JSON
// pass the OpenAI front runs over its body (router/openai.h CheckJsonBounds). Properties: a
// refusal is one of the statuses the server answers with; a complete request's body is within
// the body limit and its head within the head limit; a body the JSON pass accepts parses into a
// tree within the pass's bounds (values, array lengths, depth); the client a trusted proxy's
// X-Forwarded-For names is the proxy or an address of the header that is not a proxy.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "baton/router/http_server.h"
#include "baton/router/openai.h"
#include "nlohmann/json.hpp"

namespace {

constexpr size_t kMaxElements = 64;  // small bounds, so that inputs reach them

baton::router::HttpServerOptions Options() {
  baton::router::HttpServerOptions options;
  options.limits.max_body_bytes = 4096;
  options.limits.max_header_bytes = 1024;
  auto none = [](const baton::router::HttpRequest&, baton::router::HttpResponder&) {};
  options.routes = {{"GET", "/health", false, none},
                    {"POST", "/v1/completions", true, none},
                    {"POST", "/v1/chat/completions", true, none}};
  return options;
}

// Values, the longest array and the depth of a tree.
void Measure(const nlohmann::json& j, size_t depth, size_t& values, size_t& longest,
             size_t& deepest) {
  ++values;
  deepest = std::max(deepest, depth);
  if (j.is_array()) longest = std::max(longest, j.size());
  if (j.is_structured()) {
    for (const auto& child : j) Measure(child, depth + 1, values, longest, deepest);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const baton::router::HttpServerOptions options = Options();
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const baton::router::ParsedHttpRequest parsed = baton::router::ParseHttpRequest(bytes, options);
  switch (parsed.status) {
    case 0:
    case 400:
    case 404:
    case 413:
    case 415:
    case 431:
      break;
    default:
      std::abort();
  }
  if (parsed.status != 0 && parsed.message.empty()) std::abort();
  if (!parsed.complete) return 0;
  if (parsed.status != 0 || parsed.request.body.size() > options.limits.max_body_bytes) {
    std::abort();
  }
  size_t head = 0;
  for (const auto& [name, value] : parsed.request.headers) head += name.size() + value.size();
  if (head > options.limits.max_header_bytes) std::abort();
  // Its client as a trusted proxy forwarded it: the proxy itself, or an address of the header
  // that parses and is not a proxy.
  static const baton::TrustedProxies proxies =
      *baton::TrustedProxies::Parse({"127.0.0.0/8", "fd00::/8"}, "fuzz");
  const std::string* forwarded = parsed.request.Header("x-forwarded-for");
  const std::string client = proxies.ClientOf("127.0.0.1", forwarded);
  if (client != "127.0.0.1" &&
      (forwarded == nullptr || forwarded->find(client) == std::string::npos ||
       proxies.Contains(client) || baton::ClientGroup(client, 32) == client)) {
    std::abort();
  }
  if (!baton::router::openai::CheckJsonBounds(parsed.request.body, kMaxElements).ok()) return 0;
  const nlohmann::json tree = nlohmann::json::parse(parsed.request.body, nullptr, false);
  if (tree.is_discarded()) std::abort();  // the pass accepted what is not JSON
  size_t values = 0, longest = 0, deepest = 0;
  Measure(tree, 0, values, longest, deepest);
  if (values > baton::router::openai::JsonValueBound(kMaxElements) || longest > kMaxElements ||
      deepest > baton::router::openai::kMaxJsonNesting) {
    std::abort();
  }
  return 0;
}
