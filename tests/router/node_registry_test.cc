// The router's node registry (router/node_registry.h) on its own: a node_id bound to the
// certificate identity that registered it (registrations, drains and cache events from another
// refused), the per-node certificate's instance as the only node_id it may register, node_ids
// forgotten after their silence, and the bounds on node_ids in all and per identity.
#include "baton/router/node_registry.h"

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "baton/common/hash.h"
#include "baton/kvstore/chain.h"
#include "baton/model/model_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/eventually.h"
#include "testing/free_port.h"

namespace baton::router {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr char kPodA[] = "spiffe://baton/prefill/prefill-a";
constexpr char kPodB[] = "spiffe://baton/prefill/prefill-b";
constexpr char kPrefillRole[] = "spiffe://baton/prefill";

v1::RegisterRequest Registration(const std::string& id, bool draining = false) {
  v1::RegisterRequest request;
  request.set_node_id(id);
  request.set_role(v1::NODE_ROLE_PREFILL);
  request.set_address(id + ".invalid:1");
  request.set_model_fingerprint("weights-a");
  request.set_draining(draining);
  return request;
}

// A snapshot saying the node holds one block (both regions).
v1::RegisterRequest WithOneBlock(v1::RegisterRequest request, uint64_t sequence = 1) {
  v1::CacheEventBatch& batch = *request.mutable_cache_events();
  batch.set_sequence(sequence);
  batch.set_snapshot(true);
  Sha256Digest key{};
  key[0] = 1;
  for (v1::StoreRegion group : {v1::STORE_REGION_BLOCK_KV, v1::STORE_REGION_PRODUCER_SWA}) {
    v1::BlockStored& stored = *batch.add_events()->mutable_block_stored();
    stored.add_block_hashes(kvstore::KeyBytes(key));
    stored.set_cache_group(group);
    stored.set_medium("cpu");
  }
  return request;
}

class NodeRegistryTest : public ::testing::Test {
 protected:
  // The queues of prefills count down by a clock the tests move (now_ms_).
  NodeRegistryTest() : models_{{"", *model::PresetConfig("tiny"), nullptr}} {
    options_.now_ms = [this] { return now_ms_; };
  }
  NodeRegistry& Registry() {
    if (registry_ == nullptr) registry_ = std::make_unique<NodeRegistry>(models_, options_);
    return *registry_;
  }
  std::vector<ServedModel> models_;
  NodeRegistry::Options options_;
  std::unique_ptr<NodeRegistry> registry_;
  double now_ms_ = 1000;
};

// One pod's certificate cannot re-register, drain or send cache events for another's node_id,
// and the refusal names the node_id and the caller's identity.
TEST_F(NodeRegistryTest, AnotherPodCannotSpeakForANode) {
  ASSERT_TRUE(Registry().RegisterFrom(kPodA, WithOneBlock(Registration("prefill-a"))).ok());
  ASSERT_TRUE(Registry().RegisterFrom(kPodB, Registration("prefill-b")).ok());
  v1::RegisterRequest moved = Registration("prefill-a");
  moved.set_address("127.0.0.1:1");  // a dead address
  for (const v1::RegisterRequest& attempt : {moved, Registration("prefill-a", /*draining=*/true),
                                             WithOneBlock(Registration("prefill-a"), 2)}) {
    const absl::Status refused = Registry().RegisterFrom(kPodB, attempt);
    EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(refused.message(), HasSubstr("node_id: 'prefill-a'"));
    EXPECT_THAT(refused.message(), HasSubstr(kPodB));
  }
  // prefill-a keeps its address, stays undrained, and its cache index is its own (the refused
  // batch 2 would have replaced batch 1; its next batch still follows batch 1).
  NodeLease a = Registry().Pick(v1::NODE_ROLE_PREFILL, {"prefill-b"});
  ASSERT_TRUE(static_cast<bool>(a));
  EXPECT_EQ(a->id(), "prefill-a");
  EXPECT_EQ(a->info.address(), "prefill-a.invalid:1");
  EXPECT_FALSE(a->draining);
  bool resync = false;
  v1::RegisterRequest next = Registration("prefill-a");
  next.mutable_cache_events()->set_sequence(2);
  ASSERT_TRUE(Registry().RegisterFrom(kPodA, next, &resync).ok());
  EXPECT_FALSE(resync);
  EXPECT_EQ(Registry().cache_index().blocks("prefill-a"), 2u);
}

// A per-node certificate registers only the node_id its instance names, even a free one.
TEST_F(NodeRegistryTest, APerNodeCertificateRegistersItsInstanceOnly) {
  const absl::Status other = Registry().RegisterFrom(kPodA, Registration("prefill-c"));
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.message(), HasSubstr("node_id: 'prefill-c' is not the instance 'prefill-a'"));
  EXPECT_EQ(Registry().NodeIds(), 0u);
  // A role-only certificate (an older PKI) keeps the role-only binding: any node_id, bound to
  // that certificate, which a pod's own certificate cannot then take.
  ASSERT_TRUE(Registry().RegisterFrom(kPrefillRole, Registration("prefill-a")).ok());
  EXPECT_EQ(Registry().RegisterFrom(kPodA, Registration("prefill-a")).code(),
            absl::StatusCode::kPermissionDenied);
}

// A role-only certificate (every pod of the role carries it, as the chart's shared Secret
// does) binds a node_id to the address it registered from as well: a pod at another address
// cannot re-register it, drain it or speak in its name while it lives; once it has expired,
// a pod back at another address may take its node_id again.
TEST_F(NodeRegistryTest, ARoleOnlyCertificateBindsTheNodeIdToItsPeer) {
  options_.node_ttl_ms = 1000;
  ASSERT_TRUE(Registry()
                  .RegisterFrom(kPrefillRole, WithOneBlock(Registration("prefill-a")), nullptr,
                                "10.0.0.5")
                  .ok());
  const absl::Status taken =
      Registry().RegisterFrom(kPrefillRole, Registration("prefill-a", true), nullptr, "10.0.0.6");
  EXPECT_EQ(taken.code(), absl::StatusCode::kPermissionDenied) << taken;
  EXPECT_THAT(taken.message(), HasSubstr("10.0.0.6"));
  {
    NodeLease a = Registry().Pick(v1::NODE_ROLE_PREFILL, {});
    ASSERT_TRUE(static_cast<bool>(a));
    EXPECT_FALSE(a->draining);
  }
  // The pod itself keeps its heartbeats.
  EXPECT_TRUE(
      Registry().RegisterFrom(kPrefillRole, Registration("prefill-a"), nullptr, "10.0.0.5").ok());
  EXPECT_EQ(NodeRegistry::BindingOf(kPodA, "10.0.0.5"), kPodA);
  // Silent past its expiry: its node_id may be registered from elsewhere.
  absl::Status back;
  EXPECT_TRUE(testing::Eventually(
      [&] {
        back = Registry().RegisterFrom(kPrefillRole, Registration("prefill-a"), nullptr,
                                       "10.0.0.6");
        return back.ok();
      },
      std::chrono::seconds(20), std::chrono::milliseconds(50)))
      << back;
  EXPECT_EQ(Registry().RegisterFrom(kPrefillRole, Registration("prefill-a"), nullptr, "10.0.0.5")
                .code(),
            absl::StatusCode::kPermissionDenied);
}

// A node_id not heard from for forget_after_ms goes, with its cache index and its binding.
TEST_F(NodeRegistryTest, ASilentNodeIsForgottenWithItsCacheIndex) {
  options_.node_ttl_ms = 1000;
  options_.forget_after_ms = 3000;
  const Clock::time_point start = Clock::now();
  ASSERT_TRUE(Registry().RegisterFrom(kPrefillRole, WithOneBlock(Registration("p1"))).ok());
  ASSERT_TRUE(Registry().RegisterFrom(kPrefillRole, Registration("p2")).ok());
  EXPECT_EQ(Registry().cache_index().nodes(), 1u);
  // Expired (past the TTL) but not yet forgotten.
  EXPECT_EQ(Registry().ForgetExpired(start + std::chrono::milliseconds(2000)), 0u);
  EXPECT_EQ(Registry().NodeIds(), 2u);
  EXPECT_EQ(Registry().ForgetExpired(start + std::chrono::milliseconds(4000)), 2u);
  EXPECT_EQ(Registry().NodeIds(), 0u);
  EXPECT_EQ(Registry().cache_index().nodes(), 0u);
  EXPECT_EQ(Registry().cache_index().blocks("p1"), 0u);
  // Its node_id is free again.
  EXPECT_TRUE(Registry().RegisterFrom(kPodA, Registration("prefill-a")).ok());
}

// Model skew shows per served model, fingerprint and role (baton_router_nodes_by_model): two
// prefill nodes on weights-a and a decode node on weights-b are three nodes in two
// fingerprints that no pair shares; a store is not counted.
TEST_F(NodeRegistryTest, LiveNodesAreCountedByModelFingerprintAndRole) {
  models_[0].name = "baton";
  ASSERT_TRUE(Registry().RegisterFrom(kPrefillRole, Registration("p1")).ok());
  ASSERT_TRUE(Registry().RegisterFrom(kPrefillRole, Registration("p2")).ok());
  v1::RegisterRequest decode = Registration("d1");
  decode.set_role(v1::NODE_ROLE_DECODE);
  decode.set_model_fingerprint("weights-b");
  ASSERT_TRUE(Registry().RegisterFrom("spiffe://baton/decode", decode).ok());
  v1::RegisterRequest store = Registration("kvstore");
  store.set_role(v1::NODE_ROLE_KVSTORE);
  store.set_model_fingerprint("");
  ASSERT_TRUE(Registry().RegisterFrom("spiffe://baton/kvstore/kvstore", store).ok());
  std::vector<std::tuple<std::string, std::string, std::string, double>> counts;
  for (const NodeRegistry::ModelCount& m : Registry().LiveByModel()) {
    counts.emplace_back(m.model, m.fingerprint, m.role, m.nodes);
  }
  EXPECT_THAT(counts, ::testing::UnorderedElementsAre(
                          std::make_tuple("baton", "weights-a", "prefill", 2.0),
                          std::make_tuple("baton", "weights-b", "decode", 1.0)));
}

// A store node is connected to as it registers, before any prompt probes it: a probe has
// --lookup-timeout-ms (200 ms) for its answer, too little on a busy machine to make the
// connection and its TLS handshake as well.
TEST_F(NodeRegistryTest, AStoreNodeIsConnectedToAsItRegisters) {
  const testing::Listener listener;
  ASSERT_TRUE(listener.ok());
  v1::RegisterRequest store = Registration("kvstore");
  store.set_role(v1::NODE_ROLE_KVSTORE);
  store.set_model_fingerprint("");
  store.set_address(listener.address());
  ASSERT_TRUE(Registry().RegisterFrom("spiffe://baton/kvstore/kvstore", store).ok());
  EXPECT_TRUE(listener.Connected(std::chrono::seconds(20)))
      << "the router did not connect to the store node";
}

// node_ids are bounded per identity and in all; past either a new one is refused by name, a
// registered one keeps its heartbeats, and a forgotten one makes room.
TEST_F(NodeRegistryTest, NodeIdsAreBoundedPerIdentityAndInAll) {
  options_.max_node_ids = 3;
  options_.max_node_ids_per_identity = 2;
  options_.forget_after_ms = 1000;
  const Clock::time_point start = Clock::now();
  ASSERT_TRUE(Registry().RegisterFrom(kPrefillRole, Registration("x1")).ok());
  ASSERT_TRUE(Registry().RegisterFrom(kPrefillRole, Registration("x2")).ok());
  const absl::Status per_identity = Registry().RegisterFrom(kPrefillRole, Registration("x3"));
  EXPECT_EQ(per_identity.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(per_identity.message(), HasSubstr("node_id: 'x3'"));
  EXPECT_THAT(per_identity.message(), HasSubstr("--max-node-ids-per-identity 2"));
  const std::string decode_role = "spiffe://baton/decode";
  v1::RegisterRequest d1 = Registration("d1"), d2 = Registration("d2");
  d1.set_role(v1::NODE_ROLE_DECODE);
  d2.set_role(v1::NODE_ROLE_DECODE);
  ASSERT_TRUE(Registry().RegisterFrom(decode_role, d1).ok());
  const absl::Status in_all = Registry().RegisterFrom(decode_role, d2);
  EXPECT_EQ(in_all.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(in_all.message(), HasSubstr("node_id: 'd2'"));
  EXPECT_THAT(in_all.message(), HasSubstr("--max-node-ids 3"));
  EXPECT_TRUE(Registry().RegisterFrom(kPrefillRole, Registration("x1")).ok());  // a heartbeat
  EXPECT_EQ(Registry().NodeIds(), 3u);
  EXPECT_EQ(Registry().ForgetExpired(start + std::chrono::seconds(5)), 3u);
  EXPECT_TRUE(Registry().RegisterFrom(kPrefillRole, Registration("x3")).ok());
  EXPECT_TRUE(Registry().RegisterFrom(decode_role, d2).ok());
}

// Routers that share a prefill node agree on it through what the node reports: each holds at
// most its share of the slots (the slots over the routers the node says take it), and prices
// the node's queue with the other routers' work (what the node reports beyond this router's).
TEST_F(NodeRegistryTest, APrefillNodesSlotsAndQueueAreSharedWithTheOtherRouters) {
  v1::RegisterRequest decode = Registration("d1");
  decode.set_role(v1::NODE_ROLE_DECODE);
  ASSERT_TRUE(Registry().RegisterFrom("spiffe://baton/decode", decode).ok());
  v1::RegisterRequest prefill = Registration("p1");
  ASSERT_TRUE(Registry().RegisterFrom(kPrefillRole, prefill).ok());
  auto choose = [&] { return Registry().ChoosePrefill(0, "", {}, {}, /*slots=*/2); };
  ASSERT_EQ(choose().open.size(), 1u);
  NodeLease first = Registry().TakePrefillSlot(choose().open[0].node, 300);
  // One router (or none reported yet): this one may hold both slots.
  EXPECT_EQ(choose().open.size(), 1u);
  EXPECT_DOUBLE_EQ(choose().open[0].pending_ms, 300);
  // The node says two routers take it, and that it holds 1,000 ms of work: this router's 300
  // and 700 of the other's. This router is at its share (one of the two slots).
  prefill.mutable_load()->set_routers(2);
  prefill.mutable_load()->set_prefill_work_ms(1000);
  ASSERT_TRUE(Registry().RegisterFrom(kPrefillRole, prefill).ok());
  const NodeRegistry::PrefillChoice full = choose();
  EXPECT_EQ(full.live, 1);
  EXPECT_TRUE(full.open.empty());
  // With six slots (three a router) it may take a second, priced behind both routers' work;
  // a prefill it sends after the report adds its own.
  auto six = [&] { return Registry().ChoosePrefill(0, "", {}, {}, 6); };
  ASSERT_EQ(six().open.size(), 1u);
  EXPECT_DOUBLE_EQ(six().open[0].pending_ms, 1000);
  NodeLease second = Registry().TakePrefillSlot(six().open[0].node, 200);
  ASSERT_EQ(six().open.size(), 1u);
  EXPECT_DOUBLE_EQ(six().open[0].pending_ms, 1200);
  // Four slots are two a router: this one holds both of its.
  EXPECT_TRUE(Registry().ChoosePrefill(0, "", {}, {}, 4).open.empty());
  // Its first prefill ends: the slot is free again, and its work is no longer counted.
  Registry().PrefillDone(*first.node(), 300);
  first.Reset();
  Registry().PrefillDone(*second.node(), 200);
  second.Reset();
  ASSERT_EQ(choose().open.size(), 1u);
  EXPECT_DOUBLE_EQ(choose().open[0].pending_ms, 700);  // the other router's, until a report
  prefill.mutable_load()->set_prefill_work_ms(0);
  ASSERT_TRUE(Registry().RegisterFrom(kPrefillRole, prefill).ok());
  ASSERT_EQ(choose().open.size(), 1u);
  EXPECT_DOUBLE_EQ(choose().open[0].pending_ms, 0);
  // A heartbeat made while this router's prefill ran can arrive after its answer: the work it
  // reports is that prefill's, not a queue (else the node looks busy until its next report).
  NodeLease third = Registry().TakePrefillSlot(choose().open[0].node, 400);
  Registry().PrefillDone(*third.node(), 400);
  third.Reset();
  prefill.mutable_load()->set_prefill_work_ms(400);
  ASSERT_TRUE(Registry().RegisterFrom(kPrefillRole, prefill).ok());
  ASSERT_EQ(choose().open.size(), 1u);
  EXPECT_DOUBLE_EQ(choose().open[0].pending_ms, 0);
  // The next report of the same work is another router's.
  ASSERT_TRUE(Registry().RegisterFrom(kPrefillRole, prefill).ok());
  ASSERT_EQ(choose().open.size(), 1u);
  EXPECT_DOUBLE_EQ(choose().open[0].pending_ms, 400);
}

// A node computes its prefills one at a time, so this router's prefills there count down as
// time passes: a node about to answer looks nearly free, not busy for the whole prediction.
TEST_F(NodeRegistryTest, ARoutersPrefillsOnANodeCountDownAsTheNodeRunsThem) {
  v1::RegisterRequest decode = Registration("d1");
  decode.set_role(v1::NODE_ROLE_DECODE);
  ASSERT_TRUE(Registry().RegisterFrom("spiffe://baton/decode", decode).ok());
  v1::RegisterRequest prefill = Registration("p1");
  ASSERT_TRUE(Registry().RegisterFrom(kPrefillRole, prefill).ok());
  auto queue = [&] {
    const NodeRegistry::PrefillChoice choice = Registry().ChoosePrefill(0, "", {}, {}, 4);
    EXPECT_EQ(choice.open.size(), 1u);
    return choice.open.empty() ? -1.0 : choice.open[0].pending_ms;
  };
  NodeLease first =
      Registry().TakePrefillSlot(Registry().ChoosePrefill(0, "", {}, {}, 4).open[0].node, 300);
  EXPECT_DOUBLE_EQ(queue(), 300);
  now_ms_ += 200;
  EXPECT_DOUBLE_EQ(queue(), 100);
  NodeLease second = Registry().TakePrefillSlot(first.node(), 500);
  EXPECT_DOUBLE_EQ(queue(), 600);  // behind the first's last 100
  // The node reports while the first runs: its work ahead is all this router's (the report
  // counts the first down as well), so none is another router's.
  prefill.mutable_load()->set_prefill_work_ms(600);
  ASSERT_TRUE(Registry().RegisterFrom(kPrefillRole, prefill).ok());
  EXPECT_DOUBLE_EQ(queue(), 600);
  // The first is answered early, at 250 ms: the second is all that is ahead, from now on.
  now_ms_ += 50;
  Registry().PrefillDone(*first.node(), 300);
  first.Reset();
  EXPECT_DOUBLE_EQ(queue(), 500);
  now_ms_ += 400;
  EXPECT_DOUBLE_EQ(queue(), 100);
  // Past its prediction it is taken as done: nothing is ahead until it is answered.
  now_ms_ += 1000;
  EXPECT_DOUBLE_EQ(queue(), 0);
  Registry().PrefillDone(*second.node(), 500);
  second.Reset();
  EXPECT_DOUBLE_EQ(queue(), 0);
}

// What a node's load report says is bounded: its predicted work and its count of routers.
TEST_F(NodeRegistryTest, LoadReportsOutOfBoundsAreRefusedByName) {
  for (const double work : {-1.0, std::numeric_limits<double>::quiet_NaN(),
                            std::numeric_limits<double>::infinity(), 1e12}) {
    v1::RegisterRequest request = Registration("p1");
    request.mutable_load()->set_prefill_work_ms(work);
    const absl::Status refused = Registry().RegisterFrom(kPrefillRole, request);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << work;
    EXPECT_THAT(refused.message(), HasSubstr("load.prefill_work_ms")) << work;
  }
  v1::RegisterRequest request = Registration("p1");
  request.mutable_load()->set_routers(5000);
  const absl::Status refused = Registry().RegisterFrom(kPrefillRole, request);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("load.routers: 5000"));
  // A decode node's rates: every time finite and within a day, tokens per step within 1024,
  // the step stretch and its quantiles within 1e4.
  using Set = void (v1::DecodeRates::*)(double);
  for (const auto& [field, set] :
       {std::pair<std::string, Set>{"step_fixed_ms", &v1::DecodeRates::set_step_fixed_ms},
        {"step_per_row_ms", &v1::DecodeRates::set_step_per_row_ms},
        {"replay_ms_per_gflop", &v1::DecodeRates::set_replay_ms_per_gflop},
        {"replay_piece_fixed_ms", &v1::DecodeRates::set_replay_piece_fixed_ms},
        {"replay_piece_row_ms", &v1::DecodeRates::set_replay_piece_row_ms},
        {"step_stretch", &v1::DecodeRates::set_step_stretch},
        {"step_stretch_p10", &v1::DecodeRates::set_step_stretch_p10},
        {"step_stretch_p50", &v1::DecodeRates::set_step_stretch_p50},
        {"step_stretch_p90", &v1::DecodeRates::set_step_stretch_p90},
        {"step_stretch_p99", &v1::DecodeRates::set_step_stretch_p99},
        {"tokens_per_step", &v1::DecodeRates::set_tokens_per_step}}) {
    for (const double bad : {-1.0, std::numeric_limits<double>::quiet_NaN(), 1e12}) {
      v1::RegisterRequest decode = Registration("d1");
      decode.set_role(v1::NODE_ROLE_DECODE);
      (decode.mutable_load()->mutable_decode_rates()->*set)(bad);
      const absl::Status refused_rate = Registry().RegisterFrom("spiffe://baton/decode", decode);
      EXPECT_EQ(refused_rate.code(), absl::StatusCode::kInvalidArgument) << field << " " << bad;
      EXPECT_THAT(refused_rate.message(), HasSubstr("load.decode_rates." + field)) << bad;
    }
  }
  // A decode node's shadow verification tallies: bounded in number, a known mode, no more
  // disagreements than positions, finite sums.
  auto fidelity_refused = [&](const std::function<void(v1::FidelityReport&)>& spoil,
                              const char* field) {
    v1::RegisterRequest decode = Registration("d1");
    decode.set_role(v1::NODE_ROLE_DECODE);
    v1::FidelityReport& report = *decode.mutable_load()->mutable_fidelity();
    v1::FidelityTally& tally = *report.add_tallies();
    tally.set_mode("compact");
    tally.set_positions(10);
    spoil(report);
    const absl::Status refused_report = Registry().RegisterFrom("spiffe://baton/decode", decode);
    EXPECT_EQ(refused_report.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(refused_report.message(), HasSubstr(field));
  };
  fidelity_refused([](v1::FidelityReport& r) { r.mutable_tallies(0)->set_mode("off"); },
                   "load.fidelity.tallies.mode");
  fidelity_refused([](v1::FidelityReport& r) { r.mutable_tallies(0)->set_top1_disagreements(11); },
                   "load.fidelity.tallies.top1_disagreements");
  fidelity_refused(
      [](v1::FidelityReport& r) {
        r.mutable_tallies(0)->set_kl_sum(std::numeric_limits<double>::quiet_NaN());
      },
      "load.fidelity.tallies");
  fidelity_refused([](v1::FidelityReport& r) { r.set_cpu_seconds(-1); },
                   "load.fidelity.cpu_seconds");
  fidelity_refused(
      [](v1::FidelityReport& r) {
        for (int i = 0; i < 64; ++i) *r.add_tallies() = r.tallies(0);
      },
      "load.fidelity.tallies: 65");
  EXPECT_EQ(Registry().NodeIds(), 0u);  // nothing registered by a refused report
}

// Replay-on-decode replays on the decode node: a prefill node that holds the producers only is
// priced at the mean replay rate its live partners report (those that measured one); under
// prefill-all a prefill node replays itself, at its own compute rate (0 here).
TEST_F(NodeRegistryTest, ReplayOnDecodeIsPricedAtTheDecodeNodesReportedRate) {
  for (const v1::Split split : {v1::SPLIT_REPLAY_ON_DECODE, v1::SPLIT_PREFILL_ALL}) {
    SCOPED_TRACE(v1::Split_Name(split));
    options_.split = split;
    registry_.reset();
    for (const auto& [id, rate] :
         {std::pair<std::string, double>{"d1", 30}, {"d2", 50}, {"d3", 0}}) {
      v1::RegisterRequest decode = Registration(id);
      decode.set_role(v1::NODE_ROLE_DECODE);
      decode.mutable_load()->mutable_decode_rates()->set_replay_ms_per_gflop(rate);
      ASSERT_TRUE(Registry().RegisterFrom("spiffe://baton/decode", decode).ok()) << id;
    }
    v1::RegisterRequest prefill = Registration("p1");
    if (split == v1::SPLIT_REPLAY_ON_DECODE) prefill.set_held_layers(v1::HELD_LAYERS_PRODUCERS);
    ASSERT_TRUE(Registry().RegisterFrom(kPrefillRole, prefill).ok());
    const double want = split == v1::SPLIT_REPLAY_ON_DECODE ? 40 : 0;
    const auto all = Registry().ChoosePrefill(0, "", {}, {}, 2);
    ASSERT_EQ(all.open.size(), 1u);
    EXPECT_DOUBLE_EQ(all.open[0].replay_ms_per_gflop, want);
    // A decode node lost to this request no longer counts.
    const auto without_d2 = Registry().ChoosePrefill(0, "", {}, {"d2"}, 2);
    ASSERT_EQ(without_d2.open.size(), 1u);
    EXPECT_DOUBLE_EQ(without_d2.open[0].replay_ms_per_gflop, want > 0 ? 30 : 0);
  }
}

// A prefill choice takes the live prefill nodes a live decode node pairs with (the same
// weights), of the fingerprint asked for and not excluded, and prices a rate a node has not
// measured at the (geometric) mean of its live peers' (the cost model's prior when none has
// one); a node that registers again with other weights is a new node and is chosen by its new
// ones. (These nodes report no sample count: their rates are taken whole.)
TEST_F(NodeRegistryTest, AChoiceTakesPairedNodesAndFillsUnmeasuredRatesFromPeers) {
  v1::RegisterRequest decode = Registration("d1");
  decode.set_role(v1::NODE_ROLE_DECODE);
  ASSERT_TRUE(Registry().RegisterFrom("spiffe://baton/decode", decode).ok());
  auto prefill = [&](const std::string& id, const std::string& weights, double compute) {
    v1::RegisterRequest request = Registration(id);
    request.set_model_fingerprint(weights);
    request.mutable_load()->mutable_rates()->set_compute_ms_per_gflop(compute);
    return Registry().RegisterFrom(kPrefillRole, request);
  };
  ASSERT_TRUE(prefill("p1", "weights-a", 10).ok());
  ASSERT_TRUE(prefill("p2", "weights-a", 30).ok());
  ASSERT_TRUE(prefill("p3", "weights-a", 0).ok());   // measured nothing yet
  ASSERT_TRUE(prefill("p4", "weights-b", 50).ok());  // no decode node takes weights-b
  auto ids = [](const NodeRegistry::PrefillChoice& choice) {
    std::map<std::string, double> compute;
    for (const auto& candidate : choice.open) {
      compute[candidate.node->id()] = candidate.rates.compute_ms_per_gflop;
    }
    return compute;
  };
  // p4 is unpaired, but it is live and measured: its rate counts in the peers' mean.
  const double mean = std::cbrt(10.0 * 30 * 50);
  auto near = [](std::map<std::string, double> got, std::map<std::string, double> want) {
    if (got.size() != want.size()) return false;
    for (const auto& [id, rate] : want) {
      if (!got.contains(id) || std::abs(got[id] - rate) > 1e-9 * rate) return false;
    }
    return true;
  };
  EXPECT_TRUE(near(ids(Registry().ChoosePrefill(0, "", {}, {}, 2)),
                   {{"p1", 10}, {"p2", 30}, {"p3", mean}}));
  EXPECT_TRUE(
      near(ids(Registry().ChoosePrefill(0, "", {"p2"}, {}, 2)), {{"p1", 10}, {"p3", mean}}));
  EXPECT_TRUE(Registry().ChoosePrefill(0, "weights-b", {}, {}, 2).open.empty());
  EXPECT_TRUE(Registry().ChoosePrefill(0, "weights-c", {}, {}, 2).open.empty());
  // A decode node of weights-b: p4 pairs, and is chosen when its fingerprint is asked for.
  v1::RegisterRequest decode_b = Registration("d2");
  decode_b.set_role(v1::NODE_ROLE_DECODE);
  decode_b.set_model_fingerprint("weights-b");
  ASSERT_TRUE(Registry().RegisterFrom("spiffe://baton/decode", decode_b).ok());
  EXPECT_EQ(ids(Registry().ChoosePrefill(0, "weights-b", {}, {}, 2)),
            (std::map<std::string, double>{{"p4", 50}}));
  // The pairing decode node lost to this request: no weights-b partner is left.
  EXPECT_TRUE(Registry().ChoosePrefill(0, "weights-b", {}, {"d2"}, 2).open.empty());
  // p1 comes back with weights-b: a new node, counted under its new weights.
  ASSERT_TRUE(prefill("p1", "weights-b", 20).ok());
  EXPECT_EQ(ids(Registry().ChoosePrefill(0, "weights-b", {}, {}, 2)),
            (std::map<std::string, double>{{"p1", 20}, {"p4", 50}}));
  // No node has measured a rate: the prior.
  registry_.reset();
  ASSERT_TRUE(Registry().RegisterFrom("spiffe://baton/decode", decode).ok());
  ASSERT_TRUE(prefill("p1", "weights-a", 0).ok());
  const auto unmeasured = Registry().ChoosePrefill(0, "", {}, {}, 2);
  ASSERT_EQ(unmeasured.open.size(), 1u);
  EXPECT_DOUBLE_EQ(unmeasured.open[0].rates.compute_ms_per_gflop,
                   kvstore::DefaultPrefillRates().compute_ms_per_gflop);
  EXPECT_DOUBLE_EQ(unmeasured.open[0].rates.store_ms_per_mib,
                   kvstore::DefaultPrefillRates().store_ms_per_mib);
}

// A node's own rates price it as far as its evidence goes (kvstore::RateEvidence): a node with
// few prefills measured is priced near its peers, and one that has had no work for a while
// drifts back to them, so that a node priced high on a few slow prefills gets work to measure
// again instead of being starved; work it reports, or this router's prefill there, keeps its
// rates fresh.
TEST_F(NodeRegistryTest, ANodeIsPricedAtItsOwnRatesAsFarAsItsEvidenceGoes) {
  v1::RegisterRequest decode = Registration("d1");
  decode.set_role(v1::NODE_ROLE_DECODE);
  ASSERT_TRUE(Registry().RegisterFrom("spiffe://baton/decode", decode).ok());
  auto beat = [&](const std::string& id, double fixed_ms, uint32_t samples, double work_ms = 0) {
    v1::RegisterRequest request = Registration(id);
    request.mutable_load()->mutable_rates()->set_fixed_ms(fixed_ms);
    request.mutable_load()->mutable_rates()->set_samples(samples);
    request.mutable_load()->set_prefill_work_ms(work_ms);
    return Registry().RegisterFrom(kPrefillRole, request);
  };
  auto fixed = [&] {
    std::map<std::string, double> out;
    for (const auto& candidate : Registry().ChoosePrefill(0, "", {}, {}, 2).open) {
      out[candidate.node->id()] = candidate.rates.fixed_ms;
    }
    return out;
  };
  ASSERT_TRUE(beat("fast", 20, 40).ok());
  ASSERT_TRUE(beat("slow", 180, 5).ok());  // a quarter of the evidence
  // The pool weighs them 1 and 1/4; "slow" is a quarter its own, three quarters the pool's.
  const double pool = std::exp((std::log(20.0) + 0.25 * std::log(180.0)) / 1.25);
  std::map<std::string, double> priced = fixed();
  EXPECT_NEAR(priced["fast"], 20, 1e-9);
  EXPECT_NEAR(priced["slow"], std::exp(0.25 * std::log(180.0) + 0.75 * std::log(pool)), 1e-6);
  EXPECT_LT(priced["slow"], 60);
  // Twenty prefills measured: its own rate, whatever its peers'.
  ASSERT_TRUE(beat("slow", 180, 20).ok());
  EXPECT_NEAR(fixed()["slow"], 180, 1e-9);
  // Both keep reporting, but "slow" measures nothing new: after two half-lives it is a quarter
  // its own. "fast" measured a prefill each beat and stays whole.
  for (int beats = 0; beats < 20; ++beats) {
    now_ms_ += kvstore::kEvidenceHalfLifeMs / 10;
    ASSERT_TRUE(beat("fast", 20, 41 + beats).ok());
    ASSERT_TRUE(beat("slow", 180, 20).ok());
  }
  const double aged_pool = std::exp((std::log(20.0) + 0.25 * std::log(180.0)) / 1.25);
  priced = fixed();
  EXPECT_NEAR(priced["fast"], 20, 1e-9);
  EXPECT_NEAR(priced["slow"], std::exp(0.25 * std::log(180.0) + 0.75 * std::log(aged_pool)), 1e-6);
  // Work it reports (a long prefill that has not ended) is not idleness: whole again.
  ASSERT_TRUE(beat("slow", 180, 20, 900).ok());
  EXPECT_NEAR(fixed()["slow"], 180, 1e-9);
  // Idle again, then this router sends it a prefill: fresh while that prefill is in flight.
  now_ms_ += 2 * kvstore::kEvidenceHalfLifeMs;
  ASSERT_TRUE(beat("slow", 180, 20).ok());
  EXPECT_LT(fixed()["slow"], 90);
  const NodeRegistry::PrefillChoice choice = Registry().ChoosePrefill(0, "", {}, {}, 2);
  for (const auto& candidate : choice.open) {
    if (candidate.node->id() == "slow") {
      NodeLease lease = Registry().TakePrefillSlot(candidate.node, 100);
      EXPECT_NEAR(fixed()["slow"], 180, 1e-9);
      Registry().PrefillDone(*candidate.node, 100);
    }
  }
}

// The registry keeps each node's rates' logs from its heartbeat (the pool and the blend work in
// them): a node's new rates price it from the heartbeat that brings them, exactly as
// kvstore::CredibleRates prices those rates.
TEST_F(NodeRegistryTest, ANodesNewRatesPriceItFromTheHeartbeatThatBringsThem) {
  v1::RegisterRequest decode = Registration("d1");
  decode.set_role(v1::NODE_ROLE_DECODE);
  ASSERT_TRUE(Registry().RegisterFrom("spiffe://baton/decode", decode).ok());
  auto beat = [&](const std::string& id, double compute, double fixed_ms, uint32_t samples) {
    v1::RegisterRequest request = Registration(id);
    request.mutable_load()->mutable_rates()->set_compute_ms_per_gflop(compute);
    request.mutable_load()->mutable_rates()->set_fixed_ms(fixed_ms);
    request.mutable_load()->mutable_rates()->set_samples(samples);
    return Registry().RegisterFrom(kPrefillRole, request);
  };
  auto priced = [&](const std::string& id) {
    for (const auto& candidate : Registry().ChoosePrefill(0, "", {}, {}, 2).open) {
      if (candidate.node->id() == id) return candidate.rates;
    }
    ADD_FAILURE() << id << " is not open";
    return kvstore::PrefillRates{};
  };
  ASSERT_TRUE(beat("a", 10, 20, 40).ok());
  ASSERT_TRUE(beat("b", 30, 90, 10).ok());  // half its evidence
  for (const auto& [compute, fixed_ms] : {std::pair{30.0, 90.0}, {5.0, 400.0}, {50.0, 35.0}}) {
    ASSERT_TRUE(beat("b", compute, fixed_ms, 10).ok());
    const kvstore::PrefillRates a = {.compute_ms_per_gflop = 10, .fixed_ms = 20};
    const kvstore::PrefillRates b = {.compute_ms_per_gflop = compute, .fixed_ms = fixed_ms};
    kvstore::PooledRates pool;
    pool.Add(a, 1);
    pool.Add(b, 0.5);
    const kvstore::PrefillRates want =
        kvstore::CredibleRates(b, 0.5, pool.Pooled(kvstore::DefaultPrefillRates()));
    const kvstore::PrefillRates got = priced("b");
    EXPECT_EQ(got.compute_ms_per_gflop, want.compute_ms_per_gflop) << compute;
    EXPECT_EQ(got.fixed_ms, want.fixed_ms) << fixed_ms;
    EXPECT_EQ(got.local_ms_per_mib, want.local_ms_per_mib);
  }
}

// Nodes of one weights fingerprint share one copy of it (a placement tells a node's view by
// the pointer, not by reading the string); a node that comes back with other weights takes
// the other fingerprint's.
TEST_F(NodeRegistryTest, NodesOfOneFingerprintShareOneCopyOfIt) {
  auto node = [&](const std::string& id, const std::string& fingerprint) {
    v1::RegisterRequest request = Registration(id);
    request.set_model_fingerprint(fingerprint);
    EXPECT_TRUE(Registry().RegisterFrom(kPrefillRole, request).ok());
    for (const std::shared_ptr<RegisteredNode>& live : Registry().LiveServingNodes()) {
      if (live->id() == id) return live;
    }
    return std::shared_ptr<RegisteredNode>();
  };
  const std::shared_ptr<RegisteredNode> p1 = node("p1", "weights-a");
  const std::shared_ptr<RegisteredNode> p2 = node("p2", "weights-a");
  const std::shared_ptr<RegisteredNode> p3 = node("p3", "weights-b");
  ASSERT_TRUE(p1 && p2 && p3);
  ASSERT_NE(p1->fingerprint, nullptr);
  EXPECT_EQ(p1->fingerprint, p2->fingerprint);
  EXPECT_NE(p1->fingerprint, p3->fingerprint);
  EXPECT_EQ(*p1->fingerprint, "weights-a");
  EXPECT_EQ(*p3->fingerprint, "weights-b");
  const std::shared_ptr<RegisteredNode> p1_again = node("p1", "weights-b");
  ASSERT_TRUE(p1_again);
  EXPECT_EQ(p1_again->fingerprint, p3->fingerprint);
  EXPECT_EQ(*p2->fingerprint, "weights-a");
}

}  // namespace
}  // namespace baton::router
