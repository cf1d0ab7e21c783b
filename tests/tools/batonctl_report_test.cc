// `batonctl report` run as a process on small hand-made JSON files of each kind (simulate,
// replay, approx_error): report.md has each section, the PNGs exist and are PNGs; bad inputs
// and a missing gnuplot give clear errors. Needs gnuplot (gnuplot-nox, from scripts/setup.sh).
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "run_batonctl.h"
#include "test_dir.h"

namespace {

using baton::testing::Result;
using baton::testing::RunBatonctl;
using ::testing::HasSubstr;

std::string Dir() {
  return baton::testing::ProcessTempDir();
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = Dir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool IsPng(const std::string& path) {
  const std::string head = ReadFile(path).substr(0, 8);
  return head == std::string("\x89PNG\r\n\x1a\n", 8);
}

// Two groups over three budgets and an unlimited store; "kind" absent as in older outputs.
const char kSimulate[] = R"({"results": [
  {"block_size": 64, "keep": 134, "hit_cap": "ring", "store_budget": 1073741824,
   "requests": 10, "token_hit_ratio": 0.2, "request_hit_ratio": 0.3, "evicted_blocks": 50,
   "stored_bytes_peak": 1073741000, "flops_vs_no_cache": 0.9, "flops_vs_uncapped": 1.01},
  {"block_size": 64, "keep": 134, "hit_cap": "ring", "store_budget": 4294967296,
   "requests": 10, "token_hit_ratio": 0.4, "request_hit_ratio": 0.5, "evicted_blocks": 10},
  {"block_size": 64, "keep": 134, "hit_cap": "ring", "store_budget": null,
   "requests": 10, "token_hit_ratio": 0.6, "request_hit_ratio": 0.6, "evicted_blocks": 0},
  {"block_size": 64, "keep": 256, "hit_cap": "keep", "store_budget": 1073741824,
   "requests": 10, "token_hit_ratio": 0.1, "request_hit_ratio": 0.2, "evicted_blocks": 50},
  {"block_size": 64, "keep": 256, "hit_cap": "keep", "store_budget": null,
   "requests": 10, "token_hit_ratio": 0.5, "request_hit_ratio": 0.6, "evicted_blocks": 0}]})";

const char kReplay[] = R"({"kind": "replay", "requests": 4, "errors": 1,
  "request_hit_rate": 0.5, "token_hit_rate": 0.4, "cached_tokens": 1000, "replayed_rows": 800,
  "ttft_ms": {"p50": 20.0, "p90": 40.0, "p99": 41.0}, "itl_ms": {"p50": 2.0, "p90": 3.0,
  "p99": 4.0}, "output_tokens_per_s": 123.4, "per_request": [
  {"index": 0, "prompt_tokens": 1000, "cached_tokens": 0, "ttft_ms": 40.0, "ok": true},
  {"index": 1, "prompt_tokens": 1000, "cached_tokens": 900, "ttft_ms": 8.0, "ok": true},
  {"index": 2, "prompt_tokens": 1000, "cached_tokens": 500, "ttft_ms": 20.0, "ok": true},
  {"index": 3, "prompt_tokens": 1000, "cached_tokens": 0, "ttft_ms": 0.0, "ok": false}]})";

// Values span decades and include zeros: a log axis with zeros drawn below the smallest.
const char kApproxError[] = R"({"kind": "approx_error", "results": [
  {"mode": "compact", "keep": 134, "prefix_hit_tokens": 0, "kl_mean": 0.01, "kl_max": 0.05,
   "top1_agreement": 0.98, "max_abs_logit_diff": 0.5,
   "steps": [{"step": 0, "kl_mean": 0.02}, {"step": 1, "kl_mean": 0.0}],
   "ring_distance": [{"edge_distance": 1, "max_abs": 0.5}]},
  {"mode": "compact", "keep": 512, "prefix_hit_tokens": 0, "kl_mean": 0.0001, "kl_max": 0.001,
   "top1_agreement": 1.0, "max_abs_logit_diff": 0.02, "steps": [], "ring_distance": []},
  {"mode": "compact", "keep": 2541, "prefix_hit_tokens": 0, "kl_mean": 0.0, "kl_max": 0.0,
   "top1_agreement": 1.0, "max_abs_logit_diff": 0.0, "steps": [], "ring_distance": []}]})";

TEST(BatonctlReportTest, WritesEverySectionAndItsPlots) {
  const std::string out = Dir() + "/report";
  const Result r =
      RunBatonctl("report --out " + out + " " + WriteFile("sim.json", kSimulate) + " " +
                  WriteFile("replay.json", kReplay) + " " + WriteFile("approx.json", kApproxError));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const std::string md = ReadFile(out + "/report.md");
  for (const char* text :
       {"## Simulate: ", "Hit ratio against store budget", "](1-simulate-hit-ratio.png)",
        "unlimited", "## Replay: ", "TTFT against cached fraction", "](2-replay-ttft.png)",
        "| ttft_ms p90 | 40 |", "| [0.9, 1.0] | 1 |", "## Approximation error: ", "Error against K",
        "](3-approx-error-error-vs-keep.png)", "log y axis", "zeros are drawn at",
        "](3-approx-error-kl-vs-edge-distance.png)", "retained region's edge"}) {
    EXPECT_THAT(md, HasSubstr(text));
  }
  for (const char* png :
       {"1-simulate-hit-ratio.png", "2-replay-ttft.png", "3-approx-error-error-vs-keep.png",
        "3-approx-error-kl-vs-edge-distance.png"}) {
    EXPECT_TRUE(IsPng(out + "/" + png)) << png;
    EXPECT_TRUE(std::filesystem::exists(out + "/" + std::string(png, strlen(png) - 4) + ".gp"))
        << png;
  }
}

TEST(BatonctlReportTest, UnknownShapeNamesTheFile) {
  const std::string odd = WriteFile("odd.json", R"({"kind": "latency", "values": [1, 2]})");
  Result r = RunBatonctl("report --out " + Dir() + "/odd " + odd);
  EXPECT_EQ(r.exit_status, 2);
  EXPECT_THAT(r.err, HasSubstr(odd + ": unknown JSON shape (kind 'latency')"));

  const std::string broken = WriteFile("broken.json", "{");
  r = RunBatonctl("report --out " + Dir() + "/odd " + broken);
  EXPECT_EQ(r.exit_status, 2);
  EXPECT_THAT(r.err, HasSubstr(broken + ": not valid JSON"));

  const std::string no_ratio = WriteFile(
      "no_ratio.json", R"({"results": [{"block_size": 64, "keep": 134, "hit_cap": "ring"}]})");
  r = RunBatonctl("report --out " + Dir() + "/odd " + no_ratio);
  EXPECT_EQ(r.exit_status, 2);
  EXPECT_THAT(r.err, HasSubstr(no_ratio + ": results[0].token_hit_ratio: missing"));

  const std::string bad_step = WriteFile(
      "bad_step.json", R"({"kind": "approx_error", "results": [{"mode": "mask", "keep": 70,
      "kl_mean": 0.1, "max_abs_logit_diff": 1.0, "steps": [{"step": "first"}]}]})");
  r = RunBatonctl("report --out " + Dir() + "/odd " + bad_step);
  EXPECT_EQ(r.exit_status, 2);
  EXPECT_THAT(r.err, HasSubstr(bad_step + ": results[0].steps"));

  r = RunBatonctl("report --out " + Dir() + "/odd /nonexistent/x.json");
  EXPECT_EQ(r.exit_status, 2);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent/x.json: cannot be read"));
}

TEST(BatonctlReportTest, MissingGnuplotIsAClearError) {
  const Result r = RunBatonctl("report --gnuplot /nonexistent/gnuplot --out " + Dir() +
                               "/nognuplot " + WriteFile("sim2.json", kSimulate));
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_THAT(r.err, HasSubstr("gnuplot ('/nonexistent/gnuplot') cannot be run"));
  EXPECT_THAT(r.err, HasSubstr("gnuplot-nox"));
}

}  // namespace
