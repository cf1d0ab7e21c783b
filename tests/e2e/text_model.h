// The model the HTTP tests serve: tiny, with the default tokenizer's vocabulary (4,096 pieces)
// and its tokenizer files (BATON_TOKENIZER_DIR, which scripts/setup.sh trains), made once per
// test process.
#pragma once

#include <filesystem>
#include <string>

#include "baton/model/model_factory.h"
#include "gtest/gtest.h"
#include "test_dir.h"

namespace baton::testing {

inline const std::string& TextModel() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    const std::string d = ProcessTempDir() + "/tiny-text";
    absl::StatusOr<ModelConfig> config = model::PresetConfig("tiny");
    config->vocab_size = 4096;
    EXPECT_TRUE(model::MakeModel(*config, 3, d).ok());
    for (const char* file :
         {"tokenizer.model", "tokenizer_config.json", "generation_config.json"}) {
      fs::copy_file(fs::path(BATON_TOKENIZER_DIR) / file, fs::path(d) / file);
    }
    return d;
  }();
  return dir;
}

}  // namespace baton::testing
