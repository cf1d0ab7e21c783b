#include "baton/launcher/child_commands.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "baton/common/pki.h"
#include "baton/common/wire_names.h"
#include "baton/kernels/backend_options.h"

namespace baton::launcher {

std::string InstanceName(const std::string& role, int i) {
  return i == 0 ? role : role + "-" + std::to_string(i);
}

ChildCommand ChildCommands::Router() const {
  std::vector<std::string> args = {"--model",
                                   model_.dir,
                                   "--port",
                                   std::to_string(options_.port),
                                   "--transport",
                                   std::string(TransportName(options_.transport)),
                                   "--split",
                                   std::string(model::SplitName(options_.split)),
                                   "--prefill-policy",
                                   options_.prefill_policy,
                                   "--require-kvstore",
                                   "--kvstore-replication",
                                   std::to_string(options_.kvstore_replication),
                                   "--internal-ready-file",
                                   layout_.ReadyFile(kRouterInternal)};
  if (options_.client_tls) {
    args.insert(args.end(), {"--client-tls-cert", (layout_.tls() / "router.crt").string(),
                             "--client-tls-key", (layout_.tls() / "router.key").string()});
  }
  if (!options_.api_keys.empty()) args.insert(args.end(), {"--api-keys", options_.api_keys});
  if (options_.fidelity_sample_rate > 0) {
    args.insert(args.end(),
                {"--fidelity-sample-rate", absl::StrCat(options_.fidelity_sample_rate)});
  }
  if (options_.host != "127.0.0.1") args.insert(args.end(), {"--host", options_.host});
  args.insert(args.end(), model_.name_flags.begin(), model_.name_flags.end());
  if (model_.http) {
    args.insert(args.end(), {"--http-port", std::to_string(options_.http_port), "--http-ready-file",
                             layout_.ReadyFile(kRouterHttp)});
  }
  return Make("router", "router", std::move(args));
}

ChildCommand ChildCommands::Kvstore(int i, const std::string& router_internal) const {
  const std::string name = InstanceName("kvstore", i);
  return Make(name, "kvstore",
              {"--model", model_.dir, "--router", router_internal, "--node-id", name, "--data-dir",
               (layout_.data_dir / name).string(), "--budget-bytes",
               std::to_string(options_.kvstore_budget)});
}

ChildCommand ChildCommands::Decode(int i, const std::string& router_internal) const {
  const std::string name = InstanceName("decode", i);
  std::vector<std::string> args = {"--model",
                                   model_.dir,
                                   "--router",
                                   router_internal,
                                   "--node-id",
                                   name,
                                   "--pages",
                                   std::to_string(options_.decode_pages),
                                   "--device",
                                   std::string(model::DeviceName(options_.device.device)),
                                   "--weights",
                                   std::string(model::WeightTypeName(options_.device.weights)),
                                   "--replay-rows-per-step",
                                   std::to_string(options_.replay_rows_per_step),
                                   "--replay-step-budget",
                                   absl::StrCat(options_.replay_step_budget),
                                   "--speculative",
                                   options_.speculative,
                                   "--speculative-tokens",
                                   std::to_string(options_.speculative_tokens),
                                   "--speculative-policy",
                                   options_.speculative_policy};
  AppendModelFlags(args);
  ChildCommand command = Make(name, "decode", std::move(args));
  AppendTeamSize(command);
  return command;
}

ChildCommand ChildCommands::Prefill(int i, const std::string& router_internal,
                                    const std::string& kvstore) const {
  const std::string name = InstanceName("prefill", i);
  std::vector<std::string> args = {"--model",
                                   model_.dir,
                                   "--router",
                                   router_internal,
                                   "--node-id",
                                   name,
                                   "--kvstore",
                                   kvstore,
                                   "--device",
                                   std::string(model::DeviceName(options_.device.device)),
                                   "--weights",
                                   std::string(model::WeightTypeName(options_.device.weights)),
                                   "--split",
                                   std::string(model::SplitName(options_.split)),
                                   "--block-cache-bytes",
                                   std::to_string(options_.block_cache_bytes)};
  AppendModelFlags(args);
  ChildCommand command = Make(name, "prefill", std::move(args));
  AppendTeamSize(command);
  return command;
}

// The CPU kernels' thread team follows OMP_NUM_THREADS (kernels/cpu_team.h), which the chart
// sets to each pod's CPU request: so sized, nodes on one machine do not all contend for every
// core of it.
void ChildCommands::AppendTeamSize(ChildCommand& command) const {
  if (options_.threads_per_node > 0) {
    command.env.push_back("OMP_NUM_THREADS=" + std::to_string(options_.threads_per_node));
  }
}

void ChildCommands::AppendModelFlags(std::vector<std::string>& args) const {
  if (options_.device.cuda_prefill_attention) {
    args.insert(args.end(),
                {"--cuda-prefill-attention",
                 kernels::PrefillAttentionName(*options_.device.cuda_prefill_attention)});
  }
  args.insert(args.end(), model_.name_flags.begin(), model_.name_flags.end());
}

ChildCommand ChildCommands::Make(const std::string& name, const std::string& role,
                                 std::vector<std::string> args) const {
  const std::vector<std::string> identity = IdentityFlags(name, role);
  args.insert(args.end(), identity.begin(), identity.end());
  args.insert(args.end(), {"--metrics-port", "0", "--metrics-ready-file", layout_.MetricsFile(name),
                           "--log-format", log::FormatName(options_.log_format), "--ready-file",
                           layout_.ReadyFile(name)});
  if (!options_.config_file.empty()) args.insert(args.end(), {"--config", options_.config_file});
  for (const Setting& setting : options_.settings) {
    // One argument, --NAME=VALUE, so that a flag takes a value too (--sync-writes=false).
    if (setting.role == role) args.push_back("--" + setting.name + "=" + setting.value);
  }
  return {name, layout_.Program("baton-" + role), std::move(args), layout_.ReadyFile(name)};
}

// Mutual TLS inside the cluster: the router with its role's certificate, each node with its
// own (MakeClusterPki), whose instance is the node_id it registers.
std::vector<std::string> ChildCommands::IdentityFlags(const std::string& name,
                                                      const std::string& role) const {
  if (options_.insecure_internal) return {"--insecure-internal"};
  const std::filesystem::path tls = layout_.tls();
  const std::string stem =
      role == "router" ? (tls / role).string() : pki::NodeCertificateStem(tls.string(), name);
  return {"--tls-ca",   (tls / "ca.crt").string(), "--tls-cert", stem + ".crt", "--tls-key",
          stem + ".key"};
}

}  // namespace baton::launcher
