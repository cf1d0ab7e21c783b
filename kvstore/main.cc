// baton-kvstore: the prefix store as a service (RocksDB under --data-dir), with
// grpc.health.v1; registers with the router.
#include "CLI/CLI.hpp"
#include "baton/common/rpc.h"
#include "baton/common/server_flags.h"
#include "baton/kvstore/kvstore_service.h"
#include "baton/model/weights.h"

int main(int argc, char** argv) {
  baton::BlockShutdownSignals();
  CLI::App app{"baton-kvstore: the prefix store"};
  std::string model_dir, router, data_dir;
  baton::ServerFlags flags;
  uint64_t budget = 0;
  app.add_option("--model", model_dir, "Model directory (values carry its fingerprint)")
      ->required();
  app.add_option("--data-dir", data_dir, "RocksDB folder")->required();
  app.add_option("--budget-bytes", budget, "Bytes of stored values at most (0: unlimited)");
  baton::AddServerFlags(app, flags);
  app.add_option("--router", router, "Router address to register with");
  if (auto exit = baton::ParseServerFlags(app, argc, argv, "baton-kvstore", "kvstore", flags)) {
    return *exit;
  }
  auto fingerprint = baton::model::ModelFingerprint(model_dir);
  if (!fingerprint.ok()) {
    baton::log::Error("cannot start", {{"error", std::string(fingerprint.status().message())}});
    return 2;
  }
  auto store = baton::kvstore::PrefixStore::Open(
      {.path = data_dir, .model_fingerprint = *fingerprint, .budget_bytes = budget});
  if (!store.ok()) {
    baton::log::Error("cannot start", {{"error", std::string(store.status().message())}});
    return 1;
  }
  baton::kvstore::KvStoreService service(**store);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  return baton::ServeUntilShutdown(
      "baton-kvstore", builder, flags.server,
      baton::NodeRegistration(router, "kvstore", baton::v1::NODE_ROLE_KVSTORE, *fingerprint,
                              [] { return baton::v1::LoadReport(); }));
}
