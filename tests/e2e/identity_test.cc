// One identity per pod, with the real binaries under `baton up` (issue 48, items 4 and 5): each
// node carries a certificate of its own (spiffe://baton/<role>/<name>), so one prefill node
// cannot re-register, drain or send cache events as another; a prefill node's forged word that
// the decode node failed does not take the decode node down; and node_ids that fall silent are
// forgotten, with the router's memory back near where it was.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "baton/common/pki.h"
#include "baton/common/rpc.h"
#include "baton/model/model_factory.h"
#include "baton/model/weights.h"
#include "baton_up.h"
#include "client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scrape.h"
#include "test_dir.h"
#include "testing/eventually.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using testing::BatonUp;
using testing::Eventually;
using ::testing::HasSubstr;
using testing::Sample;
using testing::Scrape;
using testing::TlsAs;

// A prefill node with a certificate of its own from the cluster's CA that answers every Prefill
// with UNAVAILABLE and the trailer blaming the decode node: a node lying about its partner.
class LyingPrefill final : public v1::PrefillNode::Service {
 public:
  LyingPrefill(const std::string& tls, const std::string& stem) {
    grpc::SslServerCredentialsOptions ssl(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = testing::ReadFile(tls + "/ca.crt");
    ssl.pem_key_cert_pairs.push_back(
        {testing::ReadFile(stem + ".key"), testing::ReadFile(stem + ".crt")});
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(ssl), &port);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    address = "127.0.0.1:" + std::to_string(port);
  }
  ~LyingPrefill() override { server_->Shutdown(std::chrono::system_clock::now()); }
  grpc::Status Prefill(grpc::ServerContext* context, const v1::PrefillRequest*,
                       v1::PrefillResponse*) override {
    ++calls;
    context->AddTrailingMetadata(kFailedNodeKey, "decode");
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "commit failed (made up)");
  }
  std::string address;
  std::atomic<int> calls{0};

 private:
  std::unique_ptr<grpc::Server> server_;
};

class IdentityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path dir = fs::path(testing::ProcessTempDir()) / "identity";
    model_ = (dir / "tiny").string();
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 21, model_).ok());
    // Heartbeats every 100 ms and the shortest expiry they allow (3 x 100 + 5000), after which
    // a silent node_id is forgotten at once.
    const std::string config = (dir / "config.yaml").string();
    std::ofstream(config) << "router:\n  heartbeat-ms: 100\n  node-expiry-ms: 5300\n"
                             "  node-forget-after-ms: 5300\n";
    up_ = new BatonUp(dir / "up", model_,
                      {"--prefill-nodes", "2", "--decode-pages", "256", "--config", config,
                       "--threads-per-node", "1"});
    ASSERT_TRUE(up_->WaitUntilUp()) << up_->log();
    tls_ = (dir / "up" / "tls").string();
  }
  static void TearDownTestSuite() {
    delete up_;
    up_ = nullptr;
  }

  // The router's Registry as the holder of `cert` (a stem under the cluster's tls/ folder:
  // "nodes/prefill-1", or the role-only "prefill").
  static std::unique_ptr<v1::Registry::Stub> RegistryAs(const std::string& cert) {
    return v1::Registry::NewStub(
        grpc::CreateChannel(up_->Address("router-internal.addr"), TlsAs(cert, tls_)));
  }
  static v1::RegisterRequest Registration(const std::string& node_id, const std::string& address) {
    v1::RegisterRequest request;
    request.set_node_id(node_id);
    request.set_role(v1::NODE_ROLE_PREFILL);
    request.set_address(address);
    request.set_model_fingerprint(*model::ModelFingerprint(model_));
    request.set_state_format_version(2);  // transfer::kStateFormatVersion
    return request;
  }
  // A snapshot of `blocks` made-up chain keys (both regions) from `seed`.
  static void AddSnapshot(v1::RegisterRequest& request, int blocks, uint32_t seed) {
    v1::CacheEventBatch& batch = *request.mutable_cache_events();
    batch.set_sequence(1);
    batch.set_snapshot(true);
    for (v1::StoreRegion group : {v1::STORE_REGION_BLOCK_KV, v1::STORE_REGION_PRODUCER_SWA}) {
      v1::BlockStored& stored = *batch.add_events()->mutable_block_stored();
      for (int i = 0; i < blocks; ++i) {
        std::string key(32, '\0');  // a chain key's 32 bytes
        std::snprintf(key.data(), key.size(), "%u/%d", seed, i);
        stored.add_block_hashes(key);
      }
      stored.set_cache_group(group);
      stored.set_medium("cpu");
    }
  }
  static grpc::Status Register(v1::Registry::Stub& registry, const v1::RegisterRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::RegisterResponse reply;
    return registry.Register(&context, request, &reply);
  }
  static double RouterMetric(const std::string& name,
                             const std::map<std::string, std::string>& labels = {}) {
    return Sample(Scrape(up_->Address("router.metrics")), name, labels).value_or(0.0);
  }
  static int64_t RouterRssKib() {
    std::ifstream status("/proc/" + std::to_string(up_->Child("", "baton-router")) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
    }
    return -1;
  }
  static testing::Outcome Serve(std::chrono::milliseconds deadline = std::chrono::seconds(60)) {
    auto stub = v1::Generation::NewStub(
        grpc::CreateChannel(up_->Address("router.addr"), grpc::InsecureChannelCredentials()));
    return testing::Generate(*stub, testing::Request({5, 6, 7, 8, 9}, 4), deadline);
  }

  static inline BatonUp* up_ = nullptr;
  static inline std::string model_, tls_;
};

// One prefill node's certificate cannot register another's node_id at another address, drain
// it, send cache events in its name, or claim a node_id that is not its own; the role-only
// certificate cannot take a node's id either; and both prefill nodes keep serving.
// This suite's cluster runs with `--threads-per-node 1`: every model node's CPU kernels are a
// team of one thread (its OMP_NUM_THREADS), where the machine's default is a thread a core.
TEST_F(IdentityTest, EachModelNodesThreadTeamIsTheSizeBatonUpGaveIt) {
  const std::string log = up_->log();
  int teams = 0;
  for (size_t at = log.find("cpu kernels"); at != std::string::npos;
       at = log.find("cpu kernels", at + 1)) {
    const std::string line = log.substr(at, log.find('\n', at) - at);
    EXPECT_THAT(line, HasSubstr("threads=1")) << line;
    ++teams;
  }
  EXPECT_GE(teams, 3);  // prefill, prefill-1 and decode (and any of them restarted)
}

TEST_F(IdentityTest, OnePrefillNodeCannotSpeakForAnother) {
  auto impostor = RegistryAs("nodes/prefill-1");
  v1::RegisterRequest moved = Registration("prefill", "127.0.0.1:1");  // a dead address
  v1::RegisterRequest drain = Registration("prefill", up_->Address("prefill.addr"));
  drain.set_draining(true);
  v1::RegisterRequest events = Registration("prefill", up_->Address("prefill.addr"));
  AddSnapshot(events, 4, 1);
  for (const v1::RegisterRequest& attempt : {moved, drain, events}) {
    const grpc::Status refused = Register(*impostor, attempt);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(refused.error_message(), HasSubstr("node_id: 'prefill'"));
    EXPECT_THAT(refused.error_message(), HasSubstr("spiffe://baton/prefill/prefill-1"));
  }
  // A free node_id is not its either: a certificate registers its own instance only.
  const grpc::Status claimed = Register(*impostor, Registration("prefill-9", "127.0.0.1:1"));
  EXPECT_EQ(claimed.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(claimed.error_message(), HasSubstr("is not the instance 'prefill-1'"));
  EXPECT_EQ(Register(*RegistryAs("prefill"), moved).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  for (int i = 0; i < 4; ++i) {
    const testing::Outcome served = Serve();
    EXPECT_TRUE(served.status.ok()) << served.status.error_message();
  }
  EXPECT_EQ(RouterMetric("baton_nodes", {{"role", "prefill"}}), 2);
}

// A prefill node that blames the decode node for its own failure (the baton-failed-node trailer)
// makes that request do without the decode node; the router still reaches the decode node, so
// it is not marked down (which its next heartbeat would count as a return).
TEST_F(IdentityTest, AForgedFailureTrailerDoesNotTakeTheDecodeNodeDown) {
  ASSERT_TRUE(pki::IssueNodeCertificate(tls_, "prefill", "mallory").ok());
  const std::string stem = pki::NodeCertificateStem(tls_, "mallory");
  LyingPrefill liar(tls_, stem);
  auto registry = RegistryAs("nodes/mallory");
  v1::RegisterRequest mallory = Registration("mallory", liar.address);
  // Priced far below the real nodes, so that the router's policy sends it the next request.
  v1::PrefillRates& rates = *mallory.mutable_load()->mutable_rates();
  for (auto set :
       {&v1::PrefillRates::set_compute_ms_per_gflop, &v1::PrefillRates::set_local_ms_per_mib,
        &v1::PrefillRates::set_store_ms_per_mib, &v1::PrefillRates::set_fixed_ms}) {
    (rates.*set)(1e-6);
  }
  rates.set_samples(1000);
  const double returns = RouterMetric("baton_node_registrations_total", {{"role", "decode"}});
  const double lost = RouterMetric("baton_retries_total", {{"reason", "decode_lost"}});
  // Each attempt registers it afresh (it sends no heartbeats); a request it takes fails once
  // its only decode node is avoided, so the client's deadline is short.
  for (int i = 0; i < 5 && liar.calls == 0; ++i) {
    ASSERT_TRUE(Register(*registry, mallory).ok());
    (void)Serve(std::chrono::seconds(2));
  }
  ASSERT_GE(liar.calls, 1);
  mallory.set_draining(true);  // it takes nothing more
  ASSERT_TRUE(Register(*registry, mallory).ok());
  EXPECT_GE(RouterMetric("baton_retries_total", {{"reason", "decode_reported_lost"}}), 1);
  EXPECT_EQ(RouterMetric("baton_retries_total", {{"reason", "decode_lost"}}), lost);
  // A decode node marked down would be counted back at its next heartbeat (every 100 ms).
  EXPECT_FALSE(Eventually(
      [&] {
        return RouterMetric("baton_node_registrations_total", {{"role", "decode"}}) > returns;
      },
      std::chrono::seconds(2), std::chrono::milliseconds(100)));
  const testing::Outcome served = Serve();
  EXPECT_TRUE(served.status.ok()) << served.status.error_message();
}

// 200 invented node_ids, each with a cache snapshot, from the cluster's role-only prefill
// certificate: all are gone once they have been silent for --node-forget-after-ms, and the
// router's memory is back near its baseline.
TEST_F(IdentityTest, InventedNodeIdsAreForgottenAndTheirMemoryFreed) {
  constexpr int kInvented = 200;
  constexpr int kBlocks = 2048;     // per region: 4096 chain keys a node
  constexpr double kRealNodes = 4;  // kvstore, decode, prefill, prefill-1
  const int64_t baseline_rss = RouterRssKib();
  auto registry = RegistryAs("prefill");
  for (int i = 0; i < kInvented; ++i) {
    v1::RegisterRequest ghost = Registration("ghost-" + std::to_string(i), "127.0.0.1:1");
    ghost.set_draining(true);  // nothing is routed there meanwhile
    AddSnapshot(ghost, kBlocks, static_cast<uint32_t>(i));
    ASSERT_TRUE(Register(*registry, ghost).ok()) << i;
  }
  EXPECT_GE(RouterMetric("baton_router_node_ids"), kRealNodes + kInvented);
  const int64_t peak_rss = RouterRssKib();
  EXPECT_TRUE(Eventually([&] { return RouterMetric("baton_router_node_ids") == kRealNodes; },
                         std::chrono::seconds(20), std::chrono::milliseconds(200)))
      << RouterMetric("baton_router_node_ids");
  EXPECT_GE(RouterMetric("baton_router_nodes_forgotten_total"), kInvented);
  int64_t rss = 0;
  // Back within a quarter of what the invented nodes took.
  EXPECT_TRUE(Eventually(
      [&] { return (rss = RouterRssKib()) <= baseline_rss + (peak_rss - baseline_rss) / 4; },
      std::chrono::seconds(10), std::chrono::milliseconds(200)));
  std::printf("router RSS: baseline %lld KiB, with %d invented node_ids %lld KiB, after %lld KiB\n",
              static_cast<long long>(baseline_rss), kInvented, static_cast<long long>(peak_rss),
              static_cast<long long>(rss));
  const testing::Outcome served = Serve();
  EXPECT_TRUE(served.status.ok()) << served.status.error_message();
}

}  // namespace
}  // namespace baton
