// The prefill node's reads from the store fleet (prefill_node/store_fleet.h) against store
// nodes that answer, or that stop answering mid-read: gRPC's generated mock stubs, each
// ReadBlocks call served by a reader that gives the node's blocks or hangs until the call's
// deadline, as a frozen process does.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>

#include "baton/kvstore/chain.h"
#include "baton/kvstore/placement.h"
#include "baton/v1/kvstore_mock.grpc.pb.h"
#include "prefill_node/store_fleet.h"
#include "testing/free_port.h"

namespace baton::prefill_node {
namespace {

using ::testing::_;
using ::testing::NiceMock;

// Answers a ReadBlocks call: each key asked, found with `payload`, unless `hang` is set: then
// nothing comes until the call's deadline, which ends it with DEADLINE_EXCEEDED.
class FakeReader : public grpc::ClientReaderInterface<v1::StoredBlock> {
 public:
  FakeReader(const grpc::ClientContext& context, const v1::ReadBlocksRequest& request,
             std::string payload, bool hang)
      : deadline_(context.deadline()),
        request_(request),
        payload_(std::move(payload)),
        hang_(hang) {}
  bool Read(v1::StoredBlock* block) override {
    if (hang_) {
      std::this_thread::sleep_until(deadline_);
      return false;
    }
    if (next_ >= request_.keys_size()) return false;
    block->set_key(request_.keys(next_++));
    block->set_found(true);
    block->set_payload(payload_);
    return true;
  }
  bool NextMessageSize(uint32_t* size) override {
    *size = static_cast<uint32_t>(payload_.size() + 64);
    return true;
  }
  grpc::Status Finish() override {
    return hang_ ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline") : grpc::Status::OK;
  }
  void WaitForInitialMetadata() override {}

 private:
  std::chrono::system_clock::time_point deadline_;
  v1::ReadBlocksRequest request_;
  std::string payload_;
  bool hang_;
  int next_ = 0;
};

class StoreFleetReadTest : public ::testing::Test {
 protected:
  // A store node `id` of the route: frozen ones hang every read; each counts its calls.
  void AddNode(const std::string& id, bool frozen) {
    auto stub = std::make_shared<NiceMock<v1::MockKvStoreStub>>();
    ON_CALL(*stub, ReadBlocksRaw(_, _))
        .WillByDefault(
            [this, id, frozen](grpc::ClientContext* context, const v1::ReadBlocksRequest& request) {
              ++calls_[id];
              return new FakeReader(*context, request, Payload(), frozen);
            });
    route_.ids.push_back(id);
    route_.stubs.push_back(stub);
  }
  static std::string Payload() { return std::string(16, 'v'); }

  // Reads every block of a 12-block chain by `deadline` from now; the blocks read.
  std::pair<bool, std::vector<int64_t>> ReadAll(std::chrono::milliseconds within) {
    std::vector<Sha256Digest> keys;
    for (int b = 0; b < 12; ++b) {
      const std::string text = "block " + std::to_string(b);
      keys.push_back(Sha256Of(text.data(), text.size()));
    }
    std::vector<int64_t> blocks(keys.size());
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int64_t>(i);
    std::vector<int64_t> read;
    grpc::ServerContext caller;
    const bool ok = client_.Read(route_, caller, trace::StartSpan(std::nullopt), keys, blocks,
                                 kvstore::Region::kBlockKv, "", Payload().size(),
                                 std::chrono::system_clock::now() + within,
                                 [&](int64_t block, const std::string& payload) {
                                   EXPECT_EQ(payload, Payload());
                                   read.push_back(block);
                                 });
    return {ok, read};
  }

  StoreFleetClient client_{""};
  StoreFleetClient::Route route_;
  std::map<std::string, std::atomic<int>> calls_;
};

TEST_F(StoreFleetReadTest, AnOwnerThatStopsAnsweringCostsHalfTheBudgetThenItsPeersServeTheHit) {
  // Two owners per block (R = 2 of 3); kvstore-1 hangs. Every block it is asked for first has
  // its other owner asked once the hedge (half the time left) has passed.
  AddNode("kvstore", false);
  AddNode("kvstore-1", true);
  AddNode("kvstore-2", false);
  route_.replication = 2;
  const auto [ok, read] = ReadAll(std::chrono::seconds(4));
  EXPECT_TRUE(ok) << "the blocks asked of the frozen owner were not asked of their other owner";
  EXPECT_EQ(read.size(), 12u);
  EXPECT_GE(calls_["kvstore-1"].load(), 1) << "the frozen owner was never asked first";
}

TEST_F(StoreFleetReadTest, ASoleOwnerThatStopsAnsweringIsWaitedForUntilTheDeadline) {
  // R = 1: a block whose only owner hangs has no one else to ask, so its call is not cut at
  // the hedge; the load fails at its deadline and the hit is computed.
  AddNode("kvstore", false);
  AddNode("kvstore-1", true);
  route_.replication = 1;
  const auto start = std::chrono::system_clock::now();
  const auto [ok, read] = ReadAll(std::chrono::milliseconds(600));
  EXPECT_FALSE(ok);
  EXPECT_GE(std::chrono::system_clock::now() - start, std::chrono::milliseconds(600))
      << "a call with no other owner left ended before the load's deadline";
}

// The node's own store (--kvstore) is connected to when the node starts: the first hit's read
// has only the hit's compute time (50 ms at least) for its deadline, and a connection with its
// TLS handshake made inside it on a busy machine turned that hit into a miss.
TEST(StoreFleetConnectTest, TheNodesOwnStoreIsConnectedBeforeAnyRead) {
  const testing::Listener store;
  ASSERT_TRUE(store.ok());
  const StoreFleetClient client(store.address());
  // No read is made: a connection arrives all the same.
  EXPECT_TRUE(store.Connected(std::chrono::seconds(20)))
      << "the client did not connect to its store until asked";
}

}  // namespace
}  // namespace baton::prefill_node
