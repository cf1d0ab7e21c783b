#include "baton/common/connection_slots.h"

#include <algorithm>
#include <boost/asio/ip/address.hpp>

#include "absl/strings/str_cat.h"

namespace baton {

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

bool ConnectionSlots::Admit(const std::string& group, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = per_group_.find(group);
  const int from_group = it == per_group_.end() ? 0 : it->second;
  if (from_group >= caps_.max_per_client) return false;
  const int open_to_all =
      caps_.max_connections - std::clamp(caps_.reserved, 0, caps_.max_connections);
  if (open_ >= caps_.max_connections || (open_ >= open_to_all && !TrustedLocked(group, now))) {
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
