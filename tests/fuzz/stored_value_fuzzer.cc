// Prefix-store values as read back from RocksDB: any bytes decode or are refused (a miss); a
// value that decodes is exactly what Encode writes for its parent and payload, so nothing
// outside the format is ever accepted.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "baton/kvstore/stored_value.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using baton::kvstore::Region;
  // Small payloads (16 and 8 floats), so that the fuzzer can reach whole values.
  static const baton::kvstore::ValueCodec codec("fuzz-model", 64, 32);
  const baton::Sha256Digest key = baton::Sha256Of("key", 3);
  const std::string value(reinterpret_cast<const char*>(data), size);
  for (Region region : {Region::kBlockKv, Region::kProducerSwa}) {
    std::string payload;
    std::optional<baton::Sha256Digest> parent;
    if (codec.Decode(key, region, value, &payload, &parent) &&
        codec.Encode(key, parent, payload) != value) {
      std::abort();  // accepted a value Encode would not write
    }
  }
  return 0;
}
