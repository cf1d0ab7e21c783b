// baton-router: the client-facing entry point. Serves baton.v1.Generation on --port (TLS and
// API keys when configured) and the node Registry on --internal-port (mutual TLS), each on
// its own server so that the client port never serves Registry; both speak grpc.health.v1
// (SERVING only while a prefill and a decode node are live).

#include <cstdint>
#include <cstdlib>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "CLI/CLI.hpp"
#include "baton/common/ced_rules.h"
#include "baton/common/options.h"
#include "baton/common/rpc.h"
#include "baton/common/server_flags.h"
#include "baton/common/wire_names.h"
#include "baton/kvstore/hit_policy.h"
#include "baton/kvstore/ttft_model.h"
#include "baton/router/router_main.h"

namespace {

// The model, the listeners, the client API's TLS and keys, and how a request is served: its
// default truncation, transport, split, hit cap and prefill-node policy.
void AddServingFlags(CLI::App& app, baton::router::RouterFlags& flags) {
  baton::router::RouterOptions& options = flags.options;
  app.add_option("--model", flags.model_dir, "Model directory (its config.json is read)")
      ->required();
  baton::AddServerFlags(app, flags.server_flags);
  app.add_option("--internal-port", flags.internal_port,
                 "Port of the Registry nodes register with (mutual TLS; 0: any free port)")
      ->check(baton::InRange(0, 65535));
  app.add_option("--internal-ready-file", flags.internal_ready_file,
                 "Write the internal host:port here once serving");
  app.add_option("--client-tls-cert", flags.client_cert, "PEM certificate of the client API (TLS)");
  app.add_option("--client-tls-key", flags.client_key, "PEM private key of --client-tls-cert");
  app.add_option("--client-tls-ca", flags.client_ca,
                 "PEM CA whose client certificates the client API requires (optional)");
  app.add_option("--api-keys", flags.api_keys_file,
                 "YAML mapping API key -> tenant; clients then send 'authorization: Bearer <key>'");
  baton::AddEnumOption(app, "--default-mode", flags.default_mode,
                       {baton::v1::TRUNCATION_MODE_OFF, baton::v1::TRUNCATION_MODE_MASK,
                        baton::v1::TRUNCATION_MODE_COMPACT},
                       baton::TruncationModeName, "Default truncation: off, mask or compact");
  app.add_option("--default-keep", options.default_keep, "Default keep K (0: ring capacity C)")
      ->check(baton::InRange(int64_t{0}, int64_t{UINT32_MAX}));
  app.add_option("--max-tokens-limit", options.max_tokens_limit, "Largest max_tokens accepted")
      ->check(baton::InRange(int64_t{1}, int64_t{UINT32_MAX}));
  app.add_option("--max-model-len", flags.max_model_len,
                 "Largest prompt + max_tokens (default 0: the model's positions, config.json "
                 "max_position_embeddings; more than a served model's positions is refused). It "
                 "also bounds a text prompt's bytes and the client API's message size")
      ->check(baton::InRange(int64_t{0}, int64_t{UINT32_MAX}));
  baton::AddEnumOption(app, "--transport", options.transport,
                       {baton::v1::TRANSPORT_UCX, baton::v1::TRANSPORT_GRPC}, baton::TransportName,
                       "StateBlock transport: ucx or grpc");
  app.add_option("--reservation-timeout-ms", options.reservation_timeout_ms,
                 "Decode reservations not committed by then are freed")
      ->check(baton::InRange(int64_t{1}, int64_t{UINT32_MAX}));
  baton::AddEnumOption(
      app, "--split", options.split,
      {baton::v1::SPLIT_PREFILL_ALL, baton::v1::SPLIT_REPLAY_ON_DECODE}, baton::SplitName,
      "How a request is cut between nodes: prefill-all (the prefill node runs every "
      "layer) or replay-on-decode (it runs the producers only, and the decode node "
      "replays the consumer layers); only prefill nodes started with the same --split "
      "are accepted");
  baton::AddEnumOption(
      app, "--hit-cap", options.hit_cap,
      {baton::kvstore::HitCap::kRing, baton::kvstore::HitCap::kKeep}, baton::kvstore::HitCapName,
      "Prefix-hit cap: ring (floor((L - C) / B) blocks) or keep (floor((L - K) / B))");
  baton::AddEnumOption(
      app, "--prefill-policy", options.prefill_policy,
      {baton::kvstore::RoutingPolicy::kLeastLoaded, baton::kvstore::RoutingPolicy::kLongestPrefix,
       baton::kvstore::RoutingPolicy::kPredictedTtft},
      baton::kvstore::RoutingPolicyName,
      "Which prefill node takes a request: least-loaded, longest-prefix (the most "
      "blocks in its local cache) or predicted-ttft (queue + load + compute + replay "
      "at its measured rates; default)");
  app.add_option("--lookup-timeout-ms", options.lookup_timeout_ms,
                 "Prefix-store lookups slower than this run the request cold")
      ->check(baton::InRange(int64_t{1}, int64_t{UINT32_MAX}));
  app.add_option("--kvstore-replication", options.kvstore_replication,
                 "Owners of each prefix-store value among the live store nodes (DESIGN section "
                 "5): with R >= 2, losing a store node loses no hit. More than the live nodes "
                 "means all of them")
      ->check(baton::InRange(1, 16));
  app.add_option("--trace-sample-ratio", options.trace_sample_ratio,
                 "Fraction of the traces the router starts (requests without a traceparent) "
                 "that are sampled: the prefix store logs their calls at info, the others at "
                 "debug; a client's traceparent keeps its own sampled flag (default 1)")
      ->check(baton::InRange(0.0, 1.0));
  app.add_option("--fidelity-sample-rate", options.fidelity_sample_rate,
                 "Shadow verification: the share of the requests served with truncation whose "
                 "decode node also computes them untruncated, at the lowest priority, and "
                 "reports the difference in baton_fidelity_* metrics (docs/fidelity.md; "
                 "default 0)")
      ->check(baton::InRange(0.0, 1.0));
  app.add_option("--fidelity-tokens", options.fidelity_tokens,
                 "Shadow verification: completion tokens a sampled request's shadow compares "
                 "(default 32)")
      ->check(baton::InRange(1, 256));
}

// Admission: the queue, tenants' shares, prefill slots and timeouts.
void AddAdmissionFlags(CLI::App& app, baton::router::RouterFlags& flags) {
  baton::router::RouterOptions& options = flags.options;
  app.add_option("--max-queued", options.max_queued,
                 "Requests that may wait for a prefill slot; beyond, RESOURCE_EXHAUSTED at once "
                 "(default 1024)")
      ->check(baton::InRange(int64_t{0}, int64_t{1} << 20));
  app.add_option("--max-queued-per-tenant", options.max_queued_per_tenant,
                 "Most requests of one tenant (API key) that may wait, beside its weighted fair "
                 "part of --max-queued among the active tenants; beyond, that tenant gets "
                 "RESOURCE_EXHAUSTED while others are still queued (default 0: the fair part "
                 "alone)")
      ->check(baton::InRange(int64_t{0}, int64_t{1} << 20));
  app.add_option("--max-streams-per-tenant", options.max_streams_per_tenant,
                 "Most requests of one tenant (API key) admitted at once, each holding a decode "
                 "slot, beside its weighted fair part of the slots the model's live decode nodes "
                 "report; more wait while other tenants' requests go first (default 0: the fair "
                 "part alone)")
      ->check(baton::InRange(int64_t{0}, int64_t{1} << 20));
  app.add_option("--prefill-slots", options.prefill_slots,
                 "Prefills in flight per prefill node, shared by the routers the node registers "
                 "with (default 2: one computing, one ready)")
      ->check(baton::InRange(int64_t{1}, int64_t{1} << 10));
  app.add_option("--stream-idle-timeout", flags.stream_idle_timeout,
                 "Cancel a client's stream, and free its decode slot, once the client has taken "
                 "no message for this long (30s, 500ms, 2m; a bare number is seconds; 0: never)");
  app.add_option("--prefill-timeout-ms", options.prefill_timeout_ms,
                 "Longest a prefill may take (the client's deadline, when shorter, wins)")
      ->check(baton::InRange(uint32_t{1}, uint32_t{86400000}));
}

// The OpenAI-compatible HTTP front and its bounds.
void AddHttpFlags(CLI::App& app, baton::router::RouterFlags& flags) {
  baton::router::HttpOptions& http = flags.http;
  app.add_option("--http-port", http.port,
                 "Serve the OpenAI-compatible HTTP API here (0: any free port; -1, the default: "
                 "off). Needs a model with a tokenizer")
      ->check(baton::InRange(-1, 65535));
  app.add_option("--http-ready-file", http.ready_file,
                 "Write the HTTP host:port here once serving");
  app.add_option("--http-threads", http.threads,
                 "HTTP requests served at once (a stream holds one for its life; default 512); "
                 "one that finds them all busy gets 503 with Retry-After")
      ->check(baton::InRange(4, 16384));
  app.add_option("--http-max-requests-per-tenant", http.max_requests_per_tenant,
                 "Most HTTP requests of one tenant (API key) served at once, beside its weighted "
                 "fair part of --http-threads among the tenants with requests in flight; beyond, "
                 "429 for that tenant while others are served (default 0: the fair part alone)")
      ->check(baton::InRange(0, 16384));
  // Every resource of the HTTP front is bounded before an API key is checked (http_server.h).
  baton::router::HttpLimits& limits = http.limits;
  app.add_option("--http-max-connections", limits.max_connections,
                 "HTTP connections open at once; more are closed as they arrive (default 4096)")
      ->check(baton::InRange(1, 1 << 20));
  app.add_option("--http-max-connections-per-client", limits.max_connections_per_client,
                 "HTTP connections open at once from one client: an IPv4 address's "
                 "--http-ipv4-prefix, an IPv6 address's /64 (default 256)")
      ->check(baton::InRange(1, 1 << 20));
  app.add_option("--http-trusted-proxies", flags.http_trusted_proxies,
                 "Networks of the proxies in front of the HTTP port (an Ingress controller's or "
                 "a Gateway's pods; e.g. 10.0.0.0/8, fd00::/8; repeatable). A connection from one "
                 "is held to --http-max-connections alone, and each request on it is its "
                 "X-Forwarded-For client's (the rightmost address that is not such a proxy) for "
                 "body memory; from anyone else X-Forwarded-For is ignored (default: none)")
      ->delimiter(',');
  app.add_option("--http-ipv4-prefix", limits.ipv4_prefix_length,
                 "IPv4 clients are counted per prefix of this length for the connection caps "
                 "and body memory (default 32: per address; IPv6 clients always per /64)")
      ->check(baton::InRange(8, 32));
  app.add_option("--http-max-body-bytes", http.max_body_bytes,
                 "Largest request body, whatever its transfer encoding (default 8 MiB); bodies "
                 "with a Content-Encoding are refused")
      ->check(baton::InRange(size_t{1} << 10, size_t{1} << 30));
  app.add_option("--http-max-header-bytes", limits.max_header_bytes,
                 "Largest request line and headers together (default 16 KiB; larger: 431)")
      ->check(baton::InRange(size_t{1} << 10, size_t{1} << 20));
  app.add_option("--http-body-memory-bytes", limits.body_memory_bytes,
                 "Request bodies held at once across all connections (default 256 MiB); past it "
                 "a request gets 503 with Retry-After before its body is read")
      ->check(baton::InRange(uint64_t{1} << 20, uint64_t{1} << 40));
  app.add_option("--http-request-timeout-ms", flags.http_request_timeout_ms,
                 "A request's head and body must arrive within this long (default 10000)")
      ->check(baton::InRange(int64_t{100}, int64_t{3600000}));
  app.add_option("--http-head-timeout-ms", flags.http_head_timeout_ms,
                 "A new connection's first request head must be complete within this long of "
                 "its accept, TLS handshake included (default 2000)")
      ->check(baton::InRange(int64_t{100}, int64_t{3600000}));
  app.add_option("--http-idle-timeout-ms", flags.http_idle_timeout_ms,
                 "A kept-alive connection idle this long between requests is closed (default "
                 "5000)")
      ->check(baton::InRange(int64_t{100}, int64_t{3600000}));
  app.add_option("--http-write-timeout-ms", flags.http_write_timeout_ms,
                 "A client that takes no part of a response for this long is disconnected "
                 "(default 60000)")
      ->check(baton::InRange(int64_t{100}, int64_t{3600000}));
}

// Metrics, served names and models, and the nodes' registry: heartbeats, expiry, identities,
// client connection ages.
void AddRegistryFlags(CLI::App& app, baton::router::RouterFlags& flags) {
  baton::router::RouterOptions& options = flags.options;
  baton::router::HttpOptions& http = flags.http;
  app.add_flag("--metrics-tenant-names", options.metrics_tenant_names,
               "Label /metrics series with tenant names; by default each tenant is a digest of "
               "its name (t- and 12 hex digits, stable across restarts), since the page is open "
               "to whoever reaches the metrics port");
  app.add_option("--served-model-name", http.model.name,
                 "The name --model is served under: what requests ask for (GenerateRequest.model, "
                 "the OpenAI \"model\" field) and what its nodes register with (their own "
                 "--served-model-name; default: the model directory's name)");
  app.add_option("--extra-model", flags.extra_models,
                 "NAME=DIR: serve another model beside --model, under NAME, with nodes of its own "
                 "(repeatable)");
  app.add_flag("--require-kvstore", options.require_kvstore,
               "Become SERVING only once a kvstore has registered too (losing it later makes "
               "requests cold, not the router unready). Off by default: without a store "
               "requests run cold, and a store that is late or restarting must not take "
               "serving down");
  app.add_option("--heartbeat-ms", options.heartbeat_ms,
                 "How often nodes register again, reporting their load (default 500)")
      ->check(baton::InRange(uint32_t{50}, uint32_t{10000}));
  app.add_option("--node-expiry-ms", options.node_ttl_ms,
                 "A node not heard from for this long gets no new request (default 6500; at "
                 "least three heartbeats plus a 5 s resolver timeout)")
      ->check(baton::InRange(uint32_t{5150}, uint32_t{600000}));
  app.add_option(
         "--node-forget-after-ms", options.node_forget_after_ms,
         "A node not heard from for this long is forgotten: its entry, its node_id's "
         "binding to its certificate and its cache index (default 0: four --node-expiry-ms, "
         "at least 30000; else at least --node-expiry-ms)")
      ->check(baton::InRange(uint32_t{0}, uint32_t{86400000}));
  app.add_option("--max-node-ids", options.max_node_ids,
                 "At most this many node_ids registered at once; a new one past it is refused "
                 "(default 4096)")
      ->check(baton::InRange(uint32_t{1}, uint32_t{1000000}));
  app.add_option("--max-node-ids-per-identity", options.max_node_ids_per_identity,
                 "At most this many node_ids per certificate identity: what one role-only "
                 "certificate (spiffe://baton/<role>, shared by a role's pods) may hold; a "
                 "per-node certificate registers its own node_id only (default 256)")
      ->check(baton::InRange(uint32_t{1}, uint32_t{1000000}));
  app.add_option("--client-max-connection-age", flags.client_max_connection_age,
                 "Close a client's connection to the client port (gRPC GOAWAY, HTTP "
                 "\"Connection: close\") once it is this old, so that clients spread over "
                 "routers added since (2m, 30s; default 0: never). Clients should retry "
                 "UNAVAILABLE, as batonctl does: a call started just as the GOAWAY arrives "
                 "fails so");
  app.add_option("--client-max-connection-age-grace", flags.client_max_connection_age_grace,
                 "How long calls in flight on such a connection may still run before it is cut "
                 "(default 0: until they end)");
}

}  // namespace

int main(int argc, char** argv) {
#if defined(__GLIBC__)
  // Blocks of 256 KiB and more straight from mmap, and back to the system when freed: the cache
  // index's table grows and shrinks with the nodes' caches (a flood of invented node_ids, once
  // forgotten, must give its memory back). glibc's own threshold rises with each such block
  // freed, after which they stay in its heap.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
#endif
  baton::BlockShutdownSignals();
  CLI::App app{"baton-router: client API, hit policy and node selection"};
  baton::CaptureDefaults(app);
  baton::router::RouterFlags flags;
  AddServingFlags(app, flags);
  AddAdmissionFlags(app, flags);
  AddHttpFlags(app, flags);
  AddRegistryFlags(app, flags);
  if (auto exit =
          baton::ParseServerFlags(app, argc, argv, "baton-router", "router", flags.server_flags)) {
    return *exit;
  }
  return baton::router::RunRouter(flags);
}
