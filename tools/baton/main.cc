// `baton up`: the embedded default (DESIGN section 7). Starts baton-router, baton-kvstore
// (RocksDB under <data-dir>/kvstore), --prefill-nodes baton-prefill and --decode-nodes
// baton-decode on loopback (serving the trained model models/ced-brown-shared, one block-KV source,
// when no model is given, or generating --preset into the data dir) and prints the router address
// once it reports SERVING.
//
// Secure by default: a throwaway CA and one certificate per role (router, prefill, decode,
// kvstore, client) under <data-dir>/tls/, every internal surface on mutual TLS, the client
// port plaintext on loopback unless --client-tls (then TLS with the router's certificate), and
// --api-keys handed to the router.
//
// A component that exits on its own is started again on the same port (after 0.5 s, doubling
// to 10 s while it keeps failing within 30 s of its start), so faults can be tried by hand:
// kill -9 a decode node and its streams move to another and it comes back. Five quick
// failures in a row of one component stop everything (exit 1); --no-restart stops
// everything at the first exit instead. On SIGINT or SIGTERM every child is stopped and
// `baton up` exits only after all of them have exited.
//
// This file only declares the flags; the launcher library (baton/launcher/launcher.h) does the
// rest.
#include <cstdlib>
#include <iostream>
#include <string_view>

#include "CLI/CLI.hpp"
#include "baton/common/options.h"
#include "baton/common/wire_names.h"
#include "baton/kernels/backend_options.h"
#include "baton/launcher/launcher.h"

namespace {

// The decode nodes' flags baton up passes on.
void AddDecodeFlags(CLI::App& up, baton::launcher::LaunchOptions& options) {
  up.add_option("--replay-rows-per-step", options.replay_rows_per_step,
                "replay-on-decode: boundary rows each decode step replays beside the running "
                "streams' tokens")
      ->check(baton::InRange(int64_t{1}, int64_t{1} << 20));
  up.add_option("--replay-step-budget", options.replay_step_budget,
                "replay-on-decode: the share of the streams' step time a decode step's replay "
                "rows may add (baton-decode --replay-step-budget)")
      ->check(baton::InRange(0.0, 100.0));
  up.add_option("--speculative", options.speculative,
                "The decode nodes' speculative decoding: off, ngram (prompt lookup) or draft:DIR "
                "(a draft model with the served model's tokenizer, e.g. "
                "models/ced-brown-draft); requests may override it (default off)");
  up.add_option("--speculative-tokens", options.speculative_tokens,
                "Tokens drafted per step at most (0: the model's max_backtrack)")
      ->check(baton::InRange(int64_t{0}, int64_t{1} << 20));
  up.add_option("--speculative-policy", options.speculative_policy,
                "cost: drafts only as many tokens as pay for themselves at the measured costs "
                "(default); acceptance: always draft, as many as the acceptance suggests")
      ->check(baton::OneOf({"cost", "acceptance"}));
  up.add_option("--decode-pages", options.decode_pages, "Block-KV pages of each decode node")
      ->check(baton::InRange(1, 1 << 24));
  up.add_option("--threads-per-node", options.threads_per_node,
                "Threads of each prefill and decode node's CPU kernels (their OMP_NUM_THREADS, "
                "as the chart sets each pod's to its CPU request; default 0: every CPU of the "
                "machine, for each node)")
      ->check(baton::InRange(0, 1024));
}

// The config file, logs, the client API's access (host, TLS, API keys, internal TLS) and
// --set, which hands any flag to a role's processes.
void AddAccessAndSettingFlags(CLI::App& up, baton::launcher::LaunchOptions& options) {
  up.add_option("--config", options.config_file,
                "Config file handed to every component (each reads `common` and its own "
                "section); the addresses, ports and paths baton up sets win")
      ->check(CLI::ExistingFile);
  baton::AddEnumOption(up, "--log-format", options.log_format,
                       {baton::log::Format::kText, baton::log::Format::kJson},
                       baton::log::FormatName, "Components log as text or json");
  up.add_flag("--insecure-internal", options.insecure_internal,
              "Run the internal surfaces in plaintext (a baseline for benchmarks; trusted hosts "
              "only)");
  up.add_option("--host", options.host,
                "Address the router's client API and HTTP API listen on (default 127.0.0.1; "
                "the nodes stay on loopback)");
  up.add_flag("--client-tls", options.client_tls,
              "Serve the client API over TLS with <data-dir>/tls/router.crt (clients trust "
              "<data-dir>/tls/ca.crt)");
  up.add_option("--api-keys", options.api_keys,
                "YAML mapping API key -> tenant, handed to the router (clients send "
                "'authorization: Bearer <key>')")
      ->check(CLI::ExistingFile);
  up.add_option_function<std::vector<std::string>>(
      "--set",
      [&options](const std::vector<std::string>& items) {
        for (const std::string& item : items) {
          absl::StatusOr<baton::launcher::Setting> setting = baton::launcher::ParseSetting(item);
          if (!setting.ok()) throw CLI::ValidationError(std::string(setting.status().message()));
          options.settings.push_back(*std::move(setting));
        }
      },
      "ROLE.NAME=VALUE (repeatable): flag --NAME=VALUE for every baton-ROLE process (router, "
      "prefill, decode, kvstore), any flag of that binary that baton up does not set itself "
      "(baton-ROLE --print-options lists them), checked by the binary before anything starts");
}

// How requests are cut and moved between the nodes, and where the nodes run the model.
void AddPlacementFlags(CLI::App& up, baton::launcher::LaunchOptions& options) {
  using baton::model::Device;
  using baton::model::Split;
  using baton::model::WeightType;
  baton::AddEnumOption(up, "--transport", options.transport,
                       {baton::v1::TRANSPORT_UCX, baton::v1::TRANSPORT_GRPC}, baton::TransportName,
                       "StateBlock transport: ucx or grpc");
  baton::AddEnumOption(up, "--split", options.split, {Split::kPrefillAll, Split::kReplayOnDecode},
                       baton::model::SplitName,
                       "How requests are cut between the nodes: prefill-all (the prefill node "
                       "runs every layer) or replay-on-decode (it holds and runs the producers "
                       "only; the decode node replays the consumer layers)");
  baton::AddEnumOption(up, "--device", options.device.device, {Device::kCpu, Device::kCuda},
                       baton::model::DeviceName,
                       "Where prefill and decode nodes run the model: cpu, or cuda (a CUDA build "
                       "on a machine with a GPU; exits 2 naming the reason otherwise)");
  baton::AddEnumOption(up, "--weights", options.device.weights,
                       {WeightType::kFp32, WeightType::kBf16}, baton::model::WeightTypeName,
                       "How the nodes hold the model's weight matrices: fp32, or bf16 (--device "
                       "cpu only)");
  baton::AddEnumOption(
      up, "--cuda-prefill-attention", options.device.cuda_prefill_attention,
      {baton::kernels::PrefillAttention::kSimple, baton::kernels::PrefillAttention::kGemm},
      baton::kernels::PrefillAttentionName,
      "With --device cuda, the nodes' kernel for prefill chunks' attention: simple or gemm "
      "(default: the environment's BATON_CUDA_PREFILL_ATTENTION, else simple)");
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread exists: every thread blocks them, and only the supervisor takes them.
  baton::launcher::BlockShutdownSignals();

  baton::launcher::LaunchOptions options;
  CLI::App app{"baton: run a whole baton cluster on this machine"};
  app.require_subcommand(1);
  CLI::App* up = app.add_subcommand("up", "Start router, prefill and decode on loopback");
  baton::CaptureDefaults(*up);
  up->add_option("--model", options.model_dir,
                 "Model directory (default: the trained model ced-brown-shared that ships with "
                 "baton)");
  up->add_option("--preset", options.preset,
                 "Generate this preset (tiny, small, ...) into the data dir and serve it, instead "
                 "of the trained default");
  up->add_option("--port", options.port, "Router port (0: any free port)")
      ->check(baton::InRange(0, 65535));
  up->add_option("--data-dir", options.data_dir, "Where the generated model and run files go");
  AddPlacementFlags(*up, options);
  AddDecodeFlags(*up, options);
  up->add_option("--http-port", options.http_port,
                 "The router's OpenAI-compatible HTTP API (0: any free port; -1: off); served "
                 "when the model has a tokenizer")
      ->check(baton::InRange(-1, 65535));
  up->add_option("--tokenizer", options.tokenizer_dir,
                 "Folder whose tokenizer.model (and tokenizer_config.json, "
                 "generation_config.json) the generated model gets (default: the one "
                 "scripts/setup.sh builds)")
      ->check(CLI::ExistingDirectory);
  up->add_option("--prefill-nodes", options.prefill_nodes,
                 "baton-prefill processes to run (1 to 16)")
      ->check(baton::InRange(1, 16));
  up->add_option("--decode-nodes", options.decode_nodes, "baton-decode processes to run (1 to 16)")
      ->check(baton::InRange(1, 16));
  up->add_option("--kvstore-nodes", options.kvstore_nodes,
                 "baton-kvstore processes to run (1 to 16): the prefix store as a fleet named "
                 "kvstore, kvstore-1, ..., each under <data-dir>/<name>")
      ->check(baton::InRange(1, 16));
  up->add_option("--kvstore-replication", options.kvstore_replication,
                 "Owners of each stored value among the store nodes (1 to --kvstore-nodes): with "
                 "2 or more, losing a store node loses no hit")
      ->check(baton::InRange(1, 16));
  up->add_flag("--no-restart", options.no_restart,
               "Stop everything when a component exits, instead of starting it again");
  up->add_option("--kvstore-budget-bytes", options.kvstore_budget,
                 "Each prefix-store node's budget under <data-dir>/kvstore[-i] (default 8 GiB)")
      ->check(baton::InRange(uint64_t{0}, uint64_t{1} << 50));
  up->add_option("--block-cache-bytes", options.block_cache_bytes,
                 "Each prefill node's local block cache, looked in before the prefix store "
                 "(default 512 MiB; 0: none)")
      ->check(baton::InRange(uint64_t{0}, uint64_t{1} << 40));
  up->add_option("--prefill-policy", options.prefill_policy,
                 "The router's choice of prefill node: least-loaded, longest-prefix or "
                 "predicted-ttft (default)")
      ->check(baton::OneOf({"least-loaded", "longest-prefix", "predicted-ttft"}));
  up->add_option("--fidelity-sample-rate", options.fidelity_sample_rate,
                 "The router's share of truncated requests shadow verified on their decode node "
                 "(docs/fidelity.md; default 0)")
      ->check(baton::InRange(0.0, 1.0));
  AddAccessAndSettingFlags(*up, options);
  bool print_options = false;  // read from argv before parsing, below
  up->add_flag("--print-options", print_options,
               "Print baton up's options (name, type, default, range or allowed values, help) as "
               "JSON, and exit");
  for (int i = 2; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--print-options") {
      std::cout << baton::DescribeOptions(*up, "baton up", "up") << "\n";
      return 0;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // The environment, read once: the CUDA prefill attention kernel where no flag names it, handed
  // to the nodes as their flag.
  if (absl::Status s = baton::model::ApplyPrefillAttentionVariable(
          std::getenv(baton::kernels::kPrefillAttentionVariable), options.device);
      !s.ok()) {
    std::cerr << "baton up: " << s.message() << "\n";
    return 2;
  }

  baton::launcher::Supervisor children;
  if (absl::Status s = baton::launcher::StartCluster(options, children); !s.ok()) {
    std::cerr << "baton up: " << s.message() << "\n";
    children.StopAll();
    return baton::launcher::ExitCode(s);
  }
  const absl::Status ended = children.Supervise(/*restart=*/!options.no_restart);
  if (!ended.ok()) std::cerr << "baton up: " << ended.message() << "\n";
  children.StopAll();
  std::cout << "baton up: stopped" << std::endl;
  return baton::launcher::ExitCode(ended);
}
