#include "baton/common/connection_slots.h"

#include <algorithm>
#include <optional>
#include <boost/asio/ip/address.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace baton {
namespace {

// An address as 16 bytes (IPv4 as IPv4-mapped IPv6), or nullopt when it does not parse.
std::optional<std::array<uint8_t, 16>> Bytes(std::string_view text) {
  namespace ip = boost::asio::ip;
  boost::system::error_code ec;
  const ip::address address = ip::make_address(std::string(text), ec);
  if (ec) return std::nullopt;
  const ip::address_v6 v6 =
      address.is_v4() ? ip::make_address_v6(ip::v4_mapped, address.to_v4()) : address.to_v6();
  const ip::address_v6::bytes_type bytes = v6.to_bytes();
  std::array<uint8_t, 16> out;
  std::copy(bytes.begin(), bytes.end(), out.begin());
  return out;
}

bool SamePrefix(const std::array<uint8_t, 16>& a, const std::array<uint8_t, 16>& b, int bits) {
  for (int i = 0; i < 16 && bits > 0; ++i, bits -= 8) {
    const uint8_t mask = bits >= 8 ? 0xff : static_cast<uint8_t>(0xff << (8 - bits));
    if ((a[i] & mask) != (b[i] & mask)) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<TrustedProxies> TrustedProxies::Parse(const std::vector<std::string>& networks,
                                                     const std::string& flag) {
  TrustedProxies proxies;
  for (const std::string& entry : networks) {
    const std::string text(absl::StripAsciiWhitespace(entry));
    const size_t slash = text.find('/');
    const std::string address = text.substr(0, slash);
    const std::optional<std::array<uint8_t, 16>> bytes = Bytes(address);
    const bool v4 = address.find(':') == std::string::npos;
    int prefix = v4 ? 32 : 128;
    if (!bytes || (slash != std::string::npos &&
                   (!absl::SimpleAtoi(text.substr(slash + 1), &prefix) || prefix < 0 ||
                    prefix > (v4 ? 32 : 128)))) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": '", entry, "' is not a network: ADDRESS or ADDRESS/PREFIX, e.g. 10.0.0.0/8 or "
          "fd00::/8 (a prefix of 0 to 32 for IPv4, 0 to 128 for IPv6)"));
    }
    proxies.networks_.push_back({.bytes = *bytes, .prefix = v4 ? 96 + prefix : prefix});
  }
  return proxies;
}

bool TrustedProxies::Contains(std::string_view address) const {
  const std::optional<std::array<uint8_t, 16>> bytes = Bytes(address);
  if (!bytes) return false;
  return std::any_of(networks_.begin(), networks_.end(), [&](const Network& network) {
    return SamePrefix(*bytes, network.bytes, network.prefix);
  });
}

std::string TrustedProxies::ClientOf(std::string_view peer,
                                     const std::string* forwarded_for) const {
  if (forwarded_for == nullptr) return std::string(peer);
  const std::vector<absl::string_view> hops = absl::StrSplit(*forwarded_for, ',');
  for (auto hop = hops.rbegin(); hop != hops.rend(); ++hop) {
    absl::string_view address = absl::StripAsciiWhitespace(*hop);
    // "[2001:db8::1]" and "[2001:db8::1]:443" as some proxies write them; "192.0.2.1:443" too.
    if (absl::ConsumePrefix(&address, "[")) {
      address = address.substr(0, address.find(']'));
    } else if (std::count(address.begin(), address.end(), ':') == 1) {
      address = address.substr(0, address.find(':'));
    }
    const std::string text(address);
    if (!Bytes(text)) return std::string(peer);
    if (!Contains(text)) return text;
  }
  return std::string(peer);
}

std::string ClientGroup(std::string_view address, int ipv4_prefix_length) {
  namespace ip = boost::asio::ip;
  boost::system::error_code ec;
  ip::address parsed = ip::make_address(std::string(address), ec);
  if (ec) return std::string(address);
  if (parsed.is_v6() && parsed.to_v6().is_v4_mapped()) {
    parsed = ip::make_address_v4(ip::v4_mapped, parsed.to_v6());
  }
  if (parsed.is_v4()) {
    const int bits = std::clamp(ipv4_prefix_length, 0, 32);
    const uint32_t mask = bits == 0 ? 0 : ~uint32_t{0} << (32 - bits);
    const ip::address_v4 network(parsed.to_v4().to_uint() & mask);
    return absl::StrCat(network.to_string(), "/", bits);
  }
  ip::address_v6::bytes_type bytes = parsed.to_v6().to_bytes();
  std::fill(bytes.begin() + 8, bytes.end(), 0);  // the interface identifier
  return absl::StrCat(ip::address_v6(bytes).to_string(), "/64");
}

bool ConnectionSlots::Admit(const std::string& group, Clock::time_point now, bool proxy) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = per_group_.find(group);
  const int from_group = it == per_group_.end() ? 0 : it->second;
  if (from_group >= caps_.max_per_client && !proxy) return false;
  const int open_to_all =
      caps_.max_connections - std::clamp(caps_.reserved, 0, caps_.max_connections);
  if (open_ >= caps_.max_connections ||
      (open_ >= open_to_all && !proxy && !TrustedLocked(group, now))) {
    return false;
  }
  ++open_;
  ++per_group_[group];
  return true;
}

void ConnectionSlots::Leave(const std::string& group) {
  std::lock_guard<std::mutex> lock(mutex_);
  --open_;
  if (auto it = per_group_.find(group); it != per_group_.end() && --it->second <= 0) {
    per_group_.erase(it);
  }
}

void ConnectionSlots::Trust(const std::string& group, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = trusted_.find(group); it != trusted_.end()) {
    it->second = now;
    return;
  }
  // Full: the expired go, then (a rare O(n) scan) the one least recently seen.
  if (trusted_.size() >= static_cast<size_t>(std::max(1, caps_.max_connections))) {
    std::erase_if(trusted_,
                  [&](const auto& entry) { return now - entry.second > caps_.trust_for; });
  }
  if (trusted_.size() >= static_cast<size_t>(std::max(1, caps_.max_connections))) {
    trusted_.erase(
        std::min_element(trusted_.begin(), trusted_.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; }));
  }
  trusted_[group] = now;
}

int ConnectionSlots::open() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return open_;
}

bool ConnectionSlots::TrustedLocked(const std::string& group, Clock::time_point now) const {
  const auto it = trusted_.find(group);
  return it != trusted_.end() && now - it->second <= caps_.trust_for;
}

}  // namespace baton
