// config.json: any text is parsed and validated or refused with a message; never a crash,
// an accepted config's sizes multiply without overflow, and its block_kv_sources map every
// consumer layer to a group that exists.
#include <cstddef>
#include <cstdint>

#include "baton/common/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::StatusOr<baton::ModelConfig> config =
      baton::ParseModelConfig(absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!config.ok()) return 0;
  (void)config->ring_capacity();
  // Every consumer layer reads a block-KV group that exists, and the sources own their groups.
  const int64_t groups = config->num_block_kv_groups();
  for (int64_t l = config->n_prefill_layer; l < config->num_hidden_layers; ++l) {
    const int64_t group = config->block_kv_group(l);
    if (group < 0 || group >= groups) __builtin_trap();
    if (config->is_block_kv_source(l) && group > 0 && config->block_kv_group(l - 1) != group - 1) {
      __builtin_trap();
    }
  }
  return 0;
}
