// `batonctl stores`: the prefix store's live nodes as a router sees them
// (baton.v1.Generation/ListStores), each with its counters, as one JSON object.
#include <chrono>
#include <iostream>
#include <string>

#include "baton/v1/generation.grpc.pb.h"
#include "client.h"
#include "commands.h"
#include "nlohmann/json.hpp"

namespace baton::tools {
namespace {

struct StoresOptions {
  ClientOptions client;
  int64_t timeout_ms = 10000;
};

int RunStores(const StoresOptions& o) {
  v1::ListStoresResponse reply;
  if (const int failed = CallRouter(o.client, o.timeout_ms, "stores",
                                    [&](v1::Generation::Stub& stub, grpc::ClientContext& context) {
                                      return stub.ListStores(&context, v1::ListStoresRequest(),
                                                             &reply);
                                    });
      failed != kExitOk) {
    return failed;
  }
  uint64_t values = 0;
  for (const v1::StoreStatus& store : reply.stores()) values += store.stats().block_kv_values();
  nlohmann::json stores = nlohmann::json::array();
  for (const v1::StoreStatus& store : reply.stores()) {
    const v1::KvStoreStats& s = store.stats();
    nlohmann::json entry = {{"node_id", store.node_id()},
                            {"model_fingerprint", store.model_fingerprint()},
                            {"answered", store.answered()},
                            {"skipped", store.skipped()}};
    if (!store.answered()) {
      entry["error"] = store.error();
    } else {
      entry.update({{"block_kv_values", s.block_kv_values()},
                    {"producer_swa_values", s.producer_swa_values()},
                    // The node's part of the fleet's block-KV values (R copies of each value).
                    {"value_share", values > 0 ? static_cast<double>(s.block_kv_values()) /
                                                     static_cast<double>(values)
                                               : 0.0},
                    {"stored_bytes", s.stored_bytes()},
                    {"budget_bytes", s.budget_bytes()},
                    {"reads_hit", s.hits()},
                    {"reads_missed", s.misses()},
                    {"bytes_read", s.bytes_read()},
                    {"bytes_written", s.bytes_written()},
                    {"evictions", s.evictions()},
                    {"corrupt_values", s.corrupt_values()}});
    }
    stores.push_back(std::move(entry));
  }
  std::cout << nlohmann::json{{"replication", reply.replication()},
                              {"live", reply.stores_size()},
                              {"stores", stores}}
                   .dump()
            << "\n";
  return kExitOk;
}

}  // namespace

Command AddStoresCommand(CLI::App& app) {
  auto o = std::make_shared<StoresOptions>();
  CLI::App* command = app.add_subcommand(
      "stores",
      "List a router's live prefix-store nodes (the set every lookup is placed over) with each "
      "node's values, bytes and reads; prints {\"replication\": R, \"live\": N, \"stores\": "
      "[...]}");
  AddClientFlags(*command, o->client);
  command->add_option("--timeout-ms", o->timeout_ms, "Deadline of the call (default 10000)")
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  return {command, [o] { return RunStores(*o); }};
}

}  // namespace baton::tools
