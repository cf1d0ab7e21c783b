// Everything `baton up`'s flags set, with the flags' defaults. main.cc declares the flags into
// one LaunchOptions (an enum-valued flag as its enum) and settles what the environment adds
// (BATON_CUDA_PREFILL_ATTENTION); the launcher reads it and never changes it. CLI11 has checked
// the ranges and names main gives it; the launcher checks the rest (that the device is here,
// the weight type on it, UCX_TLS, --model against --preset) before anything starts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/common/log.h"
#include "baton/model/engine_factory.h"
#include "baton/model/split.h"
#include "baton/v1/node.pb.h"

namespace baton::launcher {

// One `--set ROLE.NAME=VALUE`: flag --NAME VALUE for every process of ROLE (ParseSetting).
struct Setting {
  std::string role;  // router, prefill, decode or kvstore
  std::string name;  // the flag without dashes, as the binary's --print-options names it
  std::string value;
};

struct LaunchOptions {
  // The model. Neither --model nor --preset: the trained ced-brown-shared beside the binary,
  // else the small preset generated into the data dir.
  std::string model_dir;      // --model
  std::string preset;         // --preset: generated into <data-dir>/model[-<preset>]
  std::string tokenizer_dir;  // --tokenizer: the generated model's tokenizer; empty: searched

  // The router.
  int port = 50051;                // --port: client API (0: any free port)
  int http_port = 8000;            // --http-port: OpenAI API (0: any free port; -1: off)
  std::string host = "127.0.0.1";  // --host: where the client and HTTP APIs listen
  bool client_tls = false;         // --client-tls: the client API on TLS (router.crt)
  std::string api_keys;            // --api-keys: YAML file, API key -> tenant
  v1::Transport transport = v1::TRANSPORT_UCX;     // --transport: StateBlock transport
  model::Split split = model::Split::kPrefillAll;  // --split (router, prefill)
  int64_t replay_rows_per_step = 8;    // --replay-rows-per-step: the decode nodes' replay pieces
  double replay_step_budget = 1.0;     // --replay-step-budget: their share of a step's time
  std::string speculative = "off";     // --speculative: the decode nodes' drafter
  int64_t speculative_tokens = 0;      // --speculative-tokens: drafted per step (0: max_backtrack)
  std::string speculative_policy = "cost";
  // The nodes.
  int prefill_nodes = 1;         // --prefill-nodes (1 to 16)
  int decode_nodes = 1;          // --decode-nodes (1 to 16)
  int64_t decode_pages = 2048;   // --decode-pages: block-KV pages of each decode node
  // --threads-per-node: each prefill and decode node's CPU thread team (its OMP_NUM_THREADS);
  // 0: the node's own default, a thread for every CPU it may run on.
  int threads_per_node = 0;
  // --device, --weights (bf16: cpu only), --cuda-prefill-attention (unset: the environment's
  // BATON_CUDA_PREFILL_ATTENTION as main read it, else the nodes' default).
  model::DeviceFlags device;
  int kvstore_nodes = 1;               // --kvstore-nodes (1 to 16): kvstore, kvstore-1, ...
  int kvstore_replication = 1;         // --kvstore-replication (1 to --kvstore-nodes): the router's
  uint64_t kvstore_budget = uint64_t{8} << 30;       // --kvstore-budget-bytes, each store node's
  uint64_t block_cache_bytes = uint64_t{512} << 20;  // --block-cache-bytes: each prefill node's
  // --prefill-policy: the router's (its enum, handed on by name)
  std::string prefill_policy = "predicted-ttft";
  double fidelity_sample_rate = 0;  // --fidelity-sample-rate: the router's (docs/fidelity.md)

  // Every component.
  std::string data_dir = "baton-data";  // --data-dir: run/, tls/, kvstore/, generated models
  std::string config_file;              // --config: handed to every component
  log::Format log_format = log::Format::kText;  // --log-format
  bool insecure_internal = false;       // --insecure-internal: no mutual TLS inside
  bool no_restart = false;              // --no-restart: the first exit stops everything
  // --set ROLE.NAME=VALUE (repeatable): any flag of a role's binary that baton up does not set
  // itself, handed to each of its processes after baton up's own and checked by that binary's
  // --check-config before anything starts (CheckSettings).
  std::vector<Setting> settings;
};

// "ROLE.NAME=VALUE" as a Setting; INVALID_ARGUMENT naming --set and what is allowed otherwise.
absl::StatusOr<Setting> ParseSetting(const std::string& item);

}  // namespace baton::launcher
