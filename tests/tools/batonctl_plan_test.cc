// `batonctl plan` run as a process: its JSON, its seed tables, and exit status 2 with a clear
// message for bad input.
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "run_batonctl.h"
#include "test_dir.h"

namespace {

using baton::testing::Result;
using baton::testing::RunBatonctl;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(BatonctlPlanTest, JsonHasThePlanAndEstimate) {
  const Result r = RunBatonctl(
      "plan --prompt-len 12 --keep 4 --mode compact --window 3 "
      "--max-backtrack 0 --json");
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["ring_capacity"], 4);
  EXPECT_EQ(json["total_consumer_rows"], 4);
  EXPECT_EQ(json["total_swa_pairs"], 9);
  ASSERT_EQ(json["chunks"].size(), 1u);
  const auto& chunk = json["chunks"][0];
  EXPECT_EQ(chunk["q_start"], 0);
  EXPECT_EQ(chunk["q_len"], 12);
  EXPECT_EQ(chunk["clip_prefix"], 8);
  EXPECT_EQ(chunk["consumer_rows"], 4);
  EXPECT_EQ(chunk["swa_pairs"], 9);
  EXPECT_EQ(chunk["consumer_positions"], nlohmann::json({8, 9, 10, 11}));
  EXPECT_EQ(chunk["swa_lo"], nlohmann::json({8, 8, 8, 9}));
  EXPECT_EQ(chunk["consumer_slots"], nlohmann::json({0, 1, 2, 3}));
}

// batonctl's main reads the environment once and hands the CPU kernels what it says: a
// BATON_CPU_ISA that names no level is refused there, by name, before any command runs; a level
// the CPU has is taken.
TEST(BatonctlPlanTest, AnUnknownCpuLevelInTheEnvironmentIsRefusedByName) {
  setenv("BATON_CPU_ISA", "avx9", 1);
  const Result refused = RunBatonctl("plan --prompt-len 1000 --window 16 --json");
  setenv("BATON_CPU_ISA", "baseline", 1);
  const Result baseline = RunBatonctl("plan --prompt-len 1000 --window 16 --json");
  unsetenv("BATON_CPU_ISA");
  EXPECT_EQ(refused.exit_status, 2);
  EXPECT_NE(refused.err.find("BATON_CPU_ISA: 'avx9' is not a level; use baseline, avx2 or avx512"),
            std::string::npos)
      << refused.err;
  EXPECT_TRUE(refused.out.empty());
  EXPECT_EQ(baseline.exit_status, 0) << baseline.err;
}

TEST(BatonctlPlanTest, ChunksAndChunkSizeTileFromValidStart) {
  Result r = RunBatonctl(
      "plan --prompt-len 1024 --keep 140 --mode compact --window 128 "
      "--chunks 256,256,256,256 --json");
  ASSERT_EQ(r.exit_status, 0) << r.err;
  auto json = nlohmann::json::parse(r.out);
  EXPECT_EQ(json["total_consumer_rows"], 143);
  EXPECT_EQ(json["ring_capacity"], 134);

  r = RunBatonctl("plan --prompt-len 1000 --window 16 --chunk-size 300 --valid-start 100 --json");
  ASSERT_EQ(r.exit_status, 0) << r.err;
  json = nlohmann::json::parse(r.out);
  ASSERT_EQ(json["chunks"].size(), 3u);
  EXPECT_EQ(json["chunks"][0]["q_start"], 100);
  EXPECT_EQ(json["chunks"][2]["q_len"], 300);
  EXPECT_EQ(json["chunks"][0]["swa_lo"][0], 100);
  EXPECT_EQ(json["total_consumer_rows"], 900);
}

TEST(BatonctlPlanTest, ModelConfigAddsFlops) {
  const std::string path = baton::testing::ProcessTempDir() + "/plan_config.json";
  std::ofstream(path) << R"({"vocab_size": 512, "hidden_size": 128, "intermediate_size": 384,
    "num_hidden_layers": 8, "n_prefill_layer": 4, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 32, "sliding_window": 16, "kv_block_size": 16})";
  const Result off = RunBatonctl("plan --prompt-len 512 --window 16 --json --model-config " + path);
  ASSERT_EQ(off.exit_status, 0) << off.err;
  const Result compact = RunBatonctl(
      "plan --prompt-len 512 --window 16 --mode compact --keep 22 "
      "--json --model-config " +
      path);
  ASSERT_EQ(compact.exit_status, 0) << compact.err;
  const auto off_json = nlohmann::json::parse(off.out);
  const auto compact_json = nlohmann::json::parse(compact.out);
  EXPECT_EQ(off_json["layer_rows"], 8 * 512);
  EXPECT_EQ(compact_json["layer_rows"], 4 * 512 + 4 * 22);
  EXPECT_LT(compact_json["flops"]["total"].get<double>(), off_json["flops"]["total"].get<double>());
}

// With block_kv_sources, block KV is G groups instead of D layers: the plan's block-KV bytes fall
// by D / G, its consumer FLOPs by the D - G projections no longer made, and nothing else moves.
TEST(BatonctlPlanTest, BlockKvSourcesShrinkBlockKvAndItsProjections) {
  const std::string config = R"({"vocab_size": 512, "hidden_size": 128, "intermediate_size": 384,
    "num_hidden_layers": 8, "n_prefill_layer": 4, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 32, "sliding_window": 16, "kv_block_size": 16)";
  const std::string plain = baton::testing::ProcessTempDir() + "/plan_plain.json";
  const std::string shared = baton::testing::ProcessTempDir() + "/plan_shared.json";
  std::ofstream(plain) << config << "}";
  std::ofstream(shared) << config << R"(, "block_kv_sources": [4]})";
  nlohmann::json plans[2];
  for (int i = 0; i < 2; ++i) {
    const Result r = RunBatonctl("plan --prompt-len 100 --window 16 --json --model-config " +
                                 (i == 0 ? plain : shared));
    ASSERT_EQ(r.exit_status, 0) << r.err;
    plans[i] = nlohmann::json::parse(r.out);
  }
  EXPECT_EQ(plans[0]["block_kv_groups"], 4);
  EXPECT_EQ(plans[1]["block_kv_groups"], 1);
  // 7 pages of 16 positions, each group's K and V rows of kv_dim 32 floats.
  EXPECT_EQ(plans[0]["state_block_bytes"]["block_kv"], 7 * 4 * 2 * 16 * 32 * 4);
  EXPECT_EQ(plans[1]["state_block_bytes"]["block_kv"], 7 * 1 * 2 * 16 * 32 * 4);
  EXPECT_EQ(plans[1]["state_block_bytes"]["producer_swa"],
            plans[0]["state_block_bytes"]["producer_swa"]);
  EXPECT_EQ(plans[1]["state_block_bytes"]["consumer_swa"],
            plans[0]["state_block_bytes"]["consumer_swa"]);
  // Three projections of 100 rows, [2 * 32, 128] each, fewer.
  EXPECT_DOUBLE_EQ(
      plans[0]["flops"]["consumer"].get<double>() - plans[1]["flops"]["consumer"].get<double>(),
      3.0 * 100 * 2 * 128 * 2 * 32);
  EXPECT_EQ(plans[1]["flops"]["producer"], plans[0]["flops"]["producer"]);
  EXPECT_EQ(plans[1]["layer_rows"], plans[0]["layer_rows"]);
}

// Under replay-on-decode the StateBlock carries the boundary rows of [max(s_keep, s_valid), L)
// (hidden_size floats each) in place of the consumer rings: K rows under compact, fewer after a
// prefix hit, L under off; block KV and the producer rings do not change.
TEST(BatonctlPlanTest, ReplayOnDecodeStateBlockCarriesTheBoundaryRows) {
  const std::string config = baton::testing::ProcessTempDir() + "/plan_replay.json";
  std::ofstream(config) << R"({"vocab_size": 512, "hidden_size": 128, "intermediate_size": 384,
    "num_hidden_layers": 8, "n_prefill_layer": 4, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 32, "sliding_window": 16, "kv_block_size": 16})";
  auto plan = [&](const std::string& args) {
    const Result r = RunBatonctl("plan --prompt-len 1000 --window 16 --json --model-config " +
                                 config + " " + args);
    EXPECT_EQ(r.exit_status, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const int64_t row = 128 * 4;
  for (const auto& [args, rows] : std::vector<std::pair<std::string, int64_t>>{
           {"--mode compact --keep 22", 22},
           {"--mode compact --keep 40 --valid-start 976", 24},
           {"--mode mask --keep 22", 22},
           {"", 1000}}) {
    SCOPED_TRACE(args);
    const auto json = plan(args);
    const auto& all = json["state_block_bytes"];
    const auto& replay = json["replay_on_decode_state_block_bytes"];
    EXPECT_EQ(replay["boundary_rows"], rows * row);
    EXPECT_EQ(replay["block_kv"], all["block_kv"]);
    EXPECT_EQ(replay["producer_swa"], all["producer_swa"]);
    EXPECT_EQ(replay["total"], replay["block_kv"].get<int64_t>() +
                                   replay["producer_swa"].get<int64_t>() + rows * row);
    EXPECT_EQ(all["total"], all["block_kv"].get<int64_t>() + all["producer_swa"].get<int64_t>() +
                                all["consumer_swa"].get<int64_t>());
  }
  // The serving default (compact, K = C): fewer bytes than prefill-all's rings.
  const auto json = plan("--mode compact --keep 22");
  EXPECT_LT(json["replay_on_decode_state_block_bytes"]["total"].get<int64_t>(),
            json["state_block_bytes"]["total"].get<int64_t>());
}

TEST(BatonctlPlanTest, SeedTablesMatchTheSeedLayout) {
  const Result r = RunBatonctl("plan --seed-tables");
  ASSERT_EQ(r.exit_status, 0) << r.err;
  for (const char* line :
       {"short         2/ 3    2/ 3    2/ 3\n", "long         12/33   12/ 9    4/ 9\n",
        "clipped       4/ 9    4/ 0    1/ 0\n", "crossing      4/12    4/ 3    2/ 3\n",
        "valid-start   2/ 3    2/ 3    2/ 3\n",
        "total consumer rows: 143 (one 1024-row chunk: 140)\n",
        "    64             2560                2560   1.0000\n",
        "  1024            40960               23280   0.5684\n",
        " 16384           655360              330480   0.5043\n"}) {
    EXPECT_THAT(r.out, HasSubstr(line));
  }
}

struct BadArgs {
  const char* args;
  const char* message;
};

TEST(BatonctlPlanTest, BadInputExitsTwoWithAClearMessage) {
  const BadArgs cases[] = {
      {"plan --prompt-len 12 --keep 3 --mode compact --window 3 --max-backtrack 0",
       "keep K is 3 with truncation mode 'compact'; it must be >= the ring capacity"},
      {"plan --prompt-len 0 --window 3", "prompt length L is 0"},
      {"plan --prompt-len 12 --window 3 --chunks 4,4", "chunks: lengths sum to 8"},
      {"plan --prompt-len 12 --window 3 --chunks 4,x,4", "--chunks: 'x' is not an integer"},
      {"plan --prompt-len 12 --window 3 --valid-start 12", "s_valid is 12"},
      {"plan --prompt-len 12 --window 3 --mode fast", "--mode: 'fast' is not a truncation mode"},
      {"plan --prompt-len 12 --window 3 --chunk-size 0", "--chunk-size: chunk size is 0"},
      {"plan --prompt-len twelve --window 3", "--prompt-len"},
      {"plan --window 3", "--prompt-len is required"},
      {"plan --prompt-len 12 --window 3 --chunk-size 4 --chunks 4,8", "excludes"},
      {"plan --prompt-len 12 --window 3 --model-config /nonexistent.json",
       "cannot open model config '/nonexistent.json'"},
      {"frobnicate", "frobnicate"},
  };
  for (const BadArgs& c : cases) {
    const Result r = RunBatonctl(c.args);
    EXPECT_EQ(r.exit_status, 2) << c.args;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.args;
    EXPECT_THAT(r.out, IsEmpty()) << c.args;
  }
}

}  // namespace
