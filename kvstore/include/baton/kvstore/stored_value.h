// One stored value of the prefix store (DESIGN section 5): the value format and its checks,
// apart from RocksDB so that they can be tested and fuzzed on their own.
//
// Layout: magic "BTKV" (4), format version (4), digest of the model fingerprint (32),
// has-parent flag (1), parent key (32), checksum (8), payload length (8), then the payload.
// The checksum is XXH3-64 of the key followed by every byte of the value except the checksum
// field, so a value copied under another key, or given another parent, fails.
//
// A value decodes only when every check passes: magic, version and fingerprint; a parent
// different from its key; a payload of exactly one block of its region for the model; every
// float32 of it finite (block KV and SWA rows are activations: a NaN would poison every request
// that loads it); the checksum.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "baton/common/hash.h"
#include "baton/kvstore/prefix_index.h"

namespace baton::kvstore {

// Bytes a stored value takes beyond its payload, and where its checksum field lies.
inline constexpr uint64_t kValueHeaderBytes = 4 + 4 + 32 + 1 + 32 + 8 + 8;
inline constexpr uint64_t kValueChecksumOffset = 4 + 4 + 32 + 1 + 32;

// The size a payload of `payload_bytes` takes in the store, the unit of the budget.
constexpr uint64_t StoredValueBytes(uint64_t payload_bytes) {
  return kValueHeaderBytes + payload_bytes;
}

// Index of the first float32 of `payload` that is NaN or Inf, or nullopt when all are finite.
std::optional<size_t> FirstNonFinite(std::string_view payload);

// The values of one model's shape: its payload sizes, and the model whose values it makes and
// takes by default. Immutable; thread-safe.
class ValueCodec {
 public:
  // Payload sizes of one block per region (model::StateLayout: page_floats() and
  // stored_swa_block_floats() floats, as bytes).
  ValueCodec(std::string_view model_fingerprint, uint64_t block_kv_payload_bytes,
             uint64_t producer_swa_payload_bytes);

  // What a value's header carries for `model_fingerprint`.
  static Sha256Digest ModelDigest(std::string_view model_fingerprint);
  // The model digest in `value`'s header; nullopt when it is too short to have one.
  static std::optional<Sha256Digest> ModelOf(std::string_view value);

  uint64_t payload_bytes(Region region) const;
  const Sha256Digest& model_digest() const { return fingerprint_digest_; }
  // A value of this codec's model, or of `model` (a digest from ModelDigest).
  std::string Encode(const Sha256Digest& key, const std::optional<Sha256Digest>& parent,
                     std::string_view payload) const;
  std::string Encode(const Sha256Digest& key, const std::optional<Sha256Digest>& parent,
                     std::string_view payload, const Sha256Digest& model) const;
  // Checks the value stored under (key, region); on success sets its parent and, when
  // `payload` is given, its payload. False when any check fails. The value must be of this
  // codec's model, or with `any_model` of any (a store holding several models' values checks
  // each read against its reader's model instead).
  bool Decode(const Sha256Digest& key, Region region, std::string_view value, std::string* payload,
              std::optional<Sha256Digest>* parent, bool any_model = false) const;

 private:
  Sha256Digest fingerprint_digest_;
  uint64_t block_kv_payload_bytes_;
  uint64_t producer_swa_payload_bytes_;
};

}  // namespace baton::kvstore
