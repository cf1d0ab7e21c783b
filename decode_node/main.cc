// baton-decode: a decode node. Loads the model, maps its state pools (allocated through UCX),
// serves DecodeNode plus grpc.health.v1, and registers with the router (node/node_main.h).
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "baton/common/options.h"
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
      ->check(baton::InRange(1, 1 << 20));
  app.add_option("--pages", options.pages, "Block-KV pages in the pool")
      ->check(baton::InRange(1, 1 << 24));
  app.add_option("--replay-rows-per-step", options.replay_rows_per_step,
                 "Replay-on-decode: boundary rows of arriving prompts replayed per decode step "
                 "while streams are decoding (default 8; a step with none decoding takes up to "
                 "512)")
      ->check(baton::InRange(int64_t{1}, int64_t{1} << 20));
  app.add_option("--replay-step-budget", options.replay_step_budget,
                 "Replay-on-decode: the share of the decoding streams' step time that a step's "
                 "replay rows may add, priced at the replay piece costs this node measures "
                 "(default 1: a step at most twice the streams' own; 0.5 for 1.5x), within "
                 "--replay-rows-per-step and at least a row a step; 0: the row bound alone")
      ->check(baton::InRange(0.0, 100.0));
  app.add_option("--draft-rows-per-step", options.draft_rows_per_step,
                 "Speculative decoding with a draft model: prompt rows the draft model takes in "
                 "per decode step, over all requests (default 64); a longer prompt is taken in "
                 "over several steps and drafts once it has caught up")
      ->check(baton::InRange(int64_t{1}, int64_t{1} << 20));
  app.add_option("--fidelity-queue", options.fidelity_queue,
                 "Shadow verifications that may wait for spare capacity (run at the lowest "
                 "priority, docs/fidelity.md), and requests that may hold their served logits "
                 "for one at once; one more is dropped and counted in "
                 "baton_fidelity_shadows_total{outcome=\"dropped\"} (default 4)")
      ->check(baton::InRange(int64_t{1}, int64_t{1024}));
  app.add_option("--max-batch", options.max_batch, "Requests per decode step")
      ->check(baton::InRange(1, 1 << 16));
  app.add_option("--max-waiting", options.max_waiting,
                 "Reservations that may wait for memory before RESOURCE_EXHAUSTED")
      ->check(baton::InRange(0, 1 << 20));
  app.add_flag("--ucx-peer-errors", options.ucx_peer_errors,
               "UCX endpoints with peer error handling: a dead prefill node fails its transfer "
               "instead of this process (network transports only: UCX 1.13 cannot use shared "
               "memory with it)");
  app.add_option("--watchdog-ms", options.watchdog_ms,
                 "Liveness turns NOT_SERVING when the decode loop has not advanced for this long "
                 "while it has requests (default 30000)")
      ->check(baton::InRange(int64_t{10}, int64_t{3600000}));
  app.add_option("--inject-step-stall-ms", options.inject_step_stall_ms,
                 "Tests: sleep this long before each decode step (a wedged worker)")
      ->check(baton::InRange(int64_t{0}, int64_t{3600000}));
  app.add_option("--fidelity-inject-stall-ms", options.fidelity_inject_stall_ms,
                 "Tests: each shadow verification waits this long before it runs")
      ->check(baton::InRange(int64_t{0}, int64_t{3600000}));
  app.add_flag("--inject-consumer-ring-fault", options.inject_consumer_ring_fault,
               "Tests: zero each request's consumer SWA rings once its prompt is in (a consumer "
               "replay made wrong, for shadow verification's tests)");
  app.add_flag("--poison-freed-memory", options.poison_freed_memory,
               "Fill freed pool memory with a poison pattern and count writes into it "
               "(baton_pool_poison_violations; for tests and debugging). It watches the host "
               "pool: with --device cuda, decode steps write the pool's device mirror instead");
}

// The flags resolved once the model is loaded (ResolveDecodeOptions).
struct DecodeFlagText {
  std::string transfer_faults;
  std::string stream_idle_timeout = "60s";
  std::string speculative = "off";
  int64_t speculative_tokens = 0;
  baton::decode_node::SpeculativePolicy speculative_policy =
      baton::decode_node::SpeculativePolicy::kCost;
};

void AddDecodeTextFlags(CLI::App& app, DecodeFlagText& text) {
  app.add_option("--inject-transfer-faults", text.transfer_faults,
                 "Faults in every StateBlock read, for tests: drop=P,corrupt=P,truncate=P,"
                 "delay_ms=N,seed=N");
  app.add_option("--stream-idle-timeout", text.stream_idle_timeout,
                 "Cancel a stream, and free its slot and pages, once its reader (the router) has "
                 "taken no message for this long (30s, 500ms, 2m; a bare number is seconds; 0: "
                 "never)");
  app.add_option(
      "--speculative", text.speculative,
      "Speculative decoding: off, ngram (prompt lookup over the prompt and the tokens so "
      "far) or draft:DIR (a draft model with the same tokenizer, run beside the model); "
      "a request may choose among what this enables (off enables neither, ngram prompt lookup, "
      "draft:DIR both) and is refused asking for more (default off)");
  app.add_option("--speculative-tokens", text.speculative_tokens,
                 "Tokens drafted per step at most, adapted per request to its acceptance (0: the "
                 "model's max_backtrack, which is also the most allowed)")
      ->check(baton::InRange(int64_t{0}, int64_t{1} << 20));
  using baton::decode_node::SpeculativePolicy;
  baton::AddEnumOption(app, "--speculative-policy", text.speculative_policy,
                       {SpeculativePolicy::kCost, SpeculativePolicy::kAcceptance},
                       baton::decode_node::SpeculativePolicyName,
                       "cost: a request drafts as many tokens as pay for themselves at the step "
                       "and draft costs this node measures, none when none do (the default); "
                       "acceptance: it always drafts, as many as its recent acceptance suggests");
}

// The text flags and the node's into `options`, against the loaded model; an error names the
// flag (exit 2).
absl::Status ResolveDecodeOptions(const DecodeFlagText& text, const baton::node::NodeFlags& flags,
                                  const baton::model::Engine& engine,
                                  baton::decode_node::DecodeOptions& options) {
  absl::StatusOr<baton::decode_node::SpeculativeConfig> speculative =
      baton::decode_node::ParseSpeculative(text.speculative, text.speculative_tokens,
                                           text.speculative_policy, engine.config());
  if (!speculative.ok()) return speculative.status();
  options.speculative = *speculative;
  if (options.speculative.drafter == baton::decode_node::Drafter::kDraft) {
    auto draft =
        baton::decode_node::DraftModel::Load(options.speculative.draft_dir, flags.model_dir, engine,
                                             flags.device, options.speculative.tokens);
    if (!draft.ok()) return draft.status();
    options.draft_model = *std::move(draft);
  }
  absl::StatusOr<std::chrono::milliseconds> idle =
      baton::ParseStreamIdleTimeout(text.stream_idle_timeout);
  if (!idle.ok()) return idle.status();
  options.stream_idle_timeout = *idle;
  if (!text.transfer_faults.empty()) {
    auto spec = baton::transfer::ParseFaultSpec(text.transfer_faults);
    if (!spec.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--inject-transfer-faults: ", spec.status().message()));
    }
    options.transfer_faults = *spec;
  }
  options.use_ucx = !flags.no_ucx;
  options.ucx_allow_unprotected_tcp = flags.ucx_allow_unprotected_tcp;
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  baton::BlockShutdownSignals();
  CLI::App app{"baton-decode: decode node"};
  baton::CaptureDefaults(app);
  baton::node::NodeFlags flags{.node_id = "decode"};
  baton::node::AddNodeFlags(app, flags);
  baton::decode_node::DecodeOptions options;
  AddDecodeFlags(app, options);
  DecodeFlagText text;
  AddDecodeTextFlags(app, text);
  baton::node::NodeStart start =
      baton::node::StartNode(app, argc, argv, "baton-decode", "decode", flags);
  if (start.exit) return *start.exit;
  if (absl::Status s = ResolveDecodeOptions(text, flags, *start.engine, options); !s.ok()) {
    std::cerr << s.message() << "\n";
    return 2;
  }
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
