// baton-router: the client-facing entry point. Serves baton.v1.Generation and the node
// Registry, plus grpc.health.v1 (SERVING only while a prefill and a decode node are live)
// and reflection.
#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "baton/common/rpc.h"
#include "baton/common/server_flags.h"
#include "baton/router/router_service.h"

int main(int argc, char** argv) {
  baton::BlockShutdownSignals();
  CLI::App app{"baton-router: client API, hit policy and node selection"};
  std::string model_dir, default_mode = "compact", transport = "ucx", hit_cap = "ring";
  baton::ServerFlags flags;
  baton::router::RouterOptions options;
  app.add_option("--model", model_dir, "Model directory (its config.json is read)")->required();
  baton::AddServerFlags(app, flags);
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
  app.add_flag("--require-kvstore", options.require_kvstore,
               "Become SERVING only once a kvstore has registered too (losing it later makes "
               "requests cold, not the router unready)");
  if (auto exit = baton::ParseServerFlags(app, argc, argv, "baton-router", "router", flags)) {
    return *exit;
  }
  auto config = baton::LoadModelConfig(model_dir + "/config.json");
  if (!config.ok()) {
    baton::log::Error("cannot start", {{"error", std::string(config.status().message())}});
    return 2;
  }
  options.default_mode = default_mode == "off"    ? baton::v1::TRUNCATION_MODE_OFF
                         : default_mode == "mask" ? baton::v1::TRUNCATION_MODE_MASK
                                                  : baton::v1::TRUNCATION_MODE_COMPACT;
  if (options.default_mode != baton::v1::TRUNCATION_MODE_OFF && options.default_keep != 0 &&
      options.default_keep < config->ring_capacity()) {
    baton::log::Error("cannot start",
                      {{"error", absl::StrCat("--default-keep ", options.default_keep,
                                              " is below the ring capacity C = ",
                                              config->ring_capacity())}});
    return 2;
  }
  options.hit_cap =
      hit_cap == "keep" ? baton::kvstore::HitCap::kKeep : baton::kvstore::HitCap::kRing;
  options.transport = transport == "grpc" ? baton::v1::TRANSPORT_GRPC : baton::v1::TRANSPORT_UCX;
  baton::router::RouterService service(*config, options);
  grpc::ServerBuilder builder;
  builder.RegisterService(static_cast<baton::v1::Generation::Service*>(&service));
  builder.RegisterService(static_cast<baton::v1::Registry::Service*>(&service));
  return baton::ServeUntilShutdown(
      "baton-router", builder, flags.server, {},
      [&](grpc::Server& started) { service.WatchHealth(&started); }, [&] { service.StopHealth(); });
}
