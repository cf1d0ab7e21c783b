// batonctl approx-error on the tiny model (W = 16, C = 22, D = 4 consumer layers, so
// R = W + (D - 1)(W - 1) = 61): exact where the seed says truncation is exact, measurably not
// below R, and the prefix-hit variants behave as DESIGN section 5 says.
#include <algorithm>
#include <fstream>
#include <vector>
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

// Rounding level: compact multiplies matrices of other shapes than off, so its float sums
// differ in the last bits (logits are of order 10); real truncation error is far above it.
constexpr double kRounding = 1e-4;

const std::string& TinyModel() {
  static const std::string dir = [] {
    const std::string d = testing::ProcessTempDir() + "/tiny";
    EXPECT_EQ(RunBatonctl("make-model --preset tiny --out " + d).exit_status, 0);
    return d;
  }();
  return dir;
}

const nlohmann::json& Find(const nlohmann::json& report, const std::string& mode, int keep,
                           int hit) {
  for (const nlohmann::json& r : report["results"]) {
    if (r["mode"] == mode && r["keep"] == keep && r["prefix_hit_tokens"] == hit) return r;
  }
  static const nlohmann::json missing;
  ADD_FAILURE() << "no result for " << mode << " keep " << keep << " hit " << hit;
  return missing;
}

TEST(BatonctlApproxError, ExactAtSpanAndCompactEqualsMaskButNotBelowSpan) {
  const auto run = RunBatonctl("approx-error --model " + TinyModel() +
                               " --keep 22,61 --num-prompts 3 --prompt-len 200 --steps 6 --json");
  ASSERT_EQ(run.exit_status, 0) << run.err;
  const nlohmann::json report = nlohmann::json::parse(run.out);
  EXPECT_EQ(report["kind"], "approx_error");
  EXPECT_EQ(report["span_r"], 61);
  EXPECT_EQ(report["ring_capacity"], 22);
  // L = 200, ring cap: H = floor((200 - 22) / 16) * 16 = 176.
  const int hit = 176;
  for (const std::string mode : {"mask", "compact"}) {
    const nlohmann::json& exact = Find(report, mode, 61, 0);
    EXPECT_LE(exact["max_abs_logit_diff"].get<double>(), kRounding) << mode;
    EXPECT_EQ(exact["top1_agreement"], 1.0) << mode;
    ASSERT_EQ(exact["steps"].size(), 6u);
    // Ring rows at least (D - 1)(W - 1) = 45 inside the retained region are exact too.
    for (const nlohmann::json& row : exact["ring_distance"]) {
      if (row["edge_distance"].get<int>() >= 45) {
        EXPECT_LE(row["max_abs"].get<double>(), kRounding) << row;
      }
    }
    const nlohmann::json& below = Find(report, mode, 22, 0);
    EXPECT_GT(below["max_abs_logit_diff"].get<double>(), 10 * kRounding) << mode;
    EXPECT_GT(below["kl_max"].get<double>(), 0) << mode;
    double ring_max = 0;
    for (const nlohmann::json& row : below["ring_distance"]) {
      ring_max = std::max(ring_max, row["max_abs"].get<double>());
    }
    EXPECT_GT(ring_max, 10 * kRounding) << mode;

    // K = C: H = 176 <= L - K = 178, so the hit gives the cold answer. K = 61: H > L - K =
    // 139, the replay starts at H and the answer is a cold run with s_valid = H instead.
    EXPECT_LE(Find(report, mode, 22, hit)["max_abs_vs_cold"].get<double>(), kRounding) << mode;
    EXPECT_GT(Find(report, mode, 61, hit)["max_abs_vs_cold"].get<double>(), 10 * kRounding)
        << mode;
  }
  for (const nlohmann::json& row : report["compact_vs_mask"]) {
    EXPECT_LE(row["max_abs_logit_diff"].get<double>(), kRounding) << row;
  }
  EXPECT_EQ(report["compact_vs_mask"].size(), 2u);
}

TEST(BatonctlApproxError, PrintsATableAndRefusesBadInput) {
  const auto table = RunBatonctl("approx-error --model " + TinyModel() +
                                 " --keep 22 --num-prompts 1 --prompt-len 60 --steps 2");
  ASSERT_EQ(table.exit_status, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("R = W + (D-1)(W-1) = 61"));
  EXPECT_THAT(table.out, HasSubstr("compact vs mask at keep 22"));

  // A 30-token prompt leaves the ring cap no block (floor((30 - 22) / 16) = 0): cold runs only.
  const auto short_run = RunBatonctl("approx-error --model " + TinyModel() +
                                     " --keep 22 --num-prompts 2 --prompt-len 30 --steps 2 --json");
  ASSERT_EQ(short_run.exit_status, 0) << short_run.err;
  const nlohmann::json short_report = nlohmann::json::parse(short_run.out);
  ASSERT_EQ(short_report["results"].size(), 2u);  // mask and compact, cold
  for (const nlohmann::json& r : short_report["results"]) {
    EXPECT_EQ(r["prefix_hit_tokens"], 0);
    EXPECT_EQ(r["prompts"], 2);
  }

  const std::string prompts = testing::ProcessTempDir() + "/prompts.jsonl";
  std::ofstream(prompts) << "[5, 6, 7]\n[5, 600]\n";
  struct Case {
    std::string args, message;
  };
  for (const Case& c : std::vector<Case>{
           {"--keep 10", "--keep: 10 is below the ring capacity C = 22"},
           {"--modes off", "--modes: off is the reference"},
           {"--modes fast", "--modes"},
           {"--steps 0", "--steps is 0"},
           {"--prompts " + prompts, "--prompts: line 2: 600 is not a token id in [0, 512)"},
           {"--prompts /no/such/file", "--prompts: cannot read /no/such/file"},
       }) {
    const auto run = RunBatonctl("approx-error --model " + TinyModel() + " " + c.args);
    EXPECT_EQ(run.exit_status, 2) << c.args;
    EXPECT_THAT(run.err, HasSubstr(c.message)) << c.args;
  }
}

}  // namespace
}  // namespace baton
