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
#include "baton/kvstore/hit_policy.h"
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

  // Registers a node of `role` (holding `held`, speaking StateBlock format `format`) and gives
  // its fake; the registration's status.
  grpc::Status Register(const std::string& id, v1::NodeRole role, uint32_t format = 2,
                        v1::HeldLayers held = v1::HELD_LAYERS_ALL) {
    v1::RegisterRequest request;
    request.set_node_id(id);
    request.set_role(role);
    request.set_address(id + ".invalid:1");
    request.set_model_fingerprint("weights-a");
    request.set_state_format_version(format);
    request.set_held_layers(held);
    request.mutable_load()->set_total_slots(8);
    grpc::ServerContext context;
    v1::RegisterResponse reply;
    return Router().Register(&context, &request, &reply);
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
  EXPECT_CALL(*nodes_->kvstore["s1"], Lookup(_, _, _))
      .WillOnce(Invoke(
          [&](grpc::ClientContext*, const v1::LookupRequest& request, v1::LookupResponse* found) {
            keys = request.keys_size();
            found->set_block_kv_blocks(request.keys_size());
            for (int i = 0; i < request.keys_size(); ++i) found->add_swa_present(true);
            return grpc::Status::OK;
          }));
  v1::PrefillRequest seen;
  EXPECT_CALL(Prefill("p1"), Prefill(_, _, _)).WillOnce(FirstToken(7, &seen));
  Decode("d1", {Output({8}, v1::FINISH_REASON_LENGTH)});
  FakeWriter writer;
  ASSERT_TRUE(Generate(Request(prompt_len), writer).ok());
  EXPECT_EQ(keys, prompt_len / config_.kv_block_size);
  kvstore::ChainLookup all;
  all.block_kv_blocks = keys;
  all.swa_present.assign(keys, true);
  const int64_t blocks = kvstore::HitBlocks({.prompt_len = prompt_len,
                                             .keep = config_.ring_capacity(),
                                             .truncation_on = true,
                                             .ring_capacity = config_.ring_capacity(),
                                             .window = config_.sliding_window,
                                             .block_size = config_.kv_block_size,
                                             .cap = options_.hit_cap},
                                            all);
  ASSERT_GT(blocks, 0);
  EXPECT_EQ(int64_t{seen.s_valid()}, blocks * config_.kv_block_size);
}

TEST_F(RouterServiceTest, AFailingPrefixStoreMeansACold) {
  nodes_->kvstore["s1"] = std::make_shared<NiceMock<v1::MockKvStoreStub>>();
  ASSERT_TRUE(Register("s1", v1::NODE_ROLE_KVSTORE).ok());
  EXPECT_CALL(*nodes_->kvstore["s1"], Lookup(_, _, _))
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
