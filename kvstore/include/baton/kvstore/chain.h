// Prefix-store chain keys (DESIGN section 5): k_{-1} = SHA-256(model fingerprint || tenant ||
// cache_salt), k_b = SHA-256(k_{b-1} || tokens of block b as little-endian int32). A key names a
// block together with everything before it, so equal keys mean equal prefixes. The tenant comes
// from the client's API key (never from the request body) and enters as its length (uint32 LE)
// then its bytes, or not at all when empty (no API keys configured); the client's salt isolates
// further within a tenant and can never stand in for another tenant.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "baton/common/hash.h"

namespace baton::kvstore {

// One key per full block of `tokens` (a trailing partial block has none).
std::vector<Sha256Digest> ChainKeys(absl::string_view model_fingerprint, absl::string_view tenant,
                                    absl::string_view cache_salt, std::span<const int32_t> tokens,
                                    int64_t block_size);

inline std::string KeyBytes(const Sha256Digest& key) {
  return std::string(reinterpret_cast<const char*>(key.data()), key.size());
}

}  // namespace baton::kvstore
