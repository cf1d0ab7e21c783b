// baton-prefill: a prefill node. Loads the model, serves PrefillNode plus grpc.health.v1,
// and registers with the router (node/node_main.h).
#include "CLI/CLI.hpp"
#include "baton/common/options.h"
#include "baton/node/node_main.h"
#include "baton/prefill_node/prefill_service.h"
#include "baton/transfer/ucx.h"

namespace {

// The flags that set PrefillOptions, in --help's order.
void AddPrefillFlags(CLI::App& app, baton::prefill_node::PrefillOptions& options) {
  app.add_option("--token-budget", options.token_budget, "Rows per prefill chunk")
      ->check(baton::InRange(1, 1 << 24));
  app.add_option("--kvstore", options.kvstore_address,
                 "Prefix store (baton-kvstore) address for requests that name no store nodes "
                 "(a router with live store nodes sends them with each request)");
  app.add_option("--store-read-min-ms", options.store_read_min_ms,
                 "A hit's store reads end at its predicted compute time (then it is computed), "
                 "and no sooner than this (default 50)")
      ->check(baton::InRange(int64_t{1}, int64_t{600000}));
  app.add_option("--write-back-bytes", options.write_back_bytes,
                 "Block payload bytes waiting for the prefix store at most (default 256 MiB)")
      ->check(baton::InRange(uint64_t{1} << 20, uint64_t{1} << 40));
  app.add_option("--commit-timeout-ms", options.commit_timeout_ms,
                 "How long a commit, and so the decode node's read of the exposed regions, may "
                 "take (default 30000)")
      ->check(baton::InRange(1, 600000));
  app.add_option("--watchdog-ms", options.watchdog_ms,
                 "Liveness turns NOT_SERVING when a prefill has computed no chunk for this long "
                 "(default 30000)")
      ->check(baton::InRange(int64_t{10}, int64_t{3600000}));
  app.add_option("--max-staged-requests", options.max_staged_requests,
                 "Requests holding staging memory at once, from before the model through the "
                 "commit (default 4)")
      ->check(baton::InRange(int64_t{1}, int64_t{1} << 16));
  app.add_option("--staging-cache-bytes", options.staging_cache_bytes,
                 "Idle staging memory kept for reuse, each buffer only for requests to the same "
                 "decode node (default 1 GiB; 0: register staging memory per request)")
      ->check(baton::InRange(uint64_t{0}, uint64_t{1} << 40));
  app.add_option("--block-cache-bytes", options.block_cache_bytes,
                 "Memory for recently used blocks (block KV and producer SWA rows), looked in "
                 "before the prefix store; the router routes by what it holds (default 0: none)")
      ->check(baton::InRange(uint64_t{0}, uint64_t{1} << 40));
}

}  // namespace

int main(int argc, char** argv) {
  baton::BlockShutdownSignals();
  CLI::App app{"baton-prefill: prefill node"};
  baton::CaptureDefaults(app);
  baton::node::NodeFlags flags{.node_id = "prefill"};
  baton::node::AddNodeFlags(app, flags);
  baton::node::AddSplitFlag(app, flags);
  baton::prefill_node::PrefillOptions options;
  AddPrefillFlags(app, options);
  baton::node::NodeStart start =
      baton::node::StartNode(app, argc, argv, "baton-prefill", "prefill", flags);
  if (start.exit) return *start.exit;
  options.use_ucx = !flags.no_ucx;
  options.split = start.split;
  options.ucx_allow_unprotected_tcp = flags.ucx_allow_unprotected_tcp;
  // UCX over RDMA pins the staging memory kept for reuse (and each request's while it waits
  // for its reader): a memlock limit below the cache is refused here, by name.
  if (options.use_ucx) {
    if (std::optional<int> exit = baton::transfer::RefuseUnlockableUcxMemory(
            flags.ucx_allow_unprotected_tcp, options.staging_cache_bytes,
            "the staging cache (--staging-cache-bytes)")) {
      return *exit;
    }
  }
  baton::prefill_node::PrefillService service(*start.engine, options);
  baton::node::NodeHooks hooks = baton::node::HooksOf(service);
  // Decode nodes read this node's staging memory by UCX from this worker only.
  hooks.ucx_worker_address = service.ucx_worker_address();
  if (service.has_block_cache()) {
    hooks.cache = {.take = [&service] { return service.CacheEvents(); },
                   .resync = [&service] { service.CacheResync(); }};
  }
  return baton::node::ServeNode("baton-prefill", flags, baton::v1::NODE_ROLE_PREFILL, *start.engine,
                                service, std::move(hooks));
}
