// batonctl replay against a running `baton up`: a few hand-written trace lines (Mooncake
// format) with shared hash ids; every request is accounted for, the repeated prefix hits the
// store, and the report's totals agree with its per-request rows.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "baton_up.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "test_dir.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using testing::ReadFile;

// Runs `command` with the shell; returns (exit status, stdout), stderr into `err`.
int RunShell(const std::string& command, std::string* out, const std::string& err) {
  const std::string out_path = testing::ProcessTempDir() + "/run.out";
  const int status = std::system((command + " > " + out_path + " 2> " + err).c_str());
  *out = ReadFile(out_path);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Replay, EveryTraceRequestIsAccountedForAndRepeatsHit) {
  const fs::path dir = fs::path(testing::ProcessTempDir()) / "replay";
  fs::create_directories(dir);
  const std::string model = (dir / "tiny").string();
  std::string out;
  ASSERT_EQ(RunShell(std::string(BATONCTL_PATH) + " make-model --preset tiny --out " + model, &out,
                (dir / "make.err").string()),
            0);
  // The tiny model: vocabulary 512, C = 22, B = 16.
  testing::BatonUp up(dir / "data", model);
  ASSERT_TRUE(up.WaitUntilUp()) << up.log();
  const std::string router = up.Address("router.addr");

  // Length scale 1/8: 64 tokens per hash id. Line 3 repeats line 1's first three blocks
  // (192 tokens), so it can hit floor((200 - 22) / 16) = 11 blocks = 176 tokens of them; at
  // time scale 3 it is sent 4.5 s after line 1, long after line 1's blocks reach the store.
  const std::string trace = (dir / "trace.jsonl").string();
  std::ofstream(trace)
      << "{\"timestamp\": 0, \"input_length\": 1600, \"output_length\": 4, \"hash_ids\": [0, 1, 2, 3]}\n"
      << "{\"timestamp\": 500, \"input_length\": 1000, \"output_length\": 3, \"hash_ids\": [7, 8]}\n"
      << "{\"timestamp\": 1500, \"input_length\": 1600, \"output_length\": 5, \"hash_ids\": [0, 1, 2, 9]}\n"
      << "{\"timestamp\": 2000, \"input_length\": 300, \"output_length\": 2, \"hash_ids\": [11]}\n";
  const int status =
      RunShell(std::string(BATONCTL_PATH) + " replay --trace " + trace + " --addr " + router +
              " --length-scale 0.125 --vocab-size 512 --concurrency 2 --time-scale 3 --json",
          &out, (dir / "replay.err").string());
  ASSERT_EQ(status, 0) << ReadFile(dir / "replay.err");
  EXPECT_THAT(ReadFile(dir / "replay.err"), HasSubstr("4/4 requests"));  // the progress bar
  const nlohmann::json report = nlohmann::json::parse(out);
  EXPECT_EQ(report["kind"], "replay");
  EXPECT_EQ(report["requests"], 4);
  EXPECT_EQ(report["completed"], 4);
  EXPECT_EQ(report["errors"], 0);
  ASSERT_EQ(report["per_request"].size(), 4u);
  const std::vector<int64_t> prompt = {200, 125, 200, 38}, output = {4, 3, 5, 2};
  int64_t prompt_total = 0, cached_total = 0, output_total = 0;
  for (int i = 0; i < 4; ++i) {
    const nlohmann::json& r = report["per_request"][i];
    EXPECT_EQ(r["index"], i);
    EXPECT_EQ(r["ok"], true) << r;
    EXPECT_EQ(r["prompt_tokens"], prompt[i]);
    EXPECT_EQ(r["output_tokens"], output[i]);
    EXPECT_GT(r["ttft_ms"].get<double>(), 0);
    prompt_total += r["prompt_tokens"].get<int64_t>();
    cached_total += r["cached_tokens"].get<int64_t>();
    output_total += r["output_tokens"].get<int64_t>();
  }
  EXPECT_EQ(report["per_request"][0]["cached_tokens"], 0);
  EXPECT_EQ(report["per_request"][2]["cached_tokens"], 176);
  EXPECT_EQ(report["prompt_tokens"], prompt_total);
  EXPECT_EQ(report["cached_tokens"], cached_total);
  EXPECT_EQ(report["output_tokens"], output_total);
  EXPECT_DOUBLE_EQ(report["token_hit_rate"].get<double>(),
                   static_cast<double>(cached_total) / prompt_total);
  EXPECT_GT(report["ttft_ms"]["p50"].get<double>(), 0);
  EXPECT_GT(report["itl_ms"]["p99"].get<double>(), 0);

  // A trace line with a bad field is refused by line and field before anything is sent.
  std::ofstream(trace) << "{\"timestamp\": 0, \"input_length\": -5, \"output_length\": 1, "
                          "\"hash_ids\": [1]}\n";
  EXPECT_EQ(RunShell(std::string(BATONCTL_PATH) + " replay --trace " + trace + " --addr " + router,
                &out, (dir / "bad.err").string()),
            2);
  EXPECT_THAT(ReadFile(dir / "bad.err"), HasSubstr("line 1"));
  EXPECT_THAT(ReadFile(dir / "bad.err"), HasSubstr("input_length"));
}

}  // namespace
}  // namespace baton
