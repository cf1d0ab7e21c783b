#include "baton/router/router_main.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "baton/common/cert_expiry.h"
#include "baton/common/ced_rules.h"
#include "baton/common/log.h"
#include "baton/common/model_config.h"
#include "baton/common/rpc.h"
#include "baton/common/security.h"
#include "baton/common/stream_watch.h"
#include "baton/kvstore/hit_policy.h"
#include "baton/text/tokenizer.h"
#include "prompt.h"

namespace baton::router {

bool KeysInPlainTextOffLoopback(const std::string& host, bool keys, bool tls) {
  if (!keys || tls) return false;
  const bool loopback = host == "localhost" || host == "::1" || host == "[::1]" ||
                        absl::StartsWith(host, "127.");
  return !loopback;
}

namespace {

// What the servers are made from, built from the flags before any of them starts.
struct RouterSetup {
  ModelConfig config;  // --model's
  RouterOptions options;
  HttpOptions http;
  std::shared_ptr<grpc::ServerCredentials> client_credentials;
  std::chrono::milliseconds max_connection_age{0}, max_connection_age_grace{0};  // 0: never
};

// --default-mode and --default-keep: keep >= C under mask and compact (common/ced_rules.h).
absl::Status SetDefaultTruncation(v1::TruncationMode mode, const ModelConfig& config,
                                  RouterOptions& options) {
  const int64_t C = config.ring_capacity();
  if (absl::Status keep = CheckKeep(mode != v1::TRUNCATION_MODE_OFF,
                                    EffectiveKeep(options.default_keep, C), C, "--default-keep");
      !keep.ok()) {
    return keep;
  }
  options.default_mode = mode;
  return absl::OkStatus();
}

// The model's tokenizer. The gRPC API serves token ids without one; the HTTP API takes text
// and cannot.
absl::Status LoadTokenizer(const std::string& model_dir, const ModelConfig& config, bool http,
                           RouterOptions& options) {
  if (auto tokenizer = text::Tokenizer::Load(model_dir, config.vocab_size); tokenizer.ok()) {
    options.tokenizer = *std::move(tokenizer);
    if (!options.tokenizer->chat().ok()) {
      log::Warn(
          "the model's chat template cannot be rendered; /v1/chat/completions "
          "will refuse requests",
          {{"error", std::string(options.tokenizer->chat().status().message())}});
    }
  } else if (!absl::IsNotFound(tokenizer.status())) {
    if (http) return tokenizer.status();
    log::Warn("the model's tokenizer cannot be loaded; serving token ids only",
              {{"error", std::string(tokenizer.status().message())}});
  }
  if (http && options.tokenizer == nullptr) {
    return absl::FailedPreconditionError("--http-port: the model directory " + model_dir +
                                         " has no tokenizer.model; the HTTP API takes text");
  }
  return absl::OkStatus();
}

// A model served beside --model (--extra-model NAME=DIR): its config, checked against the
// router's defaults, and its tokenizer (required with the HTTP API, which takes text).
absl::StatusOr<ServedModel> LoadExtraModel(const std::string& spec, const RouterOptions& options,
                                           bool http) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--extra-model: '", spec, "' must be NAME=DIR (a name and a model directory)"));
  }
  ServedModel model;
  model.name = spec.substr(0, eq);
  const std::string dir = spec.substr(eq + 1);
  if (model.name == options.model_name) {
    return absl::InvalidArgumentError(absl::StrCat("--extra-model: the name '", model.name,
                                                   "' is already served (each name once)"));
  }
  for (const ServedModel& other : options.more_models) {
    if (other.name == model.name) {
      return absl::InvalidArgumentError(absl::StrCat("--extra-model: the name '", model.name,
                                                     "' is given twice (each name once)"));
    }
  }
  absl::StatusOr<ModelConfig> config = LoadModelConfig(dir + "/config.json");
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--extra-model ", model.name, ": ", config.status().message()));
  }
  model.config = *std::move(config);
  const int64_t C = model.config.ring_capacity();
  if (absl::Status keep = CheckKeep(options.default_mode != v1::TRUNCATION_MODE_OFF,
                                    EffectiveKeep(options.default_keep, C), C, "--default-keep");
      !keep.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--extra-model ", model.name, ": ", keep.message()));
  }
  auto tokenizer = text::Tokenizer::Load(dir, model.config.vocab_size);
  if (tokenizer.ok()) {
    model.tokenizer = *std::move(tokenizer);
  } else if (http) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--extra-model ", model.name, ": ", tokenizer.status().message(),
        " (with --http-port every model needs a tokenizer.model; the HTTP API takes text)"));
  } else if (!absl::IsNotFound(tokenizer.status())) {
    log::Warn("a model's tokenizer cannot be loaded; serving token ids only",
              {{"model", model.name}, {"error", std::string(tokenizer.status().message())}});
  }
  return model;
}

// Every --extra-model, served by the router and, with an HTTP front, by it too.
absl::Status AddExtraModels(const std::vector<std::string>& specs, RouterOptions& options,
                            HttpOptions& http) {
  for (const std::string& spec : specs) {
    absl::StatusOr<ServedModel> extra = LoadExtraModel(spec, options, http.port >= 0);
    if (!extra.ok()) return extra.status();
    if (http.port >= 0) {
      http.more_models.push_back({{extra->name, options.max_tokens_limit, options.max_model_len,
                                   extra->config.max_position_embeddings},
                                  extra->tokenizer});
    }
    options.more_models.push_back(*std::move(extra));
  }
  return absl::OkStatus();
}

// The HTTP front's deadlines, and, when it is on, what it shares with the client API: the
// host, the TLS files and the token limits.
void SetHttpOptions(const RouterFlags& flags, const RouterOptions& options, HttpOptions& http) {
  http.limits.request_timeout = std::chrono::milliseconds(flags.http_request_timeout_ms);
  http.limits.head_timeout = std::chrono::milliseconds(flags.http_head_timeout_ms);
  http.limits.idle_timeout = std::chrono::milliseconds(flags.http_idle_timeout_ms);
  http.limits.write_timeout = std::chrono::milliseconds(flags.http_write_timeout_ms);
  if (http.port < 0) return;
  const std::string& host = flags.server_flags.server.host;
  http.host = host.empty() ? "0.0.0.0" : host;
  http.tls_cert = flags.client_cert;
  http.tls_key = flags.client_key;
  http.tls_client_ca = flags.client_ca;
  http.model.max_tokens_limit = options.max_tokens_limit;
  http.model.max_model_len = options.max_model_len;
  for (openai::ModelEntry& entry : http.more_models) {
    entry.model.max_model_len = options.max_model_len;
  }
}

// The durations and connection limits of `flags` checked into `setup`: the stream idle timeout,
// node expiry and forgetting, client connection ages, the HTTP front's trusted proxies.
absl::Status SetTimesAndLimits(const RouterFlags& flags, RouterSetup& setup) {
  RouterOptions& options = setup.options;
  absl::StatusOr<std::chrono::milliseconds> idle =
      ParseStreamIdleTimeout(flags.stream_idle_timeout);
  if (!idle.ok()) return idle.status();
  options.stream_idle_timeout = *idle;
  if (options.node_ttl_ms < MinNodeExpiryMs(options.heartbeat_ms)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--node-expiry-ms: ", options.node_ttl_ms, " is below ",
        MinNodeExpiryMs(options.heartbeat_ms), " (three --heartbeat-ms of ", options.heartbeat_ms,
        " plus a ", kResolverTimeoutMs, " ms resolver timeout)"));
  }
  if (options.node_forget_after_ms != 0 && options.node_forget_after_ms < options.node_ttl_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--node-forget-after-ms: ", options.node_forget_after_ms, " is below --node-expiry-ms ",
        options.node_ttl_ms, ": a node is forgotten only after it expired"));
  }
  absl::StatusOr<std::chrono::milliseconds> age = ParseDurationFlag(
      "--client-max-connection-age", flags.client_max_connection_age, "; 0: never");
  if (!age.ok()) return age.status();
  absl::StatusOr<std::chrono::milliseconds> grace =
      ParseDurationFlag("--client-max-connection-age-grace", flags.client_max_connection_age_grace,
                        "; 0: until the calls end");
  if (!grace.ok()) return grace.status();
  setup.max_connection_age = *age;
  setup.max_connection_age_grace = *grace;
  setup.http.limits.max_connection_age = *age;
  absl::StatusOr<TrustedProxies> proxies =
      TrustedProxies::Parse(flags.http_trusted_proxies, "--http-trusted-proxies");
  if (!proxies.ok()) return proxies.status();
  setup.http.limits.trusted_proxies = *std::move(proxies);
  return absl::OkStatus();
}

// The flags' values checked and made into what the servers need, in the order the errors are
// reported.
absl::StatusOr<RouterSetup> Setup(const RouterFlags& flags) {
  RouterSetup setup{.options = flags.options, .http = flags.http};
  RouterOptions& options = setup.options;
  const bool http = setup.http.port >= 0;
  if (absl::Status s = SetTimesAndLimits(flags, setup); !s.ok()) return s;
  absl::StatusOr<ModelConfig> config = LoadModelConfig(flags.model_dir + "/config.json");
  if (!config.ok()) return config.status();
  setup.config = *std::move(config);
  if (absl::Status s = SetDefaultTruncation(flags.default_mode, setup.config, options); !s.ok()) {
    return s;
  }
  if (absl::Status s = LoadTokenizer(flags.model_dir, setup.config, http, options); !s.ok()) {
    return s;
  }
  if (!flags.api_keys_file.empty()) {
    absl::StatusOr<ApiKeys> keys = ApiKeys::Load(flags.api_keys_file);
    if (!keys.ok()) return keys.status();
    options.api_keys = std::make_shared<const ApiKeys>(*std::move(keys));
  }
  if (const std::string& host = flags.server_flags.server.host;
      KeysInPlainTextOffLoopback(host, options.api_keys != nullptr, !flags.client_cert.empty())) {
    log::Warn(
        "API keys cross the network in plain text: the client ports listen beyond loopback "
        "without TLS; set --client-cert and --client-key, or keep a TLS proxy in front",
        {{"host", host.empty() ? std::string("(every address)") : host}});
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      security::ClientApiCredentials(flags.client_cert, flags.client_key, flags.client_ca,
                                     /*api_key_check=*/options.api_keys != nullptr);
  if (!credentials.ok()) return credentials.status();
  setup.client_credentials = *std::move(credentials);
  // The client-facing certificate's expiry (gRPC client API and HTTPS front alike).
  if (!flags.client_cert.empty()) {
    static const std::shared_ptr<metrics::Collector> expiry =
        ExportCertificateExpiry({{"client", flags.client_cert}});
  }
  std::string& name = setup.http.model.name;  // --served-model-name
  if (name.empty()) name = DefaultServedModelName(flags.model_dir);
  options.model_name = name;
  if (absl::Status s = AddExtraModels(flags.extra_models, options, setup.http); !s.ok()) return s;
  std::vector<ServedModel> served = {{options.model_name, setup.config, nullptr}};
  served.insert(served.end(), options.more_models.begin(), options.more_models.end());
  absl::StatusOr<uint32_t> max_model_len = ResolveMaxModelLen(flags.max_model_len, served);
  if (!max_model_len.ok()) return max_model_len.status();
  options.max_model_len = *max_model_len;
  SetHttpOptions(flags, options, setup.http);
  setup.http.model.max_positions = setup.config.max_position_embeddings;
  return setup;
}

// Serves the Registry on the internal server and Generation (and the HTTP front, which calls
// it in-process) on the client one until shutdown.
int Serve(const RouterFlags& flags, const RouterSetup& setup) {
  RouterService service(setup.config, setup.options);
  grpc::ServerBuilder internal_builder, client_builder;
  internal_builder.RegisterService(static_cast<v1::Registry::Service*>(&service));
  client_builder.RegisterService(static_cast<v1::Generation::Service*>(&service));
  // Clients keep their connection; one closed at an age (a GOAWAY, after which the client
  // reconnects through the Service) lets routers the autoscaler adds take their share.
  if (setup.max_connection_age.count() > 0) {
    const auto ms = [](std::chrono::milliseconds d) {
      return static_cast<int>(std::min<int64_t>(d.count(), std::numeric_limits<int>::max()));
    };
    client_builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, ms(setup.max_connection_age));
    if (setup.max_connection_age_grace.count() > 0) {
      client_builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                                        ms(setup.max_connection_age_grace));
    }
  }
  // The internal server takes the shared flags (host, metrics) with its own port and file.
  ServerOptions internal = flags.server_flags.server;
  internal.port = flags.internal_port;
  internal.ready_file = flags.internal_ready_file;
  ServerOptions client_options = flags.server_flags.server;
  const ClientApiLimits limits =
      ClientLimits(setup.options.max_model_len, client_options.rpc_memory_bytes);
  client_options.max_receive_message_bytes = limits.max_receive_message_bytes;
  client_options.rpc_memory_bytes = limits.rpc_memory_bytes;
  log::Info("client API limits", {{"max_model_len", setup.options.max_model_len},
                                  {"max_receive_message_bytes", limits.max_receive_message_bytes},
                                  {"rpc_memory_bytes", limits.rpc_memory_bytes}});
  // Keys are checked from each call's metadata before its message is read.
  if (setup.options.api_keys != nullptr) {
    setup.client_credentials->SetAuthMetadataProcessor(service.ApiKeyCheck());
  }
  ClientEndpoint client{&client_builder, client_options, setup.client_credentials};
  std::unique_ptr<HttpFront> http_front;
  if (setup.http.port >= 0) {
    client.on_serving = [&](grpc::Server& server) {
      http_front = std::make_unique<HttpFront>(
          setup.http, server.InProcessChannel(grpc::ChannelArguments()), setup.options.tokenizer,
          setup.options.api_keys, [&service] { return service.Serving(); });
      return http_front->Start();
    };
  }
  return ServeUntilShutdown(
      "baton-router", internal_builder, internal, {},
      [&](HealthSetter health) { service.WatchHealth(std::move(health)); },
      [&] {
        if (http_front != nullptr) http_front->Stop();
        service.StopHealth();
      },
      client, [&](std::chrono::steady_clock::time_point deadline) { service.Drain(deadline); });
}

}  // namespace

absl::StatusOr<uint32_t> ResolveMaxModelLen(uint32_t configured,
                                            const std::vector<ServedModel>& models) {
  if (models.empty()) return absl::InvalidArgumentError("--model: no model is served");
  if (configured == 0) return static_cast<uint32_t>(models.front().config.max_position_embeddings);
  for (const ServedModel& model : models) {
    const int64_t positions = model.config.max_position_embeddings;
    if (int64_t{configured} > positions) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--max-model-len: ", configured, " exceeds the ", positions, " positions of the model '",
          model.name, "' (max_position_embeddings in its config.json); give at most ", positions,
          ", or 0 for the model's positions"));
    }
  }
  return configured;
}

ClientApiLimits ClientLimits(uint32_t max_model_len, int64_t rpc_memory_bytes) {
  const int64_t request =
      int64_t{kPromptTextBytesPerToken} * max_model_len + kClientRequestFieldsBytes;
  const int64_t receive =
      std::clamp<int64_t>(request, kMinClientMessageBytes, security::kMaxMessageBytes);
  const int64_t memory = std::min(rpc_memory_bytes, std::max(16 * receive, int64_t{64} << 20));
  return {static_cast<int>(receive), memory};
}

int RunRouter(const RouterFlags& flags) {
  absl::StatusOr<RouterSetup> setup = Setup(flags);
  if (!setup.ok()) {
    log::Error("cannot start", {{"error", std::string(setup.status().message())}});
    return 2;
  }
  return Serve(flags, *setup);
}

}  // namespace baton::router
