// SHA-256 (OpenSSL) for model fingerprints, prefix-store chain keys and region checksums.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace baton {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental hashing; Finish() may be called once.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t size);
  void Update(absl::string_view text) { Update(text.data(), text.size()); }
  Sha256Digest Finish();

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

Sha256Digest Sha256Of(const void* data, size_t size);
std::string HexDigest(const Sha256Digest& digest);

}  // namespace baton
