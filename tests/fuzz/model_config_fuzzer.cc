// config.json: any text is parsed and validated or refused with a message; never a crash,
// and an accepted config's sizes multiply without overflow.
#include <cstddef>
#include <cstdint>

#include "baton/common/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::StatusOr<baton::ModelConfig> config =
      baton::ParseModelConfig(absl::string_view(reinterpret_cast<const char*>(data), size));
  if (config.ok()) (void)config->ring_capacity();
  return 0;
}
