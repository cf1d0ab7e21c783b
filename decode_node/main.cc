// baton-decode: a decode node. Loads the model, maps its state pools (allocated through UCX),
// serves DecodeNode plus grpc.health.v1, and registers with the router (node/node_main.h).
#include <iostream>

#include "CLI/CLI.hpp"
#include "baton/common/stream_watch.h"
#include "baton/decode_node/decode_service.h"
#include "baton/decode_node/state_pool.h"
#include "baton/node/node_main.h"
#include "baton/transfer/transport.h"
#include "baton/transfer/ucx.h"

namespace {

// The flags that set DecodeOptions, in --help's order.
void AddDecodeFlags(CLI::App& app, baton::decode_node::DecodeOptions& options) {
  app.add_option("--slots", options.slots, "State slots (concurrent requests)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--pages", options.pages, "Block-KV pages in the pool")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--replay-rows-per-step", options.replay_rows_per_step,
                 "Replay-on-decode: boundary rows of arriving prompts replayed per decode step "
                 "while streams are decoding (default 8; a step with none decoding takes up to "
                 "512)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--draft-rows-per-step", options.draft_rows_per_step,
                 "Speculative decoding with a draft model: prompt rows the draft model takes in "
                 "per decode step, over all requests (default 64); a longer prompt is taken in "
                 "over several steps and drafts once it has caught up")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--max-batch", options.max_batch, "Requests per decode step")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--max-waiting", options.max_waiting,
                 "Reservations that may wait for memory before RESOURCE_EXHAUSTED")
      ->check(CLI::Range(0, 1 << 20));
  app.add_flag("--ucx-peer-errors", options.ucx_peer_errors,
               "UCX endpoints with peer error handling: a dead prefill node fails its transfer "
               "instead of this process (network transports only: UCX 1.13 cannot use shared "
               "memory with it)");
  app.add_option("--watchdog-ms", options.watchdog_ms,
                 "Liveness turns NOT_SERVING when the decode loop has not advanced for this long "
                 "while it has requests (default 30000)")
      ->check(CLI::Range(int64_t{10}, int64_t{3600000}));
  app.add_option("--inject-step-stall-ms", options.inject_step_stall_ms,
                 "Tests: sleep this long before each decode step (a wedged worker)")
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}));
  app.add_flag("--poison-freed-memory", options.poison_freed_memory,
               "Fill freed pool memory with a poison pattern and count writes into it "
               "(baton_pool_poison_violations; for tests and debugging). It watches the host "
               "pool: with --device cuda, decode steps write the pool's device mirror instead");
}

}  // namespace

int main(int argc, char** argv) {
  baton::BlockShutdownSignals();
  CLI::App app{"baton-decode: decode node"};
  baton::node::NodeFlags flags{.node_id = "decode"};
  baton::node::AddNodeFlags(app, flags);
  baton::decode_node::DecodeOptions options;
  AddDecodeFlags(app, options);
  std::string transfer_faults;
  app.add_option("--inject-transfer-faults", transfer_faults,
                 "Faults in every StateBlock read, for tests: drop=P,corrupt=P,truncate=P,"
                 "delay_ms=N,seed=N");
  std::string stream_idle_timeout = "60s";
  app.add_option("--stream-idle-timeout", stream_idle_timeout,
                 "Cancel a stream, and free its slot and pages, once its reader (the router) has "
                 "taken no message for this long (30s, 500ms, 2m; a bare number is seconds; 0: "
                 "never)");
  std::string speculative = "off";
  app.add_option(
      "--speculative", speculative,
      "Speculative decoding: off, ngram (prompt lookup over the prompt and the tokens so "
      "far) or draft:DIR (a draft model with the same tokenizer, run beside the model); "
      "a request may choose among what this enables (off enables neither, ngram prompt lookup, "
      "draft:DIR both) and is refused asking for more (default off)");
  int64_t speculative_tokens = 0;
  app.add_option("--speculative-tokens", speculative_tokens,
                 "Tokens drafted per step at most, adapted per request to its acceptance (0: the "
                 "model's max_backtrack, which is also the most allowed)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  std::string speculative_policy = "cost";
  app.add_option("--speculative-policy", speculative_policy,
                 "cost: a request drafts as many tokens as pay for themselves at the step and "
                 "draft costs this node measures, none when none do (the default); acceptance: "
                 "it always drafts, as many as its recent acceptance suggests");
  baton::node::NodeStart start =
      baton::node::StartNode(app, argc, argv, "baton-decode", "decode", flags);
  if (start.exit) return *start.exit;
  if (auto config = baton::decode_node::ParseSpeculative(
          speculative, speculative_tokens, speculative_policy, start.engine->config());
      config.ok()) {
    options.speculative = *config;
  } else {
    std::cerr << config.status().message() << "\n";
    return 2;
  }
  if (options.speculative.drafter == baton::decode_node::Drafter::kDraft) {
    auto draft = baton::decode_node::DraftModel::Load(options.speculative.draft_dir,
                                                      flags.model_dir, *start.engine, flags.device,
                                                      options.speculative.tokens);
    if (!draft.ok()) {
      std::cerr << draft.status().message() << "\n";
      return 2;
    }
    options.draft_model = *std::move(draft);
  }
  if (auto idle = baton::ParseStreamIdleTimeout(stream_idle_timeout); idle.ok()) {
    options.stream_idle_timeout = *idle;
  } else {
    std::cerr << idle.status().message() << "\n";
    return 2;
  }
  if (!transfer_faults.empty()) {
    auto spec = baton::transfer::ParseFaultSpec(transfer_faults);
    if (!spec.ok()) {
      std::cerr << "--inject-transfer-faults: " << spec.status().message() << "\n";
      return 2;
    }
    options.transfer_faults = *spec;
  }
  options.use_ucx = !flags.no_ucx;
  options.ucx_allow_unprotected_tcp = flags.ucx_allow_unprotected_tcp;
  // UCX over RDMA pins the whole pool: a memlock limit below it is refused here, by name,
  // instead of every request failing once the registration does.
  if (options.use_ucx) {
    if (std::optional<int> exit = baton::transfer::RefuseUnlockableUcxMemory(
            flags.ucx_allow_unprotected_tcp,
            baton::decode_node::StatePool::BytesFor(start.engine->state_layout(), options.slots,
                                                    options.pages),
            "the decode pool (--slots, --pages)")) {
      return *exit;
    }
  }
  baton::decode_node::DecodeService service(*start.engine, options);
  if (!service.status().ok()) {
    baton::log::Error("cannot start", {{"error", std::string(service.status().message())}});
    return 2;
  }
  return baton::node::ServeNode("baton-decode", flags, baton::v1::NODE_ROLE_DECODE, *start.engine,
                                service, baton::node::HooksOf(service));
}
