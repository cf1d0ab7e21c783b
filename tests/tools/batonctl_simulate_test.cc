// `batonctl simulate` run as a process on small hand-made traces: hit counts for both hit caps,
// a budget that forces eviction (SWA rows first, least recently used leaf first) and the hit
// back-off it causes, and exit status 2 with a clear message for bad input. Every expected
// figure is worked out by hand in the comments.
#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <tuple>

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

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = baton::testing::ProcessTempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// With --trace-block 8 every hash id is 8 tokens, i.e. two chain blocks of B = 4.
std::string CapTrace(int output_length = 1) {
  std::string text;
  for (const char* request : {R"("timestamp": 0, "input_length": 24, "hash_ids": [1, 2, 3])",
                              R"("timestamp": 1, "input_length": 24, "hash_ids": [1, 2, 3])",
                              R"("timestamp": 2, "input_length": 20, "hash_ids": [1, 2, 9])",
                              R"("timestamp": 3, "input_length": 13, "hash_ids": [1, 5])",
                              R"("timestamp": 4, "input_length": 10, "hash_ids": [7, 8])"}) {
    text += "{" + std::string(request) + ", \"output_length\": " + std::to_string(output_length) +
            "}\n";
  }
  return WriteFile("cap_trace_" + std::to_string(output_length) + ".jsonl", text);
}

// The same requests, each asking six tokens (five from decode steps).
std::string DecodeTrace() {
  return CapTrace(6);
}

nlohmann::json Simulate(const std::string& args) {
  const Result r = RunBatonctl("simulate --json " + args);
  EXPECT_EQ(r.exit_status, 0) << r.err;
  if (r.exit_status != 0) return nlohmann::json::object();
  return nlohmann::json::parse(r.out);
}

// B = 4, W = 4, max_backtrack 1: C = 6; K = 10 > C so the caps differ. No budget: every block
// ever written stays, with its SWA rows, so the hit is the shared prefix, capped.
//   r0 L=24 ids 1,2,3: 6 blocks, nothing stored: h = 0.
//   r1 L=24 ids 1,2,3: 6 blocks present. ring: floor((24-6)/4) = 4 -> H = 16;
//                                        keep: floor((24-10)/4) = 3 -> H = 12.
//   r2 L=20 ids 1,2,9: blocks 0-3 shared (ids 1, 2), block 4 is id 9's: 4 present.
//                      ring: floor(14/4) = 3 -> H = 12; keep: floor(10/4) = 2 -> H = 8.
//   r3 L=13 ids 1,5: 3 full blocks, blocks 0-1 (id 1) present.
//                      ring: floor(7/4) = 1 -> H = 4; keep: floor(3/4) = 0 -> H = 0.
//   r4 L=10 ids 7,8: nothing shared: 0.
// Prompt tokens 24+24+20+13+10 = 91; cached: ring 16+12+4 = 32, keep 12+8 = 20.
// Uncapped (at most floor((L-1)/4) blocks): r1 5 of 6 -> 20, r2 4 -> 16, r3 2 -> 8: 44.
// Replayed consumer rows, one chunk [H, L) each (compact: from clamp(L-K, H, L-1)):
//   ring: r0 24-14 = 10, r1 24-16 = 8, r2 20-12 = 8, r3 13-4 = 9, r4 10: 45.
//   keep: r0 10, r1 24-14 = 10, r2 20-10 = 10, r3 13-3 = 10, r4 10: 50.
TEST(BatonctlSimulateTest, HitCountsForBothCaps) {
  const nlohmann::json out =
      Simulate("--trace " + CapTrace() +
               " --trace-block 8 --block-size 4 --window 4 --max-backtrack 1 --keep 10 "
               "--hit-cap ring,keep --token-budget 0");
  EXPECT_EQ(out["kind"], "simulate");
  ASSERT_EQ(out["results"].size(), 2u);
  const nlohmann::json& ring = out["results"][0];
  const nlohmann::json& keep = out["results"][1];
  EXPECT_EQ(ring["hit_cap"], "ring");
  EXPECT_EQ(keep["hit_cap"], "keep");
  for (const nlohmann::json* r : {&ring, &keep}) {
    EXPECT_EQ((*r)["block_size"], 4);
    EXPECT_EQ((*r)["keep"], 10);
    EXPECT_EQ((*r)["window"], 4);
    EXPECT_EQ((*r)["max_backtrack"], 1);
    EXPECT_EQ((*r)["requests"], 5);
    EXPECT_EQ((*r)["prompt_tokens"], 91);
    EXPECT_EQ((*r)["cached_tokens_uncapped"], 44);
    EXPECT_EQ((*r)["prefill_rows_no_cache"], 91);
    EXPECT_EQ((*r)["prefill_rows_uncapped"], 91 - 44);
    EXPECT_EQ((*r)["evicted_blocks"], 0);
    EXPECT_TRUE((*r)["store_budget"].is_null());
    EXPECT_TRUE((*r)["flops"].is_null());  // no model config
    EXPECT_TRUE((*r)["stored_bytes_peak"].is_null());
  }
  EXPECT_EQ(ring["cached_tokens"], 32);
  EXPECT_EQ(keep["cached_tokens"], 20);
  EXPECT_DOUBLE_EQ(ring["token_hit_ratio"].get<double>(), 32.0 / 91);
  EXPECT_DOUBLE_EQ(ring["request_hit_ratio"].get<double>(), 3.0 / 5);
  EXPECT_DOUBLE_EQ(keep["request_hit_ratio"].get<double>(), 2.0 / 5);
  EXPECT_EQ(ring["prefill_rows"], 91 - 32);
  EXPECT_EQ(keep["prefill_rows"], 91 - 20);
  EXPECT_EQ(ring["replayed_rows"], 45);
  EXPECT_EQ(keep["replayed_rows"], 50);
}

TEST(BatonctlSimulateTest, KeepZeroMeansTheRingCapacityAndListsSweepInOrder) {
  // K = 0 means C; with K = C both caps coincide (ring: 32 cached tokens as above). The sweep
  // runs block size outermost, then keep, hit cap, budget, window, max_backtrack.
  const nlohmann::json out = Simulate(
      "--trace " + CapTrace() +
      " --trace-block 8 --block-size 4,8 --window 4 --max-backtrack 1,2 --keep 0 --hit-cap keep");
  ASSERT_EQ(out["results"].size(), 4u);
  EXPECT_EQ(out["results"][0]["block_size"], 4);
  EXPECT_EQ(out["results"][0]["max_backtrack"], 1);
  EXPECT_EQ(out["results"][0]["keep"], 6);
  EXPECT_EQ(out["results"][0]["cached_tokens"], 32);
  EXPECT_EQ(out["results"][1]["block_size"], 4);
  EXPECT_EQ(out["results"][1]["max_backtrack"], 2);
  EXPECT_EQ(out["results"][1]["keep"], 7);
  EXPECT_EQ(out["results"][2]["block_size"], 8);
  EXPECT_EQ(out["results"][3]["keep"], 7);
}

// A tiny model: P = 1 producer and D = 2 consumer layers, kv_dim = 1 x 2, B = 4, W = 2,
// max_backtrack 0 (C = 3). Values (89-byte header + float32 payload):
//   block KV:     89 + 4 bytes x D 2 x (K, V) 2 x B 4 x kv_dim 2 = 89 + 128 = 217
//   producer SWA: 89 + 4 bytes x P 1 x 2 x 4 x 2                  = 89 +  64 = 153
// so a whole block is 370 bytes. Budget 1697 = 4 blocks + one block KV.
std::string TinyConfig() {
  return WriteFile("tiny_config.json", R"({"vocab_size": 64, "hidden_size": 4,
    "intermediate_size": 8, "num_hidden_layers": 3, "n_prefill_layer": 1,
    "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 2, "sliding_window": 2,
    "max_backtrack": 0, "kv_block_size": 4})");
}

// Blocks a0..a3 (ids 1, 2), b0 (id 5), d0 (id 9).
//   r0 L=16 ids 1,2: writes a0..a3: 1480 bytes.
//   r1 L=4 id 5: b0 KV -> 1697 (fits); b0 SWA -> 1850: the LRU leaf is a3 (b0 is newer): a3
//      loses its SWA rows (SWA first) -> 1697. Evicted: 1 SWA.
//   r2 L=19 ids 1,2,7: 4 full blocks a0..a3, all with block KV; cap floor((19-3)/4) = 4.
//      h = 4 needs SWA of blocks from (16-2+1)/4 = 3: a3 has none -> back off;
//      h = 3 needs SWA from (12-2+1)/4 = 2: a2 has it -> H = 12 (16 without the budget).
//      Writes from block 3: a3 KV present (touched); a3 SWA added -> 1850; LRU leaf is now b0
//      (a3 was just used) -> b0 loses its SWA -> 1697. Evicted: 2 SWA.
//   r3 L=4 id 9: d0 KV -> 1914: LRU leaf b0 loses its block KV -> 1697; d0 SWA -> 1850: LRU
//      leaf a3 loses its SWA -> 1697. Evicted: 1 block KV, 3 SWA.
// Totals: prompt 16+4+19+4 = 43, cached 12, hit requests 1 of 4, evicted 4 (1 KV + 3 SWA),
// peak after eviction 1697. Unlimited: r2 gets H = 16 and the store ends with 6 blocks
// (a0..a3, b0, d0) = 2220 bytes.
TEST(BatonctlSimulateTest, BudgetEvictsSwaFirstAndTheHitBacksOff) {
  const std::string trace =
      WriteFile("budget_trace.jsonl",
                R"({"timestamp": 0, "input_length": 16, "output_length": 1, "hash_ids": [1, 2]}
{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [5]}
{"timestamp": 0, "input_length": 19, "output_length": 1, "hash_ids": [1, 2, 7]}
{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [9]}
)");
  const nlohmann::json out = Simulate("--trace " + trace + " --trace-block 8 --model-config " +
                                      TinyConfig() + " --store-budget 1697,unlimited");
  ASSERT_EQ(out["results"].size(), 2u);
  const nlohmann::json& budget = out["results"][0];
  const nlohmann::json& unlimited = out["results"][1];
  // Block size, window and max_backtrack come from the config.
  EXPECT_EQ(budget["block_size"], 4);
  EXPECT_EQ(budget["window"], 2);
  EXPECT_EQ(budget["keep"], 3);
  EXPECT_EQ(budget["store_budget"], 1697);
  EXPECT_EQ(budget["prompt_tokens"], 43);
  EXPECT_EQ(budget["cached_tokens"], 12);
  EXPECT_DOUBLE_EQ(budget["request_hit_ratio"].get<double>(), 0.25);
  EXPECT_EQ(budget["evicted_blocks"], 4);
  EXPECT_EQ(budget["evicted_block_kv"], 1);
  EXPECT_EQ(budget["evicted_producer_swa"], 3);
  EXPECT_EQ(budget["stored_bytes_peak"], 1697);

  EXPECT_TRUE(unlimited["store_budget"].is_null());
  EXPECT_EQ(unlimited["cached_tokens"], 16);
  EXPECT_EQ(unlimited["evicted_blocks"], 0);
  EXPECT_EQ(unlimited["stored_bytes_peak"], 2220);
  // FLOPs with a config: a hit saves work, and the capped hit costs no less than uncapped.
  EXPECT_LT(unlimited["flops"].get<double>(), unlimited["flops_no_cache"].get<double>());
  EXPECT_LE(unlimited["flops_uncapped"].get<double>(), unlimited["flops"].get<double>());
  EXPECT_DOUBLE_EQ(unlimited["flops_vs_no_cache"].get<double>(),
                   unlimited["flops"].get<double>() / unlimited["flops_no_cache"].get<double>());
}

TEST(BatonctlSimulateTest, TableHasOneRowPerSetting) {
  const Result r = RunBatonctl("simulate --trace " + CapTrace() +
                               " --trace-block 8 --block-size 4 --window 4 --max-backtrack 1 "
                               "--keep 0,10");
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("token_hit"));
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 3);  // header + 2 settings
}

struct BadArgs {
  std::string args;
  std::string message;
};

TEST(BatonctlSimulateTest, BadInputExitsTwoWithAClearMessage) {
  const std::string trace = "--trace " + CapTrace() + " --trace-block 8 ";
  const std::string bad_trace =
      WriteFile("bad_trace.jsonl",
                R"({"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": [1]}
{"timestamp": 0, "output_length": 1, "hash_ids": [1]}
)");
  const BadArgs cases[] = {
      {"simulate --trace " + bad_trace + " --trace-block 8",
       "--trace: " + baton::testing::ProcessTempDir() +
           "/bad_trace.jsonl: line 2: input_length: "
           "missing"},
      {"simulate --trace /nonexistent.jsonl", "/nonexistent.jsonl: cannot be read"},
      {"simulate " + trace + "--store-budget 1GiB", "--store-budget: needs --model-config"},
      {"simulate " + trace + "--keep 5 --window 4 --max-backtrack 1",
       "--keep: 5 is below the ring capacity C = 6"},
      {"simulate " + trace + "--hit-cap ring,fast",
       "--hit-cap: 'fast' is unknown; allowed: ring, keep"},
      {"simulate " + trace + "--block-size 0", "--block-size: 0 is not allowed"},
      {"simulate " + trace + "--block-size 4,x", "--block-size: 'x' is not an integer"},
      {"simulate " + trace + "--window 0", "--window: 0 is not allowed"},
      {"simulate " + trace + "--max-backtrack -1", "--max-backtrack: -1 is not allowed"},
      {"simulate " + trace + "--model-config " + TinyConfig() + " --store-budget 3XB",
       "--store-budget: '3XB' is not a byte count"},
      {"simulate " + trace + "--max-requests -1", "--max-requests: -1 is not allowed"},
      {"simulate " + trace + "--length-scale 0", "--length-scale: 0 is not allowed"},
      {"simulate --keep 0", "--trace is required"},
  };
  for (const BadArgs& c : cases) {
    const Result r = RunBatonctl(c.args);
    EXPECT_EQ(r.exit_status, 2) << c.args;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.args;
    EXPECT_THAT(r.out, IsEmpty()) << c.args;
  }
}

TEST(BatonctlSimulateTest, MaxRequestsTakesTheFirstRequests) {
  // The first two requests of the cap trace: r1 hits 16 tokens with the ring cap, K = C = 6.
  const nlohmann::json out =
      Simulate("--trace " + CapTrace() +
               " --trace-block 8 --block-size 4 --window 4 --max-backtrack 1 --max-requests 2");
  ASSERT_EQ(out["results"].size(), 1u);
  EXPECT_EQ(out["results"][0]["requests"], 2);
  EXPECT_EQ(out["results"][0]["prompt_tokens"], 48);
  EXPECT_EQ(out["results"][0]["cached_tokens"], 16);
}

}  // namespace

namespace {

// The cluster simulation from the command line: one row per cache size and policy, the rates
// taken from --rates, and bad cluster flags refused by name.
TEST(BatonctlSimulateTest, PoliciesRunTheTraceThroughACluster) {
  const nlohmann::json out =
      Simulate("--trace " + CapTrace() + " --trace-block 8 --model-config " + TinyConfig() +
               " --policy least-loaded,predicted-ttft --prefill-nodes 2 --block-cache-bytes "
               "0,1MiB --rates compute_ms_per_gflop=2,fixed_ms=1 --time-scale 1000");
  EXPECT_EQ(out["kind"], "simulate-cluster");
  EXPECT_DOUBLE_EQ(out["rates"]["compute_ms_per_gflop"].get<double>(), 2);
  EXPECT_DOUBLE_EQ(out["rates"]["fixed_ms"].get<double>(), 1);
  ASSERT_EQ(out["results"].size(), 4u);
  for (const nlohmann::json& row : out["results"]) {
    EXPECT_EQ(row["requests"], 5);
    EXPECT_EQ(row["prompt_tokens"], 91);
    EXPECT_EQ(row["prefill_nodes"], 2);
    // Arrivals a second apart: every request finds an idle node, so its TTFT is its service.
    EXPECT_GT(row["ttft_ms"]["p50"].get<double>(), 0);
    EXPECT_LE(row["ttft_ms"]["p50"].get<double>(), row["ttft_ms"]["p99"].get<double>());
  }
  // Without a cache every hit comes from the store; with one, some come from a node's cache.
  EXPECT_EQ(out["results"][0]["local_cached_tokens"], 0);
  EXPECT_GT(out["results"][0]["store_cached_tokens"].get<int64_t>(), 0);
  EXPECT_GT(out["results"][3]["local_cached_tokens"].get<int64_t>(), 0);
  // One store node by default: it serves every lookup (one a request), at some rate.
  const nlohmann::json& store = out["results"][0]["store"];
  EXPECT_EQ(store["nodes"], 1);
  EXPECT_EQ(store["replication"], 1);
  ASSERT_EQ(store["per_node"].size(), 1u);
  EXPECT_EQ(store["per_node"][0]["node"], "kvstore");
  EXPECT_GT(store["per_node"][0]["lookups_per_s"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(store["busiest"]["writes_per_s"].get<double>(),
                   store["per_node"][0]["writes_per_s"].get<double>());
  // Only --per-request lists the requests: each in trace order, its TTFT its service here.
  EXPECT_FALSE(out["results"][0].contains("per_request"));
  const nlohmann::json listed =
      Simulate("--trace " + CapTrace() + " --trace-block 8 --model-config " + TinyConfig() +
               " --policy predicted-ttft --block-cache-bytes 1MiB --rates "
               "compute_ms_per_gflop=2,fixed_ms=1 --time-scale 1000 --per-request");
  const nlohmann::json& requests = listed["results"][0]["per_request"];
  ASSERT_EQ(requests.size(), 5u);
  int64_t cached = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(requests[i]["index"], i);
    EXPECT_GE(requests[i]["node"].get<int64_t>(), 0);
    EXPECT_DOUBLE_EQ(requests[i]["admitted_ms"].get<double>(), 0);
    EXPECT_NEAR(requests[i]["ttft_ms"].get<double>(), requests[i]["service_ms"].get<double>(),
                1e-9);
    cached += requests[i]["cached_tokens"].get<int64_t>();
  }
  EXPECT_EQ(cached, listed["results"][0]["local_cached_tokens"].get<int64_t>() +
                        listed["results"][0]["store_cached_tokens"].get<int64_t>());

  // A fleet of three with two owners a value: each node's rates, the writes doubled in all.
  const nlohmann::json fleet =
      Simulate("--trace " + CapTrace() + " --trace-block 8 --model-config " + TinyConfig() +
               " --policy least-loaded --store-nodes 3 --store-replication 2 --rates "
               "compute_ms_per_gflop=2,fixed_ms=1 --time-scale 1000");
  const nlohmann::json& three = fleet["results"][0]["store"];
  ASSERT_EQ(three["per_node"].size(), 3u);
  EXPECT_EQ(three["per_node"][2]["node"], "kvstore-2");
  double writes = 0;
  for (const nlohmann::json& node : three["per_node"]) {
    writes += node["writes_per_s"].get<double>();
  }
  EXPECT_NEAR(writes, 2 * store["per_node"][0]["writes_per_s"].get<double>(), 1e-6 * writes);
  // Without decode nodes no ITL is predicted; with one, every token after the first has its gap
  // (each request asks 4 of the trace's 6 tokens), and the SLOs give the goodput.
  EXPECT_TRUE(out["results"][0]["itl_ms"].is_null());
  EXPECT_TRUE(out["results"][0]["goodput"].is_null());
  const nlohmann::json decoded =
      Simulate("--trace " + DecodeTrace() + " --trace-block 8 --model-config " + TinyConfig() +
               " --policy least-loaded --decode-nodes 1 --decode-rates step_fixed_ms=3,"
               "step_per_row_ms=1 --max-output-tokens 4 --ttft-slo-ms 100000 --itl-slo-ms 1000 "
               "--time-scale 1000");
  const nlohmann::json& row = decoded["results"][0];
  EXPECT_GE(row["itl_ms"]["p50"].get<double>(), 4);  // a step of one row: 3 + 1 ms
  EXPECT_EQ(row["decode"]["nodes"], 1);
  EXPECT_EQ(row["goodput"]["requests_met"], 5);
  EXPECT_DOUBLE_EQ(row["goodput"]["share"].get<double>(), 1);

  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--policy fastest --model-config " + TinyConfig(), "--policy: 'fastest'"},
           {"--policy least-loaded", "--policy: needs --model-config"},
           {"--policy least-loaded --model-config " + TinyConfig() + " --prefill-nodes 0",
            "--prefill-nodes"},
           {"--policy least-loaded --model-config " + TinyConfig() + " --rates speed=3",
            "--rates: 'speed' is unknown"},
           {"--policy least-loaded --model-config " + TinyConfig() + " --block-cache-bytes 3XB",
            "--block-cache-bytes: '3XB'"},
           {"--policy least-loaded --model-config " + TinyConfig() + " --store-nodes 0",
            "--store-nodes: 0 must lie in [1, 256]"},
           {"--policy least-loaded --model-config " + TinyConfig() + " --decode-nodes -1",
            "--decode-nodes: -1 must lie in [0, 1024]"},
           {"--policy least-loaded --model-config " + TinyConfig() + " --decode-rates x=1",
            "--decode-rates: 'x' is unknown"},
           {"--policy least-loaded --model-config " + TinyConfig() + " --itl-slo-ms -3",
            "--itl-slo-ms: must be finite and >= 0"},
           {"--policy least-loaded --model-config " + TinyConfig() +
                " --store-nodes 2 --store-replication 3",
            "--store-replication: 3 must lie in [1, --store-nodes 2]"}}) {
    const Result r = RunBatonctl("simulate --trace " + CapTrace() + " --trace-block 8 " + args);
    EXPECT_EQ(r.exit_status, 2) << args;
    EXPECT_THAT(r.err, HasSubstr(message)) << args;
  }
}

// `batonctl capacity` from the command line: a cluster that meets the targets, the points it
// explored, and bad flags refused by name.
TEST(BatonctlSimulateTest, CapacityFindsTheFewestNodesForTheTargets) {
  const Result r = RunBatonctl("capacity --trace " + DecodeTrace() +
                               " --trace-block 8 --model-config " + TinyConfig() +
                               " --ttft-p99-ms 100000 --itl-p99-ms 1000 --max-nodes 4 "
                               "--rates compute_ms_per_gflop=2,fixed_ms=1 --json");
  ASSERT_EQ(r.exit_status, 0) << r.err;
  const nlohmann::json out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["kind"], "capacity");
  EXPECT_EQ(out["requests"], 5);
  // Loose targets: one node of each meets them.
  EXPECT_EQ(out["best"]["prefill_nodes"], 1);
  EXPECT_EQ(out["best"]["decode_nodes"], 1);
  EXPECT_TRUE(out["best"]["meets"].get<bool>());
  EXPECT_GT(out["best"]["itl_ms"]["p99"].get<double>(), 0);
  EXPECT_GE(out["explored"].size(), 2u);
  for (const nlohmann::json& point : out["explored"]) EXPECT_GE(point["seconds"].get<double>(), 0);
  // Targets nothing meets: no answer, exit 1, the frontier still printed.
  const Result none =
      RunBatonctl("capacity --trace " + CapTrace() + " --trace-block 8 --model-config " +
                  TinyConfig() + " --ttft-p99-ms 0.001 --max-nodes 2 --json");
  EXPECT_EQ(none.exit_status, 1);
  EXPECT_TRUE(nlohmann::json::parse(none.out)["best"].is_null());
  // Several shapes: each split, policy and cache size searched, every point named by its shape,
  // and the answer the cheapest of them (of equally many nodes, the smallest cache).
  const Result shapes = RunBatonctl(
      "capacity --trace " + DecodeTrace() + " --trace-block 8 --model-config " + TinyConfig() +
      " --ttft-p99-ms 100000 --itl-p99-ms 1000 --max-nodes 2 --split prefill-all,replay-on-decode"
      " --policy least-loaded,predicted-ttft --block-cache-bytes 1MiB,0 --rates "
      "compute_ms_per_gflop=2 --decode-rates replay_ms_per_gflop=50 --json");
  ASSERT_EQ(shapes.exit_status, 0) << shapes.err;
  const nlohmann::json shaped = nlohmann::json::parse(shapes.out);
  std::set<std::tuple<std::string, std::string, uint64_t>> seen;
  for (const nlohmann::json& point : shaped["explored"]) {
    seen.emplace(point["split"], point["policy"], point["block_cache_bytes"]);
  }
  EXPECT_EQ(seen.size(), 8u);
  EXPECT_EQ(shaped["best"]["prefill_nodes"], 1);
  EXPECT_EQ(shaped["best"]["decode_nodes"], 1);
  EXPECT_EQ(shaped["best"]["block_cache_bytes"], 0);
  // Searched on one prefix group in 3 (here the group of hash id 7) in blocks of 8 tokens: the
  // sample's points at three times their nodes, and the answer a point of the whole trace.
  const Result sampled = RunBatonctl(
      "capacity --trace " + DecodeTrace() + " --trace-block 8 --model-config " + TinyConfig() +
      " --ttft-p99-ms 100000 --itl-p99-ms 1000 --max-nodes 4 --rates compute_ms_per_gflop=2 "
      "--sample-one-in 3 --block-size 8 --json");
  ASSERT_EQ(sampled.exit_status, 0) << sampled.err;
  const nlohmann::json plan = nlohmann::json::parse(sampled.out);
  EXPECT_EQ(plan["sample_one_in"], 3);
  EXPECT_EQ(plan["block_size"], 8);
  EXPECT_EQ(plan["best"]["sample_one_in"], 1);
  EXPECT_EQ(plan["best"]["prefill_nodes"], 3);
  ASSERT_GE(plan["explored"].size(), 2u);
  EXPECT_EQ(plan["explored"][0]["sample_one_in"], 3);
  EXPECT_EQ(plan["explored"][0]["prefill_nodes"], 3);
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--ttft-p99-ms 10 --sample-one-in 0",
            "--sample-one-in: 0 must lie in [1, --max-nodes 64]"},
           {"--ttft-p99-ms 10 --sample-one-in 2",
            "--sample-one-in: 2 leaves none of the trace's 5 requests"},
           {"--ttft-p99-ms 10 --block-size 6",
            "--block-size: 6 must be a multiple of the model's 4"},
           {"--ttft-p99-ms 10 --block-size -8", "--block-size: -8 must be a multiple"},
           {"--ttft-p99-ms 0", "--ttft-p99-ms: must be a finite number > 0"},
           {"--ttft-p99-ms 10 --max-nodes 0", "--max-nodes: 0 must lie in [1, 1024]"},
           {"--ttft-p99-ms 10 --threads -1", "--threads: -1 must lie in [0, 256]"},
           {"--ttft-p99-ms 10 --policy fastest", "--policy: 'fastest'"},
           {"--ttft-p99-ms 10 --split sideways", "--split: 'sideways' is unknown"},
           {"--ttft-p99-ms 10 --split replay-on-decode",
            "--split: replay-on-decode needs the decode nodes' replay rate"},
           {"--ttft-p99-ms 10 --block-cache-bytes 1MiB,3XB", "--block-cache-bytes: '3XB'"},
           {"--ttft-p99-ms 10 --decode-rates tokens_per_step=0", "--decode-rates"}}) {
    const Result bad = RunBatonctl("capacity --trace " + CapTrace() +
                                   " --trace-block 8 --model-config " + TinyConfig() + " " + args);
    EXPECT_EQ(bad.exit_status, 2) << args;
    EXPECT_THAT(bad.err, HasSubstr(message)) << args;
  }
}

// `--rates FILE`: the output of `batonctl rates --addr ROUTER` kept in a file prices the
// cluster as the same rates given inline do, its decode rates too unless --decode-rates is
// given; a file that cannot be read or holds no rates is refused by name.
TEST(BatonctlSimulateTest, RatesComeFromAFileOfBatonctlRatesOutput) {
  const std::string inline_rates = "compute_ms_per_gflop=7,fixed_ms=3";
  const std::string inline_decode = "step_fixed_ms=4,step_per_row_ms=1.5";
  const std::string file =
      WriteFile("rates.json", nlohmann::json{{"prefill_nodes", 2},
                                             {"decode_nodes", 1},
                                             {"split", "prefill-all"},
                                             {"rates", inline_rates},
                                             {"decode_rates", inline_decode},
                                             {"nodes", nlohmann::json::array()}}
                                  .dump());
  const std::string common = "capacity --trace " + DecodeTrace() + " --trace-block 8 " +
                             "--model-config " + TinyConfig() +
                             " --ttft-p99-ms 100000 --itl-p99-ms 1000 --max-nodes 4 --json ";
  const Result given =
      RunBatonctl(common + "--rates " + inline_rates + " --decode-rates " + inline_decode);
  const Result from_file = RunBatonctl(common + "--rates " + file);
  ASSERT_EQ(given.exit_status, 0) << given.err;
  ASSERT_EQ(from_file.exit_status, 0) << from_file.err;
  auto points = [](const Result& r) {
    nlohmann::json explored = nlohmann::json::parse(r.out)["explored"];
    for (nlohmann::json& p : explored) p.erase("seconds");
    return explored;
  };
  EXPECT_EQ(points(from_file), points(given));
  // Other decode rates given beside the file win over the file's.
  const Result slower = RunBatonctl(common + "--rates " + file +
                                    " --decode-rates step_fixed_ms=40,step_per_row_ms=1.5");
  ASSERT_EQ(slower.exit_status, 0) << slower.err;
  EXPECT_GT(nlohmann::json::parse(slower.out)["best"]["itl_ms"]["p50"].get<double>(),
            nlohmann::json::parse(given.out)["best"]["itl_ms"]["p50"].get<double>());
  // simulate takes the same file.
  const Result simulated = RunBatonctl(
      "simulate --trace " + DecodeTrace() + " --trace-block 8 --model-config " + TinyConfig() +
      " --policy least-loaded --prefill-nodes 1 --decode-nodes 1 --rates " + file + " --json");
  ASSERT_EQ(simulated.exit_status, 0) << simulated.err;
  EXPECT_EQ(nlohmann::json::parse(simulated.out)["rates"]["compute_ms_per_gflop"], 7);
  for (const auto& [contents, message] : std::vector<std::pair<std::string, std::string>>{
           {"", "is not a JSON object"},
           {"[1, 2]", "is not a JSON object"},
           {R"({"decode_rates": "step_fixed_ms=4"})", "has no string \"rates\""},
           {R"({"rates": 5})", "has no string \"rates\""}}) {
    const std::string bad = WriteFile("bad_rates.json", contents);
    const Result refused = RunBatonctl(common + "--rates " + bad);
    EXPECT_EQ(refused.exit_status, 2) << contents;
    EXPECT_THAT(refused.err, HasSubstr("--rates: '" + bad + "' " + message)) << contents;
  }
  const Result missing = RunBatonctl(common + "--rates /nonexistent/rates.json");
  EXPECT_EQ(missing.exit_status, 2);
  EXPECT_THAT(missing.err, HasSubstr("--rates: '/nonexistent/rates.json' cannot be read"));
}

}  // namespace
