// baton-kvstore: the prefix store as a service (RocksDB under --data-dir), with
// grpc.health.v1; registers with the router.
#include "CLI/CLI.hpp"
#include "baton/common/options.h"
#include "baton/common/rpc.h"
#include "baton/common/server_flags.h"
#include "baton/kvstore/kvstore_service.h"
#include "baton/model/state.h"
#include "baton/model/weights.h"

int main(int argc, char** argv) {
  baton::BlockShutdownSignals();
  CLI::App app{"baton-kvstore: the prefix store"};
  baton::CaptureDefaults(app);
  std::string model_dir, router, data_dir;
  baton::ServerFlags flags;
  uint64_t budget = 0;
  app.add_option("--model", model_dir,
                 "Model directory: the size of every value, and the model of calls that name "
                 "none; values of other models of its shape (a rollout's) are kept and served "
                 "to their own readers")
      ->required();
  app.add_option("--data-dir", data_dir, "RocksDB folder")->required();
  app.add_option("--budget-bytes", budget, "Bytes of stored values at most (0: unlimited)")
      ->check(baton::InRange(uint64_t{0}, uint64_t{1} << 50));
  std::string weights_sha256;
  app.add_option("--weights-sha256", weights_sha256,
                 "SHA-256 of the model's model.safetensors (64 hex digits): the store's "
                 "fingerprint is then made from config.json and this digest, and the weights "
                 "need not be in --model (the store reads no tensor; the chart fetches only "
                 "config.json for it). It must be the served weights' digest: the store registers "
                 "its fingerprint (baton_router_nodes_by_model shows a skew)");
  bool sync_writes = false;
  app.add_flag("--sync-writes", sync_writes,
               "fsync the write-ahead log at every write and delete: acknowledged blocks survive "
               "a machine crash, not only a process crash");
  baton::kvstore::StoreCompression compression = baton::kvstore::StoreCompression::kSnappy;
  baton::AddEnumOption(
      app, "--compression", compression,
      {baton::kvstore::StoreCompression::kNone, baton::kvstore::StoreCompression::kSnappy,
       baton::kvstore::StoreCompression::kLz4, baton::kvstore::StoreCompression::kZstd},
      baton::kvstore::StoreCompressionName,
      "How RocksDB compresses the stored values on disk: none, snappy (RocksDB's "
      "default), lz4 or zstd (the most disk saved; the budget counts payload "
      "bytes either way)");
  baton::AddServerFlags(app, flags);
  app.add_option("--router", router, "Router address to register with");
  std::string node_id = "kvstore";
  app.add_option("--node-id", node_id,
                 "Name reported to the router; placement weighs it (kvstore/placement.h), so a "
                 "restarted store node keeps its name to keep its values (the chart: the pod's "
                 "name)");
  if (auto exit = baton::ParseServerFlags(app, argc, argv, "baton-kvstore", "kvstore", flags)) {
    return *exit;
  }
  auto fingerprint = baton::model::ModelFingerprint(model_dir, weights_sha256);
  // The model's layout fixes the size of every value the store accepts.
  auto config = baton::LoadModelConfig(model_dir + "/config.json");
  for (const absl::Status& s : {fingerprint.status(), config.status()}) {
    if (!s.ok()) {
      baton::log::Error("cannot start", {{"error", std::string(s.message())}});
      return 2;
    }
  }
  const auto layout = baton::model::StateLayout::For(*config);
  auto store = baton::kvstore::PrefixStore::Open(
      {.path = data_dir,
       .model_fingerprint = *fingerprint,
       .budget_bytes = budget,
       .block_kv_payload_bytes = sizeof(float) * layout.page_floats(),
       .producer_swa_payload_bytes = sizeof(float) * layout.stored_swa_block_floats(),
       .sync_writes = sync_writes,
       .compression = compression});
  if (!store.ok()) {
    baton::log::Error("cannot start", {{"error", std::string(store.status().message())}});
    return 1;
  }
  const uint64_t max_chain_blocks = config->max_position_embeddings / config->kv_block_size;
  baton::kvstore::KvStoreService service(**store, max_chain_blocks);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  return baton::ServeUntilShutdown(
      "baton-kvstore", builder, flags.server,
      baton::NodeRegistration(router, node_id, baton::v1::NODE_ROLE_KVSTORE, *fingerprint,
                              [] { return baton::v1::LoadReport(); }));
}
