// baton-kvstore: the prefix store as a service (RocksDB under --data-dir), with
// grpc.health.v1 and reflection; registers with the router.
#include <iostream>

#include "CLI/CLI.hpp"
#include "baton/common/rpc.h"
#include "baton/kvstore/kvstore_service.h"
#include "baton/model/weights.h"

int main(int argc, char** argv) {
  baton::BlockShutdownSignals();
  CLI::App app{"baton-kvstore: the prefix store"};
  std::string model_dir, router, data_dir;
  baton::ServerOptions server;
  uint64_t budget = 0;
  app.add_option("--model", model_dir, "Model directory (values carry its fingerprint)")
      ->required();
  app.add_option("--data-dir", data_dir, "RocksDB folder")->required();
  app.add_option("--budget-bytes", budget, "Bytes of stored values at most (0: unlimited)");
  app.add_option("--host", server.host, "Address to listen on (default 127.0.0.1)");
  app.add_option("--port", server.port, "Port (0: any free port)");
  app.add_option("--ready-file", server.ready_file, "Write host:port here once serving");
  app.add_option("--router", router, "Router address to register with");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto fingerprint = baton::model::ModelFingerprint(model_dir);
  if (!fingerprint.ok()) {
    std::cerr << "baton-kvstore: " << fingerprint.status().message() << "\n";
    return 2;
  }
  auto store = baton::kvstore::PrefixStore::Open(
      {.path = data_dir, .model_fingerprint = *fingerprint, .budget_bytes = budget});
  if (!store.ok()) {
    std::cerr << "baton-kvstore: " << store.status().message() << "\n";
    return 1;
  }
  baton::kvstore::KvStoreService service(**store);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  auto started = baton::StartServer(builder, server);
  if (!started.ok()) {
    std::cerr << "baton-kvstore: " << started.status().message() << "\n";
    return 1;
  }
  std::cout << "baton-kvstore serving on " << started->address << std::endl;
  std::unique_ptr<baton::Heartbeat> heartbeat;
  if (!router.empty()) {
    baton::v1::RegisterRequest node;
    node.set_node_id("kvstore");
    node.set_role(baton::v1::NODE_ROLE_KVSTORE);
    node.set_address(started->address);
    node.set_model_fingerprint(*fingerprint);
    heartbeat =
        std::make_unique<baton::Heartbeat>(router, node, [] { return baton::v1::LoadReport(); });
  }
  baton::WaitForShutdownSignal();
  heartbeat.reset();
  started->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
