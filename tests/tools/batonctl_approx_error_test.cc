// batonctl approx-error on the tiny model (W = 16, C = 22, D = 4 consumer layers, so
// R = W + (D - 1)(W - 1) = 61): exact where the seed says truncation is exact, measurably not
// below R, and the prefix-hit variants behave as DESIGN section 5 says. With --free-running,
// completions at K = R are off's, and where K = C changes one its first difference is where
// the teacher-forced comparison first disagrees.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

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

// The per-prompt lists agree with the summary figures built from them.
void ExpectFreeRunningSummaryConsistent(const nlohmann::json& r, int steps) {
  const std::vector<int> first = r["first_divergence"].get<std::vector<int>>();
  const std::vector<int> differ = r["positions_differ"].get<std::vector<int>>();
  const int n = r["completions"].get<int>();
  ASSERT_EQ(first.size(), static_cast<size_t>(n));
  ASSERT_EQ(differ.size(), static_cast<size_t>(n));
  std::vector<int> diverging;
  int differ_total = 0;
  for (int p = 0; p < n; ++p) {
    if (first[p] < 0) {
      EXPECT_EQ(differ[p], 0) << "prompt " << p;
    } else {
      // The first difference is one of the differing positions, and none come before it.
      EXPECT_GE(differ[p], 1) << "prompt " << p;
      EXPECT_LE(differ[p], steps - first[p]) << "prompt " << p;
      diverging.push_back(first[p]);
    }
    differ_total += differ[p];
  }
  const int d = static_cast<int>(diverging.size());
  EXPECT_EQ(r["diverging"], d);
  EXPECT_EQ(r["identical"], n - d);
  EXPECT_DOUBLE_EQ(r["identical_share"].get<double>(), static_cast<double>(n - d) / n);
  EXPECT_DOUBLE_EQ(r["position_divergence_share"].get<double>(),
                   static_cast<double>(differ_total) / (n * steps));
  if (d == 0) {
    EXPECT_TRUE(r["first_divergence_median"].is_null());
    EXPECT_DOUBLE_EQ(r["rule_of_three"].get<double>(), 3.0 / n);
    // Clopper-Pearson at d = 0: 0.05 = (1 - p)^n.
    EXPECT_NEAR(r["divergence_upper95"].get<double>(), 1 - std::pow(0.05, 1.0 / n), 1e-9);
  } else {
    std::sort(diverging.begin(), diverging.end());
    EXPECT_DOUBLE_EQ(r["first_divergence_median"].get<double>(),
                     (diverging[(d - 1) / 2] + diverging[d / 2]) / 2.0);
    EXPECT_FALSE(r.contains("rule_of_three"));
    EXPECT_GT(r["divergence_upper95"].get<double>(), static_cast<double>(d) / n);
  }
}

TEST(BatonctlApproxError, FreeRunningCompletionsAreOffsFromTheSpan) {
  // L = 200, no hit: K = R = 61 is exact, so every greedy completion is off's, in both modes.
  const auto run = RunBatonctl("approx-error --model " + TinyModel() +
                               " --free-running --keep 22,61 --num-prompts 6 --prompt-len 200"
                               " --steps 32 --no-prefix-hit --json");
  ASSERT_EQ(run.exit_status, 0) << run.err;
  const nlohmann::json report = nlohmann::json::parse(run.out);
  EXPECT_EQ(report["kind"], "approx_error_free_running");
  EXPECT_EQ(report["tokens"], 32);
  ASSERT_EQ(report["off_distinct_tokens"].size(), 6u);
  for (int distinct : report["off_distinct_tokens"]) {
    EXPECT_GE(distinct, 1);
    EXPECT_LE(distinct, 32);
  }
  ASSERT_EQ(report["results"].size(), 4u);  // mask and compact at 22 and 61, cold
  for (const nlohmann::json& r : report["results"]) {
    ExpectFreeRunningSummaryConsistent(r, 32);
    if (r["keep"] == 61) {
      EXPECT_EQ(r["identical"], 6) << r["mode"];
      EXPECT_EQ(r["position_divergence_share"], 0.0) << r["mode"];
    }
  }
  // Prompts of 30 and 60 tokens: only the second leaves the ring cap a hit (H = 32), so the
  // variant after the hit has one completion and the cold one two.
  const std::string prompts = testing::ProcessTempDir() + "/free-prompts.jsonl";
  {
    std::ofstream out(prompts);
    for (int len : {30, 60}) {
      nlohmann::json row = nlohmann::json::array();
      for (int i = 0; i < len; ++i) row.push_back(3 + (i * 37) % 500);
      out << row.dump() << "\n";
    }
  }
  const auto mixed =
      RunBatonctl("approx-error --model " + TinyModel() + " --free-running --prompts " + prompts +
                  " --keep 22 --modes compact --steps 4 --json");
  ASSERT_EQ(mixed.exit_status, 0) << mixed.err;
  const nlohmann::json mixed_report = nlohmann::json::parse(mixed.out);
  EXPECT_EQ(mixed_report["prompts"], 2);
  EXPECT_EQ(Find(mixed_report, "compact", 22, 0)["completions"], 2);
  EXPECT_EQ(Find(mixed_report, "compact", 22, 32)["completions"], 1);

  const auto table = RunBatonctl("approx-error --model " + TinyModel() +
                                 " --free-running --keep 22 --num-prompts 1 --prompt-len 60"
                                 " --steps 4 --modes compact");
  ASSERT_EQ(table.exit_status, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("1 prompts, 4 greedy tokens each (off's: median"));
}

TEST(BatonctlApproxError, FreeRunningFirstDivergenceIsTheFirstTeacherForcedFlip) {
  // A generated model and prompts on which K = C flips some greedy tokens (60-token prompts,
  // so the truncation drops 38 of 60 rows).
  const std::string model = testing::ProcessTempDir() + "/tiny-seed1";
  ASSERT_EQ(RunBatonctl("make-model --preset tiny --seed 1 --out " + model).exit_status, 0);
  const std::string args =
      " --keep 22 --modes compact --no-prefix-hit --num-prompts 24"
      " --prompt-len 60 --steps 16 --json";
  const auto free = RunBatonctl("approx-error --model " + model + " --free-running" + args);
  ASSERT_EQ(free.exit_status, 0) << free.err;
  const nlohmann::json free_report = nlohmann::json::parse(free.out);
  const nlohmann::json& r = free_report["results"].at(0);
  ExpectFreeRunningSummaryConsistent(r, 16);
  EXPECT_GE(r["diverging"].get<int>(), 1);

  // Teacher-forced, the same prompts are fed off's greedy completion. Until its first
  // difference a free-running variant has run exactly that, so a completion that first differs
  // at i is a top-1 disagreement at step i, and the earliest first difference is the earliest
  // disagreement (step 0, the prefill's token, has no earlier one to hide it: equal counts).
  const auto forced = RunBatonctl("approx-error --model " + model + args);
  ASSERT_EQ(forced.exit_status, 0) << forced.err;
  const nlohmann::json forced_report = nlohmann::json::parse(forced.out);
  const nlohmann::json& steps = forced_report["results"].at(0)["steps"];
  ASSERT_EQ(steps.size(), 16u);
  std::vector<int> first_at(16, 0);
  for (int f : r["first_divergence"].get<std::vector<int>>()) {
    if (f >= 0) ++first_at[f];
  }
  int earliest_flip = -1, earliest_first = -1;
  for (int i = 0; i < 16; ++i) {
    const int flips =
        static_cast<int>(std::lround((1 - steps[i]["top1_agreement"].get<double>()) * 24));
    EXPECT_GE(flips, first_at[i]) << "step " << i;
    if (i == 0) {
      EXPECT_EQ(flips, first_at[0]);
    }
    if (flips > 0 && earliest_flip < 0) earliest_flip = i;
    if (first_at[i] > 0 && earliest_first < 0) earliest_first = i;
  }
  EXPECT_EQ(earliest_first, earliest_flip);
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
