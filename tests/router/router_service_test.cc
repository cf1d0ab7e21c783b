// The router's request pipeline in one process: RouterService with gRPC's generated mock stubs
// (node_mock.grpc.pb.h, kvstore_mock.grpc.pb.h) in place of its prefill, decode and kvstore
// nodes. Each test drives a stage of GenerateCall (resolve and validate, admit, reserve, look
// up the prefix, prefill, relay) or a rule of the retry policy (routing.h kRetryPolicy) and
// checks what the client received and what each node was asked.
#include "baton/router/router_service.h"

#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "baton/common/ced_rules.h"
#include "baton/common/rpc.h"
#include "baton/kvstore/block_cache.h"
#include "baton/kvstore/chain.h"
#include "baton/kvstore/hit_policy.h"
#include "baton/kvstore/placement.h"
#include "baton/model/model_factory.h"
#include "baton/router/routing.h"
#include "baton/v1/kvstore_mock.grpc.pb.h"
#include "baton/v1/node_mock.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/test/server_context_test_spouse.h"
#include "gtest/gtest.h"

namespace baton::router {
namespace {

using ::testing::_;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Invoke;
using ::testing::NiceMock;
using ::testing::Return;

// What the client received.
class FakeWriter : public ResponseWriter {
 public:
  bool Write(const v1::GenerateResponse& response, grpc::WriteOptions) override {
    if (gone) return false;
    responses.push_back(response);
    return true;
  }
  void SendInitialMetadata() override {}

  std::vector<int32_t> Tokens() const {
    std::vector<int32_t> tokens;
    for (const auto& r : responses)
      tokens.insert(tokens.end(), r.token_ids().begin(), r.token_ids().end());
    return tokens;
  }
  bool gone = false;  // the client went away: every write fails
  std::vector<v1::GenerateResponse> responses;
};

// A decode node's stream: these outputs, then `status`.
class FakeStream : public grpc::ClientReaderInterface<v1::DecodeOutput> {
 public:
  FakeStream(std::vector<v1::DecodeOutput> outputs, grpc::Status status)
      : outputs_(std::move(outputs)), status_(std::move(status)) {}
  bool Read(v1::DecodeOutput* output) override {
    if (next_ >= outputs_.size()) return false;
    *output = outputs_[next_++];
    return true;
  }
  bool NextMessageSize(uint32_t* size) override {
    *size = next_ < outputs_.size() ? static_cast<uint32_t>(outputs_[next_].ByteSizeLong()) : 0;
    return next_ < outputs_.size();
  }
  grpc::Status Finish() override { return status_; }
  void WaitForInitialMetadata() override {}

 private:
  std::vector<v1::DecodeOutput> outputs_;
  grpc::Status status_;
  size_t next_ = 0;
};

v1::DecodeOutput Output(std::vector<int32_t> tokens,
                        v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED) {
  v1::DecodeOutput output;
  for (int32_t t : tokens) {
    output.add_token_ids(t);
    output.add_logprobs(-0.5f);
  }
  output.set_finish_reason(finish);
  return output;
}

// The fakes behind each registered node, by node id.
class FakeNodes : public NodeStubs {
 public:
  std::shared_ptr<v1::PrefillNode::StubInterface> Prefill(const RegisteredNode& node) override {
    return prefill.at(node.id());
  }
  std::shared_ptr<v1::DecodeNode::StubInterface> Decode(const RegisteredNode& node) override {
    return decode.at(node.id());
  }
  std::shared_ptr<v1::KvStore::StubInterface> KvStore(const RegisteredNode& node) override {
    return kvstore.at(node.id());
  }
  std::string FailedNode(const grpc::ClientContext& context) override {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = blamed.find(&context);
    return it == blamed.end() ? "" : it->second;
  }
  // A failed Prefill call whose server names the decode node (kFailedNodeKey).
  grpc::Status BlameDecode(grpc::ClientContext* context, grpc::Status status) {
    std::lock_guard<std::mutex> lock(mutex);
    blamed[context] = "decode";
    return status;
  }

  std::map<std::string, std::shared_ptr<NiceMock<v1::MockPrefillNodeStub>>> prefill;
  std::map<std::string, std::shared_ptr<NiceMock<v1::MockDecodeNodeStub>>> decode;
  std::map<std::string, std::shared_ptr<NiceMock<v1::MockKvStoreStub>>> kvstore;
  std::mutex mutex;
  std::map<const grpc::ClientContext*, std::string> blamed;
};

class RouterServiceTest : public ::testing::Test {
 protected:
  RouterServiceTest() : config_(*model::PresetConfig("tiny")) {}

  RouterService& Router() {
    if (router_ == nullptr) {
      options_.stubs = nodes_;
      router_ = std::make_unique<RouterService>(config_, options_);
    }
    return *router_;
  }

  // A store node's answer that it holds both regions of every key it was asked.
  static grpc::Status HoldAll(const v1::ProbeRequest& probe, v1::ProbeResponse* found) {
    for (int i = 0; i < probe.keys_size(); ++i) {
      found->add_block_kv(true);
      found->add_producer_swa(true);
    }
    return grpc::Status::OK;
  }
  // The hit policy's blocks for a prompt of `prompt_len` tokens whose whole chain the store
  // holds, under the router's default truncation.
  int64_t HitBlocksWhenAllHeld(int prompt_len) const {
    const int64_t n = prompt_len / config_.kv_block_size;
    kvstore::ChainLookup all;
    all.block_kv_blocks = n;
    all.swa_present.assign(n, true);
    return kvstore::HitBlocks({.prompt_len = prompt_len,
                               .keep = config_.ring_capacity(),
                               .truncation_on = true,
                               .ring_capacity = config_.ring_capacity(),
                               .window = config_.sliding_window,
                               .block_size = config_.kv_block_size,
                               .cap = options_.hit_cap},
                              all);
  }
  // Registers a node of `role` (holding `held`, speaking StateBlock format `format`) and gives
  // its fake; the registration's status.
  grpc::Status Register(const std::string& id, v1::NodeRole role, uint32_t format = 2,
                        v1::HeldLayers held = v1::HELD_LAYERS_ALL,
                        const v1::CacheEventBatch* events = nullptr,
                        v1::RegisterResponse* answer = nullptr) {
    v1::RegisterRequest request;
    request.set_node_id(id);
    request.set_role(role);
    request.set_address(id + ".invalid:1");
    request.set_model_fingerprint("weights-a");
    request.set_state_format_version(format);
    request.set_held_layers(held);
    request.mutable_load()->set_total_slots(8);
    if (events != nullptr) *request.mutable_cache_events() = *events;
    grpc::ServerContext context;
    v1::RegisterResponse reply;
    const grpc::Status status = Router().Register(&context, &request, &reply);
    if (answer != nullptr) *answer = reply;
    return status;
  }
  // Prefill node `id`'s heartbeat carrying `events`; the router's answer.
  v1::RegisterResponse SendEvents(const std::string& id, const v1::CacheEventBatch& events,
                                  grpc::Status* status = nullptr) {
    v1::RegisterResponse reply;
    const grpc::Status s =
        Register(id, v1::NODE_ROLE_PREFILL, 2, v1::HELD_LAYERS_ALL, &events, &reply);
    if (status != nullptr) *status = s;
    return reply;
  }
  // A snapshot batch saying `keys` (both regions) is all a node holds.
  static v1::CacheEventBatch Snapshot(uint64_t sequence, const std::vector<Sha256Digest>& keys) {
    v1::CacheEventBatch batch;
    batch.set_sequence(sequence);
    batch.set_snapshot(true);
    batch.add_events()->mutable_all_blocks_cleared();
    for (v1::StoreRegion group : {v1::STORE_REGION_BLOCK_KV, v1::STORE_REGION_PRODUCER_SWA}) {
      v1::BlockStored& stored = *batch.add_events()->mutable_block_stored();
      for (const Sha256Digest& key : keys) stored.add_block_hashes(kvstore::KeyBytes(key));
      stored.set_cache_group(group);
      stored.set_medium("cpu");
    }
    return batch;
  }
  // A prefill node's registration as `id` (its load to fill in), and its sending.
  static v1::RegisterRequest PrefillHeartbeat(const std::string& id) {
    v1::RegisterRequest heartbeat;
    heartbeat.set_node_id(id);
    heartbeat.set_role(v1::NODE_ROLE_PREFILL);
    heartbeat.set_address(id + ".invalid:1");
    heartbeat.set_model_fingerprint("weights-a");
    heartbeat.set_state_format_version(2);
    return heartbeat;
  }
  grpc::Status Heartbeat(const v1::RegisterRequest& heartbeat) {
    grpc::ServerContext context;
    v1::RegisterResponse reply;
    return Router().Register(&context, &heartbeat, &reply);
  }
  NiceMock<v1::MockPrefillNodeStub>& Prefill(const std::string& id) {
    auto& mock = nodes_->prefill[id];
    if (mock == nullptr) {
      mock = std::make_shared<NiceMock<v1::MockPrefillNodeStub>>();
      const bool replay = options_.split == v1::SPLIT_REPLAY_ON_DECODE;
      EXPECT_TRUE(Register(id, v1::NODE_ROLE_PREFILL, 2,
                           replay ? v1::HELD_LAYERS_PRODUCERS : v1::HELD_LAYERS_ALL)
                      .ok());
    }
    return *mock;
  }
  // A decode node whose Reserve gives reservation "<id>-r", and whose stream is `outputs`
  // then `status`.
  NiceMock<v1::MockDecodeNodeStub>& Decode(const std::string& id,
                                           std::vector<v1::DecodeOutput> outputs = {},
                                           grpc::Status status = grpc::Status::OK) {
    auto& mock = nodes_->decode[id];
    if (mock == nullptr) {
      mock = std::make_shared<NiceMock<v1::MockDecodeNodeStub>>();
      EXPECT_TRUE(Register(id, v1::NODE_ROLE_DECODE).ok());
    }
    ON_CALL(*mock, Reserve(_, _, _))
        .WillByDefault(Invoke(
            [id](grpc::ClientContext*, const v1::ReserveRequest&, v1::Reservation* reservation) {
              reservation->set_reservation_id(id + "-r");
              return grpc::Status::OK;
            }));
    ON_CALL(*mock, StreamRaw(_, _))
        .WillByDefault(Invoke([outputs, status](grpc::ClientContext*, const v1::StreamRequest&) {
          return new FakeStream(outputs, status);
        }));
    return *mock;
  }
  // A Prefill answer with first token `token`.
  static auto FirstToken(int32_t token, v1::PrefillRequest* seen = nullptr) {
    return Invoke([token, seen](grpc::ClientContext*, const v1::PrefillRequest& request,
                                v1::PrefillResponse* response) {
      if (seen != nullptr) *seen = request;
      response->set_first_token(token);
      response->set_first_logprob(-0.25f);
      return grpc::Status::OK;
    });
  }

  // A Reserve answer with reservation `id` that keeps the request in `seen`.
  static auto Reserved(const std::string& id, v1::ReserveRequest* seen) {
    return Invoke([id, seen](grpc::ClientContext*, const v1::ReserveRequest& request,
                             v1::Reservation* reservation) {
      *seen = request;
      reservation->set_reservation_id(id);
      return grpc::Status::OK;
    });
  }

  v1::GenerateRequest Request(int prompt_len = 8, uint32_t max_tokens = 8) const {
    v1::GenerateRequest request;
    for (int i = 0; i < prompt_len; ++i) request.add_prompt_token_ids(3 + i);
    request.mutable_sampling()->set_max_tokens(max_tokens);
    request.set_request_id("req-test");
    return request;
  }
  grpc::Status Generate(const v1::GenerateRequest& request, FakeWriter& writer,
                        grpc::ServerContext* context = nullptr) {
    grpc::ServerContext own;
    return Router().Serve(context != nullptr ? context : &own, request, &writer);
  }

  ModelConfig config_;
  RouterOptions options_;
  std::shared_ptr<FakeNodes> nodes_ = std::make_shared<FakeNodes>();
  std::unique_ptr<RouterService> router_;
};

// ---------------------------------------------------------------------------------------------
// The stages, undisturbed

TEST_F(RouterServiceTest, EveryStageRunsOnceAndTheClientGetsEveryToken) {
  v1::PrefillRequest prefill_seen;
  v1::ReserveRequest reserve_seen;
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _)).WillOnce(FirstToken(7, &prefill_seen));
  auto& decode = Decode("d1", {Output({8, 9}), Output({10}, v1::FINISH_REASON_LENGTH)});
  EXPECT_CALL(decode, Reserve(_, _, _)).WillOnce(Reserved("d1-r", &reserve_seen));
  EXPECT_CALL(decode, Release(_, _, _)).Times(0);  // the stream ran to its end
  FakeWriter writer;
  const grpc::Status status = Generate(Request(8, 4), writer);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(writer.Tokens(), ElementsAre(7, 8, 9, 10));
  ASSERT_EQ(writer.responses.size(), 3u);
  EXPECT_EQ(writer.responses.back().finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(writer.responses.back().usage().completion_tokens(), 4u);
  EXPECT_EQ(writer.responses.back().usage().prompt_tokens(), 8u);
  // Reserve: the prompt's length, the prefill node that may fill it, the attempt's id.
  EXPECT_EQ(reserve_seen.prompt_tokens(), 8u);
  EXPECT_EQ(reserve_seen.prefill_address(), "p1.invalid:1");
  EXPECT_EQ(reserve_seen.request_id(), "req-test#0");
  EXPECT_EQ(reserve_seen.completed_tokens(), 0u);
  // Prefill: the default truncation (compact, keep C), the reservation and where it lives.
  EXPECT_EQ(prefill_seen.mode(), v1::TRUNCATION_MODE_COMPACT);
  EXPECT_EQ(prefill_seen.keep(), static_cast<uint32_t>(config_.ring_capacity()));
  EXPECT_EQ(prefill_seen.reservation().reservation_id(), "d1-r");
  EXPECT_EQ(prefill_seen.decode_address(), "d1.invalid:1");
  EXPECT_EQ(prefill_seen.s_valid(), 0u);  // no kvstore: cold
  EXPECT_EQ(prefill_seen.request().prompt_token_ids_size(), 8);
}

TEST_F(RouterServiceTest, ValidateRefusesBeforeAnyNodeIsAsked) {
  options_.model_name = "tiny";
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _)).Times(0);
  EXPECT_CALL(Decode("d1"), Reserve(_, _, _)).Times(0);
  FakeWriter writer;
  v1::GenerateRequest request = Request();
  request.add_prompt_token_ids(config_.vocab_size);  // outside the vocabulary
  grpc::Status status = Generate(request, writer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("prompt_token_ids[8]"));
  request = Request();
  request.set_model("another");
  status = Generate(request, writer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  // A salt with a NUL byte could spell a keyed tenant's chain root on a shared store
  // (ChainKeysTest.ASaltWithANulByteCouldSpellAKeyedRoot): refused by name.
  request = Request();
  request.set_cache_salt(std::string("\x08\0\0\0tenant-a", 12));
  status = Generate(request, writer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("cache_salt: must not contain a NUL byte"));
  EXPECT_TRUE(writer.responses.empty());
}

TEST_F(RouterServiceTest, AdmitWithoutAPrefillNodeIsUnavailableAfterTheNodeTtl) {
  options_.node_ttl_ms = 100;
  Decode("d1");
  FakeWriter writer;
  const grpc::Status status = Generate(Request(), writer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("no prefill node"));
}

// A full queue refuses at once with a retry hint, while the only prefill slot is taken.
TEST_F(RouterServiceTest, AdmitRefusesPastTheQueueBoundWithARetryHint) {
  options_.prefill_slots = 1;
  options_.max_queued = 0;
  std::promise<void> entered, leave;
  std::shared_future<void> left = leave.get_future().share();
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _))
      .WillOnce(Invoke(
          [&](grpc::ClientContext*, const v1::PrefillRequest&, v1::PrefillResponse* response) {
            entered.set_value();
            left.wait();
            response->set_first_token(7);
            return grpc::Status::OK;
          }));
  Decode("d1", {Output({8}, v1::FINISH_REASON_LENGTH)});
  FakeWriter first_writer;
  grpc::Status first_status;
  std::thread first([&] { first_status = Generate(Request(), first_writer); });
  entered.get_future().wait();  // the first request holds the slot
  FakeWriter writer;
  grpc::ServerContext context;
  const grpc::Status status = Generate(Request(), writer, &context);
  leave.set_value();
  first.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("admission queue is full"));
  const auto trailers = grpc::testing::ServerContextTestSpouse(&context).GetTrailingMetadata();
  EXPECT_TRUE(trailers.contains(kRetryAfterKey));
  EXPECT_TRUE(first_status.ok()) << first_status.error_message();
  EXPECT_THAT(first_writer.Tokens(), ElementsAre(7, 8));
}

// With a kvstore, s_valid is the hit policy's answer to what the store holds.
TEST_F(RouterServiceTest, LookUpPrefixGivesThePrefillNodeTheHit) {
  const int prompt_len = 4 * config_.kv_block_size;
  nodes_->kvstore["s1"] = std::make_shared<NiceMock<v1::MockKvStoreStub>>();
  ASSERT_TRUE(Register("s1", v1::NODE_ROLE_KVSTORE).ok());
  int keys = 0;
  EXPECT_CALL(*nodes_->kvstore["s1"], Probe(_, _, _))
      .WillOnce(Invoke(
          [&](grpc::ClientContext*, const v1::ProbeRequest& request, v1::ProbeResponse* found) {
            keys = request.keys_size();
            return HoldAll(request, found);
          }));
  v1::PrefillRequest seen;
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _)).WillOnce(FirstToken(7, &seen));
  Decode("d1", {Output({8}, v1::FINISH_REASON_LENGTH)});
  FakeWriter writer;
  ASSERT_TRUE(Generate(Request(prompt_len), writer).ok());
  EXPECT_EQ(keys, prompt_len / config_.kv_block_size);
  const int64_t blocks = HitBlocksWhenAllHeld(prompt_len);
  ASSERT_GT(blocks, 0);
  EXPECT_EQ(int64_t{seen.s_valid()}, blocks * config_.kv_block_size);
}

// The prefill node whose local cache holds the prompt takes it (predicted-ttft and
// longest-prefix), with the hit from there; least-loaded sends it to the first idle node.
class RoutingPolicyTest : public RouterServiceTest,
                          public ::testing::WithParamInterface<PrefillPolicy> {};

TEST_P(RoutingPolicyTest, ThePolicyPricesWhereThePromptsBlocksLie) {
  options_.prefill_policy = GetParam();
  const int prompt_len = 6 * config_.kv_block_size;
  const v1::GenerateRequest request = Request(prompt_len);
  const std::vector<int32_t> tokens(request.prompt_token_ids().begin(),
                                    request.prompt_token_ids().end());
  const std::vector<Sha256Digest> keys =
      kvstore::ChainKeys("weights-a", "", "", tokens, config_.kv_block_size);
  v1::PrefillRequest on_a, on_b;
  // p-a sorts first: the least loaded on a tie.
  ON_CALL(Prefill("p-a"), Prefill(_, _, _)).WillByDefault(FirstToken(7, &on_a));
  ON_CALL(Prefill("p-b"), Prefill(_, _, _)).WillByDefault(FirstToken(7, &on_b));
  Decode("d1", {Output({8}, v1::FINISH_REASON_LENGTH)});
  grpc::Status status;
  EXPECT_FALSE(SendEvents("p-b", Snapshot(1, keys), &status).cache_resync());
  ASSERT_TRUE(status.ok()) << status.error_message();
  FakeWriter writer;
  ASSERT_TRUE(Generate(request, writer).ok());
  const int64_t cap = (prompt_len - config_.ring_capacity()) / config_.kv_block_size;
  if (GetParam() == PrefillPolicy::kLeastLoaded) {
    EXPECT_EQ(on_a.request().prompt_token_ids_size(), prompt_len);
    EXPECT_EQ(on_b.request().prompt_token_ids_size(), 0);
    EXPECT_EQ(on_a.s_valid(), 0u);
  } else {
    EXPECT_EQ(on_a.request().prompt_token_ids_size(), 0);
    ASSERT_EQ(on_b.request().prompt_token_ids_size(), prompt_len);
    EXPECT_EQ(int64_t{on_b.s_valid()}, cap * config_.kv_block_size);
  }
  // Every policy's choice is priced, for the client's timings and the metrics.
  EXPECT_GT(writer.responses.back().timings().predicted_ttft_ms(), 0);
}

INSTANTIATE_TEST_SUITE_P(Policies, RoutingPolicyTest,
                         ::testing::Values(PrefillPolicy::kLeastLoaded,
                                           PrefillPolicy::kLongestPrefix,
                                           PrefillPolicy::kPredictedTtft),
                         [](const ::testing::TestParamInfo<PrefillPolicy>& info) {
                           std::string name = kvstore::RoutingPolicyName(info.param);
                           std::erase(name, '-');
                           return name;
                         });

// A node's rates and queue price it: a node predicted slower than another that holds no block
// loses the request even with a hit (predicted-ttft weighs time, not blocks).
TEST_F(RouterServiceTest, PredictedTtftWeighsAHitAgainstANodesMeasuredRates) {
  options_.prefill_policy = PrefillPolicy::kPredictedTtft;
  const int prompt_len = 6 * config_.kv_block_size;
  const v1::GenerateRequest request = Request(prompt_len);
  const std::vector<int32_t> tokens(request.prompt_token_ids().begin(),
                                    request.prompt_token_ids().end());
  v1::PrefillRequest on_a, on_b;
  ON_CALL(Prefill("p-a"), Prefill(_, _, _)).WillByDefault(FirstToken(7, &on_a));
  ON_CALL(Prefill("p-b"), Prefill(_, _, _)).WillByDefault(FirstToken(7, &on_b));
  Decode("d1", {Output({8}, v1::FINISH_REASON_LENGTH)});
  // p-b holds the prompt but has measured a fixed cost per request far above computing it on
  // p-a.
  for (const auto& [id, fixed_ms] : {std::pair{"p-a", 5.0}, std::pair{"p-b", 60000.0}}) {
    v1::RegisterRequest heartbeat = PrefillHeartbeat(id);
    heartbeat.mutable_load()->mutable_rates()->set_fixed_ms(fixed_ms);
    heartbeat.mutable_load()->mutable_rates()->set_samples(3);
    if (std::string(id) == "p-b") {
      *heartbeat.mutable_cache_events() =
          Snapshot(1, kvstore::ChainKeys("weights-a", "", "", tokens, config_.kv_block_size));
    }
    ASSERT_TRUE(Heartbeat(heartbeat).ok());
  }
  FakeWriter writer;
  ASSERT_TRUE(Generate(request, writer).ok());
  EXPECT_EQ(on_a.request().prompt_token_ids_size(), prompt_len);
  EXPECT_EQ(on_b.request().prompt_token_ids_size(), 0);
}

// The router indexes what it placed on a prefill node with a block cache when it places it: a
// prompt sent again before the node's next heartbeat goes where its blocks now are, with the
// hit from that node's cache. A node without a block cache keeps nothing, and none is assumed.
class PlacedBlocksTest : public RouterServiceTest, public ::testing::WithParamInterface<bool> {};

TEST_P(PlacedBlocksTest, APromptSentAgainBeforeAHeartbeatFindsItsBlocksWhereTheyWereComputed) {
  const bool block_cache = GetParam();
  options_.prefill_policy = PrefillPolicy::kLongestPrefix;
  const int prompt_len = 6 * config_.kv_block_size;
  std::vector<v1::PrefillRequest> seen;
  for (const char* id : {"p-a", "p-b"}) {
    auto& mock = nodes_->prefill[id];
    mock = std::make_shared<NiceMock<v1::MockPrefillNodeStub>>();
    v1::RegisterRequest heartbeat = PrefillHeartbeat(id);
    heartbeat.mutable_load()->set_block_cache_budget_bytes(block_cache ? uint64_t{1} << 30 : 0);
    ASSERT_TRUE(Heartbeat(heartbeat).ok());
    ON_CALL(*mock, Prefill(_, _, _))
        .WillByDefault(Invoke([&seen, id](grpc::ClientContext*, const v1::PrefillRequest& request,
                                          v1::PrefillResponse* response) {
          seen.push_back(request);
          seen.back().set_decode_address(id);  // which node was asked
          response->set_first_token(7);
          return grpc::Status::OK;
        }));
  }
  Decode("d1", {Output({8}, v1::FINISH_REASON_LENGTH)});
  for (int i = 0; i < 2; ++i) {
    FakeWriter writer;
    ASSERT_TRUE(Generate(Request(prompt_len), writer).ok());
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].s_valid(), 0u) << "nothing was cached yet";
  const int64_t cap = (prompt_len - config_.ring_capacity()) / config_.kv_block_size;
  ASSERT_GT(cap, 0);
  if (block_cache) {
    EXPECT_EQ(seen[1].decode_address(), seen[0].decode_address());
    EXPECT_EQ(int64_t{seen[1].s_valid()}, cap * config_.kv_block_size);
    EXPECT_EQ(Router().registry().cache_index().expected(seen[0].decode_address()),
              2u * (prompt_len / config_.kv_block_size));
  } else {
    EXPECT_EQ(seen[1].s_valid(), 0u);
    EXPECT_EQ(Router().registry().cache_index().blocks(seen[0].decode_address()), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(BlockCache, PlacedBlocksTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "WithBlockCache" : "WithoutBlockCache";
                         });

TEST_F(RouterServiceTest, CacheEventsAfterAGapAskForASnapshot) {
  Prefill("p1");
  const std::vector<Sha256Digest> keys = {Sha256Of("a", 1)};
  v1::CacheEventBatch batch = Snapshot(1, keys);
  batch.set_snapshot(false);
  // A first batch that is no snapshot: the router cannot know what came before it.
  EXPECT_TRUE(SendEvents("p1", batch).cache_resync());
  EXPECT_FALSE(SendEvents("p1", Snapshot(1, keys)).cache_resync());
  batch.set_sequence(2);
  EXPECT_FALSE(SendEvents("p1", batch).cache_resync());
  batch.set_sequence(4);  // 3 was missed
  EXPECT_TRUE(SendEvents("p1", batch).cache_resync());
  EXPECT_EQ(Router().registry().cache_index().blocks("p1"), 0u);
  EXPECT_FALSE(SendEvents("p1", Snapshot(5, keys)).cache_resync());
  EXPECT_EQ(Router().registry().cache_index().blocks("p1"), 2u);
}

TEST_F(RouterServiceTest, BadCacheEventsAreRefusedByName) {
  Prefill("p1");
  v1::CacheEventBatch batch = Snapshot(1, {Sha256Of("a", 1)});
  batch.mutable_events(1)->mutable_block_stored()->mutable_block_hashes(0)->resize(31);
  grpc::Status status;
  SendEvents("p1", batch, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("cache_events.events[1].block_stored.block_hashes[0]"));
  batch = Snapshot(1, {Sha256Of("a", 1)});
  batch.mutable_events(2)->mutable_block_stored()->set_cache_group(v1::STORE_REGION_UNSPECIFIED);
  SendEvents("p1", batch, &status);
  EXPECT_THAT(status.error_message(), HasSubstr("cache_events.events[2].block_stored.cache_group"));
  batch = Snapshot(1, {});
  for (size_t i = 0; i <= kvstore::kMaxCacheEventHashes; ++i) {
    batch.mutable_events(1)->mutable_block_stored()->add_block_hashes(std::string(32, 'x'));
  }
  SendEvents("p1", batch, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("block hashes; at most"));
  // Nothing of a refused batch is applied.
  EXPECT_EQ(Router().registry().cache_index().blocks("p1"), 0u);
  // Only a prefill node has a block cache.
  Decode("d1");
  EXPECT_EQ(Register("d1", v1::NODE_ROLE_DECODE, 2, v1::HELD_LAYERS_ALL, &(batch = Snapshot(1, {})))
                .error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// A fleet of three store nodes with two owners per value: each node is asked once, for
// exactly the keys it owns; a key counts as held when any owner holds it, so one failing owner
// costs no hit; and the prefill carries the nodes that answered, and R.
TEST_F(RouterServiceTest, AFleetIsProbedByOwnerAndTheSetTravelsWithThePrefill) {
  options_.kvstore_replication = 2;
  const std::vector<std::string> ids = {"s1", "s2", "s3"};
  for (const std::string& id : ids) {
    nodes_->kvstore[id] = std::make_shared<NiceMock<v1::MockKvStoreStub>>();
    ASSERT_TRUE(Register(id, v1::NODE_ROLE_KVSTORE).ok());
  }
  const int prompt_len = 6 * config_.kv_block_size;
  const v1::GenerateRequest request = Request(prompt_len);
  const std::vector<int32_t> tokens(request.prompt_token_ids().begin(),
                                    request.prompt_token_ids().end());
  const std::vector<Sha256Digest> chain =
      kvstore::ChainKeys("weights-a", "", "", tokens, config_.kv_block_size);
  std::mutex mutex;
  std::map<std::string, std::vector<std::string>> asked;
  for (const std::string& id : ids) {
    EXPECT_CALL(*nodes_->kvstore[id], Probe(_, _, _))
        .WillOnce(Invoke(
            [&, id](grpc::ClientContext*, const v1::ProbeRequest& probe, v1::ProbeResponse* found) {
              std::lock_guard<std::mutex> lock(mutex);
              asked[id].assign(probe.keys().begin(), probe.keys().end());
              if (id == "s2") return grpc::Status(grpc::StatusCode::UNAVAILABLE, "down");
              return HoldAll(probe, found);
            }));
  }
  v1::PrefillRequest seen;
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _)).WillOnce(FirstToken(7, &seen));
  Decode("d1", {Output({8}, v1::FINISH_REASON_LENGTH)});
  FakeWriter writer;
  ASSERT_TRUE(Generate(request, writer).ok());
  for (size_t n = 0; n < ids.size(); ++n) {
    std::vector<std::string> owned;
    for (const Sha256Digest& key : chain) {
      for (size_t owner : kvstore::Owners(key, ids, 2)) {
        if (owner == n) owned.push_back(kvstore::KeyBytes(key));
      }
    }
    EXPECT_EQ(asked[ids[n]], owned) << ids[n];
  }
  // Every key has an owner besides s2: the whole chain is held.
  const int64_t blocks = HitBlocksWhenAllHeld(prompt_len);
  ASSERT_GT(blocks, 0);
  EXPECT_EQ(int64_t{seen.s_valid()}, blocks * config_.kv_block_size);
  // s2 did not answer: the prefill reads from and writes to the others only.
  ASSERT_EQ(seen.stores().nodes_size(), 2);
  EXPECT_EQ(seen.stores().nodes(0).node_id(), "s1");
  EXPECT_EQ(seen.stores().nodes(0).address(), "s1.invalid:1");
  EXPECT_EQ(seen.stores().nodes(1).node_id(), "s3");
  EXPECT_EQ(seen.stores().replication(), 2u);
}

TEST_F(RouterServiceTest, AFailingPrefixStoreMeansACold) {
  nodes_->kvstore["s1"] = std::make_shared<NiceMock<v1::MockKvStoreStub>>();
  ASSERT_TRUE(Register("s1", v1::NODE_ROLE_KVSTORE).ok());
  EXPECT_CALL(*nodes_->kvstore["s1"], Probe(_, _, _))
      .WillOnce(Return(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "slow")));
  v1::PrefillRequest seen;
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _)).WillOnce(FirstToken(7, &seen));
  Decode("d1", {Output({8}, v1::FINISH_REASON_LENGTH)});
  FakeWriter writer;
  ASSERT_TRUE(Generate(Request(4 * config_.kv_block_size), writer).ok());
  EXPECT_EQ(seen.s_valid(), 0u);
}

// The prefill node's own refusal is the request's: returned as is, the reservation given back.
TEST_F(RouterServiceTest, APrefillRefusalIsTheClientsAndFreesTheReservation) {
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _))
      .WillOnce(Return(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "s_valid: too large")));
  auto& decode = Decode("d1");
  EXPECT_CALL(decode, Release(_, _, _)).Times(1);
  FakeWriter writer;
  const grpc::Status status = Generate(Request(), writer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "s_valid: too large");
}

TEST_F(RouterServiceTest, AClientGoneAtTheFirstTokenFreesTheReservation) {
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _)).WillOnce(FirstToken(7));
  auto& decode = Decode("d1");
  EXPECT_CALL(decode, Release(_, _, _)).Times(1);
  EXPECT_CALL(decode, StreamRaw(_, _)).Times(0);
  FakeWriter writer;
  writer.gone = true;
  EXPECT_EQ(Generate(Request(), writer).error_code(), grpc::StatusCode::CANCELLED);
}

// ---------------------------------------------------------------------------------------------
// The retry policy, rule by rule

TEST_F(RouterServiceTest, ADecodeNodeUnreachableAtReserveIsAvoided) {
  options_.node_ttl_ms = 60000;  // a marked-down node stays down for the test
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _)).WillOnce(FirstToken(7));
  auto& lost = Decode("d1");
  EXPECT_CALL(lost, Reserve(_, _, _))
      .WillOnce(Return(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused")));
  Decode("d2", {Output({8}, v1::FINISH_REASON_LENGTH)});
  FakeWriter writer;
  const grpc::Status status = Generate(Request(), writer);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(writer.Tokens(), ElementsAre(7, 8));  // d1 was asked once (WillOnce)
}

TEST_F(RouterServiceTest, AFailedTransferIsRetriedTwiceThenIsTheClients) {
  auto& prefill = Prefill("p1");
  EXPECT_CALL(prefill, Prefill(_, _, _))
      .Times(3)
      .WillRepeatedly(Invoke([&](grpc::ClientContext* context, const v1::PrefillRequest&,
                                 v1::PrefillResponse*) {
        return nodes_->BlameDecode(context, grpc::Status(grpc::StatusCode::ABORTED, "read failed"));
      }));
  auto& decode = Decode("d1");
  EXPECT_CALL(decode, Reserve(_, _, _)).Times(3);  // the same decode node each time
  EXPECT_CALL(decode, Release(_, _, _)).Times(3);
  FakeWriter writer;
  const grpc::Status status = Generate(Request(), writer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_TRUE(writer.responses.empty());
}

TEST_F(RouterServiceTest, AFailedTransferThenASuccessServesTheRequest) {
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _))
      .WillOnce(Invoke([&](grpc::ClientContext* context, const v1::PrefillRequest&,
                           v1::PrefillResponse*) {
        return nodes_->BlameDecode(context, grpc::Status(grpc::StatusCode::ABORTED, "read failed"));
      }))
      .WillOnce(FirstToken(7));
  Decode("d1", {Output({8}, v1::FINISH_REASON_LENGTH)});
  FakeWriter writer;
  ASSERT_TRUE(Generate(Request(), writer).ok());
  EXPECT_THAT(writer.Tokens(), ElementsAre(7, 8));
}

TEST_F(RouterServiceTest, ADecodeNodeLostBeforeItsCommitIsAvoided) {
  options_.node_ttl_ms = 60000;
  v1::PrefillRequest second;
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _))
      .WillOnce(Invoke(
          [&](grpc::ClientContext* context, const v1::PrefillRequest&, v1::PrefillResponse*) {
            return nodes_->BlameDecode(
                context, grpc::Status(grpc::StatusCode::UNAVAILABLE, "commit failed"));
          }))
      .WillOnce(FirstToken(7, &second));
  auto& lost = Decode("d1");
  EXPECT_CALL(lost, Reserve(_, _, _)).Times(1);
  Decode("d2", {Output({8}, v1::FINISH_REASON_LENGTH)});
  FakeWriter writer;
  ASSERT_TRUE(Generate(Request(), writer).ok());
  EXPECT_EQ(second.decode_address(), "d2.invalid:1");
  EXPECT_THAT(writer.Tokens(), ElementsAre(7, 8));
}

// A prefill node's baton-failed-node trailer takes the decode node down only when the router
// cannot reach it either (its Release of the reservation fails): one prefill node's word alone
// makes this request do without the node, and leaves it live for the others.
TEST_F(RouterServiceTest, APrefillNodesWordAloneDoesNotTakeADecodeNodeDown) {
  options_.node_ttl_ms = 60000;  // a marked-down node would stay down for the test
  for (const bool answers : {true, false}) {
    SCOPED_TRACE(answers ? "the decode node answers the router" : "nor does it answer the router");
    router_.reset();
    nodes_ = std::make_shared<FakeNodes>();
    EXPECT_CALL(Prefill("p1"), Prefill(_, _, _))
        .WillOnce(Invoke(
            [&](grpc::ClientContext* context, const v1::PrefillRequest&, v1::PrefillResponse*) {
              return nodes_->BlameDecode(
                  context, grpc::Status(grpc::StatusCode::UNAVAILABLE, "commit failed"));
            }))
        .WillOnce(FirstToken(7));
    auto& blamed = Decode("d1");
    if (!answers) {
      ON_CALL(blamed, Release(_, _, _))
          .WillByDefault(Return(grpc::Status(grpc::StatusCode::UNAVAILABLE, "refused")));
    }
    Decode("d2", {Output({8}, v1::FINISH_REASON_LENGTH)});
    FakeWriter writer;
    ASSERT_TRUE(Generate(Request(), writer).ok());
    EXPECT_THAT(writer.Tokens(), ElementsAre(7, 8));
    EXPECT_EQ(Router().registry().LiveByRole().at("decode"), answers ? 2 : 1);
  }
}

TEST_F(RouterServiceTest, APrefillNodeLostIsAvoided) {
  options_.node_ttl_ms = 60000;
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _))
      .WillOnce(Return(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection reset")));
  EXPECT_CALL(Prefill("p2"), Prefill(_, _, _)).WillOnce(FirstToken(7));
  Decode("d1", {Output({8}, v1::FINISH_REASON_LENGTH)});
  FakeWriter writer;
  ASSERT_TRUE(Generate(Request(), writer).ok());
  EXPECT_THAT(writer.Tokens(), ElementsAre(7, 8));
}

// A decode node lost mid-stream: prompt + the tokens streamed so far are prefilled again, with
// keep K + g, on another decode node, and the client sees every token once.
TEST_F(RouterServiceTest, ADecodeNodeLostMidStreamIsReplacedWithoutRepeatingAToken) {
  options_.node_ttl_ms = 60000;
  v1::PrefillRequest first, second;
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _))
      .WillOnce(FirstToken(7, &first))
      .WillOnce(FirstToken(9, &second));
  Decode("d1", {Output({8})}, grpc::Status(grpc::StatusCode::UNAVAILABLE, "socket closed"));
  v1::ReserveRequest reserve_seen;
  auto& d2 = Decode("d2", {Output({10}, v1::FINISH_REASON_LENGTH)});
  EXPECT_CALL(d2, Reserve(_, _, _)).WillOnce(Reserved("d2-r", &reserve_seen));
  FakeWriter writer;
  const grpc::Status status = Generate(Request(8, 4), writer);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(writer.Tokens(), ElementsAre(7, 8, 9, 10));
  // The re-prefill: prompt + [7, 8], keep K + 2, two tokens completed, on the same weights.
  EXPECT_EQ(second.request().prompt_token_ids_size(), 10);
  EXPECT_EQ(second.request().prompt_token_ids(8), 7);
  EXPECT_EQ(second.request().prompt_token_ids(9), 8);
  EXPECT_EQ(second.keep(), first.keep() + 2);
  EXPECT_EQ(second.completed_tokens(), 2u);
  EXPECT_EQ(second.s_valid(), first.s_valid());
  EXPECT_EQ(reserve_seen.prompt_tokens(), 10u);
  EXPECT_EQ(reserve_seen.completed_tokens(), 2u);
  EXPECT_EQ(writer.responses.back().usage().completion_tokens(), 4u);
}

// A decode node whose output carries fewer logprobs than tokens is faulty: nothing of that
// output reaches the client (the router would have indexed past the logprobs), and the rest
// comes from another decode node, as after a lost stream.
TEST_F(RouterServiceTest, ADecodeOutputShortOfLogprobsFailsTheAttemptByName) {
  options_.node_ttl_ms = 60000;
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _)).WillOnce(FirstToken(7)).WillOnce(FirstToken(9));
  v1::DecodeOutput short_of_logprobs = Output({8, 11});
  short_of_logprobs.mutable_logprobs()->RemoveLast();
  auto& d1 = Decode("d1", {Output({8}), short_of_logprobs});
  EXPECT_CALL(d1, Reserve(_, _, _)).Times(1);
  Decode("d2", {Output({10}, v1::FINISH_REASON_LENGTH)});
  v1::GenerateRequest request = Request(8, 4);
  request.set_logprobs(true);
  FakeWriter writer;
  const grpc::Status status = Generate(request, writer);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(writer.Tokens(), ElementsAre(7, 8, 9, 10));
  for (const auto& response : writer.responses) {
    EXPECT_EQ(response.logprobs_size(), response.token_ids_size());
  }
}

// Every attempt loses its decode node: the request gives up after kMaxAttempts.
TEST_F(RouterServiceTest, ARequestGivesUpAfterItsAttempts) {
  options_.node_ttl_ms = 60000;
  int prefills = 0;
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _))
      .WillRepeatedly(Invoke(
          [&](grpc::ClientContext*, const v1::PrefillRequest&, v1::PrefillResponse* response) {
            response->set_first_token(7 + prefills++);
            return grpc::Status::OK;
          }));
  for (int i = 0; i <= kMaxAttempts; ++i) {
    Decode("d" + std::to_string(i), {}, grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone"));
  }
  FakeWriter writer;
  const grpc::Status status = Generate(Request(8, 32), writer);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("gave up"));
  EXPECT_EQ(prefills, kMaxAttempts);
  EXPECT_EQ(writer.Tokens().size(), static_cast<size_t>(kMaxAttempts));  // each token once
}

// A node that comes back registers again and is used again.
// A decode node is paired with a prefill node only when both speak the same StateBlock format:
// one of another format neither makes the router serve nor gets a reservation.
TEST_F(RouterServiceTest, ANodeOfAnotherStateBlockFormatIsNotPaired) {
  options_.node_ttl_ms = 60000;
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _)).WillOnce(FirstToken(7));
  ASSERT_TRUE(Register("d-old", v1::NODE_ROLE_DECODE, 1).ok());
  EXPECT_FALSE(Router().Serving());
  auto& decode = Decode("d1", {Output({8}, v1::FINISH_REASON_LENGTH)});
  EXPECT_TRUE(Router().Serving());
  EXPECT_CALL(decode, Reserve(_, _, _)).Times(1);
  FakeWriter writer;
  ASSERT_TRUE(Generate(Request(8, 2), writer).ok());
  EXPECT_THAT(writer.Tokens(), ElementsAre(7, 8));
}

// Under replay-on-decode a prefill node must hold the producers only (one holding every layer
// is refused, naming both sides); the reservation is for the boundary rows, and the first token
// and the prompt's figures come from the decode node's stream.
TEST_F(RouterServiceTest, UnderReplayOnDecodeTheFirstTokenComesFromTheDecodeStream) {
  options_.split = v1::SPLIT_REPLAY_ON_DECODE;
  const grpc::Status refused = Register("p-all", v1::NODE_ROLE_PREFILL);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("prefill node p-all holds every layer (--split prefill-all); this router "
                        "runs --split replay-on-decode"));
  EXPECT_EQ(
      Register("d-producers", v1::NODE_ROLE_DECODE, 2, v1::HELD_LAYERS_PRODUCERS).error_code(),
      grpc::StatusCode::FAILED_PRECONDITION);
  const grpc::Status unknown =
      Register("p-odd", v1::NODE_ROLE_PREFILL, 2, static_cast<v1::HeldLayers>(5));
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(unknown.error_message(), HasSubstr("held_layers"));

  v1::PrefillRequest prefill_seen;
  v1::ReserveRequest reserve_seen;
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _)).WillOnce(FirstToken(-1, &prefill_seen));
  v1::DecodeOutput first = Output({5});
  first.set_replay_ms(3.5);
  auto& decode = Decode("d1", {first, Output({6}, v1::FINISH_REASON_LENGTH)});
  EXPECT_CALL(decode, Reserve(_, _, _)).WillOnce(Reserved("d1-r", &reserve_seen));
  FakeWriter writer;
  const grpc::Status status = Generate(Request(40, 2), writer);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(writer.Tokens(), ElementsAre(5, 6));  // no -1 from the prefill node
  EXPECT_EQ(reserve_seen.split(), v1::SPLIT_REPLAY_ON_DECODE);
  // Compact with K = C: the replay range is the last C rows of the 40.
  EXPECT_EQ(reserve_seen.boundary_rows(), static_cast<uint32_t>(config_.ring_capacity()));
  EXPECT_EQ(prefill_seen.split(), v1::SPLIT_REPLAY_ON_DECODE);
  EXPECT_EQ(writer.responses.back().timings().replay_ms(), 3.5);
}

TEST_F(RouterServiceTest, ServingFollowsTheRegistry) {
  options_.node_ttl_ms = 60000;
  EXPECT_FALSE(Router().Serving());
  Prefill("p1");
  EXPECT_FALSE(Router().Serving());  // no decode node of the same weights
  Decode("d1");
  EXPECT_TRUE(Router().Serving());
  v1::ListModelsResponse models;
  grpc::ServerContext context;
  v1::ListModelsRequest list;
  ASSERT_TRUE(Router().ListModels(&context, &list, &models).ok());
  ASSERT_EQ(models.models_size(), 1);
  EXPECT_THAT(models.models(0).fingerprints(), ElementsAre("weights-a"));
}

}  // namespace
}  // namespace baton::router
