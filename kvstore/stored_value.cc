#include "baton/kvstore/stored_value.h"

#include <cstring>

#include "baton/common/checksum.h"

namespace baton::kvstore {
namespace {

constexpr char kMagic[4] = {'B', 'T', 'K', 'V'};
// 2: the checksum covers the key and the whole value (1 covered the payload only, so a value
// copied under another key, or given another parent, still passed).
constexpr uint32_t kFormatVersion = 2;
constexpr size_t kParentFlagOffset = 40, kParentOffset = 41, kLengthOffset = 81;
static_assert(kValueHeaderBytes == 89 && kValueChecksumOffset == 73 &&
                  kLengthOffset == kValueChecksumOffset + 8,
              "the value header layout of Encode and Decode");

template <typename T>
void Append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// The checksum field of the value stored under `key` (see the header comment).
uint64_t ValueChecksum(const Sha256Digest& key, std::string_view value) {
  return ChecksumParts({std::string_view(reinterpret_cast<const char*>(key.data()), key.size()),
                        value.substr(0, kValueChecksumOffset),
                        value.substr(kValueChecksumOffset + 8)});
}

}  // namespace

std::optional<size_t> FirstNonFinite(std::string_view payload) {
  for (size_t i = 0; i + 4 <= payload.size(); i += 4) {
    uint32_t bits;
    std::memcpy(&bits, payload.data() + i, 4);
    if ((bits & 0x7f800000u) == 0x7f800000u) return i / 4;
  }
  return std::nullopt;
}

ValueCodec::ValueCodec(std::string_view model_fingerprint, uint64_t block_kv_payload_bytes,
                       uint64_t producer_swa_payload_bytes)
    : fingerprint_digest_(Sha256Of(model_fingerprint.data(), model_fingerprint.size())),
      block_kv_payload_bytes_(block_kv_payload_bytes),
      producer_swa_payload_bytes_(producer_swa_payload_bytes) {}

Sha256Digest ValueCodec::ModelDigest(std::string_view model_fingerprint) {
  return Sha256Of(model_fingerprint.data(), model_fingerprint.size());
}

std::optional<Sha256Digest> ValueCodec::ModelOf(std::string_view value) {
  if (value.size() < kValueHeaderBytes) return std::nullopt;
  Sha256Digest model;
  std::memcpy(model.data(), value.data() + 8, 32);
  return model;
}

uint64_t ValueCodec::payload_bytes(Region region) const {
  return region == Region::kBlockKv ? block_kv_payload_bytes_ : producer_swa_payload_bytes_;
}

std::string ValueCodec::Encode(const Sha256Digest& key, const std::optional<Sha256Digest>& parent,
                               std::string_view payload) const {
  return Encode(key, parent, payload, fingerprint_digest_);
}

std::string ValueCodec::Encode(const Sha256Digest& key, const std::optional<Sha256Digest>& parent,
                               std::string_view payload, const Sha256Digest& model) const {
  std::string value;
  value.reserve(kValueHeaderBytes + payload.size());
  value.append(kMagic, 4);
  Append(value, kFormatVersion);
  value.append(reinterpret_cast<const char*>(model.data()), 32);
  value.push_back(parent.has_value() ? 1 : 0);
  const Sha256Digest none{};
  const Sha256Digest& p = parent.has_value() ? *parent : none;
  value.append(reinterpret_cast<const char*>(p.data()), 32);
  Append(value, uint64_t{0});  // the checksum, filled in below once the value is whole
  Append(value, static_cast<uint64_t>(payload.size()));
  value.append(payload);
  const uint64_t checksum = ValueChecksum(key, value);
  std::memcpy(value.data() + kValueChecksumOffset, &checksum, 8);
  return value;
}

bool ValueCodec::Decode(const Sha256Digest& key, Region region, std::string_view value,
                        std::string* payload, std::optional<Sha256Digest>* parent,
                        bool any_model) const {
  if (value.size() < kValueHeaderBytes || std::memcmp(value.data(), kMagic, 4) != 0) return false;
  uint32_t version;
  std::memcpy(&version, value.data() + 4, 4);
  if (version != kFormatVersion) return false;
  if (!any_model && std::memcmp(value.data() + 8, fingerprint_digest_.data(), 32) != 0) {
    return false;
  }
  // Only what Encode writes: the flag is 0 or 1, and a root's parent field is all zero.
  const uint8_t flag = static_cast<uint8_t>(value[kParentFlagOffset]);
  if (flag > 1) return false;
  Sha256Digest p;
  std::memcpy(p.data(), value.data() + kParentOffset, 32);
  if (flag == 0 && p != Sha256Digest{}) return false;
  if (flag == 1 && p == key) return false;  // would never be evicted (see PrefixStore::Write)
  uint64_t checksum, length;
  std::memcpy(&checksum, value.data() + kValueChecksumOffset, 8);
  std::memcpy(&length, value.data() + kLengthOffset, 8);
  if (length != value.size() - kValueHeaderBytes || length != payload_bytes(region)) return false;
  if (ValueChecksum(key, value) != checksum) return false;
  const std::string_view stored = value.substr(kValueHeaderBytes, length);
  if (FirstNonFinite(stored).has_value()) return false;
  if (payload != nullptr) payload->assign(stored);
  *parent = flag == 1 ? std::optional<Sha256Digest>(p) : std::nullopt;
  return true;
}

}  // namespace baton::kvstore
