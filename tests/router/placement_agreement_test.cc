// The router's admission and `batonctl simulate` place prefills by one rule
// (kvstore/prefill_placement.h): one request sequence, run through the cluster simulator and
// then through the router's own registry and admission in this process, makes the same choice
// of prefill node at every step, for every policy. The router's side learns what it learns in
// serving: the nodes' heartbeats (their rates and queues) and cache events (what each node's
// local cache keeps of a prefill, as the prefill node keeps it), and the store's lookup of each
// prompt at the time it is placed. It agrees too when the cache events come a heartbeat late, as
// they do in serving: the router indexes what it placed itself (without that, 57 and 59 of the
// 60 choices agreed for longest-prefix and predicted-ttft).
#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "baton/kvstore/chain.h"
#include "baton/kvstore/prefill_placement.h"
#include "baton/model/model_factory.h"
#include "baton/router/admission.h"
#include "baton/router/node_registry.h"
#include "cluster_sim.h"
#include "gtest/gtest.h"

namespace baton::router {
namespace {

constexpr char kFingerprint[] = "weights-a";
constexpr int kNodes = 3;
constexpr int64_t kSlots = 2;
const kvstore::PrefillRates kRates{
    .compute_ms_per_gflop = 40, .local_ms_per_mib = 0.5, .store_ms_per_mib = 6, .fixed_ms = 3};

std::string NodeId(int64_t n) {
  return absl::StrCat("prefill-", n);
}

// Requests over a few shared system prompts with their own suffixes, arriving in bursts (the
// nodes' slots fill and their queues grow) between quiet spells (where the caches decide).
std::vector<tools::ClusterRequest> Workload(const ModelConfig& config) {
  std::mt19937 random(7);
  const int64_t B = config.kv_block_size;
  std::vector<std::vector<int32_t>> systems(4);
  for (size_t s = 0; s < systems.size(); ++s) {
    for (int64_t t = 0; t < 6 * B; ++t) systems[s].push_back(static_cast<int32_t>(100 * s + t));
  }
  std::vector<tools::ClusterRequest> requests;
  double now = 0;
  for (int i = 0; i < 60; ++i) {
    std::vector<int32_t> tokens = systems[random() % systems.size()];
    const int64_t suffix = B * static_cast<int64_t>(2 + random() % 10) + random() % B;
    for (int64_t t = 0; t < suffix; ++t) tokens.push_back(static_cast<int32_t>(random() % 500));
    now += i % 8 < 5 ? 1.0 : 400.0;
    requests.push_back({.arrival_ms = now,
                        .prompt_len = static_cast<int64_t>(tokens.size()),
                        .chain = kvstore::ChainKeys(kFingerprint, "", "", tokens, B)});
  }
  return requests;
}

class PlacementAgreementTest : public ::testing::TestWithParam<kvstore::RoutingPolicy> {
 protected:
  PlacementAgreementTest() : models_{{"", *model::PresetConfig("tiny"), nullptr}} {
    registry_options_.node_ttl_ms = 600000;
    registry_options_.forget_after_ms = 600000;
    // The router's queues count down by the simulation's time, as the simulator's do.
    registry_options_.now_ms = [this] { return now_ms_; };
  }

  v1::RegisterRequest Node(const std::string& id, v1::NodeRole role) const {
    v1::RegisterRequest request;
    request.set_node_id(id);
    request.set_role(role);
    request.set_address(id + ".invalid:1");
    request.set_model_fingerprint(kFingerprint);
    *request.mutable_load()->mutable_rates() = kvstore::ToProto(kRates, 10);
    request.mutable_load()->set_block_cache_budget_bytes(uint64_t{1} << 40);
    return request;
  }

  // The cache events of `kept` of `chain`, as the node's block cache sends them.
  static std::vector<v1::CacheEvent> Events(const std::vector<Sha256Digest>& chain,
                                            const std::vector<kvstore::WriteBackStep>& kept) {
    std::vector<v1::CacheEvent> events;
    for (const kvstore::WriteBackStep& step : kept) {
      v1::BlockStored& stored = *events.emplace_back().mutable_block_stored();
      stored.add_block_hashes(kvstore::KeyBytes(chain[step.block]));
      if (step.parent >= 0) stored.set_parent_block_hash(kvstore::KeyBytes(chain[step.parent]));
      stored.set_cache_group(step.region == kvstore::Region::kBlockKv
                                 ? v1::STORE_REGION_BLOCK_KV
                                 : v1::STORE_REGION_PRODUCER_SWA);
      stored.set_medium("cpu");
    }
    return events;
  }

  // A prefill node's heartbeat: its queue, and `events` (none: an empty snapshot first, then
  // nothing).
  void Heartbeat(int64_t n, int64_t queued, std::vector<v1::CacheEvent> events = {}) {
    v1::RegisterRequest request = Node(NodeId(n), v1::NODE_ROLE_PREFILL);
    request.mutable_load()->set_queued_requests(static_cast<uint32_t>(queued));
    v1::CacheEventBatch& batch = *request.mutable_cache_events();
    batch.set_sequence(++sequence_[n]);
    batch.set_snapshot(sequence_[n] == 1);
    for (v1::CacheEvent& event : events) *batch.add_events() = std::move(event);
    bool resync = false;
    ASSERT_TRUE(registry_->RegisterFrom("", request, &resync).ok());
    ASSERT_FALSE(resync);
  }

  // Runs the simulator's steps through the router's registry and admission and expects the
  // same choice at every one. With `late`, a node's cache events reach the router only with its
  // heartbeat after the next (a heartbeat's lag), and the router indexes what it placed itself
  // (NodeRegistry::ExpectCached, as GenerateCall does when it sends a prefill and when the node
  // answers).
  void ExpectTheSimulatorsChoices(bool late);

  std::vector<ServedModel> models_;
  NodeRegistry::Options registry_options_;
  std::unique_ptr<NodeRegistry> registry_;
  std::map<int64_t, uint64_t> sequence_;
  double now_ms_ = 0;
};

void PlacementAgreementTest::ExpectTheSimulatorsChoices(bool late) {
  const ModelConfig& config = models_[0].config;
  const std::vector<tools::ClusterRequest> requests = Workload(config);
  const kvstore::HitPolicyInput hit{.keep = config.ring_capacity(),
                                    .truncation_on = true,
                                    .ring_capacity = config.ring_capacity(),
                                    .window = config.sliding_window,
                                    .block_size = config.kv_block_size,
                                    .cap = kvstore::HitCap::kRing};
  const tools::ClusterOptions options{.policy = GetParam(),
                                      .prefill_nodes = kNodes,
                                      .slots = kSlots,
                                      .block_cache_bytes = uint64_t{1} << 40,
                                      .hit = hit,
                                      .payload = kvstore::BlockPayloadBytes(config),
                                      .config = config,
                                      .rates = kRates,
                                      .record_steps = true};
  const tools::ClusterResult simulated = tools::SimulateCluster(requests, options);
  ASSERT_EQ(simulated.steps.size(), 2 * requests.size());

  registry_ = std::make_unique<NodeRegistry>(models_, registry_options_);
  ASSERT_TRUE(registry_->RegisterFrom("", Node("decode-0", v1::NODE_ROLE_DECODE)).ok());
  for (int64_t n = 0; n < kNodes; ++n) Heartbeat(n, 0);
  Admission admission(*registry_, models_, {.prefill_slots = kSlots});

  std::map<size_t, Admission::Admitted> admitted;  // by request, until its prefill ends
  std::map<size_t, StreamHold> holds;
  std::vector<int64_t> prefilling(kNodes, 0);
  int64_t placed = 0, same = 0, moved_off_least_loaded = 0;
  std::vector<int64_t> used(kNodes, 0);
  // Node n's heartbeat now, carrying `events` (or, late, those of its heartbeat before).
  std::vector<std::vector<v1::CacheEvent>> held_back(kNodes);
  auto send = [&](int64_t n, std::vector<v1::CacheEvent> events) {
    if (late) std::swap(events, held_back[n]);
    Heartbeat(n, std::max<int64_t>(0, prefilling[n] - 1), std::move(events));
  };
  for (const tools::ClusterStep& step : simulated.steps) {
    const tools::ClusterRequest& request = requests[step.request];
    now_ms_ = step.time_ms;
    if (step.kind == tools::ClusterStep::kEnded) {
      // The prefill node answers, and its next heartbeat says what it computed.
      const int64_t n = step.node;
      const std::vector<kvstore::WriteBackStep> computed =
          kvstore::WriteBackSteps(step.hit_blocks, static_cast<int64_t>(request.chain.size()));
      if (late)
        registry_->ExpectCached(*admitted.at(step.request).chosen.node, request.chain, computed);
      admitted.at(step.request).slot.Done();
      admitted.erase(step.request);
      --prefilling[n];
      send(n, Events(request.chain, computed));
      continue;
    }
    Admission::Ask ask;
    ask.placement = {.policy = GetParam(),
                     .hit = hit,
                     .payload = kvstore::BlockPayloadBytes(config),
                     .config = &config};
    ask.placement.hit.prompt_len = request.prompt_len;
    ask.tiers = [&](const RegisteredNode& node) {
      return kvstore::TierLookups{
          .local = registry_->cache_index().Lookup(node.id(), request.chain), .store = step.store};
    };
    grpc::ServerContext context;
    int64_t retry_after_ms = 0;
    absl::StatusOr<Admission::Admitted> got =
        admission.Admit(context, ask, holds[step.request], &retry_after_ms);
    ASSERT_TRUE(got.ok()) << got.status();
    ++placed;
    const std::string& chosen = got->chosen.node->id();
    if (chosen == NodeId(step.node)) ++same;
    EXPECT_EQ(chosen, NodeId(step.node)) << "request " << step.request;
    if (!got->placement.least_loaded) ++moved_off_least_loaded;
    EXPECT_EQ(got->placement.plan.hit.hit_blocks, step.hit_blocks) << "request " << step.request;
    // Keep following the simulator's node, so that one difference does not hide the rest.
    const int64_t n = step.node;
    ++used[n];
    ++prefilling[n];
    const int64_t h = got->placement.plan.hit.hit_blocks;
    // What the hit read stays in the node's cache, as the node reports with its heartbeat.
    const std::vector<kvstore::WriteBackStep> kept =
        kvstore::CacheKeptReads(h, config.sliding_window, config.kv_block_size);
    if (late) registry_->ExpectCached(*got->chosen.node, request.chain, kept);
    admitted.emplace(step.request, *std::move(got));
    send(n, Events(request.chain, kept));
  }
  std::cout << "[ placement ] " << kvstore::RoutingPolicyName(GetParam())
            << (late ? " (cache events a heartbeat late)" : "") << ": " << same << " of " << placed
            << " choices identical; " << moved_off_least_loaded << " off the least loaded node\n";
  EXPECT_EQ(same, placed);
  EXPECT_EQ(placed, static_cast<int64_t>(requests.size()));
  // The sequence exercises the choice: every node takes requests, and a policy that looks at
  // hits moves some off the least loaded node.
  for (int64_t n = 0; n < kNodes; ++n) EXPECT_GT(used[n], 0) << NodeId(n);
  if (GetParam() != kvstore::RoutingPolicy::kLeastLoaded) {
    EXPECT_GT(moved_off_least_loaded, 0);
  }
  for (auto& [request, hold] : holds) admission.ReleaseStream(hold);
}

TEST_P(PlacementAgreementTest, RouterAdmissionMakesTheSimulatorsChoiceAtEveryStep) {
  ExpectTheSimulatorsChoices(/*late=*/false);
}

// The nodes' cache events arrive a heartbeat after the blocks; the router's own record of what
// it placed covers the lag, so it still chooses as the simulator does (which knows at once).
TEST_P(PlacementAgreementTest, TheRoutersOwnPlacementsCoverCacheEventsThatComeAHeartbeatLate) {
  ExpectTheSimulatorsChoices(/*late=*/true);
}

INSTANTIATE_TEST_SUITE_P(Policies, PlacementAgreementTest,
                         ::testing::ValuesIn(kvstore::kRoutingPolicies),
                         [](const ::testing::TestParamInfo<kvstore::RoutingPolicy>& info) {
                           std::string name = kvstore::RoutingPolicyName(info.param);
                           std::erase(name, '-');
                           return name;
                         });

}  // namespace
}  // namespace baton::router
