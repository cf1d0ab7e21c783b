// Model files: generation is deterministic, BF16 widens on load, the fingerprint follows
// config and weights, and every kind of bad file is refused with a message naming the
// tensor or field.
#include "baton/model/weights.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "baton/common/hash.h"
#include "baton/model/engine_factory.h"
#include "baton/model/model_factory.h"
#include "baton/model/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "test_dir.h"

namespace baton::model {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

class WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = baton::testing::ProcessTempDir() + "/weights_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    config_ = *PresetConfig("tiny");
    ASSERT_TRUE(MakeModel(config_, 1, dir_).ok());
  }
  std::string weights_path() const { return dir_ + "/model.safetensors"; }
  std::string config_path() const { return dir_ + "/config.json"; }

  // Rewrites model.safetensors from `weights` minus/plus tensors, with `edit` applied.
  void Rewrite(const std::function<void(std::vector<TensorToWrite>&)>& edit) {
    weights_ = GenerateWeights(config_, 1);
    std::vector<TensorToWrite> tensors;
    for (const TensorSlot& slot : WeightTensorSlots(weights_)) {
      tensors.push_back({slot.name, slot.shape, slot.data});
    }
    edit(tensors);
    ASSERT_TRUE(WriteSafetensors(weights_path(), tensors, Dtype::kF32).ok());
  }

  void ExpectRefused(const std::string& message) {
    auto loaded = LoadCedWeights(dir_);
    ASSERT_FALSE(loaded.ok()) << "expected: " << message;
    EXPECT_THAT(loaded.status().message(), HasSubstr(message));
  }

  std::string dir_;
  ModelConfig config_;
  CedWeights weights_;
};

TEST_F(WeightsTest, GenerationIsDeterministicAndSeeded) {
  const std::string again = baton::testing::ProcessTempDir() + "/weights_again";
  const std::string other = baton::testing::ProcessTempDir() + "/weights_other";
  ASSERT_TRUE(MakeModel(config_, 1, again).ok());
  ASSERT_TRUE(MakeModel(config_, 2, other).ok());
  EXPECT_EQ(ReadFile(weights_path()), ReadFile(again + "/model.safetensors"));
  EXPECT_NE(ReadFile(weights_path()), ReadFile(other + "/model.safetensors"));
  auto a = LoadCedWeights(dir_), b = LoadCedWeights(again), c = LoadCedWeights(other);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->fingerprint, b->fingerprint);
  EXPECT_NE(a->fingerprint, c->fingerprint);
  EXPECT_EQ(a->fingerprint.size(), 64u);
}

TEST_F(WeightsTest, GeneratedActivationsAreFiniteAndUnsaturated) {
  auto model = LoadEngine(dir_);
  ASSERT_TRUE(model.ok());
  std::vector<int32_t> prompt(200);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 11) % 512);
  SequenceState state((*model)->state_layout());
  auto result = (*model)->Prefill(prompt, {.result_logits = true}, state);
  ASSERT_TRUE(result.ok());
  const int64_t V = 512;
  for (size_t r = 0; r < result->positions.size(); ++r) {
    const float* row = result->logits.data() + r * V;
    double sum = 0, sq = 0, max_logit = -1e30;
    for (int64_t v = 0; v < V; ++v) {
      ASSERT_TRUE(std::isfinite(row[v])) << "row " << r;
      sum += row[v];
      sq += row[v] * row[v];
      max_logit = std::max<double>(max_logit, row[v]);
    }
    const double mean = sum / V, spread = std::sqrt(sq / V - mean * mean);
    // Logits spread over a few units: neither flat nor one-hot.
    EXPECT_GT(spread, 0.3) << "row " << r;
    EXPECT_LT(spread, 30) << "row " << r;
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - max_logit);
    EXPECT_GT(1.0 / z, 1.0 / V) << "row " << r;
    EXPECT_LT(1.0 / z, 0.9999) << "softmax saturated at row " << r;
  }
}

TEST_F(WeightsTest, Bf16FileWidensToNearbyFloats) {
  const std::string bf16 = baton::testing::ProcessTempDir() + "/weights_bf16";
  ASSERT_TRUE(MakeModel(config_, 1, bf16, Dtype::kBF16).ok());
  auto wide = LoadCedWeights(dir_);
  auto narrow = LoadCedWeights(bf16);
  ASSERT_TRUE(wide.ok() && narrow.ok()) << narrow.status();
  EXPECT_NE(wide->fingerprint, narrow->fingerprint);
  ASSERT_EQ(wide->embed.size(), narrow->embed.size());
  for (size_t i = 0; i < wide->embed.size(); ++i) {
    ASSERT_NEAR(narrow->embed[i], wide->embed[i], std::abs(wide->embed[i]) / 256 + 1e-30);
    ASSERT_EQ(narrow->embed[i], Bf16ToFloat(FloatToBf16(wide->embed[i])));
  }
}

TEST_F(WeightsTest, FingerprintFollowsTheConfig) {
  auto before = LoadCedWeights(dir_);
  nlohmann::json json = nlohmann::json::parse(ReadFile(config_path()));
  json["rope_theta"] = 20000.0;
  WriteFile(config_path(), json.dump());
  auto after = LoadCedWeights(dir_);
  ASSERT_TRUE(before.ok() && after.ok());
  EXPECT_NE(before->fingerprint, after->fingerprint);
}

// The store's fingerprint from config.json and the weights' recorded digest (--weights-sha256)
// is the one the nodes compute from the file, without the file; another digest is another
// fingerprint, and a malformed one is refused by name.
TEST_F(WeightsTest, AFingerprintFromTheWeightsDigestNeedsNoWeights) {
  auto loaded = LoadCedWeights(dir_);
  ASSERT_TRUE(loaded.ok());
  const std::string bytes = ReadFile(weights_path());
  const Sha256Digest digest = Sha256Of(bytes.data(), bytes.size());
  const std::string hex = HexDigest(digest);
  const std::string config_only = dir_ + "_config_only";
  std::filesystem::create_directories(config_only);
  std::filesystem::copy_file(config_path(), config_only + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_FALSE(ModelFingerprint(config_only).ok());  // without the digest it needs the file
  EXPECT_EQ(ModelFingerprint(dir_).value_or(""), loaded->fingerprint);
  EXPECT_EQ(ModelFingerprint(config_only, hex).value_or(""), loaded->fingerprint);
  EXPECT_EQ(ModelFingerprint(config_only, absl::AsciiStrToUpper(hex)).value_or(""),
            loaded->fingerprint);
  std::string other = hex;
  other[0] = other[0] == '0' ? '1' : '0';
  auto changed = ModelFingerprint(config_only, other);
  ASSERT_TRUE(changed.ok());
  EXPECT_NE(*changed, loaded->fingerprint);
  for (const std::string bad : {hex.substr(1), hex + "0", "g" + hex.substr(1)}) {
    auto refused = ModelFingerprint(config_only, bad);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_THAT(refused.status().message(), HasSubstr("--weights-sha256"));
  }
}

TEST_F(WeightsTest, MissingTensorIsNamed) {
  Rewrite([](std::vector<TensorToWrite>& t) {
    std::erase_if(
        t, [](const auto& x) { return x.name == "model.layers.5.self_attn.swa_k_proj.weight"; });
  });
  ExpectRefused("tensor 'model.layers.5.self_attn.swa_k_proj.weight' is missing");
}

// A prefill node of replay-on-decode loads the producers' side only: the embedding, the
// producer layers, the boundary norm and the block-KV projections, with the same fingerprint;
// the consumer layers stay on disk, yet a file missing one of their tensors is still refused.
TEST_F(WeightsTest, TheProducersSideHoldsOnlyWhatItRuns) {
  auto all = LoadCedWeights(dir_);
  auto producers = LoadCedWeights(dir_, HeldLayers::kProducers);
  ASSERT_TRUE(all.ok() && producers.ok()) << producers.status();
  EXPECT_EQ(producers->fingerprint, all->fingerprint);
  EXPECT_EQ(producers->embed, all->embed);
  EXPECT_EQ(producers->global_kv, all->global_kv);
  ASSERT_EQ(producers->producers.size(), all->producers.size());
  EXPECT_EQ(producers->producers.back().down, all->producers.back().down);
  EXPECT_EQ(producers->consumers[0].attn_norm, all->consumers[0].attn_norm);
  EXPECT_TRUE(producers->consumers[0].q_swa_kv.empty());
  EXPECT_TRUE(producers->consumers.back().attn_norm.empty());
  EXPECT_TRUE(producers->final_norm.empty());
  CedWeights& w = *producers;
  EXPECT_FALSE(SaveCedWeights(w, dir_ + "_copy", Dtype::kF32).ok());

  Rewrite([](std::vector<TensorToWrite>& t) {
    std::erase_if(t, [](const auto& x) { return x.name == "model.layers.7.mlp.down_proj.weight"; });
  });
  auto missing = LoadCedWeights(dir_, HeldLayers::kProducers);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(),
              HasSubstr("tensor 'model.layers.7.mlp.down_proj.weight' is missing"));
}

TEST_F(WeightsTest, WrongShapeIsNamed) {
  Rewrite([](std::vector<TensorToWrite>& t) {
    for (auto& x : t) {
      if (x.name == "model.layers.2.mlp.up_proj.weight") x.shape = {128, 384};
    }
  });
  ExpectRefused(
      "tensor 'model.layers.2.mlp.up_proj.weight' has shape [128, 384]; config.json "
      "requires [384, 128]");
}

TEST_F(WeightsTest, UnexpectedTensorsAreRefused) {
  std::vector<float> extra(512 * 128, 0.0f);
  Rewrite([&](std::vector<TensorToWrite>& t) {
    t.push_back({"lm_head.weight", {512, 128}, extra.data()});
  });
  ExpectRefused("unexpected tensor 'lm_head.weight' (tie_word_embeddings is true");
  nlohmann::json json = nlohmann::json::parse(ReadFile(config_path()));
  json["tie_word_embeddings"] = false;
  WriteFile(config_path(), json.dump());
  Rewrite([](std::vector<TensorToWrite>&) {});
  ExpectRefused("tensor 'lm_head.weight' is missing (tie_word_embeddings is false)");
}

// With block_kv_sources, only its layers carry global_k_proj and global_v_proj: a file with a
// projection on another layer, or without one a source needs, is refused naming the field; the
// right file loads with G groups of block-KV projection rows.
TEST_F(WeightsTest, OnlyBlockKvSourcesCarryGlobalProjections) {
  nlohmann::json json = nlohmann::json::parse(ReadFile(config_path()));
  json["block_kv_sources"] = {4, 6};
  WriteFile(config_path(), json.dump());
  ExpectRefused(
      "unexpected tensor 'model.layers.5.self_attn.global_k_proj.weight' (only the layers of "
      "block_kv_sources project block KV");
  auto not_a_source = [](const TensorToWrite& x) {
    return x.name.find("layers.5.self_attn.global_") != std::string::npos ||
           x.name.find("layers.7.self_attn.global_") != std::string::npos;
  };
  Rewrite([&](std::vector<TensorToWrite>& t) { std::erase_if(t, not_a_source); });
  auto loaded = LoadCedWeights(dir_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const int64_t kv = config_.num_key_value_heads * config_.head_dim;
  EXPECT_EQ(loaded->config.num_block_kv_groups(), 2);
  EXPECT_EQ(loaded->global_kv.size(), static_cast<size_t>(2 * 2 * kv * config_.hidden_size));
  // Group 1 holds layer 6's projection rows as the file has them.
  const CedWeights generated = GenerateWeights(config_, 1);
  const std::vector<float>& plain = generated.global_kv;
  const size_t group_floats = 2 * kv * config_.hidden_size;
  EXPECT_TRUE(std::equal(loaded->global_kv.begin() + group_floats, loaded->global_kv.end(),
                         plain.begin() + 2 * group_floats));
  Rewrite([&](std::vector<TensorToWrite>& t) {
    std::erase_if(t, [&](const TensorToWrite& x) {
      return not_a_source(x) || x.name == "model.layers.6.self_attn.global_v_proj.weight";
    });
  });
  ExpectRefused(
      "tensor 'model.layers.6.self_attn.global_v_proj.weight' is missing (its layer is one of "
      "block_kv_sources)");
}

TEST_F(WeightsTest, UnknownDtypeIsNamed) {
  std::string bytes = ReadFile(weights_path());
  const size_t at = bytes.find("\"F32\"");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 5, "\"F16\"");
  WriteFile(weights_path(), bytes);
  ExpectRefused("dtype \"F16\" is not supported; allowed: F32, BF16");
}

TEST_F(WeightsTest, TruncatedFilesAreRefused) {
  const std::string bytes = ReadFile(weights_path());
  WriteFile(weights_path(), bytes.substr(0, bytes.size() - 100));
  ExpectRefused("the file is truncated or corrupt");
  WriteFile(weights_path(), bytes.substr(0, 5));
  ExpectRefused("shorter than the 8-byte header length");
  WriteFile(weights_path(), bytes.substr(0, 200));
  ExpectRefused("exceeds the file");
  std::filesystem::remove(weights_path());
  ExpectRefused("cannot open weights file");
}

// A safetensors file of `header` (JSON text) and `data`, its length field set to `length`.
std::string Safetensors(const std::string& header, const std::string& data, uint64_t length) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return bytes + header + data;
}

void ExpectReadRefused(const std::string& path, const std::string& bytes,
                       const std::string& message) {
  WriteFile(path, bytes);
  auto file = SafetensorsFile::Read(path);
  ASSERT_FALSE(file.ok()) << "expected: " << message;
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(file.status().message(), HasSubstr(message));
}

TEST_F(WeightsTest, HeaderLengthPastTheFileIsRefused) {
  const std::string header = R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  const std::string data(8, '\0');
  const std::string path = dir_ + "/raw.safetensors";
  WriteFile(path, Safetensors(header, data, header.size()));
  ASSERT_TRUE(SafetensorsFile::Read(path).ok());  // the well-formed file reads
  ExpectReadRefused(path, Safetensors(header, data, header.size() + data.size() + 1),
                    "exceeds the file");
  // 8 + length wraps 64 bits to 7: the check must not add.
  ExpectReadRefused(path, Safetensors(header, data, ~uint64_t{0}), "exceeds the file");
}

TEST_F(WeightsTest, TensorOffsetsAndShapesPastTheFileAreRefused) {
  const std::string path = dir_ + "/raw.safetensors";
  auto file_with = [](const std::string& shape, const std::string& offsets) {
    const std::string header =
        R"({"t": {"dtype": "F32", "shape": )" + shape + R"(, "data_offsets": )" + offsets + "}}";
    return Safetensors(header, std::string(8, '\0'), header.size());
  };
  ExpectReadRefused(path, file_with("[2]", "[0, 18446744073709551615]"),
                    "tensor 't': data [0, 18446744073709551615) lies outside the 8 data bytes");
  ExpectReadRefused(path, file_with("[2]", "[18446744073709551608, 8]"), "lies outside");
  // 2^40 * 2^40 * 4 bytes wraps to 0 in 64 bits and would match an empty range.
  ExpectReadRefused(path, file_with("[1099511627776, 1099511627776]", "[0, 0]"),
                    "tensor 't': holds 0 bytes; shape [1099511627776,1099511627776] in F32 "
                    "needs more than 2^64");
  ExpectReadRefused(path, file_with("[3]", "[0, 8]"), "holds 8 bytes; shape [3] in F32 needs 12");
}

TEST_F(WeightsTest, InconsistentConfigIsNamed) {
  nlohmann::json json = nlohmann::json::parse(ReadFile(config_path()));
  json["n_prefill_layer"] = 8;
  WriteFile(config_path(), json.dump());
  ExpectRefused("'n_prefill_layer' is 8; it must lie in [1, num_hidden_layers)");
  json["n_prefill_layer"] = 3;  // consistent, but the file's layers no longer match
  json["hidden_size"] = 64;
  WriteFile(config_path(), json.dump());
  ExpectRefused(
      "tensor 'model.embed_tokens.weight' has shape [512, 128]; config.json requires "
      "[512, 64]");
}

}  // namespace
}  // namespace baton::model
