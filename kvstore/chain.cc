#include "baton/kvstore/chain.h"

namespace baton::kvstore {

std::vector<Sha256Digest> ChainKeys(absl::string_view model_fingerprint, absl::string_view tenant,
                                    absl::string_view cache_salt, std::span<const int32_t> tokens,
                                    int64_t block_size) {
  Sha256 root;
  root.Update(model_fingerprint);
  if (!tenant.empty()) {
    // Length-prefixed, so that no (tenant, salt) pair can spell another's.
    const uint32_t n = static_cast<uint32_t>(tenant.size());
    const uint8_t le[4] = {static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8),
                           static_cast<uint8_t>(n >> 16), static_cast<uint8_t>(n >> 24)};
    root.Update(le, 4);
    root.Update(tenant);
  }
  root.Update(cache_salt);
  Sha256Digest previous = root.Finish();
  std::vector<Sha256Digest> keys;
  const int64_t blocks = static_cast<int64_t>(tokens.size()) / block_size;
  for (int64_t b = 0; b < blocks; ++b) {
    Sha256 hash;
    hash.Update(previous.data(), previous.size());
    for (int64_t i = b * block_size; i < (b + 1) * block_size; ++i) {
      const uint32_t v = static_cast<uint32_t>(tokens[i]);
      const uint8_t le[4] = {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8),
                             static_cast<uint8_t>(v >> 16), static_cast<uint8_t>(v >> 24)};
      hash.Update(le, 4);
    }
    previous = hash.Finish();
    keys.push_back(previous);
  }
  return keys;
}

}  // namespace baton::kvstore
