// The decode node's service in process, over a real in-process gRPC channel, pulling
// StateBlocks from a loopback PrefillNode that serves exposures (the gRPC transport): a good
// pull commits, checksum mismatches and injected faults fail the request and free it, a
// reservation that expires during its transfer never receives a byte (poisoned pool memory
// stays intact), full pools queue up to a bound and then refuse with RESOURCE_EXHAUSTED, and
// wire values past their bounds (chunks outside their region, lengths that wrap, oversized
// ids) are refused.
#include "baton/decode_node/decode_service.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "baton/common/checksum.h"
#include "baton/model/engine_factory.h"
#include "baton/model/model_factory.h"
#include "baton/transfer/exposure.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "test_dir.h"
#include "testing/eventually.h"

namespace baton::decode_node {
namespace {

using ::baton::testing::Eventually;
using ::baton::testing::EventuallyThat;
using ::testing::HasSubstr;

// A PrefillNode that serves reads of its exposures as a protobuf server would (the bytes
// baton-prefill writes raw), or, when told to,
// holds each read back first or answers with one chunk of its own (a misbehaving peer).
class FakePrefill final : public v1::PrefillNode::Service {
 public:
  grpc::Status ReadRegions(grpc::ServerContext* context, const v1::ReadRegionsRequest* request,
                           grpc::ServerWriter<v1::RegionChunk>* writer) override {
    if (hold_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms.load()));
    if (forged.has_value()) {
      writer->Write(*forged);
      return grpc::Status::OK;
    }
    // As a protobuf server would send them (baton-prefill writes the same bytes raw).
    transfer::RegionRead read;
    grpc::Status status = ToGrpcStatus(table.Open("", *request, &read));
    for (uint64_t i = 0; status.ok() && i < read.chunks(); ++i) {
      grpc::ByteBuffer wire = read.Chunk(i);
      v1::RegionChunk chunk;
      status = grpc::SerializationTraits<v1::RegionChunk>::Deserialize(&wire, &chunk);
      if (status.ok() && !writer->Write(chunk)) status = grpc::Status::CANCELLED;
    }
    ++served;
    return status;
  }
  transfer::ExposureTable table;
  std::atomic<int> hold_ms{0};
  std::atomic<int> served{0};
  std::optional<v1::RegionChunk> forged;
};

class DecodeServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = baton::testing::ProcessTempDir() + "/decode_tiny";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 2, dir).ok());
    model_ = model::LoadEngine(dir)->release();
  }
  static void TearDownTestSuite() { delete model_; }

  void Start(DecodeOptions options, bool ucx = false) {
    options.use_ucx = ucx;
    options.poison_freed_memory = true;
    service_ = std::make_unique<DecodeService>(*model_, options);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    stub_ = v1::DecodeNode::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
    grpc::ServerBuilder prefill_builder;
    int port = 0;
    prefill_builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    prefill_builder.RegisterService(&prefill_);
    prefill_server_ = prefill_builder.BuildAndStart();
    prefill_address_ = "127.0.0.1:" + std::to_string(port);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    if (prefill_server_) prefill_server_->Shutdown(std::chrono::system_clock::now());
  }

  v1::ReserveRequest ReserveRequest(const std::string& id, uint32_t prompt,
                                    uint32_t max_tokens) const {
    v1::ReserveRequest request;
    request.set_request_id(id);
    request.set_prompt_tokens(prompt);
    request.set_model_fingerprint(model_->fingerprint());
    request.mutable_sampling()->set_max_tokens(max_tokens);
    request.set_prefill_address(prefill_address_);
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
  // An exposure of `prompt_len` positions on the fake prefill node, each region filled with
  // its own byte, and the commit that names it with matching checksums.
  // With `ucx`, the exposure is in UCX memory of that pool and the commit names TRANSPORT_UCX.
  v1::CommitRequest Expose(const v1::Reservation& reservation, uint32_t prompt_len,
                           transfer::StagingPool* ucx = nullptr) {
    const transfer::RegionSizes sizes =
        transfer::RegionSizesFor(model_->state_layout(), prompt_len);
    auto exposure = transfer::Exposure::Create(ucx != nullptr ? *ucx : staging_, sizes, "", "decode");
    EXPECT_TRUE(exposure.ok());
    std::memset((*exposure)->producer_swa(), 1, sizes.producer_swa);
    std::memset((*exposure)->consumer_swa(), 2, sizes.consumer_swa);
    std::memset((*exposure)->block_kv(), 3, sizes.block_kv);
    prefill_.table.Add(*exposure);
    v1::CommitRequest commit;
    *commit.mutable_source() =
        (*exposure)->Source(ucx != nullptr ? v1::TRANSPORT_UCX : v1::TRANSPORT_GRPC);
    v1::StateHeader& h = *commit.mutable_header();
    h.set_format_version(transfer::kStateFormatVersion);
    h.set_model_fingerprint(model_->fingerprint());
    h.set_request_id("r");
    h.set_reservation_id(reservation.reservation_id());
    h.set_prompt_len(prompt_len);
    h.set_first_token(3);
    h.set_producer_swa_bytes(sizes.producer_swa);
    h.set_consumer_swa_bytes(sizes.consumer_swa);
    h.set_block_kv_bytes(sizes.block_kv);
    h.set_producer_swa_checksum(Checksum((*exposure)->producer_swa(), sizes.producer_swa));
    h.set_consumer_swa_checksum(Checksum((*exposure)->consumer_swa(), sizes.consumer_swa));
    h.set_block_kv_checksum(Checksum((*exposure)->block_kv(), sizes.block_kv));
    return commit;
  }
  grpc::Status Commit(const v1::CommitRequest& commit) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::CommitResponse committed;
    return stub_->Commit(&context, commit, &committed);
  }
  v1::StatsResponse Stats() {
    grpc::ClientContext context;
    v1::StatsResponse stats;
    EXPECT_TRUE(stub_->Stats(&context, v1::StatsRequest(), &stats).ok());
    return stats;
  }
  // Polls until the node holds no reservation and every page and slot is free.
  ::testing::AssertionResult Drained() {
    return Eventually(
        [&]() -> ::testing::AssertionResult {
          const v1::StatsResponse s = Stats();
          if (s.reservations() == 0 && s.load().free_pages() == s.load().total_pages() &&
              s.load().free_slots() == s.load().total_slots()) {
            return ::testing::AssertionSuccess();
          }
          return ::testing::AssertionFailure()
                 << s.reservations() << " reservations, " << s.load().free_pages() << " of "
                 << s.load().total_pages() << " pages and " << s.load().free_slots() << " of "
                 << s.load().total_slots() << " slots free";
        },
        std::chrono::seconds(5));
  }
  // Reserves the whole pool once more, so every freed slot and page is handed out again and
  // its poison checked; the count of disturbed ones.
  int64_t PoisonViolationsAfterReuse(uint32_t prompt) {
    v1::Reservation again;
    EXPECT_TRUE(Reserve("reuse", prompt, 5, &again).ok());
    return service_->poison_violations();
  }

  static model::Engine* model_;
  // A prefill side in UCX memory (UcxReadsComeOnly...); declared first, so that the exposures
  // below, which hold its registrations, go before it.
  std::unique_ptr<transfer::UcxWorker> ucx_exposer_;
  std::unique_ptr<transfer::StagingPool> ucx_staging_;
  transfer::StagingPool staging_{nullptr, 0};
  FakePrefill prefill_;
  std::unique_ptr<grpc::Server> prefill_server_;
  std::string prefill_address_;
  std::unique_ptr<DecodeService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::DecodeNode::Stub> stub_;
};
model::Engine* DecodeServiceTest::model_ = nullptr;

// One rule for the first token and every later one: a stop id, then EOS, then the length.
TEST(FinishReasonTest, StopAndEosComeBeforeTheLengthForEveryToken) {
  const std::set<int32_t> stop = {7};
  constexpr int64_t kEos = 2;
  for (uint32_t completion : {1u, 5u}) {  // the first token, a later one
    // The last token allowed that is also a stop id, or the EOS id: STOP and EOS, not LENGTH.
    EXPECT_EQ(FinishReasonFor(7, completion, completion, stop, false, kEos),
              v1::FINISH_REASON_STOP);
    EXPECT_EQ(FinishReasonFor(kEos, completion, completion, stop, false, kEos),
              v1::FINISH_REASON_EOS);
    // ignore_eos: EOS is an ordinary token; only the length ends the request.
    EXPECT_EQ(FinishReasonFor(kEos, completion, completion, stop, true, kEos),
              v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(FinishReasonFor(kEos, completion, completion + 1, stop, true, kEos),
              v1::FINISH_REASON_UNSPECIFIED);
    // A stop id finishes before the limit too; an ordinary token at the limit is LENGTH.
    EXPECT_EQ(FinishReasonFor(7, completion, completion + 3, stop, false, kEos),
              v1::FINISH_REASON_STOP);
    EXPECT_EQ(FinishReasonFor(3, completion, completion, stop, false, kEos),
              v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(FinishReasonFor(3, completion, completion + 1, stop, false, kEos),
              v1::FINISH_REASON_UNSPECIFIED);
  }
}

TEST(StatePoolTest, WritesIntoFreedMemoryAreCounted) {
  const model::StateLayout layout = {.producer_layers = 1,
                                     .consumer_layers = 1,
                                     .ring_capacity = 4,
                                     .block_size = 4,
                                     .kv_dim = 2,
                                     .block_kv_groups = 1};
  StatePool pool(layout, 1, 2);
  pool.EnablePoison();
  std::optional<int64_t> slot = pool.TryReserve(2);
  ASSERT_TRUE(slot.has_value());
  float* page = pool.Allocate();
  ASSERT_NE(page, nullptr);
  page[0] = 1.0f;  // a live page may be written
  pool.Free(page);
  pool.Unreserve(*slot, 1);
  EXPECT_EQ(pool.poison_violations(), 0);
  pool.consumer_ring(*slot)[1] = 2.0f;  // a write after the slot was freed
  ASSERT_TRUE(pool.TryReserve(2).has_value());
  EXPECT_EQ(pool.poison_violations(), 1);
  page[3] = 3.0f;  // and after the page was freed
  EXPECT_EQ(pool.Allocate(), page);
  EXPECT_EQ(pool.poison_violations(), 2);
}

TEST_F(DecodeServiceTest, PulledRegionsCommitAndTheRequestStreams) {
  Start({.slots = 2, .pages = 64});
  v1::Reservation reservation;
  // max_tokens 1: the first token (the prefill node's) finishes it, so no decode step runs
  // over the made-up state.
  ASSERT_TRUE(Reserve("r1", 40, 1, &reservation).ok());
  EXPECT_EQ(reservation.pages(), 3u);  // 40 positions in blocks of 16
  const grpc::Status committed = Commit(Expose(reservation, 40));
  ASSERT_TRUE(committed.ok()) << committed.error_message();
  EXPECT_EQ(prefill_.served, 3);  // one read per region
  grpc::ClientContext context;
  v1::StreamRequest request;
  request.set_reservation_id(reservation.reservation_id());
  auto stream = stub_->Stream(&context, request);
  v1::DecodeOutput output;
  ASSERT_TRUE(stream->Read(&output));
  EXPECT_EQ(output.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_TRUE(Drained());
  EXPECT_EQ(PoisonViolationsAfterReuse(40), 0);
}

TEST_F(DecodeServiceTest, ChecksumMismatchFailsTheRequestAndFreesIt) {
  Start({.slots = 2, .pages = 64});
  v1::Reservation reservation;
  ASSERT_TRUE(Reserve("r1", 40, 5, &reservation).ok());
  v1::CommitRequest commit = Expose(reservation, 40);
  v1::StateHeader& h = *commit.mutable_header();
  h.set_block_kv_checksum(h.block_kv_checksum() ^ 1);
  const grpc::Status status = Commit(commit);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(status.error_message(), HasSubstr("region block_kv failed its checksum"));
  EXPECT_TRUE(Drained());
}

TEST_F(DecodeServiceTest, CorruptedTransferFailsItsChecksum) {
  Start({.slots = 2, .pages = 64, .transfer_faults = transfer::FaultSpec{.corrupt = 1}});
  v1::Reservation reservation;
  ASSERT_TRUE(Reserve("r1", 40, 5, &reservation).ok());
  grpc::Status status = Commit(Expose(reservation, 40));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(status.error_message(), HasSubstr("region producer_swa failed its checksum"));
  EXPECT_TRUE(Drained());
}

TEST_F(DecodeServiceTest, TruncatedTransferFailsItsChecksum) {
  Start({.slots = 2, .pages = 64, .transfer_faults = transfer::FaultSpec{.truncate = 1}});
  v1::Reservation reservation;
  ASSERT_TRUE(Reserve("r2", 40, 5, &reservation).ok());
  const grpc::Status status = Commit(Expose(reservation, 40));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(status.error_message(), HasSubstr("region block_kv failed its checksum"));
  EXPECT_TRUE(Drained());
}

TEST_F(DecodeServiceTest, DroppedTransferEndsAtTheReservationDeadline) {
  Start({.slots = 1, .pages = 64, .transfer_faults = transfer::FaultSpec{.drop = 1}});
  v1::Reservation reservation;
  ASSERT_TRUE(Reserve("r1", 40, 5, &reservation, /*timeout_ms=*/1000).ok());
  const grpc::Status status = Commit(Expose(reservation, 40));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(Drained());
  EXPECT_EQ(PoisonViolationsAfterReuse(40), 0);
}

// The decode node reads by UCX only from the worker its reservation names (the one the prefill
// node registered with the router, over mutual TLS), never from one a Commit supplies.
TEST_F(DecodeServiceTest, UcxReadsComeOnlyFromTheWorkerTheReservationNames) {
  Start({.slots = 2, .pages = 64}, /*ucx=*/true);
  auto exposer = transfer::UcxWorker::Create();
  auto other = transfer::UcxWorker::Create();
  ASSERT_TRUE(exposer.ok() && other.ok());
  ucx_exposer_ = *std::move(exposer);
  ucx_staging_ = std::make_unique<transfer::StagingPool>(ucx_exposer_.get(), 0);
  transfer::StagingPool& pool = *ucx_staging_;
  auto reserve = [&](const std::string& id, const std::string& ucx_address) {
    v1::ReserveRequest request = ReserveRequest(id, 20, 5);
    request.set_prefill_ucx_worker_address(ucx_address);
    v1::Reservation reservation;
    EXPECT_TRUE(Send(request, &reservation).ok());
    return reservation;
  };
  // A Commit naming another worker is refused before anything is read.
  v1::Reservation first = reserve("r1", ucx_exposer_->address());
  v1::CommitRequest forged = Expose(first, 20, &pool);
  forged.mutable_source()->set_ucx_worker_address((*other)->address());
  grpc::Status status = Commit(forged);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("source.ucx_worker_address"));
  EXPECT_TRUE(Drained());
  // A reservation that names no worker takes no UCX commit.
  v1::Reservation unnamed = reserve("r2", "");
  status = Commit(Expose(unnamed, 20, &pool));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("registered no UCX worker address"));
  EXPECT_TRUE(Drained());
  // The reserved worker is read whatever the Commit says of it, here nothing.
  v1::Reservation named = reserve("r3", ucx_exposer_->address());
  v1::CommitRequest commit = Expose(named, 20, &pool);
  commit.mutable_source()->clear_ucx_worker_address();
  status = Commit(commit);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Stats().reservations(), 1u);
}

// A UCX Commit naming staging memory outside what its key covers (here just past its end, where
// a shared-memory get would copy from this process's own memory or fault) is refused by name
// before anything is read, and the node stays up: the next commit is served.
TEST_F(DecodeServiceTest, AUcxCommitOutsideItsExposureIsRefusedAndTheNodeStaysUp) {
  Start({.slots = 2, .pages = 64}, /*ucx=*/true);
  auto exposer = transfer::UcxWorker::Create();
  ASSERT_TRUE(exposer.ok());
  ucx_exposer_ = *std::move(exposer);
  ucx_staging_ = std::make_unique<transfer::StagingPool>(ucx_exposer_.get(), 0);
  auto reserve = [&](const std::string& id) {
    v1::ReserveRequest request = ReserveRequest(id, 20, 5);
    request.set_prefill_ucx_worker_address(ucx_exposer_->address());
    v1::Reservation reservation;
    EXPECT_TRUE(Send(request, &reservation).ok());
    return reservation;
  };
  v1::CommitRequest forged = Expose(reserve("r1"), 20, ucx_staging_.get());
  const v1::RegionSource& exposed = forged.source();
  forged.mutable_source()->set_address(exposed.exposed_address() + exposed.exposed_bytes());
  grpc::Status status = Commit(forged);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("source.address"));
  EXPECT_THAT(status.error_message(), HasSubstr("outside the memory the key covers"));
  EXPECT_TRUE(Drained());
  status = Commit(Expose(reserve("r2"), 20, ucx_staging_.get()));
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Stats().reservations(), 1u);
}

// The reproducer: a reservation that expires before its transfer is done is freed, and the
// prefill node's bytes, arriving later, never land in it (nor in whoever gets it next).
TEST_F(DecodeServiceTest, ReservationExpiringDuringItsTransferNeverReceivesAByte) {
  Start({.slots = 1, .pages = 3});
  prefill_.hold_ms = 2500;  // the prefill node answers after the reservation's deadline
  v1::Reservation reservation;
  ASSERT_TRUE(Reserve("r1", 40, 1, &reservation, /*timeout_ms=*/1000).ok());
  const grpc::Status status = Commit(Expose(reservation, 40));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(Drained());
  // Wait until the prefill node has sent its answers (one read of each of the three regions,
  // all in flight at once), then hand the same slot and pages out.
  EXPECT_TRUE(EventuallyThat([&] { return prefill_.served.load(); }, 3, std::chrono::seconds(5)));
  EXPECT_EQ(PoisonViolationsAfterReuse(40), 0);
  // A commit to the expired reservation is refused before anything is read.
  prefill_.hold_ms = 0;
  const grpc::Status late = Commit(Expose(reservation, 40));
  EXPECT_EQ(late.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(prefill_.served, 3);
}

// The reproducer: a chunk whose end wraps 64 bits (offset 2^64 - 8192, 8208 bytes) would
// write 8 KiB below the ring with a naive end check.
TEST_F(DecodeServiceTest, ChunkWhoseEndWrapsIsRefusedAndWritesNothing) {
  Start({.slots = 2, .pages = 64});
  v1::Reservation reservation;
  ASSERT_TRUE(Reserve("r1", 40, 5, &reservation).ok());
  v1::RegionChunk forged;
  forged.set_region(v1::REGION_PRODUCER_SWA);
  forged.set_offset(~uint64_t{0} - 8192 + 1);
  forged.set_data(std::string(8208, 'x'));
  prefill_.forged = forged;
  const grpc::Status status = Commit(Expose(reservation, 40));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Every region's read gets the forged chunk; whichever is refused first is named.
  EXPECT_THAT(status.error_message(), HasSubstr("lies outside region REGION_"));
  EXPECT_TRUE(Drained());
  // Nothing landed in any freed slot or page.
  EXPECT_EQ(PoisonViolationsAfterReuse(40), 0);
}

TEST_F(DecodeServiceTest, ChunksOutsideTheRegionAreRefused) {
  Start({.slots = 1, .pages = 64});
  v1::Reservation reservation;
  ASSERT_TRUE(Reserve("r1", 10, 5, &reservation).ok());
  v1::RegionChunk forged;
  forged.set_region(v1::REGION_PRODUCER_SWA);
  forged.set_offset(0);
  forged.set_data(std::string(reservation.producer_swa_bytes() + 4, 'x'));
  prefill_.forged = forged;
  const grpc::Status status = Commit(Expose(reservation, 10));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("lies outside region REGION_"));
}

TEST_F(DecodeServiceTest, CommitNamingAnUnknownExposureFailsAndFrees) {
  Start({.slots = 1, .pages = 64});
  v1::Reservation reservation;
  ASSERT_TRUE(Reserve("r1", 10, 5, &reservation).ok());
  v1::CommitRequest commit = Expose(reservation, 10);
  commit.mutable_source()->set_exposure_id("0123456789abcdef0123456789abcdef");
  const grpc::Status status = Commit(commit);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("no open exposure"));
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
  // Polled with a deadline: the waiter's Reserve reaches the queue when its thread runs.
  ASSERT_TRUE(EventuallyThat([&] { return Stats().load().queued_requests(); }, 1u,
                             std::chrono::seconds(10), std::chrono::milliseconds(10)));
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
  EXPECT_EQ(reservation.pages(), 3u);
}

// A replay-on-decode reservation takes pool pages for its boundary rows beside the block KV,
// and those go back with it; a split the node does not know, boundary rows under prefill-all or
// more boundary rows than prompt tokens are refused by name before anything is reserved.
TEST_F(DecodeServiceTest, ReplayReservationsHoldBoundaryRowPagesAndBadOnesAreRefused) {
  Start({.slots = 2, .pages = 64});
  v1::Reservation reservation;
  auto reserve = [&](uint32_t split, uint32_t rows) {
    v1::ReserveRequest request = ReserveRequest("replay", 40, 5);
    request.set_split(static_cast<v1::Split>(split));
    request.set_boundary_rows(rows);
    return Send(request, &reservation);
  };
  for (const auto& [split, rows, field] : std::vector<std::tuple<uint32_t, uint32_t, std::string>>{
           {7, 0, "split"}, {0, 3, "boundary_rows"}, {1, 41, "boundary_rows"}}) {
    const grpc::Status refused = reserve(split, rows);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_THAT(refused.error_message(), HasSubstr(field));
  }
  EXPECT_EQ(Stats().load().free_pages(), 64u);

  ASSERT_TRUE(reserve(v1::SPLIT_REPLAY_ON_DECODE, 40).ok());
  const model::StateLayout layout = model_->state_layout();
  const uint64_t page = sizeof(float) * layout.page_floats();
  const uint64_t row = sizeof(float) * layout.hidden_size;
  EXPECT_EQ(reservation.split(), v1::SPLIT_REPLAY_ON_DECODE);
  EXPECT_EQ(reservation.boundary_rows(), 40u);
  EXPECT_EQ(reservation.boundary_row_bytes(), row);
  EXPECT_EQ(reservation.consumer_swa_bytes(), 0u);  // the rings are not transferred
  const uint64_t boundary_pages = (40 * row + page - 1) / page;
  EXPECT_EQ(Stats().load().free_pages(), 64u - 3u - boundary_pages);  // 45 positions: 3 pages
  grpc::ClientContext context;
  v1::ReleaseRequest release;
  release.set_reservation_id(reservation.reservation_id());
  v1::ReleaseResponse released;
  ASSERT_TRUE(stub_->Release(&context, release, &released).ok());
  EXPECT_TRUE(EventuallyThat([&] { return Stats().load().free_pages(); }, ::testing::Eq(64u)));
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

  v1::ReserveRequest address = ReserveRequest("address", 10, 5);
  address.set_prefill_address(std::string(513, 'a'));
  status = Send(address, &reservation);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("prefill_address: 513 bytes; it must be at most 512"));

  // The largest allowed of each is served.
  v1::ReserveRequest largest = ReserveRequest(std::string(256, 'i'), 10, 5);
  for (int i = 0; i < 64; ++i) largest.mutable_sampling()->add_stop_token_ids(i);
  largest.set_prefill_identity(std::string(512, 'p'));
  status = Send(largest, &reservation);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// Shadow verification's ask: at most 256 tokens, and only with the prompt to recompute.
// Nothing is reserved for a refused one.
TEST_F(DecodeServiceTest, ShadowVerificationAsksAreRefusedByName) {
  Start({.slots = 1, .pages = 64});
  v1::Reservation reservation;
  v1::ReserveRequest too_many = ReserveRequest("too-many", 3, 5);
  for (int32_t id : {1, 2, 3}) too_many.add_prompt_token_ids(id);
  too_many.set_fidelity_tokens(257);
  grpc::Status status = Send(too_many, &reservation);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("fidelity_tokens: 257; at most 256"));
  v1::ReserveRequest no_prompt = ReserveRequest("no-prompt", 3, 5);
  no_prompt.set_fidelity_tokens(4);
  status = Send(no_prompt, &reservation);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("prompt_token_ids: shadow verification"));
  EXPECT_EQ(service_->Load().free_slots(), 1u);
  too_many.set_fidelity_tokens(256);
  status = Send(too_many, &reservation);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// The prompt that speculative decoding drafts from: empty or exactly prompt_tokens ids, each in
// the vocabulary; and a draft model asked of a node without one. Nothing is reserved for them.
TEST_F(DecodeServiceTest, SpeculationInputsAreRefusedByName) {
  Start({.slots = 1, .pages = 64});
  v1::Reservation reservation;
  v1::ReserveRequest short_prompt = ReserveRequest("short", 10, 5);
  for (int32_t id = 0; id < 9; ++id) short_prompt.add_prompt_token_ids(id);
  grpc::Status status = Send(short_prompt, &reservation);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("prompt_token_ids: 9 ids; it must be empty or hold prompt_tokens (10)"));
  v1::ReserveRequest bad_id = ReserveRequest("bad-id", 3, 5);
  for (int32_t id : {1, 512, 2}) bad_id.add_prompt_token_ids(id);
  status = Send(bad_id, &reservation);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("prompt_token_ids: token 1 is 512"));
  v1::ReserveRequest draft = ReserveRequest("draft", 3, 5);
  for (int32_t id : {1, 2, 3}) draft.add_prompt_token_ids(id);
  draft.mutable_sampling()->set_speculative(v1::SPECULATIVE_DRAFT);
  status = Send(draft, &reservation);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("sampling.speculative: DRAFT"));
  EXPECT_EQ(service_->Load().free_slots(), 1u);
  // Prompt lookup, on this node that runs --speculative off: refused too (issue 48).
  draft.mutable_sampling()->set_speculative(v1::SPECULATIVE_NGRAM);
  status = Send(draft, &reservation);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("sampling.speculative: NGRAM"));
  EXPECT_EQ(service_->Load().free_slots(), 1u);
}

// On a node that runs prompt lookup, a request may ask for it.
TEST_F(DecodeServiceTest, PromptLookupIsServedWhereTheOperatorEnabledIt) {
  Start({.slots = 1, .pages = 64, .speculative = {.drafter = Drafter::kNgram, .tokens = 2}});
  v1::ReserveRequest lookup = ReserveRequest("lookup", 3, 5);
  for (int32_t id : {1, 2, 3}) lookup.add_prompt_token_ids(id);
  lookup.mutable_sampling()->set_speculative(v1::SPECULATIVE_NGRAM);
  v1::Reservation reservation;
  const grpc::Status status = Send(lookup, &reservation);
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
