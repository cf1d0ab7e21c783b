// `batonctl make-model` and `batonctl forward` run as processes: the JSON interface that
// outside checks use, and exit status 2 with a clear message for bad input.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "run_batonctl.h"
#if BATON_HAS_CUDA
#include "baton/kernels/cuda/context.h"
#endif
#include "test_dir.h"

namespace {

using baton::testing::Result;
using baton::testing::RunBatonctl;
using ::testing::HasSubstr;

class BatonctlModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const Result r = RunBatonctl("make-model --preset tiny --seed 3 --out " + Dir());
    ASSERT_EQ(r.exit_status, 0) << r.err;
  }
  static std::string Dir() { return baton::testing::ProcessTempDir() + "/batonctl_tiny"; }
  static std::string Tokens(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string((i * 31 + 7) % 512);
    return s;
  }
};

TEST_F(BatonctlModelTest, ForwardReportsResultRowsAndGreedyTokens) {
  const Result off =
      RunBatonctl("forward --model " + Dir() + " --tokens " + Tokens(40) + " --decode 5 --json");
  ASSERT_EQ(off.exit_status, 0) << off.err;
  const auto json = nlohmann::json::parse(off.out);
  ASSERT_EQ(json["positions"].size(), 40u);
  EXPECT_EQ(json["positions"][0], 0);
  EXPECT_EQ(json["positions"][39], 39);
  ASSERT_EQ(json["logits"].size(), 40u);
  EXPECT_EQ(json["logits"][0].size(), 512u);
  ASSERT_EQ(json["tokens"].size(), 5u);
  // The first token is the argmax of the last prompt row.
  const auto& last = json["logits"][39];
  size_t best = 0;
  for (size_t v = 1; v < last.size(); ++v) {
    if (last[v].get<double>() > last[best].get<double>()) best = v;
  }
  EXPECT_EQ(json["tokens"][0], best);

  const Result compact = RunBatonctl("forward --model " + Dir() + " --tokens " + Tokens(40) +
                                     " --mode compact --keep 25 --chunk-size 7 --decode 5 --json");
  ASSERT_EQ(compact.exit_status, 0) << compact.err;
  const auto cjson = nlohmann::json::parse(compact.out);
  ASSERT_EQ(cjson["positions"].size(), 25u);  // retained rows only, no placeholder
  EXPECT_EQ(cjson["positions"][0], 15);

  const Result hit = RunBatonctl("forward --model " + Dir() + " --tokens " + Tokens(40) +
                                 " --mode compact --keep 22 --valid-start 16 --json");
  ASSERT_EQ(hit.exit_status, 0) << hit.err;
  const auto hjson = nlohmann::json::parse(hit.out);
  ASSERT_EQ(hjson["positions"].size(), 22u);
  EXPECT_EQ(hjson["positions"][0], 18);
  EXPECT_TRUE(hjson["tokens"].empty());
}

// --split replay-on-decode runs the prompt as the two nodes of that split do (DESIGN section 6):
// the replayed rows' logits and the greedy tokens are prefill-all's, for any replay step size,
// and the prefill side holds fewer weight bytes.
TEST_F(BatonctlModelTest, ReplayOnDecodeSplitGivesThePrefillAllTokens) {
  auto run = [&](const std::string& args) {
    const Result r = RunBatonctl("forward --model " + Dir() + " --tokens " + Tokens(40) +
                                 " --decode 6 --json " + args);
    EXPECT_EQ(r.exit_status, 0) << args << "\n" << r.err;
    return r.exit_status == 0 ? nlohmann::json::parse(r.out) : nlohmann::json{};
  };
  for (const std::string truncation :
       {"", "--mode compact --keep 25 --chunk-size 7", "--mode mask --keep 22 --valid-start 16"}) {
    SCOPED_TRACE(truncation);
    const auto all = run(truncation);
    ASSERT_FALSE(all.empty());
    EXPECT_EQ(all["split"], "prefill-all");
    EXPECT_EQ(all["prefill_weight_bytes"], all["weight_bytes"]);
    for (const std::string step : {"0", "3"}) {
      const auto split =
          run(truncation + " --split replay-on-decode --replay-rows-per-step " + step);
      ASSERT_FALSE(split.empty());
      EXPECT_EQ(split["split"], "replay-on-decode");
      EXPECT_EQ(split["tokens"], all["tokens"]);
      EXPECT_LT(split["prefill_weight_bytes"].get<int64_t>(), all["weight_bytes"].get<int64_t>());
      // The replayed rows are the result rows from max(s_keep, s_valid), with the same logits.
      std::map<int, size_t> row_of;
      for (size_t r = 0; r < all["positions"].size(); ++r) row_of[all["positions"][r]] = r;
      ASSERT_FALSE(split["positions"].empty());
      EXPECT_EQ(split["positions"].back(), 39);
      for (size_t r = 0; r < split["positions"].size(); ++r) {
        const int pos = split["positions"][r];
        ASSERT_TRUE(row_of.contains(pos)) << pos;
        const auto& a = split["logits"][r];
        const auto& b = all["logits"][row_of[pos]];
        double worst = 0;
        for (size_t v = 0; v < a.size(); ++v) {
          worst = std::max(worst, std::abs(a[v].get<double>() - b[v].get<double>()));
        }
        EXPECT_LT(worst, 1e-4) << "pos " << pos;
      }
    }
  }
}

TEST_F(BatonctlModelTest, BadInputExitsTwoWithAClearMessage) {
  const std::pair<std::string, std::string> cases[] = {
      {"forward --model /nonexistent --tokens 1,2", "cannot open model config"},
      {"forward --model " + Dir() + " --tokens 1,2,999", "token 2 is 999"},
      {"forward --model " + Dir() + " --tokens 1,,2", "--tokens"},
      {"forward --model " + Dir() + " --tokens 1,2 --mode compact --keep 5",
       "keep K is 5 with truncation mode 'compact'"},
      {"forward --model " + Dir() + " --tokens 1,2 --valid-start 2", "s_valid is 2"},
      {"forward --model " + Dir() + " --tokens 1,2 --decode -1", "--decode is -1"},
      {"forward --model " + Dir() + " --tokens 1,2 --device tpu", "--device: 'tpu' is unknown"},
      {"forward --model " + Dir() + " --tokens 1,2 --split half", "--split: 'half' is unknown"},
      {"forward --model " + Dir() +
           " --tokens 1,2 --split replay-on-decode "
           "--replay-rows-per-step -1",
       "--replay-rows-per-step is -1"},
      {"make-model --preset huge --out /tmp/x", "--preset: preset 'huge' is unknown"},
  };
  for (const auto& [args, message] : cases) {
    const Result r = RunBatonctl(args);
    EXPECT_EQ(r.exit_status, 2) << args;
    EXPECT_THAT(r.err, HasSubstr(message)) << args;
  }
}

// make-model --preset small-shared writes the small shapes with one block-KV source: its
// config.json lists it, only layer 8 carries the global projections, forward runs it, and plan
// counts one block-KV group.
TEST_F(BatonctlModelTest, SmallSharedPresetHasOneBlockKvSource) {
  const std::string out = baton::testing::ProcessTempDir() + "/small_shared";
  const Result made = RunBatonctl("make-model --preset small-shared --out " + out);
  ASSERT_EQ(made.exit_status, 0) << made.err;
  std::ifstream config_file(out + "/config.json");
  const auto config = nlohmann::json::parse(config_file);
  EXPECT_EQ(config["block_kv_sources"], nlohmann::json::array({8}));
  EXPECT_EQ(config["num_hidden_layers"], 16);
  std::ifstream weights(out + "/model.safetensors", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(weights)), {});
  EXPECT_NE(bytes.find("model.layers.8.self_attn.global_k_proj.weight"), std::string::npos);
  EXPECT_EQ(bytes.find("model.layers.9.self_attn.global_k_proj.weight"), std::string::npos);
  EXPECT_EQ(bytes.find("model.layers.15.self_attn.global_v_proj.weight"), std::string::npos);
  const Result forward =
      RunBatonctl("forward --model " + out + " --tokens 5,17,300,4000 --decode 2 --json");
  ASSERT_EQ(forward.exit_status, 0) << forward.err;
  EXPECT_EQ(nlohmann::json::parse(forward.out)["tokens"].size(), 2u);
  const Result plan = RunBatonctl("plan --prompt-len 200 --window 128 --json --model-config " +
                                  out + "/config.json");
  ASSERT_EQ(plan.exit_status, 0) << plan.err;
  EXPECT_EQ(nlohmann::json::parse(plan.out)["block_kv_groups"], 1);
}

// make-model --tokenizer gives the model the tokenizer files (what `baton up` and the Helm
// chart's init container do for the small preset); a folder without tokenizer.model is refused.
TEST_F(BatonctlModelTest, MakeModelCopiesATokenizerIn) {
  const std::string out = baton::testing::ProcessTempDir() + "/with_tokenizer";
  const Result r = RunBatonctl("make-model --preset tiny --out " + out + " --tokenizer " +
                               std::string(BATON_TOKENIZER_DIR));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  for (const char* file : {"tokenizer.model", "tokenizer_config.json", "generation_config.json"}) {
    EXPECT_EQ(std::filesystem::file_size(std::filesystem::path(out) / file),
              std::filesystem::file_size(std::filesystem::path(BATON_TOKENIZER_DIR) / file))
        << file;
  }
  const Result missing = RunBatonctl("make-model --preset tiny --out " + out + "2 --tokenizer " +
                                     baton::testing::ProcessTempDir());
  EXPECT_EQ(missing.exit_status, 2);
  EXPECT_THAT(missing.err, HasSubstr("tokenizer.model does not exist"));
}

// Without CUDA kernels, or without a device, --device cuda is refused with exit status 2 and
// the reason; with both, it must give the CPU's result rows and greedy tokens.
TEST_F(BatonctlModelTest, DeviceCudaRunsOrExitsTwoWithTheReason) {
  const std::string args = "forward --model " + Dir() + " --tokens " + Tokens(40) +
                           " --mode compact --keep 22 --chunk-size 9 --valid-start 8 --decode 3"
                           " --json";
  const Result gpu = RunBatonctl(args + " --device cuda");
#if !BATON_HAS_CUDA
  EXPECT_EQ(gpu.exit_status, 2);
  EXPECT_THAT(gpu.err, HasSubstr("--device cuda: this build has no CUDA kernels"));
#else
  if (baton::kernels::cuda::DeviceCount() == 0) {
    EXPECT_EQ(gpu.exit_status, 2);
    EXPECT_THAT(gpu.err, HasSubstr("--device cuda: no CUDA device: " +
                                   baton::kernels::cuda::NoDeviceReason()));
    return;
  }
  ASSERT_EQ(gpu.exit_status, 0) << gpu.err;
  const Result cpu = RunBatonctl(args + " --device cpu");
  ASSERT_EQ(cpu.exit_status, 0) << cpu.err;
  const auto g = nlohmann::json::parse(gpu.out), c = nlohmann::json::parse(cpu.out);
  EXPECT_EQ(g["positions"], c["positions"]);
  EXPECT_EQ(g["tokens"], c["tokens"]);
  ASSERT_EQ(g["logits"].size(), c["logits"].size());
  for (size_t r = 0; r < c["logits"].size(); ++r) {
    double diff = 0, scale = 1e-12;
    for (size_t v = 0; v < c["logits"][r].size(); ++v) {
      const double a = g["logits"][r][v].get<double>(), b = c["logits"][r][v].get<double>();
      diff = std::max(diff, std::abs(a - b));
      scale = std::max(scale, std::abs(b));
    }
    EXPECT_LE(diff / scale, 1e-3) << "row " << r;
  }
#endif
}

}  // namespace
