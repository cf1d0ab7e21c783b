// batonctl eval on the trained models in models/: the held-out text's NLL under each
// truncation equals the figure tools/train/train.py computed in PyTorch for the same windows
// (metrics.json), the trained models read English better than chance, and bad options are
// refused by name. Also approx-error's --text: prompts and continuations from the text.
#include <cmath>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "run_batonctl.h"
#include "test_dir.h"

namespace baton {
namespace {

using ::testing::HasSubstr;
using testing::RunBatonctl;

const std::string kModels = BATON_MODELS_DIR;

nlohmann::json Metrics(const std::string& model) {
  std::ifstream in(kModels + "/" + model + "/metrics.json");
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

class EvalTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EvalTest, HeldOutNllEqualsTheTrainingScriptsFigureInEveryMode) {
  const std::string dir = kModels + "/" + GetParam();
  const nlohmann::json metrics = Metrics(GetParam());
  ASSERT_TRUE(metrics.is_object()) << dir << "/metrics.json";
  const int64_t C = metrics["ring_capacity"];
  struct Case {
    std::string key, mode;
    int64_t keep;
  };
  const Case cases[] = {{"off", "off", 0},
                        {"compact_keep_" + std::to_string(C), "compact", C},
                        {"mask_keep_" + std::to_string(2 * C), "mask", 2 * C}};
  double off_nll = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    ASSERT_TRUE(metrics["validation"].contains(c.key));
    const nlohmann::json& expected = metrics["validation"][c.key];
    // Prefill in chunks of 96 rows, as a prefill node would; the figure must not move.
    const auto run =
        RunBatonctl("eval --model " + dir + " --text " + dir + "/heldout.txt --mode " + c.mode +
                    " --keep " + std::to_string(c.keep) + " --chunk-size 96 --json");
    ASSERT_EQ(run.exit_status, 0) << run.err;
    const nlohmann::json got = nlohmann::json::parse(run.out);
    EXPECT_EQ(got["tokens"], expected["tokens"]);
    const double nll = got["nll"], want = expected["nll"];
    EXPECT_NEAR(nll, want, 1e-3 * want);
    EXPECT_NEAR(got["perplexity"].get<double>(), std::exp(nll), 1e-9 * std::exp(nll));
    if (c.mode == "off") off_nll = nll;
  }
  // Trained: far below the uniform distribution's log(V).
  EXPECT_LT(off_nll, 0.75 * std::log(4096.0));
}

INSTANTIATE_TEST_SUITE_P(Models, EvalTest,
                         ::testing::Values("ced-brown-plain", "ced-brown-replay",
                                           "ced-brown-shared"));

TEST(BatonctlEval, BadOptionsAreRefusedByName) {
  const std::string dir = kModels + "/ced-brown-replay";
  const std::string text = dir + "/heldout.txt";
  struct Case {
    std::string args, field;
  };
  const Case cases[] = {
      {"--text /nonexistent/file", "--text"},
      {"--text " + text + " --mode compact --keep 10", "--keep"},
      {"--text " + text + " --mode sideways", "--mode"},
      {"--text " + text + " --context 100000", "--context"},
      {"--text " + text + " --context 64 --prompt-len 64", "--prompt-len"},
      {"--text " + text + " --chunk-size -1", "--chunk-size"},
      {"--text " + text + " --batch 0", "--batch"},
  };
  for (const Case& c : cases) {
    const auto run = RunBatonctl("eval --model " + dir + " " + c.args + " --json");
    EXPECT_EQ(run.exit_status, 2) << c.args;
    EXPECT_THAT(run.err, HasSubstr(c.field)) << c.args;
    EXPECT_TRUE(run.out.empty()) << c.args;
  }
  // A text shorter than one window.
  const std::string tiny = testing::ProcessTempDir() + "/short.txt";
  std::ofstream(tiny) << "The jury said.\n";
  const auto run = RunBatonctl("eval --model " + dir + " --text " + tiny);
  EXPECT_EQ(run.exit_status, 2);
  EXPECT_THAT(run.err, HasSubstr("fewer than one window"));
}

TEST(BatonctlApproxError, TextPromptsAreTeacherForcedOnTheTextAndExactAtSpanR) {
  const std::string dir = kModels + "/ced-brown-replay";
  const nlohmann::json metrics = Metrics("ced-brown-replay");
  const int64_t C = metrics["ring_capacity"], R = metrics["span_r"];
  const auto run = RunBatonctl("approx-error --model " + dir + " --text " + dir +
                               "/heldout.txt --num-prompts 2 --prompt-len 300 --steps 8 --keep " +
                               std::to_string(C) + "," + std::to_string(R) + " --json");
  ASSERT_EQ(run.exit_status, 0) << run.err;
  const nlohmann::json report = nlohmann::json::parse(run.out);
  EXPECT_EQ(report["prompts"], 2);
  for (const nlohmann::json& r : report["results"]) {
    SCOPED_TRACE(r.dump().substr(0, 200));
    if (r["prefix_hit_tokens"] != 0) continue;  // a hit narrows the retained rows to L - H
    if (r["keep"] == R) {
      // Exact up to rounding (compact multiplies matrices of other shapes than off).
      EXPECT_LT(r["max_abs_logit_diff"].get<double>(), 1e-3);
      EXPECT_LT(r["kl_mean"].get<double>(), 1e-10);
    } else {
      // K = C on a trained model moves the outputs measurably.
      EXPECT_GT(r["kl_mean"].get<double>(), 1e-10);
      EXPECT_GT(r["max_abs_logit_diff"].get<double>(), 1e-3);
    }
  }
  // The text too short for the window asked for.
  const auto refused = RunBatonctl("approx-error --model " + dir + " --text " + dir +
                                   "/heldout.txt --prompt-len 100000 --steps 4");
  EXPECT_EQ(refused.exit_status, 2);
  EXPECT_THAT(refused.err, HasSubstr("--text"));
}

}  // namespace
}  // namespace baton
