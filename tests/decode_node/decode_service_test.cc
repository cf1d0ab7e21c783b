// The decode node's service in process, over a real in-process gRPC channel: checksum
// mismatches fail the request and free it, uncommitted reservations expire, full pools queue
// up to a bound and then refuse with RESOURCE_EXHAUSTED, and wire values past their bounds
// (region chunks outside their region, lengths that wrap, oversized ids) are refused.
#include "baton/decode_node/decode_service.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "baton/common/checksum.h"
#include "baton/model/model_factory.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "test_dir.h"

namespace baton::decode_node {
namespace {

using ::testing::HasSubstr;

class DecodeServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = baton::testing::ProcessTempDir() + "/decode_tiny";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 2, dir).ok());
    model_ = model::CedModel::Load(dir)->release();
  }
  static void TearDownTestSuite() { delete model_; }

  void Start(DecodeOptions options) {
    options.use_ucx = false;
    service_ = std::make_unique<DecodeService>(*model_, options);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    stub_ = v1::DecodeNode::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  static v1::ReserveRequest ReserveRequest(const std::string& id, uint32_t prompt,
                                           uint32_t max_tokens) {
    v1::ReserveRequest request;
    request.set_request_id(id);
    request.set_prompt_tokens(prompt);
    request.set_model_fingerprint(model_->fingerprint());
    request.mutable_sampling()->set_max_tokens(max_tokens);
    return request;
  }
  grpc::Status Send(const v1::ReserveRequest& request, v1::Reservation* out) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub_->Reserve(&context, request, out);
  }
  grpc::Status Reserve(const std::string& id, uint32_t prompt, uint32_t max_tokens,
                       v1::Reservation* out, uint32_t timeout_ms = 10000) {
    v1::ReserveRequest request = ReserveRequest(id, prompt, max_tokens);
    request.set_timeout_ms(timeout_ms);
    return Send(request, out);
  }
  // Pushes one chunk of `bytes` at `offset` into `region` of `reservation`; the status.
  grpc::Status Push(const v1::Reservation& reservation, v1::Region region, uint64_t offset,
                    const std::string& bytes) {
    grpc::ClientContext context;
    v1::PushRegionsResponse pushed;
    auto writer = stub_->PushRegions(&context, &pushed);
    v1::RegionChunk chunk;
    chunk.set_reservation_id(reservation.reservation_id());
    chunk.set_region(region);
    chunk.set_offset(offset);
    chunk.set_data(bytes);
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  }
  v1::StatsResponse Stats() {
    grpc::ClientContext context;
    v1::StatsResponse stats;
    EXPECT_TRUE(stub_->Stats(&context, v1::StatsRequest(), &stats).ok());
    return stats;
  }
  bool Drained() {
    for (int i = 0; i < 100; ++i) {
      const v1::StatsResponse s = Stats();
      if (s.reservations() == 0 && s.load().free_pages() == s.load().total_pages() &&
          s.load().free_slots() == s.load().total_slots()) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  static model::CedModel* model_;
  std::unique_ptr<DecodeService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::DecodeNode::Stub> stub_;
};
model::CedModel* DecodeServiceTest::model_ = nullptr;

TEST_F(DecodeServiceTest, ChecksumMismatchFailsTheRequestAndFreesIt) {
  Start({.slots = 2, .pages = 64});
  v1::Reservation reservation;
  ASSERT_TRUE(Reserve("r1", 40, 5, &reservation).ok());
  EXPECT_EQ(reservation.page_addrs_size(), 3);  // 40 positions in blocks of 16
  // Push recognisable bytes into every region over the gRPC transport.
  grpc::ClientContext push_context;
  v1::PushRegionsResponse pushed;
  auto writer = stub_->PushRegions(&push_context, &pushed);
  const std::string producer(reservation.producer_swa_bytes(), 'p');
  const std::string consumer(reservation.consumer_swa_bytes(), 'c');
  const std::string block_kv(3 * reservation.page_bytes(), 'k');
  for (auto [region, bytes] : {std::pair{v1::REGION_PRODUCER_SWA, &producer},
                               {v1::REGION_CONSUMER_SWA, &consumer},
                               {v1::REGION_BLOCK_KV, &block_kv}}) {
    v1::RegionChunk chunk;
    chunk.set_reservation_id(reservation.reservation_id());
    chunk.set_region(region);
    chunk.set_data(*bytes);
    ASSERT_TRUE(writer->Write(chunk));
  }
  writer->WritesDone();
  ASSERT_TRUE(writer->Finish().ok());
  EXPECT_EQ(pushed.bytes(), producer.size() + consumer.size() + block_kv.size());

  v1::CommitRequest commit;
  v1::StateHeader& h = *commit.mutable_header();
  h.set_format_version(1);
  h.set_model_fingerprint(model_->fingerprint());
  h.set_request_id("r1");
  h.set_reservation_id(reservation.reservation_id());
  h.set_prompt_len(40);
  h.set_first_token(3);
  h.set_producer_swa_bytes(producer.size());
  h.set_consumer_swa_bytes(consumer.size());
  h.set_block_kv_bytes(block_kv.size());
  h.set_producer_swa_checksum(Checksum(producer.data(), producer.size()));
  h.set_consumer_swa_checksum(Checksum(consumer.data(), consumer.size()));
  h.set_block_kv_checksum(Checksum(block_kv.data(), block_kv.size()) ^ 1);
  grpc::ClientContext commit_context;
  v1::CommitResponse committed;
  const grpc::Status status = stub_->Commit(&commit_context, commit, &committed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(status.error_message(), HasSubstr("region block_kv failed its checksum"));
  EXPECT_TRUE(Drained());
}

TEST_F(DecodeServiceTest, UncommittedReservationExpires) {
  Start({.slots = 2, .pages = 64});
  v1::Reservation reservation;
  ASSERT_TRUE(Reserve("r1", 10, 5, &reservation, /*timeout_ms=*/150).ok());
  EXPECT_EQ(Stats().reservations(), 1u);
  EXPECT_TRUE(Drained());
}

TEST_F(DecodeServiceTest, FullPoolsQueueUpToTheBoundThenRefuse) {
  Start({.slots = 1, .pages = 64, .max_waiting = 0});
  v1::Reservation first, second;
  ASSERT_TRUE(Reserve("a", 10, 5, &first).ok());
  grpc::Status refused = Reserve("b", 10, 5, &second);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("wait queue is at its bound"));
  // Larger than the whole pool: refused at once whatever the queue.
  refused = Reserve("huge", 2000, 5, &second);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("the pool has 64"));
}

TEST_F(DecodeServiceTest, QueuedReservationGetsMemoryWhenItIsFreed) {
  Start({.slots = 1, .pages = 64, .max_waiting = 1});
  v1::Reservation first, second;
  ASSERT_TRUE(Reserve("a", 10, 5, &first).ok());
  grpc::Status queued;
  std::thread waiter([&] { queued = Reserve("b", 10, 5, &second); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(Stats().load().queued_requests(), 1u);
  grpc::ClientContext context;
  v1::ReleaseRequest release;
  release.set_reservation_id(first.reservation_id());
  v1::ReleaseResponse released;
  ASSERT_TRUE(stub_->Release(&context, release, &released).ok());
  waiter.join();
  EXPECT_TRUE(queued.ok()) << queued.error_message();
  // Reservation ids are the decode node's: 128 random bits, never the caller's request id.
  EXPECT_EQ(second.reservation_id().size(), 32u);
  EXPECT_NE(second.reservation_id(), first.reservation_id());
}

TEST_F(DecodeServiceTest, ChunksOutsideTheRegionAreRefused) {
  Start({.slots = 1, .pages = 64});
  v1::Reservation reservation;
  ASSERT_TRUE(Reserve("r1", 10, 5, &reservation).ok());
  const grpc::Status status = Push(reservation, v1::REGION_PRODUCER_SWA,
                                   reservation.producer_swa_bytes() - 4, std::string(8, 'x'));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("lies outside region REGION_PRODUCER_SWA"));
}

TEST_F(DecodeServiceTest, ChunkWhoseEndWrapsIsRefusedAndWritesNothing) {
  Start({.slots = 2, .pages = 64});
  v1::Reservation a, b;
  ASSERT_TRUE(Reserve("a", 10, 5, &a).ok());
  ASSERT_TRUE(Reserve("b", 10, 5, &b).ok());
  // offset + size wraps to 16, so a naive end check passes and the write lands 8 KiB below
  // b's producer ring: in a's consumer ring, the slot just before it in the pool.
  const uint64_t offset = ~uint64_t{0} - 8192 + 1;
  ASSERT_EQ(a.consumer_swa_addr() + a.consumer_swa_bytes(), b.producer_swa_addr());
  ASSERT_GE(a.consumer_swa_bytes(), 8192u);
  const char* watched = reinterpret_cast<const char*>(a.consumer_swa_addr());
  const size_t watched_bytes = a.consumer_swa_bytes() + b.producer_swa_bytes();
  const std::string before(watched, watched_bytes);

  const grpc::Status status = Push(b, v1::REGION_PRODUCER_SWA, offset, std::string(8208, 'x'));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("lies outside region REGION_PRODUCER_SWA"));
  EXPECT_EQ(std::string(watched, watched_bytes), before);
}

TEST_F(DecodeServiceTest, ReserveWhosePositionsWrapUint32IsRefusedAndTheNodeServesOn) {
  Start({.slots = 1, .pages = 64});
  v1::Reservation reservation;
  // 4294967295 + 2 wraps uint32 to 1: one page reserved for 2^32 positions.
  const grpc::Status refused = Reserve("wrap", 4294967295u, 2, &reservation);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("prompt_tokens"));
  EXPECT_THAT(refused.error_message(),
              HasSubstr(absl::StrCat(model_->config().max_position_embeddings)));
  const grpc::Status beyond = Reserve(
      "long", static_cast<uint32_t>(model_->config().max_position_embeddings), 1, &reservation);
  EXPECT_EQ(beyond.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(beyond.error_message(), HasSubstr("prompt_tokens + tokens to generate"));

  const grpc::Status served = Reserve("normal", 40, 5, &reservation);
  ASSERT_TRUE(served.ok()) << served.error_message();
  EXPECT_EQ(reservation.page_addrs_size(), 3);
}

TEST_F(DecodeServiceTest, OversizedRequestIdStopListAndIdentityAreRefused) {
  Start({.slots = 1, .pages = 64});
  v1::Reservation reservation;
  grpc::Status status = Send(ReserveRequest(std::string(257, 'i'), 10, 5), &reservation);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("request_id: 257 bytes; it must be at most 256"));

  v1::ReserveRequest stops = ReserveRequest("stops", 10, 5);
  for (int i = 0; i < 65; ++i) stops.mutable_sampling()->add_stop_token_ids(i);
  status = Send(stops, &reservation);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("sampling.stop_token_ids: 65 ids; at most 64"));

  v1::ReserveRequest identity = ReserveRequest("identity", 10, 5);
  identity.set_prefill_identity(std::string(513, 'p'));
  status = Send(identity, &reservation);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("prefill_identity: 513 bytes; it must be at most 512"));

  // The largest allowed of each is served.
  v1::ReserveRequest largest = ReserveRequest(std::string(256, 'i'), 10, 5);
  for (int i = 0; i < 64; ++i) largest.mutable_sampling()->add_stop_token_ids(i);
  largest.set_prefill_identity(std::string(512, 'p'));
  status = Send(largest, &reservation);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(DecodeServiceTest, FingerprintMismatchDoesNotRevealTheNodesFingerprint) {
  Start({.slots = 1, .pages = 64});
  v1::ReserveRequest request = ReserveRequest("r1", 10, 5);
  request.set_model_fingerprint("some-other-model");
  v1::Reservation reservation;
  const grpc::Status status = Send(request, &reservation);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("model_fingerprint: does not match"));
  EXPECT_THAT(status.error_message(), ::testing::Not(HasSubstr(model_->fingerprint())));
}

}  // namespace
}  // namespace baton::decode_node
