// baton-kvstore's service in process, over a real in-process gRPC channel: wire inputs past
// their bounds (too many keys, a block that names itself as parent, a payload of the wrong
// size) are refused with INVALID_ARGUMENT, and a refused write stores nothing.
#include "baton/kvstore/kvstore_service.h"

#include <filesystem>

#include "baton/kvstore/chain.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "test_dir.h"

namespace baton::kvstore {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kPayload = 64;
constexpr uint64_t kMaxKeys = 4;

class KvStoreServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = baton::testing::ProcessTempDir() + "/kvstore_service_" +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(path);
    auto store = PrefixStore::Open({.path = path,
                                    .model_fingerprint = "fp",
                                    .block_kv_payload_bytes = kPayload,
                                    .producer_swa_payload_bytes = kPayload});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    service_ = std::make_unique<KvStoreService>(*store_, kMaxKeys);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    stub_ = v1::KvStore::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  grpc::Status Write(const std::vector<v1::BlockWrite>& writes) {
    grpc::ClientContext context;
    v1::WriteBlocksResponse written;
    auto writer = stub_->WriteBlocks(&context, &written);
    for (const v1::BlockWrite& w : writes) writer->Write(w);
    writer->WritesDone();
    return writer->Finish();
  }
  static v1::BlockWrite Block(const Sha256Digest& key, const std::string& parent,
                              uint64_t bytes = kPayload) {
    v1::BlockWrite w;
    w.set_key(KeyBytes(key));
    w.set_parent(parent);
    w.set_region(v1::STORE_REGION_BLOCK_KV);
    w.set_payload(std::string(bytes, 'k'));
    return w;
  }

  static v1::BlockWrite WithModel(v1::BlockWrite write, const std::string& model) {
    write.set_model_fingerprint(model);
    return write;
  }

  std::unique_ptr<PrefixStore> store_;
  std::unique_ptr<KvStoreService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::KvStore::Stub> stub_;
};

TEST_F(KvStoreServiceTest, MoreKeysThanAChainHasAreRefused) {
  const auto chain = ChainKeys("fp", "", "", std::vector<int32_t>(16 * (kMaxKeys + 1), 7), 16);
  v1::LookupRequest lookup;
  for (const Sha256Digest& key : chain) lookup.add_keys(KeyBytes(key));
  grpc::ClientContext context;
  v1::LookupResponse found;
  const grpc::Status status = stub_->Lookup(&context, lookup, &found);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("keys: 5 keys; a chain of this model has at most 4"));

  lookup.mutable_keys()->RemoveLast();
  grpc::ClientContext again;
  EXPECT_TRUE(stub_->Lookup(&again, lookup, &found).ok());
}

// A fleet's lookup: per key, whatever the chain's other blocks; a bad key or too many keys is
// refused by name, and a refused probe answers nothing.
TEST_F(KvStoreServiceTest, ProbeAnswersPerKeyAndRefusesBadKeysByName) {
  const auto chain = ChainKeys("fp", "", "", std::vector<int32_t>(16 * kMaxKeys, 7), 16);
  // Blocks 1 and 3 only (0 and 2 live on other nodes).
  ASSERT_TRUE(
      Write({Block(chain[1], KeyBytes(chain[0])), Block(chain[3], KeyBytes(chain[2]))}).ok());
  v1::ProbeRequest probe;
  for (const Sha256Digest& key : chain) probe.add_keys(KeyBytes(key));
  grpc::ClientContext context;
  v1::ProbeResponse held;
  ASSERT_TRUE(stub_->Probe(&context, probe, &held).ok());
  EXPECT_THAT(held.block_kv(), ::testing::ElementsAre(false, true, false, true));
  EXPECT_THAT(held.producer_swa(), ::testing::ElementsAre(false, false, false, false));

  v1::ProbeRequest bad = probe;
  bad.set_keys(2, "short");
  v1::ProbeRequest many = probe;
  many.add_keys(KeyBytes(chain[0]));
  for (const auto& [request, message] :
       {std::pair{bad, "keys: a chain key is 32 bytes, got 5"},
        std::pair{many, "keys: 5 keys; a chain of this model has at most 4"}}) {
    grpc::ClientContext again;
    v1::ProbeResponse none;
    const grpc::Status status = stub_->Probe(&again, request, &none);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << message;
    EXPECT_THAT(status.error_message(), HasSubstr(message));
    EXPECT_EQ(none.block_kv_size(), 0);
  }
}

TEST_F(KvStoreServiceTest, RefusedWritesStoreNothing) {
  const auto chain = ChainKeys("fp", "", "", std::vector<int32_t>(32, 7), 16);
  for (const auto& [write, message] :
       {std::pair{Block(chain[0], KeyBytes(chain[0])), "parent: equals the key"},
        std::pair{Block(chain[0], "", kPayload + 4), "payload: 68 bytes"},
        std::pair{WithModel(Block(chain[0], ""), std::string(129, 'f')),
                  "model_fingerprint: 129 bytes"}}) {
    const grpc::Status status = Write({write});
    EXPECT_NE(status.error_code(), grpc::StatusCode::OK) << message;
    EXPECT_THAT(status.error_message(), HasSubstr(message));
  }
  EXPECT_EQ(store_->counters().stored_bytes, 0u);
  EXPECT_TRUE(Write({Block(chain[0], ""), Block(chain[1], KeyBytes(chain[0]))}).ok());
  EXPECT_EQ(store_->counters().block_kv_values, 2u);
}

}  // namespace
}  // namespace baton::kvstore
