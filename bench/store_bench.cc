// Prefix-store throughput: writes then reads N blocks of each stored region with the value
// sizes of a model's 64-position (B) blocks, through PrefixStore on RocksDB in a temp folder.
//
//   baton_store_bench --model DIR [--blocks 512] [--dir /tmp/...]
#include <chrono>
#include <filesystem>
#include <iostream>

#include "CLI/CLI.hpp"
#include "baton/kvstore/chain.h"
#include "baton/kvstore/prefix_store.h"
#include "baton/model/state.h"
#include "baton/model/weights.h"
#include "nlohmann/json.hpp"

int main(int argc, char** argv) {
  CLI::App app{"baton prefix-store throughput"};
  std::string model_dir, dir = "/tmp/baton_store_bench";
  int blocks = 512;
  app.add_option("--model", model_dir, "Model directory (sets the value sizes)")->required();
  app.add_option("--blocks", blocks, "Blocks per region");
  app.add_option("--dir", dir, "Scratch folder (removed first)");
  CLI11_PARSE(app, argc, argv);
  auto config = baton::LoadModelConfig(model_dir + "/config.json");
  auto fingerprint = baton::model::ModelFingerprint(model_dir);
  if (!config.ok() || !fingerprint.ok()) return 2;
  const auto layout = baton::model::StateLayout::For(*config);
  const size_t sizes[2] = {sizeof(float) * layout.page_floats(),
                           sizeof(float) * layout.stored_swa_block_floats()};
  std::filesystem::remove_all(dir);
  auto store = baton::kvstore::PrefixStore::Open({.path = dir,
                                                  .model_fingerprint = *fingerprint,
                                                  .block_kv_payload_bytes = sizes[0],
                                                  .producer_swa_payload_bytes = sizes[1]});
  if (!store.ok()) return 1;
  std::vector<int32_t> tokens(static_cast<size_t>(blocks) * layout.block_size);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 4000);
  const auto chain =
      baton::kvstore::ChainKeys(*fingerprint, "", "bench", tokens, layout.block_size);
  nlohmann::json out;
  out["block_size"] = layout.block_size;
  for (int r = 0; r < 2; ++r) {
    const auto region = static_cast<baton::kvstore::Region>(r);
    const std::string payload(sizes[r], 'x');
    auto start = std::chrono::steady_clock::now();
    for (size_t b = 0; b < chain.size(); ++b) {
      const std::optional<baton::Sha256Digest> parent =
          b > 0 ? std::optional<baton::Sha256Digest>(chain[b - 1]) : std::nullopt;
      if (!(*store)->Write(chain[b], parent, region, payload).ok()) return 1;
    }
    const double write_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    start = std::chrono::steady_clock::now();
    for (const auto& key : chain) {
      if (!(*store)->Read(key, region).ok()) return 1;
    }
    const double read_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double mib = static_cast<double>(sizes[r]) * chain.size() / (1 << 20);
    out[r == 0 ? "block_kv" : "producer_swa"] = {{"value_bytes", sizes[r]},
                                                 {"blocks", chain.size()},
                                                 {"write_mib_per_s", mib / write_s},
                                                 {"read_mib_per_s", mib / read_s}};
  }
  std::cout << out.dump(2) << "\n";
  store->reset();
  std::filesystem::remove_all(dir);
  return 0;
}
