// Several models behind one router: nodes register a served model name and their weights'
// fingerprint; the router routes a request to the model it names, pairs prefill and decode
// nodes of the same weights, and refuses nodes of a model it does not serve. A blue/green
// rollout (new weights under the same name, then the old nodes drained) loses no request.
#include <sys/wait.h>

#include <atomic>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "../tools/run_batonctl.h"
#include "baton/model/model_factory.h"
#include "client.h"
#include "cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "test_dir.h"
#include "testing/eventually.h"

namespace baton::testing {
namespace {

using ::testing::HasSubstr;

class RolloutTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string root = baton::testing::ProcessTempDir();
    // Blue and green: one config (so one served name can hold both), different weights.
    blue_ = root + "/rollout/blue";
    green_ = root + "/rollout/green";
    tiny_ = root + "/rollout/tiny";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("small"), 9, blue_).ok());
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("small"), 10, green_).ok());
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 5, tiny_).ok());
  }
  static std::string blue_, green_, tiny_;
};
std::string RolloutTest::blue_, RolloutTest::green_, RolloutTest::tiny_;

// The value of `key="..."` in a log line ("" when absent).
std::string Field(const std::string& line, const std::string& key) {
  const std::string marker = key + "=\"";
  const size_t at = line.find(marker);
  if (at == std::string::npos) return "";
  const size_t start = at + marker.size();
  return line.substr(start, line.find('"', start) - start);
}

// The weights that serve each model now, as the router lists them.
std::map<std::string, std::vector<std::string>> Listed(Cluster& cluster) {
  auto stub = cluster.Client();
  grpc::ClientContext context;
  v1::ListModelsResponse reply;
  std::map<std::string, std::vector<std::string>> listed;
  if (!stub->ListModels(&context, v1::ListModelsRequest(), &reply).ok()) return listed;
  for (const v1::ServedModel& model : reply.models()) {
    listed[model.name()].assign(model.fingerprints().begin(), model.fingerprints().end());
  }
  return listed;
}

struct Served {
  std::string prefill, decode;
};
// The nodes of each "request finished" line of the router's log, by request id.
std::map<std::string, Served> FinishedOn(const std::string& router_log) {
  std::map<std::string, Served> served;
  std::istringstream lines(router_log);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find("request finished") == std::string::npos) continue;
    served[Field(line, "request_id")] = {Field(line, "prefill_node"), Field(line, "decode_node")};
  }
  return served;
}

TEST_F(RolloutTest, ABlueGreenRolloutUnderLoadLosesNoRequest) {
  Cluster cluster(blue_);
  const std::vector<std::string> name = {"--served-model-name", "baton"};
  ASSERT_FALSE(cluster.StartRouter(name).empty());
  ASSERT_FALSE(cluster.StartDecode("blue-decode", name).empty());
  ASSERT_FALSE(cluster.StartPrefill("blue-prefill", name).empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));

  // Load: four clients, each sending requests one after another until told to stop.
  std::mt19937_64 rng(71);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(RandomPrompt(rng, 30 + i, 4096));
  struct Sent {
    std::string id;
    size_t prompt;
    Outcome outcome;
  };
  std::mutex mutex;
  std::vector<Sent> sent;
  std::atomic<bool> stop{false};
  std::atomic<int> finished{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      auto stub = cluster.Client();
      for (int i = 0; !stop; ++i) {
        const size_t p = static_cast<size_t>(c + i) % prompts.size();
        v1::GenerateRequest request = Request(prompts[p], 24);
        request.set_request_id("load-" + std::to_string(c) + "-" + std::to_string(i));
        request.set_model(i % 2 == 0 ? "baton" : "");  // by name, and the router's default
        Outcome outcome = Generate(*stub, request);
        std::lock_guard<std::mutex> lock(mutex);
        sent.push_back({request.request_id(), p, std::move(outcome)});
        ++finished;
      }
    });
  }
  auto wait_for = [&](int count) {
    return static_cast<bool>(
        Eventually([&] { return finished >= count; }, std::chrono::seconds(120)));
  };
  // Blue serves; green comes up beside it under the same name; blue is drained away.
  bool ok = wait_for(8);
  for (const char* node : {"green-decode", "green-prefill"}) cluster.ModelFor(node, green_);
  ok = ok && !cluster.StartDecode("green-decode", name).empty() &&
       !cluster.StartPrefill("green-prefill", name).empty() &&
       cluster.WaitForLog("router", "node green-prefill registered");
  const int before_drain = finished + 12;
  ok = ok && wait_for(before_drain);
  // Both colors serve the one name now.
  const std::map<std::string, std::vector<std::string>> both = Listed(cluster);
  if (ok) {
    cluster.Signal("blue-prefill", SIGTERM);
    cluster.Signal("blue-decode", SIGTERM);
  }
  std::optional<int> blue_prefill, blue_decode;
  if (ok) {
    blue_prefill = cluster.WaitExit("blue-prefill", std::chrono::seconds(90));
    blue_decode = cluster.WaitExit("blue-decode", std::chrono::seconds(90));
  }
  const int after_drain = finished + 12;
  ok = ok && wait_for(after_drain);
  const std::map<std::string, std::vector<std::string>> green_only = Listed(cluster);
  stop = true;
  for (std::thread& t : clients) t.join();
  ASSERT_TRUE(ok) << "the rollout did not run its course";
  ASSERT_EQ(both.size(), 1u);
  EXPECT_EQ(both.begin()->first, "baton");
  EXPECT_EQ(both.begin()->second.size(), 2u);
  ASSERT_EQ(green_only.size(), 1u);
  EXPECT_EQ(green_only.begin()->second.size(), 1u);
  ASSERT_TRUE(blue_prefill.has_value() && blue_decode.has_value()) << "blue did not exit";
  EXPECT_TRUE(WIFEXITED(*blue_prefill) && WEXITSTATUS(*blue_prefill) == 0);
  EXPECT_TRUE(WIFEXITED(*blue_decode) && WEXITSTATUS(*blue_decode) == 0);

  // No request failed; each ran on one color, prefill and decode alike; one prompt always
  // gives one answer on one color, and the colors' weights differ.
  const std::map<std::string, Served> served = FinishedOn(cluster.Log("router"));
  std::map<std::pair<size_t, std::string>, std::vector<int32_t>> answers;
  std::map<std::string, int> per_color;
  for (const Sent& s : sent) {
    ASSERT_TRUE(s.outcome.status.ok()) << s.id << ": " << s.outcome.status.error_message();
    ASSERT_EQ(s.outcome.tokens.size(), 24u) << s.id;
    ASSERT_TRUE(served.count(s.id)) << s.id;
    const Served& nodes = served.at(s.id);
    const std::string color = nodes.decode.substr(0, nodes.decode.find('-'));
    EXPECT_EQ(nodes.prefill.substr(0, nodes.prefill.find('-')), color) << s.id;
    ++per_color[color];
    auto [it, fresh] = answers.try_emplace({s.prompt, color}, s.outcome.tokens);
    if (!fresh) EXPECT_EQ(it->second, s.outcome.tokens) << s.id;
  }
  EXPECT_GT(per_color["blue"], 0);
  EXPECT_GT(per_color["green"], 0);
  bool differ = false;
  for (size_t p = 0; p < prompts.size(); ++p) {
    auto blue = answers.find({p, "blue"});
    auto green = answers.find({p, "green"});
    if (blue != answers.end() && green != answers.end()) differ |= blue->second != green->second;
  }
  EXPECT_TRUE(differ) << "blue and green answered alike: the rollout changed nothing";
  // Once blue was drained, everything ran on green.
  const std::string router_log = cluster.Log("router");
  EXPECT_THAT(router_log, HasSubstr("node blue-decode is draining"));
  EXPECT_THAT(router_log, ::testing::Not(HasSubstr("decode node blue-decode lost")));
  EXPECT_TRUE(DecodeDrained(cluster, "green-decode"));
}

TEST_F(RolloutTest, TwoModelsSideBySideAreRoutedByNameAndForeignNodesAreRefused) {
  Cluster cluster(blue_);
  const std::string router =
      cluster.StartRouter({"--served-model-name", "alpha", "--extra-model", "beta=" + tiny_});
  ASSERT_FALSE(router.empty());
  const std::vector<std::string> alpha = {"--served-model-name", "alpha"};
  const std::vector<std::string> beta = {"--served-model-name", "beta"};
  ASSERT_FALSE(cluster.StartDecode("alpha-decode", alpha).empty());
  ASSERT_FALSE(cluster.StartPrefill("alpha-prefill", alpha).empty());
  for (const char* node : {"beta-decode", "beta-prefill"}) {
    cluster.ModelFor(node, tiny_);
  }
  ASSERT_FALSE(cluster.StartDecode("beta-decode", beta).empty());
  ASSERT_FALSE(cluster.StartPrefill("beta-prefill", beta).empty());
  // Nodes the router must not use: a name it does not serve, and blue's config as "beta".
  ASSERT_FALSE(cluster.StartDecode("gamma-decode", {"--served-model-name", "gamma"}).empty());
  ASSERT_FALSE(cluster.StartDecode("beta-impostor", beta).empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  ASSERT_TRUE(cluster.WaitForLog("router", "node beta-prefill registered"));
  ASSERT_TRUE(cluster.WaitForLog("router", "node gamma-decode serves 'gamma'"));
  ASSERT_TRUE(cluster.WaitForLog("router", "node beta-impostor's model config differs"));

  auto stub = cluster.Client();
  std::mt19937_64 rng(73);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 20, 512);
  for (const std::string model : {"alpha", "beta", "alpha", "beta"}) {
    v1::GenerateRequest request = Request(prompt, 8);
    request.set_request_id(model + "-" + std::to_string(rng() % 100000));
    request.set_model(model);
    const Outcome outcome = Generate(*stub, request);
    ASSERT_TRUE(outcome.status.ok()) << model << ": " << outcome.status.error_message();
    const Served served = FinishedOn(cluster.Log("router"))[request.request_id()];
    EXPECT_EQ(served.prefill, model + "-prefill");
    EXPECT_EQ(served.decode, model + "-decode");
  }
  // What the router serves: both names, each with its one pair's weights (batonctl models).
  const Result listed = RunBatonctl("models --addr " + router);
  ASSERT_EQ(listed.exit_status, 0) << listed.err;
  const nlohmann::json models = nlohmann::json::parse(listed.out, nullptr, false)["models"];
  ASSERT_TRUE(models.is_array() && models.size() == 2) << listed.out;
  EXPECT_EQ(models[0]["name"], "alpha");
  EXPECT_EQ(models[1]["name"], "beta");
  ASSERT_EQ(models[0]["fingerprints"].size(), 1u) << listed.out;
  ASSERT_EQ(models[1]["fingerprints"].size(), 1u) << listed.out;
  EXPECT_NE(models[0]["fingerprints"][0], models[1]["fingerprints"][0]);
  EXPECT_EQ(models[1]["serving"], true);
  // What the router does not serve, and what the named model's config refuses.
  v1::GenerateRequest request = Request(prompt, 8);
  request.set_model("gamma");
  Outcome outcome = Generate(*stub, request);
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(outcome.status.error_message(), HasSubstr("'alpha', 'beta'"));
  request = Request({600}, 4);  // inside alpha's vocabulary (4,096), outside beta's (512)
  request.set_model("beta");
  outcome = Generate(*stub, request);
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(outcome.status.error_message(), HasSubstr("prompt_token_ids[0]"));
  // With beta's nodes gone, beta is unavailable and alpha serves on.
  cluster.Kill("beta-prefill");
  request = Request(prompt, 4);
  request.set_model("beta");
  outcome = Generate(*stub, request);
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(outcome.status.error_message(), HasSubstr("for model 'beta'"));
  EXPECT_TRUE(Listed(cluster)["beta"].empty());
  request.set_model("alpha");
  EXPECT_TRUE(Generate(*stub, request).status.ok());
}

}  // namespace
}  // namespace baton::testing
