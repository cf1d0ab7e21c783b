// baton-router: the client-facing entry point. Serves baton.v1.Generation on --port (TLS and
// API keys when configured) and the node Registry on --internal-port (mutual TLS), each on
// its own server so that the client port never serves Registry; both speak grpc.health.v1
// (SERVING only while a prefill and a decode node are live).

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "baton/common/ced_rules.h"
#include "baton/common/model_config.h"
#include "baton/common/rpc.h"
#include "baton/common/server_flags.h"
#include "baton/common/stream_watch.h"
#include "baton/router/http_front.h"
#include "baton/router/router_service.h"
#include "baton/text/tokenizer.h"

namespace {

// A model served beside --model (--extra-model NAME=DIR): its config, checked against the
// router's defaults, and its tokenizer (required with the HTTP API, which takes text).
absl::StatusOr<baton::router::ServedModel> LoadExtraModel(
    const std::string& spec, const baton::router::RouterOptions& options, bool http) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--extra-model: '", spec, "' must be NAME=DIR (a name and a model directory)"));
  }
  baton::router::ServedModel model;
  model.name = spec.substr(0, eq);
  const std::string dir = spec.substr(eq + 1);
  if (model.name == options.model_name) {
    return absl::InvalidArgumentError(absl::StrCat("--extra-model: the name '", model.name,
                                                   "' is already served (each name once)"));
  }
  for (const baton::router::ServedModel& other : options.more_models) {
    if (other.name == model.name) {
      return absl::InvalidArgumentError(absl::StrCat("--extra-model: the name '", model.name,
                                                     "' is given twice (each name once)"));
    }
  }
  absl::StatusOr<baton::ModelConfig> config = baton::LoadModelConfig(dir + "/config.json");
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--extra-model ", model.name, ": ", config.status().message()));
  }
  model.config = *std::move(config);
  const int64_t C = model.config.ring_capacity();
  if (absl::Status keep =
          baton::CheckKeep(options.default_mode != baton::v1::TRUNCATION_MODE_OFF,
                           baton::EffectiveKeep(options.default_keep, C), C, "--default-keep");
      !keep.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--extra-model ", model.name, ": ", keep.message()));
  }
  auto tokenizer = baton::text::Tokenizer::Load(dir, model.config.vocab_size);
  if (tokenizer.ok()) {
    model.tokenizer = *std::move(tokenizer);
  } else if (http) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--extra-model ", model.name, ": ", tokenizer.status().message(),
        " (with --http-port every model needs a tokenizer.model; the HTTP API takes text)"));
  } else if (!absl::IsNotFound(tokenizer.status())) {
    baton::log::Warn("a model's tokenizer cannot be loaded; serving token ids only",
                     {{"model", model.name}, {"error", std::string(tokenizer.status().message())}});
  }
  return model;
}

}  // namespace

int main(int argc, char** argv) {
  baton::BlockShutdownSignals();
  CLI::App app{"baton-router: client API, hit policy and node selection"};
  std::string model_dir, default_mode = "compact", transport = "ucx", hit_cap = "ring";
  baton::ServerFlags flags;
  baton::router::RouterOptions options;
  int internal_port = 0;
  std::string internal_ready_file, client_cert, client_key, client_ca, api_keys_file;
  app.add_option("--model", model_dir, "Model directory (its config.json is read)")->required();
  baton::AddServerFlags(app, flags);
  app.add_option("--internal-port", internal_port,
                 "Port of the Registry nodes register with (mutual TLS; 0: any free port)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--internal-ready-file", internal_ready_file,
                 "Write the internal host:port here once serving");
  app.add_option("--client-tls-cert", client_cert, "PEM certificate of the client API (TLS)");
  app.add_option("--client-tls-key", client_key, "PEM private key of --client-tls-cert");
  app.add_option("--client-tls-ca", client_ca,
                 "PEM CA whose client certificates the client API requires (optional)");
  app.add_option("--api-keys", api_keys_file,
                 "YAML mapping API key -> tenant; clients then send 'authorization: Bearer <key>'");
  app.add_option("--default-mode", default_mode, "Default truncation: off, mask or compact")
      ->check(CLI::IsMember({"off", "mask", "compact"}));
  app.add_option("--default-keep", options.default_keep, "Default keep K (0: ring capacity C)");
  app.add_option("--max-tokens-limit", options.max_tokens_limit, "Largest max_tokens accepted");
  app.add_option("--max-model-len", options.max_model_len, "Largest prompt + max_tokens");
  app.add_option("--transport", transport, "StateBlock transport: ucx or grpc")
      ->check(CLI::IsMember({"ucx", "grpc"}));
  app.add_option("--reservation-timeout-ms", options.reservation_timeout_ms,
                 "Decode reservations not committed by then are freed");
  app.add_option("--hit-cap", hit_cap,
                 "Prefix-hit cap: ring (floor((L - C) / B) blocks) or keep (floor((L - K) / B))")
      ->check(CLI::IsMember({"ring", "keep"}));
  app.add_option("--lookup-timeout-ms", options.lookup_timeout_ms,
                 "Prefix-store lookups slower than this run the request cold");
  app.add_option("--max-queued", options.max_queued,
                 "Requests that may wait for a prefill slot; beyond, RESOURCE_EXHAUSTED at once "
                 "(default 1024)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--max-queued-per-tenant", options.max_queued_per_tenant,
                 "Requests of one tenant (API key) that may wait; beyond, that tenant gets "
                 "RESOURCE_EXHAUSTED while others are still queued (default: half of "
                 "--max-queued with API keys)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--max-streams-per-tenant", options.max_streams_per_tenant,
                 "Requests of one tenant (API key) admitted at once, each holding a decode slot; "
                 "more wait while other tenants' requests go first (default: half of the decode "
                 "slots the model's live decode nodes report, with API keys)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--prefill-slots", options.prefill_slots,
                 "Prefills in flight per prefill node (default 2: one computing, one ready)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 10));
  std::string stream_idle_timeout = "60s";
  app.add_option("--stream-idle-timeout", stream_idle_timeout,
                 "Cancel a client's stream, and free its decode slot, once the client has taken "
                 "no message for this long (30s, 500ms, 2m; a bare number is seconds; 0: never)");
  app.add_option("--prefill-timeout-ms", options.prefill_timeout_ms,
                 "Longest a prefill may take (the client's deadline, when shorter, wins)")
      ->check(CLI::Range(uint32_t{1}, uint32_t{86400000}));
  baton::router::HttpOptions http;
  http.port = -1;
  app.add_option("--http-port", http.port,
                 "Serve the OpenAI-compatible HTTP API here (0: any free port; -1, the default: "
                 "off). Needs a model with a tokenizer")
      ->check(CLI::Range(-1, 65535));
  app.add_option("--http-ready-file", http.ready_file,
                 "Write the HTTP host:port here once serving");
  app.add_option("--http-threads", http.threads,
                 "HTTP requests served at once (a stream holds one for its life; default 512); "
                 "one that finds them all busy gets 503 with Retry-After")
      ->check(CLI::Range(4, 16384));
  app.add_option("--http-max-requests-per-tenant", http.max_requests_per_tenant,
                 "HTTP requests of one tenant (API key) served at once; beyond, 429 for that "
                 "tenant while others are served (default: half of --http-threads with API keys)")
      ->check(CLI::Range(0, 16384));
  // Every resource of the HTTP front is bounded before an API key is checked (http_server.h).
  baton::router::HttpLimits& limits = http.limits;
  app.add_option("--http-max-connections", limits.max_connections,
                 "HTTP connections open at once; more are closed as they arrive (default 4096)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--http-max-connections-per-client", limits.max_connections_per_client,
                 "HTTP connections open at once from one client address (default 256)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--http-max-body-bytes", http.max_body_bytes,
                 "Largest request body, whatever its transfer encoding (default 8 MiB); bodies "
                 "with a Content-Encoding are refused")
      ->check(CLI::Range(size_t{1} << 10, size_t{1} << 30));
  app.add_option("--http-max-header-bytes", limits.max_header_bytes,
                 "Largest request line and headers together (default 16 KiB; larger: 431)")
      ->check(CLI::Range(size_t{1} << 10, size_t{1} << 20));
  app.add_option("--http-body-memory-bytes", limits.body_memory_bytes,
                 "Request bodies held at once across all connections (default 256 MiB); past it "
                 "a request gets 503 with Retry-After before its body is read")
      ->check(CLI::Range(uint64_t{1} << 20, uint64_t{1} << 40));
  int64_t request_timeout_ms = limits.request_timeout.count(),
          idle_timeout_ms = limits.idle_timeout.count(),
          write_timeout_ms = limits.write_timeout.count();
  app.add_option("--http-request-timeout-ms", request_timeout_ms,
                 "A request's head and body must arrive within this long (default 10000)")
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}));
  app.add_option("--http-idle-timeout-ms", idle_timeout_ms,
                 "A kept-alive connection idle this long between requests is closed (default "
                 "5000)")
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}));
  app.add_option("--http-write-timeout-ms", write_timeout_ms,
                 "A client that takes no part of a response for this long is disconnected "
                 "(default 60000)")
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}));
  app.add_option("--served-model-name", http.model.name,
                 "The name --model is served under: what requests ask for (GenerateRequest.model, "
                 "the OpenAI \"model\" field) and what its nodes register with (their own "
                 "--served-model-name; default: the model directory's name)");
  std::vector<std::string> extra_models;
  app.add_option("--extra-model", extra_models,
                 "NAME=DIR: serve another model beside --model, under NAME, with nodes of its own "
                 "(repeatable)");
  app.add_flag("--require-kvstore", options.require_kvstore,
               "Become SERVING only once a kvstore has registered too (losing it later makes "
               "requests cold, not the router unready)");
  if (auto exit = baton::ParseServerFlags(app, argc, argv, "baton-router", "router", flags)) {
    return *exit;
  }
  if (auto idle = baton::ParseStreamIdleTimeout(stream_idle_timeout); idle.ok()) {
    options.stream_idle_timeout = *idle;
  } else {
    baton::log::Error("cannot start", {{"error", std::string(idle.status().message())}});
    return 2;
  }
  auto config = baton::LoadModelConfig(model_dir + "/config.json");
  if (!config.ok()) {
    baton::log::Error("cannot start", {{"error", std::string(config.status().message())}});
    return 2;
  }
  absl::StatusOr<baton::v1::TruncationMode> mode =
      baton::ParseTruncationModeName(default_mode, "--default-mode");
  absl::Status keep =
      mode.ok()
          ? baton::CheckKeep(*mode != baton::v1::TRUNCATION_MODE_OFF,
                             baton::EffectiveKeep(options.default_keep, config->ring_capacity()),
                             config->ring_capacity(), "--default-keep")
          : mode.status();
  if (!keep.ok()) {
    baton::log::Error("cannot start", {{"error", std::string(keep.message())}});
    return 2;
  }
  options.default_mode = *mode;
  if (auto tokenizer = baton::text::Tokenizer::Load(model_dir, config->vocab_size);
      tokenizer.ok()) {
    options.tokenizer = *std::move(tokenizer);
    if (!options.tokenizer->chat().ok()) {
      baton::log::Warn(
          "the model's chat template cannot be rendered; /v1/chat/completions "
          "will refuse requests",
          {{"error", std::string(options.tokenizer->chat().status().message())}});
    }
  } else if (!absl::IsNotFound(tokenizer.status())) {
    // The HTTP API needs text; the gRPC API serves token ids without it.
    if (http.port >= 0) {
      baton::log::Error("cannot start", {{"error", std::string(tokenizer.status().message())}});
      return 2;
    }
    baton::log::Warn("the model's tokenizer cannot be loaded; serving token ids only",
                     {{"error", std::string(tokenizer.status().message())}});
  }
  if (http.port >= 0 && options.tokenizer == nullptr) {
    baton::log::Error("cannot start",
                      {{"error", "--http-port: the model directory " + model_dir +
                                     " has no tokenizer.model; the HTTP API takes text"}});
    return 2;
  }
  if (!api_keys_file.empty()) {
    auto keys = baton::ApiKeys::Load(api_keys_file);
    if (!keys.ok()) {
      baton::log::Error("cannot start", {{"error", std::string(keys.status().message())}});
      return 2;
    }
    options.api_keys = std::make_shared<const baton::ApiKeys>(*std::move(keys));
  }
  auto client_credentials =
      baton::security::ClientApiCredentials(client_cert, client_key, client_ca);
  if (!client_credentials.ok()) {
    baton::log::Error("cannot start",
                      {{"error", std::string(client_credentials.status().message())}});
    return 2;
  }
  options.hit_cap = *baton::kvstore::ParseHitCap(hit_cap, "--hit-cap");  // checked above
  options.transport = transport == "grpc" ? baton::v1::TRANSPORT_GRPC : baton::v1::TRANSPORT_UCX;
  if (http.model.name.empty()) http.model.name = baton::DefaultServedModelName(model_dir);
  options.model_name = http.model.name;
  for (const std::string& spec : extra_models) {
    absl::StatusOr<baton::router::ServedModel> extra =
        LoadExtraModel(spec, options, http.port >= 0);
    if (!extra.ok()) {
      baton::log::Error("cannot start", {{"error", std::string(extra.status().message())}});
      return 2;
    }
    if (http.port >= 0) {
      http.more_models.push_back(
          {{extra->name, options.max_tokens_limit, options.max_model_len}, extra->tokenizer});
    }
    options.more_models.push_back(*std::move(extra));
  }
  baton::router::RouterService service(*config, options);
  grpc::ServerBuilder internal_builder, client_builder;
  internal_builder.RegisterService(static_cast<baton::v1::Registry::Service*>(&service));
  client_builder.RegisterService(static_cast<baton::v1::Generation::Service*>(&service));
  // The internal server takes the shared flags (host, metrics) with its own port and file.
  baton::ServerOptions internal = flags.server;
  internal.port = internal_port;
  internal.ready_file = internal_ready_file;
  baton::ClientEndpoint client{&client_builder, flags.server, *client_credentials};
  limits.request_timeout = std::chrono::milliseconds(request_timeout_ms);
  limits.idle_timeout = std::chrono::milliseconds(idle_timeout_ms);
  limits.write_timeout = std::chrono::milliseconds(write_timeout_ms);
  std::unique_ptr<baton::router::HttpFront> http_front;
  if (http.port >= 0) {
    http.host = flags.server.host.empty() ? "0.0.0.0" : flags.server.host;
    http.tls_cert = client_cert;
    http.tls_key = client_key;
    http.tls_client_ca = client_ca;
    http.model.max_tokens_limit = options.max_tokens_limit;
    http.model.max_model_len = options.max_model_len;
    client.on_serving = [&](grpc::Server& server) {
      http_front = std::make_unique<baton::router::HttpFront>(
          http, server.InProcessChannel(grpc::ChannelArguments()), options.tokenizer,
          options.api_keys, [&service] { return service.Serving(); });
      return http_front->Start();
    };
  }
  return baton::ServeUntilShutdown(
      "baton-router", internal_builder, internal, {},
      [&](baton::HealthSetter health) { service.WatchHealth(std::move(health)); },
      [&] {
        if (http_front != nullptr) http_front->Stop();
        service.StopHealth();
      },
      client, [&](std::chrono::steady_clock::time_point deadline) { service.Drain(deadline); });
}
