// The prefill service in one process against a fake decode node served beside it: the prompt
// is computed and exposed, the fake reads every region over the gRPC transport and checks it
// against the header and against the engine's own prefill of the same prompt; a decode node
// that refuses or never answers the commit is named in the baton-failed-node trailer, with
// the status the router's retry classification expects.
#include "baton/prefill_node/prefill_service.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>

#include "baton/common/rpc.h"
#include "baton/model/engine_factory.h"
#include "baton/model/model_factory.h"
#include "baton/transfer/transport.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "test_dir.h"
#include "testing/eventually.h"

namespace baton::prefill_node {
namespace {

using ::testing::HasSubstr;

// A DecodeNode that only commits: it reads the exposed regions into a state of its own (kRead),
// refuses the commit as a failed read would (kAbort), or holds it until the caller gives up
// (kHang, a wedged decode node).
class FakeDecodeNode final : public v1::DecodeNode::Service {
 public:
  enum class Behaviour { kRead, kAbort, kHang };

  FakeDecodeNode(const model::StateLayout& layout, Behaviour behaviour)
      : layout_(layout), behaviour_(behaviour) {}

  grpc::Status Commit(grpc::ServerContext* context, const v1::CommitRequest* request,
                      v1::CommitResponse*) override {
    ++commits;
    header = request->header();
    if (behaviour_ == Behaviour::kAbort) {
      return grpc::Status(grpc::StatusCode::ABORTED, "reading the StateBlock failed");
    }
    if (behaviour_ == Behaviour::kHang) {
      baton::testing::Eventually([&] { return context->IsCancelled(); }, std::chrono::seconds(30),
                                 std::chrono::milliseconds(5));
      return grpc::Status(grpc::StatusCode::CANCELLED, "gave up");
    }
    state = std::make_unique<model::SequenceState>(layout_);
    if (absl::Status s = state->EnsurePages(header.prompt_len()); !s.ok()) return ToGrpcStatus(s);
    const transfer::RegionSpans into = transfer::SpansOf(*state, header.prompt_len());
    absl::Status read = transfer::MakeGrpcTransport()->Read(
        request->source(), address, into, transfer::Clock::now() + std::chrono::seconds(10));
    if (read.ok()) read = transfer::VerifyRegions(header, *state);
    return ToGrpcStatus(read);
  }

  std::string address;  // the prefill node's, where regions are read from
  std::atomic<int> commits{0};
  v1::StateHeader header;
  std::unique_ptr<model::SequenceState> state;  // what a kRead commit read

 private:
  model::StateLayout layout_;
  Behaviour behaviour_;
};

// The real engine, with the producer rows each prefill computes counted as it computes them.
class WatchedEngine final : public model::Engine {
 public:
  explicit WatchedEngine(model::Engine& inner) : inner_(inner) {}
  const ModelConfig& config() const override { return inner_.config(); }
  const std::string& fingerprint() const override { return inner_.fingerprint(); }
  model::Backend& backend() override { return inner_.backend(); }
  absl::StatusOr<model::PrefillResult> Prefill(std::span<const int32_t> tokens,
                                               const model::PrefillOptions& options,
                                               model::SequenceState& state) override {
    model::PrefillOptions watched = options;
    watched.on_producer_rows = [&](int64_t l, int64_t q_start, int64_t rows, const float* k,
                                   const float* v, int64_t stride) {
      producer_rows += rows;
      if (options.on_producer_rows) options.on_producer_rows(l, q_start, rows, k, v, stride);
    };
    return inner_.Prefill(tokens, watched, state);
  }
  absl::Status Step(std::span<const model::DecodeItem> decode,
                    std::span<const model::ReplayItem> replay) override {
    return inner_.Step(decode, replay);
  }
  model::HeldLayers held_layers() const override { return inner_.held_layers(); }
  int64_t weight_bytes() const override { return inner_.weight_bytes(); }
  absl::Status StageIn(std::span<const model::StageCopy> copies) override {
    return inner_.StageIn(copies);
  }
  absl::Status StageOut(std::span<const model::StageCopy> copies) override {
    return inner_.StageOut(copies);
  }

  std::atomic<int64_t> producer_rows{0};

 private:
  model::Engine& inner_;
};

// A prefix store that keeps what the prefill node writes back. A read of block KV is answered
// with the blocks (kServe) or with every one absent (kLose, a store that lost them after the
// router's lookup found them).
class FakeStore final : public v1::KvStore::Service {
 public:
  enum class BlockKv { kServe, kLose };

  explicit FakeStore(BlockKv block_kv) : block_kv_(block_kv) {}

  grpc::Status WriteBlocks(grpc::ServerContext*, grpc::ServerReader<v1::BlockWrite>* reader,
                           v1::WriteBlocksResponse* reply) override {
    v1::BlockWrite write;
    while (reader->Read(&write)) {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_[{write.region(), write.key()}] = write.payload();
      ++writes_;
      reply->set_written(reply->written() + 1);
    }
    return grpc::Status::OK;
  }

  grpc::Status ReadBlocks(grpc::ServerContext*, const v1::ReadBlocksRequest* request,
                          grpc::ServerWriter<v1::StoredBlock>* writer) override {
    const bool block_kv = request->region() == v1::STORE_REGION_BLOCK_KV;
    for (const std::string& key : request->keys()) {
      v1::StoredBlock block;
      block.set_key(key);
      if (!block_kv || block_kv_ == BlockKv::kServe) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = blocks_.find({request->region(), key});
        block.set_found(it != blocks_.end());
        if (it != blocks_.end()) block.set_payload(it->second);
      }
      writer->Write(block);
    }
    return grpc::Status::OK;
  }

  size_t stored() {
    std::lock_guard<std::mutex> lock(mutex_);
    return blocks_.size();
  }
  // Values written, a value written again counted again.
  size_t writes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return writes_;
  }

 private:
  const BlockKv block_kv_;
  std::mutex mutex_;
  size_t writes_ = 0;
  std::map<std::pair<int, std::string>, std::string> blocks_;
};

class PrefillServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = baton::testing::ProcessTempDir() + "/prefill_service_model";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 3, dir).ok());
    engine_ = model::LoadEngine(dir)->release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }

  // A prefill service and the fake decode node on one loopback server.
  // With `engine` the service runs on it (the suite's engine otherwise), and with `store` that
  // service is served beside it too.
  void Start(FakeDecodeNode::Behaviour behaviour, int64_t commit_timeout_ms = 10000,
             const std::function<void(PrefillOptions&)>& configure = nullptr,
             model::Engine* engine = nullptr, grpc::Service* store = nullptr) {
    PrefillOptions options{
        .token_budget = 16, .use_ucx = false, .commit_timeout_ms = commit_timeout_ms};
    if (configure) configure(options);
    service_ = std::make_unique<PrefillService>(engine != nullptr ? *engine : *engine_, options);
    decode_ = std::make_unique<FakeDecodeNode>(engine_->state_layout(), behaviour);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    builder.RegisterService(decode_.get());
    if (store != nullptr) builder.RegisterService(store);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
    decode_->address = address_;
    stub_ =
        v1::PrefillNode::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override { Stop(); }

  // Stops the server, then the service (its last copies and store writes end with it): a test
  // that gave Start an engine or a store of its own stops before they go.
  void Stop() {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
    service_.reset();
  }

  std::vector<int32_t> Prompt(int n) const {
    std::vector<int32_t> tokens;
    for (int i = 0; i < n; ++i) tokens.push_back(3 + (i * 37) % 500);
    return tokens;
  }

  // What the router sends: a reservation sized for the prompt on the fake decode node.
  v1::PrefillRequest Request(const std::vector<int32_t>& prompt) const {
    v1::PrefillRequest request;
    v1::GenerateRequest& generate = *request.mutable_request();
    generate.set_request_id("prefill-service-test");
    for (int32_t t : prompt) generate.add_prompt_token_ids(t);
    generate.mutable_sampling()->set_max_tokens(4);
    request.set_mode(v1::TRUNCATION_MODE_COMPACT);
    request.set_keep(static_cast<uint32_t>(engine_->config().ring_capacity()));
    const transfer::RegionSizes sizes =
        transfer::RegionSizesFor(engine_->state_layout(), prompt.size());
    v1::Reservation& reservation = *request.mutable_reservation();
    reservation.set_reservation_id("0123456789abcdef0123456789abcdef");
    reservation.set_producer_swa_bytes(sizes.producer_swa);
    reservation.set_consumer_swa_bytes(sizes.consumer_swa);
    reservation.set_page_bytes(sizes.page);
    reservation.set_pages(static_cast<uint32_t>(sizes.pages));
    request.set_decode_address(address_);
    request.set_transport(v1::TRANSPORT_GRPC);
    return request;
  }

  // The call's status and its baton-failed-node trailer ("" when absent).
  std::pair<grpc::Status, std::string> Call(const v1::PrefillRequest& request,
                                            v1::PrefillResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    const grpc::Status status = stub_->Prefill(&context, request, response);
    const auto& trailers = context.GetServerTrailingMetadata();
    auto failed = trailers.find(kFailedNodeKey);
    return {status, failed == trailers.end()
                        ? ""
                        : std::string(failed->second.data(), failed->second.size())};
  }

  // The state the fake decode node read is `expected`, bit for bit.
  void ExpectTheDecodeNodeRead(const model::SequenceState& expected) const {
    ASSERT_NE(decode_->state, nullptr);
    const model::SequenceState& read = *decode_->state;
    const model::StateLayout layout = engine_->state_layout();
    EXPECT_EQ(std::memcmp(read.producer_swa(), expected.producer_swa(),
                          layout.producer_swa_floats() * sizeof(float)),
              0);
    EXPECT_EQ(std::memcmp(read.consumer_swa(), expected.consumer_swa(),
                          layout.consumer_swa_floats() * sizeof(float)),
              0);
    ASSERT_EQ(read.pages().size(), expected.pages().size());
    for (size_t p = 0; p < read.pages().size(); ++p) {
      // The last page holds positions past the prompt only as zeros on both sides.
      EXPECT_EQ(
          std::memcmp(read.pages()[p], expected.pages()[p], layout.page_floats() * sizeof(float)),
          0)
          << "page " << p;
    }
  }

  static model::Engine* engine_;
  std::unique_ptr<PrefillService> service_;
  std::unique_ptr<FakeDecodeNode> decode_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::PrefillNode::Stub> stub_;
  std::string address_;
};

model::Engine* PrefillServiceTest::engine_ = nullptr;

TEST_F(PrefillServiceTest, TheDecodeNodeReadsThePromptsStateAndItsFirstToken) {
  Start(FakeDecodeNode::Behaviour::kRead);
  const std::vector<int32_t> prompt = Prompt(70);  // chunks of 16; compact K = C = 22
  v1::PrefillResponse response;
  const auto [status, failed_node] = Call(Request(prompt), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(failed_node, "");
  ASSERT_EQ(decode_->commits, 1);
  ASSERT_NE(decode_->state, nullptr);
  EXPECT_EQ(decode_->header.prompt_len(), prompt.size());
  EXPECT_EQ(decode_->header.first_token(), response.first_token());

  // The engine's own prefill of the same prompt, options and chunking.
  const model::StateLayout layout = engine_->state_layout();
  model::SequenceState expected(layout);
  absl::StatusOr<model::PrefillResult> result = engine_->Prefill(
      prompt,
      {.mode = model::TruncationMode::kCompact, .keep = layout.ring_capacity, .chunk_size = 16},
      expected);
  ASSERT_TRUE(result.ok()) << result.status();
  const int64_t V = engine_->config().vocab_size;
  EXPECT_EQ(response.first_token(),
            model::Argmax({result->logits.data() + result->logits.size() - V,
                           static_cast<size_t>(V)}));  // greedy sampling
  EXPECT_EQ(response.usage().replayed_rows(), static_cast<uint32_t>(result->consumer_rows));
  ExpectTheDecodeNodeRead(expected);
}

// The first token does not wait for the write-back: the prefill is answered before its
// computed blocks are copied into the node's block cache (the node's copier thread holds them
// here), and a drain waits for the copies.
TEST_F(PrefillServiceTest, TheAnswerDoesNotWaitForTheWriteBackAndADrainDoes) {
  std::mutex mutex;
  std::condition_variable released_cv;
  bool released = false;
  std::atomic<int> write_backs{0};
  Start(FakeDecodeNode::Behaviour::kRead, 10000, [&](PrefillOptions& options) {
    options.block_cache_bytes = uint64_t{64} << 20;
    options.before_write_back = [&] {
      ++write_backs;
      std::unique_lock<std::mutex> lock(mutex);
      released_cv.wait(lock, [&] { return released; });
    };
  });
  const int64_t B = engine_->config().kv_block_size;
  v1::PrefillResponse response;
  const auto [status, failed] = Call(Request(Prompt(static_cast<int>(3 * B + 5))), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(baton::testing::Eventually([&] { return write_backs.load() == 1; }));
  EXPECT_EQ(service_->Load().block_cache_bytes(), 0u);  // answered before the copies
  EXPECT_EQ(service_->Load().active_requests(), 0u);    // and no longer active
  {
    std::lock_guard<std::mutex> lock(mutex);
    released = true;
  }
  released_cv.notify_all();
  service_->Drain(std::chrono::steady_clock::now() + std::chrono::seconds(30));
  EXPECT_GT(service_->Load().block_cache_bytes(), 0u);  // the drain waited for them
  EXPECT_EQ(write_backs.load(), 1);
}

TEST_F(PrefillServiceTest, AFailedReadIsTheDecodeNodesAndGoesBackAsItIs) {
  Start(FakeDecodeNode::Behaviour::kAbort);
  v1::PrefillResponse response;
  const auto [status, failed_node] = Call(Request(Prompt(40)), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED) << status.error_message();
  EXPECT_EQ(failed_node, "decode");
  EXPECT_EQ(decode_->commits, 1);
}

TEST_F(PrefillServiceTest, ADecodeNodeSilentPastTheCommitTimeoutIsTakenForLost) {
  Start(FakeDecodeNode::Behaviour::kHang, /*commit_timeout_ms=*/300);
  v1::PrefillResponse response;
  const auto [status, failed_node] = Call(Request(Prompt(40)), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("did not answer the commit within 300 ms"));
  EXPECT_EQ(failed_node, "decode");
}

TEST_F(PrefillServiceTest, AReservationSizedForAnotherPromptIsRefusedBeforeAnyCommit) {
  Start(FakeDecodeNode::Behaviour::kRead);
  v1::PrefillRequest request = Request(Prompt(40));
  request.mutable_reservation()->set_pages(request.reservation().pages() + 1);
  v1::PrefillResponse response;
  const auto [status, failed_node] = Call(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("reservation"));
  EXPECT_EQ(failed_node, "");
  EXPECT_EQ(decode_->commits, 0);
}

TEST_F(PrefillServiceTest, ATokenOutsideTheVocabularyIsRefusedByName) {
  Start(FakeDecodeNode::Behaviour::kRead);
  std::vector<int32_t> prompt = Prompt(20);
  prompt[7] = static_cast<int32_t>(engine_->config().vocab_size);
  v1::PrefillResponse response;
  const auto [status, failed_node] = Call(Request(prompt), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("token 7"));
  EXPECT_EQ(decode_->commits, 0);
}

// A store hit's prompt, written back by its cold prefill, then prefilled again with the
// first H = 48 tokens from the store: the producers compute [H, L) only, and the state the
// decode node reads is the engine's own prefill of the prompt with s_valid = H, bit for bit.
// With the block KV lost after the router's lookup, the prompt is computed from its first
// token into the same state (DESIGN section 3, s_valid).
class PrefixLoadTest : public PrefillServiceTest,
                       public ::testing::WithParamInterface<FakeStore::BlockKv> {};

TEST_P(PrefixLoadTest, AHitsStateIsTheEnginesWithSValidHAndALostHitIsComputed) {
  WatchedEngine engine(*engine_);
  FakeStore store(GetParam());
  Start(
      FakeDecodeNode::Behaviour::kRead, 10000,
      // A slow test machine does not turn the hit into a miss.
      [](PrefillOptions& options) { options.store_read_min_ms = 30000; }, &engine, &store);
  const model::StateLayout layout = engine_->state_layout();
  const int64_t B = layout.block_size, C = layout.ring_capacity;
  const std::vector<int32_t> prompt = Prompt(70);  // 4 full blocks of 16; C = 22
  const int64_t H = (static_cast<int64_t>(prompt.size()) - C) / B * B;  // the cap: 48
  ASSERT_EQ(H, 48);
  v1::PrefillRequest request = Request(prompt);
  v1::StoreNode& node = *request.mutable_stores()->add_nodes();
  node.set_node_id("store");
  node.set_address(address_);
  request.mutable_stores()->set_replication(1);

  v1::PrefillResponse cold;
  ASSERT_TRUE(Call(request, &cold).first.ok());
  // Both regions of the 4 full blocks, written back after the answer.
  ASSERT_TRUE(baton::testing::Eventually([&] { return store.stored() == 8; }));

  engine.producer_rows = 0;
  request.set_s_valid(static_cast<uint64_t>(H));
  v1::PrefillResponse hit;
  const auto [status, failed_node] = Call(request, &hit);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const bool served = GetParam() == FakeStore::BlockKv::kServe;
  EXPECT_EQ(hit.usage().cached_tokens(), served ? static_cast<uint32_t>(H) : 0u);
  // Loaded, the producers computed [H, L) only; lost, all of [0, L).
  const int64_t L = static_cast<int64_t>(prompt.size());
  EXPECT_EQ(engine.producer_rows.load(), layout.producer_layers * (served ? L - H : L));

  model::SequenceState expected(layout);
  absl::StatusOr<model::PrefillResult> result = engine_->Prefill(
      prompt, {.mode = model::TruncationMode::kCompact, .keep = C, .s_valid = H, .chunk_size = 16},
      expected);
  ASSERT_TRUE(result.ok()) << result.status();
  const int64_t V = engine_->config().vocab_size;
  EXPECT_EQ(hit.first_token(), model::Argmax({result->logits.data() + result->logits.size() - V,
                                              static_cast<size_t>(V)}));
  EXPECT_EQ(decode_->header.s_valid(), static_cast<uint64_t>(H));
  ExpectTheDecodeNodeRead(expected);
  // What it computed is written back after the answer: block 3 after the hit, all four after
  // a lost one (both regions each). The node is stopped only then: its copies read the engine.
  const size_t written = 8 + (served ? 2 : 8);
  EXPECT_TRUE(baton::testing::Eventually([&] { return store.writes() == written; }))
      << store.writes() << " values written, " << written << " expected";
  Stop();
}

INSTANTIATE_TEST_SUITE_P(BlockKv, PrefixLoadTest,
                         ::testing::Values(FakeStore::BlockKv::kServe, FakeStore::BlockKv::kLose),
                         [](const auto& info) {
                           return info.param == FakeStore::BlockKv::kServe ? "Served" : "Lost";
                         });

}  // namespace
}  // namespace baton::prefill_node
