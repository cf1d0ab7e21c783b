// The prefix store as a fleet (DESIGN section 5) under `baton up --kvstore-nodes 3
// --kvstore-replication 2`: a repeated 2,000-token prompt hits at the cap with the forward
// pass's tokens; its values lie on all three nodes, two copies each; a store node that stops
// answering (SIGSTOP) or is killed (SIGKILL) costs no hit and no token, the router's breaker
// skips the frozen one, and the killed one is restarted and rejoins the live set; `batonctl
// stores` lists the set and each node's values.
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "baton/common/model_config.h"
#include "baton/common/pki.h"
#include "baton/kvstore/chain.h"
#include "baton/kvstore/placement.h"
#include "baton/model/model_factory.h"
#include "baton/model/weights.h"
#include "baton_up.h"
#include "client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scrape.h"
#include "spawn.h"
#include "test_dir.h"
#include "testing/eventually.h"

namespace baton::testing {
namespace {

const std::vector<std::string> kStores = {"kvstore", "kvstore-1", "kvstore-2"};

class StoreFleetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = ProcessTempDir() + "/fleet_small";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("small"), 9, model_).ok());
  }
  // Block-KV values a store node holds (its own /metrics).
  static double Values(const BatonUp& up, const std::string& node) {
    return Sample(Scrape(up.Address(node + ".metrics")), "baton_store_values",
                  {{"region", "block_kv"}})
        .value_or(-1);
  }
  // `baton up`'s flags for three store nodes, two owners per value, and no local block cache
  // (every hit is read from the store nodes). Its config file (written under `dir`) lets the
  // router's lookups take 2 s, keeps nodes live for a minute without a heartbeat, and gives a
  // prefill node's store reads 2 s at least: on a loaded machine a healthy store node's probe
  // is not taken for a failure, its reads are not cut at the hit's predicted compute time
  // (measured on one cold prompt), and a frozen node stays in the live set (probed, then
  // skipped by the breaker) however long requests take.
  static std::vector<std::string> FleetFlags(const std::filesystem::path& dir) {
    std::filesystem::create_directories(dir);
    const std::string config = (dir / "baton.yaml").string();
    std::ofstream(config) << "router:\n  lookup-timeout-ms: 2000\n  node-expiry-ms: 60000\n"
                             "prefill:\n  store-read-min-ms: 2000\n";
    return {"--kvstore-nodes", "3",   "--kvstore-replication", "2", "--block-cache-bytes", "0",
            "--config",        config};
  }
  // The lines of a log that are warnings or errors: why a request went cold.
  static std::string Warnings(const std::string& log) {
    std::string lines;
    std::istringstream in(log);
    for (std::string line; std::getline(in, line);) {
      if (line.find(" warning ") != std::string::npos ||
          line.find(" error ") != std::string::npos) {
        lines += line + "\n";
      }
    }
    return lines;
  }
  // The store lines of the router's and the prefill node's metrics (breakers, probes, reads,
  // load failures): where a hit went cold.
  static std::string StoreMetrics(const BatonUp& up) {
    std::string lines;
    for (const std::string node : {"router", "prefill"}) {
      std::istringstream in(Scrape(up.Address(node + ".metrics")));
      for (std::string line; std::getline(in, line);) {
        if (line.empty() || line[0] == '#') continue;
        if (line.find("store") != std::string::npos || line.find("prefix") != std::string::npos ||
            line.find("load_failures") != std::string::npos) {
          lines += node + ": " + line + "\n";
        }
      }
    }
    return lines;
  }
  static double RouterSample(const BatonUp& up, const std::string& name) {
    return Sample(Scrape(up.Address("router.metrics")), name, {}).value_or(-1);
  }

  static std::string model_;
};
std::string StoreFleetTest::model_;

TEST_F(StoreFleetTest, HitsSpreadOverTheOwnersAndSurviveAStoreNodeLost) {
  const std::filesystem::path dir = ProcessTempDir() + "/store_fleet";
  BatonUp up(dir / "up", model_, FleetFlags(dir));
  ASSERT_TRUE(up.WaitUntilUp()) << up.log();
  const ModelConfig config = *LoadModelConfig(model_ + "/config.json");
  const int64_t L = 2000, B = config.kv_block_size, C = config.ring_capacity();
  std::mt19937_64 rng(83);
  const std::vector<int32_t> prompt = RandomPrompt(rng, L, config.vocab_size);
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(up.Address("router.addr"), grpc::InsecureChannelCredentials()));
  auto run = [&] {
    const Outcome outcome = Generate(*stub, Request(prompt, 6));
    EXPECT_TRUE(outcome.status.ok()) << outcome.status.error_message();
    return outcome;
  };
  const std::vector<int32_t> forward = ForwardTokens(model_, prompt, "compact", C, 6);
  const Outcome cold = run();
  EXPECT_EQ(cold.usage.cached_tokens(), 0u);
  EXPECT_EQ(cold.tokens, forward);

  // The write-back puts each of the prompt's L / B blocks on its two owners.
  const double copies = 2.0 * static_cast<double>(L / B);
  auto total = [&] {
    double sum = 0;
    for (const std::string& node : kStores) sum += Values(up, node);
    return sum;
  };
  ASSERT_TRUE(EventuallyThat(total, ::testing::Eq(copies), std::chrono::seconds(60))) << up.log();
  for (const std::string& node : kStores) {
    EXPECT_GT(Values(up, node), 0) << node << " holds none of the prompt's blocks";
    EXPECT_LT(Values(up, node), static_cast<double>(L / B)) << node << " holds them all";
  }
  // batonctl stores: the live set, R, and each node's values.
  auto list = [&] {
    const Result listed = RunBatonctl("stores --addr " + up.Address("router.addr"));
    EXPECT_EQ(listed.exit_status, 0) << listed.err;
    return nlohmann::json::parse(listed.out);
  };
  nlohmann::json stores = list();
  EXPECT_EQ(stores["replication"], 2);
  ASSERT_EQ(stores["stores"].size(), kStores.size());
  double listed = 0;
  for (size_t i = 0; i < kStores.size(); ++i) {
    const nlohmann::json& store = stores["stores"][i];
    EXPECT_EQ(store["node_id"], kStores[i]);
    EXPECT_EQ(store["answered"], true);
    listed += store["block_kv_values"].get<double>();
  }
  EXPECT_EQ(listed, copies);
  const uint32_t cap = static_cast<uint32_t>((L - C) / B * B);
  const Outcome hit = run();
  EXPECT_EQ(hit.usage.cached_tokens(), cap);
  EXPECT_EQ(hit.tokens, forward);

  // A store node that stops answering: its keys' other owners serve the hit, and after a few
  // probes that time out the router's breaker skips it.
  const pid_t frozen = up.Child("kvstore-1");
  ASSERT_GT(frozen, 0);
  ASSERT_EQ(kill(frozen, SIGSTOP), 0);
  for (int i = 0; i < 4; ++i) {
    const Outcome during = run();
    EXPECT_EQ(during.usage.cached_tokens(), cap)
        << "request " << i << " with kvstore-1 frozen; the cluster's warnings:\n"
        << Warnings(up.log()) << "the store metrics:\n"
        << StoreMetrics(up) << "its log's last lines:\n"
        << up.log().substr(up.log().size() > 20000 ? up.log().size() - 20000 : 0);
    EXPECT_EQ(during.tokens, forward);
  }
  EXPECT_GE(RouterSample(up, "baton_router_store_breaker_trips_total"), 1);
  stores = list();
  ASSERT_EQ(stores["stores"].size(), kStores.size());
  EXPECT_EQ(stores["stores"][1]["node_id"], "kvstore-1");
  EXPECT_EQ(stores["stores"][1]["answered"], false);
  EXPECT_FALSE(stores["stores"][1]["error"].get<std::string>().empty());
  EXPECT_EQ(stores["stores"][0]["skipped"], false);
  ASSERT_EQ(kill(frozen, SIGCONT), 0);
  // Once its breaker's while is over, one probe tries the node again, and it is back.
  ASSERT_TRUE(EventuallyThat(
      [&] {
        run();
        return RouterSample(up, "baton_router_store_breaker_open");
      },
      ::testing::Eq(0.0), std::chrono::seconds(90), std::chrono::milliseconds(500)));

  // A store node killed: still every hit, and baton up starts it again; it rejoins the set
  // with the values it held (RocksDB's write-ahead log).
  const pid_t killed = up.Child("kvstore-2");
  ASSERT_GT(killed, 0);
  const double held = Values(up, "kvstore-2");
  ASSERT_GT(held, 0);
  ASSERT_EQ(kill(killed, SIGKILL), 0);
  const Outcome after = run();
  EXPECT_EQ(after.usage.cached_tokens(), cap);
  EXPECT_EQ(after.tokens, forward);
  ASSERT_TRUE(EventuallyThat([&] { return up.Child("kvstore-2"); },
                             ::testing::AllOf(::testing::Gt(0), ::testing::Ne(killed)),
                             std::chrono::seconds(60)));
  EXPECT_TRUE(EventuallyThat([&] { return RouterSample(up, "baton_kvstore_nodes"); },
                             ::testing::Eq(3.0), std::chrono::seconds(60)));
  EXPECT_EQ(RouterSample(up, "baton_kvstore_replication"), 2);
  EXPECT_TRUE(EventuallyThat([&] { return Values(up, "kvstore-2"); }, ::testing::Eq(held),
                             std::chrono::seconds(60)));
}

// A fourth store node joins a fleet of three (R = 2): the prompt stored before still hits fully
// (each key keeps one of its two owners), and a new prompt's values land where placement puts
// them over four nodes: the newcomer takes about a quarter of the copies.
TEST_F(StoreFleetTest, AFourthStoreNodeJoinsAndTakesItsShare) {
  const std::filesystem::path dir = ProcessTempDir() + "/store_fleet_join";
  BatonUp up(dir, model_, FleetFlags(dir.string() + "-config"));
  ASSERT_TRUE(up.WaitUntilUp()) << up.log();
  const ModelConfig config = *LoadModelConfig(model_ + "/config.json");
  const std::string fingerprint = *model::ModelFingerprint(model_);
  const int64_t L = 2000, B = config.kv_block_size, C = config.ring_capacity();
  const uint32_t cap = static_cast<uint32_t>((L - C) / B * B);
  std::mt19937_64 rng(89);
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(up.Address("router.addr"), grpc::InsecureChannelCredentials()));
  auto run = [&](const std::vector<int32_t>& prompt) {
    const Outcome outcome = Generate(*stub, Request(prompt, 4));
    EXPECT_TRUE(outcome.status.ok()) << outcome.status.error_message();
    return outcome;
  };
  std::vector<std::string> stores = kStores;
  auto total = [&] {
    double sum = 0;
    for (const std::string& node : stores) sum += Values(up, node);
    return sum;
  };
  const std::vector<int32_t> before = RandomPrompt(rng, L, config.vocab_size);
  const Outcome cold = run(before);
  ASSERT_TRUE(EventuallyThat(total, ::testing::Eq(2.0 * static_cast<double>(L / B)),
                             std::chrono::seconds(60)));

  // kvstore-3, started by hand as an operator would: its own certificate from the cluster's CA.
  const std::string tls = (dir / "tls").string();
  ASSERT_TRUE(pki::IssueNodeCertificate(tls, "kvstore", "kvstore-3").ok());
  const std::string stem = pki::NodeCertificateStem(tls, "kvstore-3");
  const pid_t joined = Spawn({BATON_KVSTORE_PATH,
                              "--model",
                              model_,
                              "--router",
                              up.Address("router-internal.addr"),
                              "--node-id",
                              "kvstore-3",
                              "--data-dir",
                              (dir / "kvstore-3").string(),
                              "--tls-ca",
                              tls + "/ca.crt",
                              "--tls-cert",
                              stem + ".crt",
                              "--tls-key",
                              stem + ".key",
                              "--port",
                              "0",
                              "--metrics-port",
                              "0",
                              "--metrics-ready-file",
                              (dir / "run" / "kvstore-3.metrics").string(),
                              "--ready-file",
                              (dir / "run" / "kvstore-3.addr").string()},
                             (dir / "kvstore-3.log").string());
  ASSERT_GT(joined, 0);
  stores.push_back("kvstore-3");
  EXPECT_TRUE(EventuallyThat([&] { return RouterSample(up, "baton_kvstore_nodes"); },
                             ::testing::Eq(4.0), std::chrono::seconds(60)));
  const Outcome again = run(before);
  EXPECT_EQ(again.usage.cached_tokens(), cap);
  EXPECT_EQ(again.tokens, cold.tokens);

  // The copies kvstore-3 owns among `keys` [first, end), by placement over the four nodes.
  auto owned_by_newcomer = [&](const std::vector<Sha256Digest>& keys, size_t first) {
    double n = 0;
    for (size_t b = first; b < keys.size(); ++b) {
      for (size_t owner : kvstore::Owners(keys[b], stores, 2)) n += owner == 3 ? 1 : 0;
    }
    return n;
  };
  // The hit wrote back the blocks past its cap; a new prompt writes all of its blocks, each
  // to its two owners over the four nodes.
  const std::vector<int32_t> after = RandomPrompt(rng, L, config.vocab_size);
  const std::vector<Sha256Digest> keys =
      kvstore::ChainKeys(fingerprint, "", "", after, config.kv_block_size);
  const double expected = owned_by_newcomer(keys, 0);
  run(after);
  EXPECT_TRUE(EventuallyThat(
      [&] { return Values(up, "kvstore-3"); },
      ::testing::Eq(expected + owned_by_newcomer(kvstore::ChainKeys(fingerprint, "", "", before,
                                                                    config.kv_block_size),
                                                 static_cast<size_t>(cap / B))),
      std::chrono::seconds(60)));
  // About a quarter of the copies (2 of 4 owners' slots per key, one of them the newcomer's
  // half the time): between an eighth and three eighths for 31 keys.
  const double copies = 2.0 * static_cast<double>(keys.size());
  EXPECT_GT(expected, copies / 8);
  EXPECT_LT(expected, copies * 3 / 8);
  kill(joined, SIGTERM);
  int status;
  waitpid(joined, &status, 0);
}

TEST_F(StoreFleetTest, ReplicationAboveTheStoreNodesIsRefusedByName) {
  const std::string err = ProcessTempDir() + "/fleet_bad.err";
  const int status =
      std::system((std::string(BATON_PATH) + " up --port 0 --http-port -1 " + "--data-dir " +
                   ProcessTempDir() + "/fleet_bad --model " + model_ +
                   " --kvstore-nodes 2 --kvstore-replication 3 " + "> /dev/null 2> " + err)
                      .c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_THAT(ReadFile(err), ::testing::HasSubstr("--kvstore-replication: 3 owners per value "
                                                  "need at least 3 store nodes; "
                                                  "--kvstore-nodes is 2"));
}

}  // namespace
}  // namespace baton::testing
