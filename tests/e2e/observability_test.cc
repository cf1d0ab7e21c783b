// Operations, with the real binaries: `baton up` exposes Prometheus metrics on every
// component and they move with traffic (requests, latencies, transfers, prefix hits, store
// bytes); the components' JSON logs follow one request id from router to prefill and decode;
// the config file is applied under the command line and bad files are refused by name.
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "baton_up.h"
#include "client.h"
#include "cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scrape.h"
#include "test_dir.h"
#include "testing/eventually.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::Sample;
using testing::Scrape;

const char* const kRoles[] = {"router", "prefill", "decode", "kvstore"};

// A tiny model (W = 16, C = 22, B = 16) made once per test process.
const std::string& TinyModel() {
  static const std::string dir = [] {
    const std::string d = testing::ProcessTempDir() + "/tiny";
    const std::string command =
        std::string(BATONCTL_PATH) + " make-model --preset tiny --out " + d + " > /dev/null";
    EXPECT_EQ(std::system(command.c_str()), 0);
    return d;
  }();
  return dir;
}

using testing::BatonUp;
using testing::EventuallyThat;
using testing::ReadFile;

std::map<std::string, std::string> ScrapeAll(const BatonUp& up) {
  std::map<std::string, std::string> out;
  for (const char* role : kRoles) out[role] = Scrape(up.Address(std::string(role) + ".metrics"));
  return out;
}

double Value(const std::string& exposition, const std::string& name,
             const std::map<std::string, std::string>& labels = {}) {
  return Sample(exposition, name, labels).value_or(0.0);
}

TEST(Observability, BatonUpMetricsMoveAndLogsFollowARequest) {
  BatonUp up(fs::path(testing::ProcessTempDir()) / "up", TinyModel(),
             {"--log-format", "json", "--decode-pages", "256", "--set", "decode.slots=3", "--set",
              "kvstore.sync-writes=true"});
  ASSERT_TRUE(up.WaitUntilUp()) << up.log();
  const std::map<std::string, std::string> before = ScrapeAll(up);
  for (const char* role : kRoles) {
    ASSERT_FALSE(before.at(role).empty()) << role << " serves no metrics";
    EXPECT_EQ(Value(before.at(role), "baton_build_info",
                    {{"binary", std::string("baton-") + role}, {"version", "0.1.0"}}),
              1)
        << role;
  }
  EXPECT_EQ(Value(before.at("decode"), "baton_pool_pages_capacity"), 256);
  // A decode flag baton up has none of its own for, handed on by --set (as is a store flag
  // that takes no value, which the store accepted or baton up would not be up).
  EXPECT_EQ(Value(before.at("decode"), "baton_pool_slots_capacity"), 3);
  EXPECT_EQ(Value(before.at("router"), "baton_nodes", {{"role", "decode"}}), 1);

  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(up.Address("router.addr"), grpc::InsecureChannelCredentials()));
  // 100 tokens: with C = 22 and B = 16, a repeat of the prompt may load 4 blocks.
  std::vector<int32_t> prompt;
  for (int i = 0; i < 100; ++i) prompt.push_back(3 + (i * 37) % 500);
  v1::GenerateRequest request;
  for (int32_t t : prompt) request.add_prompt_token_ids(t);
  request.mutable_sampling()->set_max_tokens(6);
  request.mutable_sampling()->set_ignore_eos(true);
  request.set_request_id("observed-1");
  ASSERT_TRUE(testing::Generate(*stub, request).status.ok());
  // The prompt's blocks reach the store after the first token; wait for them (the hit below
  // says whether they came).
  EventuallyThat(
      [&] {
        return Value(Scrape(up.Address("kvstore.metrics")), "baton_store_values",
                     {{"region", "block_kv"}});
      },
      ::testing::Ge(6), std::chrono::seconds(30), std::chrono::milliseconds(50));
  request.set_request_id("observed-2");
  const testing::Outcome hit = testing::Generate(*stub, request);
  ASSERT_TRUE(hit.status.ok());
  EXPECT_EQ(hit.usage.cached_tokens(), 64u);
  request.set_request_id("observed-3");
  request.mutable_sampling()->set_max_tokens(0);  // refused: max_tokens must be >= 1
  EXPECT_EQ(testing::Generate(*stub, request).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  // The prefill node writes a prompt's computed blocks back after its answer: the hit's two
  // new blocks are counted once its copier has taken them.
  EventuallyThat(
      [&] {
        return Value(Scrape(up.Address("prefill.metrics")), "baton_prefix_written_blocks_total") -
               Value(before.at("prefill"), "baton_prefix_written_blocks_total");
      },
      ::testing::Ge(6 + 2), std::chrono::seconds(30), std::chrono::milliseconds(50));
  const std::map<std::string, std::string> after = ScrapeAll(up);
  auto moved = [&](const std::string& role, const std::string& name,
                   const std::map<std::string, std::string>& labels = {}) {
    return Value(after.at(role), name, labels) - Value(before.at(role), name, labels);
  };
  EXPECT_EQ(moved("router", "baton_requests_total", {{"outcome", "ok"}}), 2);
  EXPECT_EQ(moved("router", "baton_requests_total", {{"outcome", "invalid_argument"}}), 1);
  EXPECT_EQ(moved("router", "baton_time_to_first_token_seconds_count"), 2);
  EXPECT_GT(moved("router", "baton_time_to_first_token_seconds_sum"), 0);
  EXPECT_EQ(moved("router", "baton_inter_token_latency_seconds_count"), 10);
  EXPECT_EQ(moved("router", "baton_generation_tokens_total"), 12);
  EXPECT_EQ(moved("router", "baton_prompt_tokens_total"), 200);
  EXPECT_EQ(moved("router", "baton_prefix_queries_total"), 2);
  EXPECT_EQ(moved("router", "baton_prefix_hits_total"), 1);
  EXPECT_EQ(moved("router", "baton_prefix_cached_tokens_total"), 64);
  EXPECT_GT(moved("router", "baton_prefix_replayed_rows_total"), 0);
  EXPECT_EQ(Value(after.at("router"), "baton_requests_running"), 0);

  EXPECT_EQ(moved("prefill", "baton_prefill_requests_total", {{"outcome", "ok"}}), 2);
  EXPECT_EQ(moved("prefill", "baton_prefill_tokens_total"), 200);
  EXPECT_GT(moved("prefill", "baton_transfer_bytes_total", {{"transport", "ucx"}}), 0);
  EXPECT_EQ(moved("prefill", "baton_transfer_seconds_count", {{"transport", "ucx"}}), 2);
  EXPECT_EQ(moved("prefill", "baton_prefix_loaded_blocks_total"), 4);
  EXPECT_EQ(moved("prefill", "baton_prefix_written_blocks_total"), 6 + 2);

  EXPECT_EQ(moved("decode", "baton_decode_requests_total", {{"outcome", "ok"}}), 2);
  EXPECT_EQ(moved("decode", "baton_decode_tokens_total"),
            10);  // the first tokens come from prefill
  EXPECT_GT(moved("decode", "baton_decode_step_seconds_count"), 0);
  EXPECT_EQ(Value(after.at("decode"), "baton_pool_pages_used"), 0);

  EXPECT_EQ(moved("kvstore", "baton_store_lookups_total"), 2);
  EXPECT_GT(moved("kvstore", "baton_store_bytes"), 0);
  // `baton up` gives the prefill node a block cache: the hit's blocks, which it computed
  // itself, come from there and not from the store.
  EXPECT_EQ(moved("kvstore", "baton_store_reads_total", {{"result", "hit"}}), 0);
  EXPECT_EQ(moved("prefill", "baton_block_cache_lookups_total", {{"result", "hit"}}), 4 + 1);
  EXPECT_GT(Value(after.at("prefill"), "baton_block_cache_bytes"), 0);
  EXPECT_GT(Value(after.at("prefill"), "baton_prefill_rate_ms", {{"rate", "compute_per_gflop"}}),
            0);
  EXPECT_EQ(moved("router", "baton_prefix_tier_cached_tokens_total", {{"tier", "local"}}), 64);
  EXPECT_EQ(moved("router", "baton_prefix_tier_cached_tokens_total", {{"tier", "store"}}), 0);
  EXPECT_EQ(moved("router", "baton_router_prefill_choices_total",
                  {{"policy", "predicted-ttft"}, {"reason", "least_loaded"}}),
            2);
  EXPECT_GT(moved("kvstore", "baton_store_written_bytes_total"), 0);

  // One request id across the router, the prefill node and the decode node (whose
  // reservation is "<id>#<attempt>").
  std::set<std::string> seen;
  std::istringstream lines(up.log());
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{') continue;
    const nlohmann::json event = nlohmann::json::parse(line);
    ASSERT_TRUE(event.contains("ts") && event.contains("level") && event.contains("event")) << line;
    const std::string id = event.value("request_id", "");
    if (id == "observed-2" || id == "observed-2#0") {
      seen.insert(event["binary"].get<std::string>() + ": " + event["event"].get<std::string>());
    }
    if (id == "observed-3") {
      EXPECT_EQ(event["code"], "invalid_argument");
      EXPECT_THAT(event["error"].get<std::string>(), HasSubstr("sampling.max_tokens"));
    }
  }
  EXPECT_TRUE(seen.count("baton-router: request finished")) << up.log();
  EXPECT_TRUE(seen.count("baton-prefill: prefill done")) << up.log();
  EXPECT_TRUE(seen.count("baton-decode: stream finished")) << up.log();
}

// Writes `text` to a config file of this test process.
std::string ConfigFile(const std::string& name, const std::string& text) {
  const std::string path = testing::ProcessTempDir() + "/" + name + ".yaml";
  std::ofstream(path) << text;
  return path;
}

TEST(Observability, ConfigFileSetsFlagsAndTheCommandLineWins) {
  testing::Cluster cluster(TinyModel());
  ASSERT_FALSE(cluster.StartRouter().empty());
  // The decode node's identity comes from the file's common section too.
  const std::string pki = testing::TestPki();
  const std::string config = ConfigFile("good", "common:\n  model: " + TinyModel() +
                                                    "\n  log-format: json\n"
                                                    "  tls-ca: " +
                                                    pki +
                                                    "/ca.crt\n"
                                                    "  tls-cert: " +
                                                    pki +
                                                    "/decode.crt\n"
                                                    "  tls-key: " +
                                                    pki +
                                                    "/decode.key\n"
                                                    "  data-dir: /not/for/decode\n"
                                                    "decode:\n  slots: 3\n  pages: 64\n"
                                                    "router:\n  hit-cap: keep\n");
  const std::string metrics = cluster.dir() + "/decode.metrics";
  ASSERT_FALSE(cluster
                   .Start("decode", BATON_DECODE_PATH,
                          {"--config", config, "--pages", "32", "--metrics-ready-file", metrics,
                           "--node-id", "configured"})
                   .empty())
      << cluster.Log("decode");
  std::string address;
  std::ifstream(metrics) >> address;
  const std::string exposition = Scrape(address);
  EXPECT_EQ(Sample(exposition, "baton_pool_slots_capacity"), 3);                 // from the file
  EXPECT_EQ(Sample(exposition, "baton_pool_pages_capacity"), 32);                // the flag wins
  EXPECT_THAT(cluster.Log("decode"), HasSubstr("\"binary\":\"baton-decode\""));  // common

  // --check-config prints what the file and the flags give, as a decode section, and exits.
  const std::string checked = testing::ProcessTempDir() + "/checked.yaml";
  ASSERT_EQ(std::system((std::string(BATON_DECODE_PATH) + " --config " + config +
                         " --pages 32 --check-config > " + checked)
                            .c_str()),
            0);
  const std::string settings = ReadFile(checked);
  EXPECT_THAT(settings, HasSubstr("decode:\n"));
  EXPECT_THAT(settings, HasSubstr("  slots: 3\n"));
  EXPECT_THAT(settings, HasSubstr("  pages: 32\n"));
  EXPECT_THAT(settings, HasSubstr("  model: " + TinyModel() + "\n"));
  EXPECT_THAT(settings, ::testing::Not(HasSubstr("data-dir")));  // not a decode flag
}

TEST(Observability, BadConfigFilesAreRefusedByName) {
  struct Case {
    std::string text;
    std::string message;
  };
  const std::string model = "common:\n  model: " + TinyModel() + "\n";
  const std::vector<Case> cases = {
      {model + "decoder:\n  slots: 3\n", "section 'decoder' is unknown"},
      {model + "decode:\n  slot: 3\n", "decode.slot: unknown key"},
      {model + "decode:\n  slots: many\n", "--slots"},
      {model + "decode:\n  slots: 0\n", "--slots"},
      {model + "decode:\n  slots: {a: 1}\n", "decode.slots: must be a value"},
      {model + "  slots: 3\n", "common.slots: not a shared key"},
      {model + "decode: [1, 2]\n", "section 'decode' must be a map"},
      {model + "decode:\n  slots: [3\n", "not valid YAML"},
      {"common:\n  log-format: xml\n  model: " + TinyModel() + "\n", "--log-format"},
  };
  int index = 0;
  for (const Case& c : cases) {
    const std::string path = ConfigFile("bad" + std::to_string(index++), c.text);
    const std::string log = testing::ProcessTempDir() + "/bad.log";
    const std::string command =
        std::string(BATON_DECODE_PATH) + " --config " + path + " --no-ucx > " + log + " 2>&1";
    const int status = std::system(command.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << c.text;
    EXPECT_EQ(WEXITSTATUS(status), 2) << c.text << "\n" << ReadFile(log);
    EXPECT_THAT(ReadFile(log), HasSubstr(c.message)) << c.text;
  }
  // A file that is not there.
  const std::string log = testing::ProcessTempDir() + "/missing.log";
  const int status = std::system(
      (std::string(BATON_ROUTER_PATH) + " --config /no/such/baton.yaml > " + log + " 2>&1")
          .c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_THAT(ReadFile(log), HasSubstr("/no/such/baton.yaml"));
}

}  // namespace
}  // namespace baton
