// The router's --api-keys file: any YAML is accepted as key -> tenant or refused by entry.
#include <cstddef>
#include <cstdint>
#include <string>

#include "baton/common/api_keys.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)baton::ApiKeys::Parse(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  return 0;
}
