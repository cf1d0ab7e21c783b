#include "baton/common/model_config.h"

#include <limits>
#include <optional>
#include <string>

#include "baton/common/checked_math.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace baton {
namespace {

using ::testing::HasSubstr;

nlohmann::json TinyConfigJson() {
  return {{"vocab_size", 512},           {"hidden_size", 128},   {"intermediate_size", 384},
          {"num_hidden_layers", 8},      {"n_prefill_layer", 4}, {"num_attention_heads", 4},
          {"num_key_value_heads", 1},    {"head_dim", 32},       {"sliding_window", 16},
          {"kv_block_size", 16},         {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0},
          {"tie_word_embeddings", true}, {"bos_token_id", 1},    {"eos_token_id", 2}};
}

TEST(ModelConfigTest, ParsesAndDerivesGroupSizes) {
  auto config = ParseModelConfig(TinyConfigJson().dump());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_producer_layers(), 4);
  EXPECT_EQ(config->num_consumer_layers(), 4);
  EXPECT_EQ(config->max_backtrack, 5);  // default
  EXPECT_EQ(config->ring_capacity(), 22);
  EXPECT_EQ(config->dependency_span(), 16 + 3 * 15);
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_FALSE(config->yoco_swa_share_hidden);
}

TEST(ModelConfigTest, RoundTripsThroughCanonicalJson) {
  auto config = ParseModelConfig(TinyConfigJson().dump());
  ASSERT_TRUE(config.ok());
  auto again = ParseModelConfig(ModelConfigToJson(*config));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ModelConfigToJson(*again), ModelConfigToJson(*config));
}

// block_kv_sources: absent, every consumer layer is a source (G = D) and the canonical text has
// no such key, so today's models keep their digests; [P] is one shared group; a list maps each
// consumer layer to its nearest source at or below it; listing every consumer layer is the same
// model as listing none.
TEST(ModelConfigTest, BlockKvSourcesGroupTheConsumerLayers) {
  auto plain = ParseModelConfig(TinyConfigJson().dump());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->num_block_kv_groups(), 4);
  for (int64_t l = 4; l < 8; ++l) {
    EXPECT_TRUE(plain->is_block_kv_source(l));
    EXPECT_EQ(plain->block_kv_group(l), l - 4);
  }
  EXPECT_EQ(ModelConfigToJson(*plain).find("block_kv_sources"), std::string::npos);

  nlohmann::json json = TinyConfigJson();
  json["block_kv_sources"] = {4};
  auto yoco = ParseModelConfig(json.dump());
  ASSERT_TRUE(yoco.ok()) << yoco.status();
  EXPECT_EQ(yoco->num_block_kv_groups(), 1);
  for (int64_t l = 4; l < 8; ++l) {
    EXPECT_EQ(yoco->is_block_kv_source(l), l == 4);
    EXPECT_EQ(yoco->block_kv_group(l), 0);
  }
  EXPECT_NE(ConfigDigest(*yoco), ConfigDigest(*plain));

  json["block_kv_sources"] = {4, 6};
  auto two = ParseModelConfig(json.dump());
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->num_block_kv_groups(), 2);
  const int64_t groups[] = {0, 0, 1, 1};
  for (int64_t l = 4; l < 8; ++l) EXPECT_EQ(two->block_kv_group(l), groups[l - 4]) << l;
  auto again = ParseModelConfig(ModelConfigToJson(*two));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->block_kv_sources, (std::vector<int64_t>{4, 6}));

  json["block_kv_sources"] = {4, 5, 6, 7};
  auto every = ParseModelConfig(json.dump());
  ASSERT_TRUE(every.ok()) << every.status();
  EXPECT_TRUE(every->block_kv_sources.empty());
  EXPECT_EQ(ConfigDigest(*every), ConfigDigest(*plain));
}

struct BadConfigCase {
  const char* key;
  nlohmann::json value;  // null: remove the key
  const char* message;
};

TEST(ModelConfigTest, RejectsInconsistentConfigsNamingTheField) {
  const BadConfigCase cases[] = {
      {"hidden_size", nullptr, "'hidden_size' is missing"},
      {"n_prefill_layer", 0, "'n_prefill_layer' is 0; it must lie in [1, num_hidden_layers)"},
      {"n_prefill_layer", 8, "'n_prefill_layer' is 8"},
      {"num_key_value_heads", 3, "'num_key_value_heads' is 3; it must divide"},
      {"head_dim", 31, "'head_dim' is 31; it must be even"},
      {"sliding_window", 0, "'sliding_window' is 0; it must lie in [1, 1048576]"},
      {"vocab_size", "512", "'vocab_size' must be an integer"},
      {"rms_norm_eps", 0.0, "'rms_norm_eps'"},
      {"tie_word_embeddings", 1, "'tie_word_embeddings' must be true or false"},
      {"eos_token_id", 512, "'eos_token_id' is 512; it must lie in [0, vocab_size)"},
      {"max_backtrack", -1, "'max_backtrack' is -1"},
      {"block_kv_sources", nlohmann::json::array({5, 6}),
       "'block_kv_sources' starts at 5; its first entry must be n_prefill_layer (4)"},
      {"block_kv_sources", nlohmann::json::array({4, 6, 5}),
       "'block_kv_sources' is not strictly ascending (6 then 5)"},
      {"block_kv_sources", nlohmann::json::array({4, 4}),
       "'block_kv_sources' is not strictly ascending (4 then 4)"},
      {"block_kv_sources", nlohmann::json::array({4, 8}),
       "'block_kv_sources' holds 8; each entry must be a consumer layer in [n_prefill_layer, "
       "num_hidden_layers) = [4, 8)"},
      {"block_kv_sources", nlohmann::json::array({3}), "'block_kv_sources' starts at 3"},
      {"block_kv_sources", nlohmann::json::array(), "'block_kv_sources' must be a non-empty list"},
      {"block_kv_sources", 4, "'block_kv_sources' must be a non-empty list"},
      {"block_kv_sources", nlohmann::json::array({4, "6"}),
       "'block_kv_sources' must hold layer indices (integers)"},
  };
  for (const BadConfigCase& c : cases) {
    nlohmann::json json = TinyConfigJson();
    if (c.value.is_null()) {
      json.erase(c.key);
    } else {
      json[c.key] = c.value;
    }
    auto config = ParseModelConfig(json.dump());
    ASSERT_FALSE(config.ok()) << c.key;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr(c.message));
  }
}

TEST(ModelConfigTest, RejectsSizesPastTheirBoundsNamingTheFieldAndTheRange) {
  const int64_t two40 = int64_t{1} << 40;
  const BadConfigCase cases[] = {
      {"vocab_size", two40, "'vocab_size' is 1099511627776; it must lie in [1, 16777216]"},
      {"hidden_size", int64_t{1} << 24, "'hidden_size' is 16777216; it must lie in [1, 65536]"},
      {"intermediate_size", two40, "'intermediate_size' is 1099511627776; it must lie in [1, "},
      {"num_hidden_layers", 4096, "'num_hidden_layers' is 4096; it must lie in [2, 1024]"},
      {"num_attention_heads", 2048, "'num_attention_heads' is 2048; it must lie in [1, 1024]"},
      {"head_dim", 8192, "'head_dim' is 8192; it must lie in [1, 4096]"},
      {"sliding_window", two40, "'sliding_window' is 1099511627776"},
      {"max_backtrack", two40, "'max_backtrack' is 1099511627776"},
      {"kv_block_size", int64_t{1} << 20, "'kv_block_size' is 1048576; it must lie in [1, 65536]"},
      {"max_position_embeddings", two40, "'max_position_embeddings' is 1099511627776"},
      {"max_position_embeddings", 0, "'max_position_embeddings' is 0; it must lie in [1, "},
      {"vocab_size", std::numeric_limits<int64_t>::max(), "'vocab_size' is 9223372036854775807"},
  };
  for (const BadConfigCase& c : cases) {
    nlohmann::json json = TinyConfigJson();
    json[c.key] = c.value;
    auto config = ParseModelConfig(json.dump());
    ASSERT_FALSE(config.ok()) << c.key;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr(c.message));
  }
}

TEST(ModelConfigTest, RefusesProductsPastTheTensorBoundInsteadOfWrapping) {
  // Each factor is within its own bound; the products are not. In int64, 2^40 * 2^24 is 0.
  nlohmann::json json = TinyConfigJson();
  json["vocab_size"] = kMaxVocabSize;
  json["hidden_size"] = kMaxHiddenSize;
  auto config = ParseModelConfig(json.dump());
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(),
              HasSubstr("config product vocab_size * hidden_size is 1099511627776 elements; it "
                        "must be <= 68719476736"));

  // Every field at its bound: the StateBlock regions (the consumer rings, 1020 * 2 * 22 * 2^22
  // floats, and a page, 1020 * 2 * 2^16 * 2^22) are past the bound.
  json = TinyConfigJson();
  json["num_hidden_layers"] = kMaxLayers;
  json["num_attention_heads"] = kMaxHeads;
  json["num_key_value_heads"] = kMaxHeads;
  json["head_dim"] = kMaxHeadDim;
  json["kv_block_size"] = kMaxKvBlockSize;
  json["hidden_size"] = 128;
  config = ParseModelConfig(json.dump());
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("config product "));
  EXPECT_THAT(config.status().message(), HasSubstr("it must be <= 68719476736"));

  EXPECT_EQ(CheckedProduct<int64_t>({int64_t{1} << 40, int64_t{1} << 24}), std::nullopt);
  EXPECT_EQ(CheckedProduct<int64_t>({int64_t{1} << 40, int64_t{1} << 22}), int64_t{1} << 62);
  EXPECT_EQ(CheckedAdd<uint64_t>(~uint64_t{0} - 8191, 8208), std::nullopt);
}

TEST(ModelConfigTest, MaxPositionEmbeddingsDefaultsAndRoundTrips) {
  auto config = ParseModelConfig(TinyConfigJson().dump());
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->max_position_embeddings, kDefaultMaxPositionEmbeddings);
  nlohmann::json json = TinyConfigJson();
  json["max_position_embeddings"] = 4096;
  config = ParseModelConfig(json.dump());
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(ParseModelConfig(ModelConfigToJson(*config))->max_position_embeddings, 4096);
}

TEST(ModelConfigTest, RejectsTextThatIsNotAJsonObject) {
  for (const char* bad : {"", "[1,2]", "{\"vocab_size\": ", "null"}) {
    auto config = ParseModelConfig(bad);
    ASSERT_FALSE(config.ok()) << bad;
    EXPECT_THAT(config.status().message(), HasSubstr("not a JSON object"));
  }
}

TEST(ModelConfigTest, MissingFileIsNotFound) {
  auto config = LoadModelConfig("/nonexistent/config.json");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(config.status().message(), HasSubstr("/nonexistent/config.json"));
}

}  // namespace
}  // namespace baton
