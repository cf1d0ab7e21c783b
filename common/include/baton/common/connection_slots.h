// The connection slots of a listener that anyone may reach (the router's HTTP front, /metrics),
// shared out so that many source addresses cannot take them all:
//
// - clients are counted by group, not by address: an IPv4 address by its /N prefix (N
//   configurable, 32 by default), an IPv6 address by its /64, since whoever holds one IPv6
//   address usually holds its whole /64 (2^64 addresses); IPv4-mapped IPv6 addresses (a
//   dual-stack listener's IPv4 peers) count as IPv4;
// - one group holds at most `max_per_client` slots;
// - the last `reserved` of the `max_connections` slots go only to trusted groups: those that
//   sent a complete request that their server accepted (an authenticated one where there are
//   keys) within the last `trust_for`. Idle or unauthenticated connections therefore cannot
//   take the slots a known client needs; they are cut off by their server's head deadline.
//
// Thread-safe. The trusted set is bounded by `max_connections` groups (the oldest go first).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace baton {

struct ConnectionCaps {
  int max_connections = 4096;
  int max_per_client = 256;  // per client group
  int reserved = 512;        // of max_connections: for trusted groups only
  int ipv4_prefix_length = 32;
  std::chrono::seconds trust_for{600};
};

// The group a peer address is counted in: "192.0.2.0/24", "2001:db8:1:2::/64". An address
// that does not parse is a group of its own (itself).
std::string ClientGroup(std::string_view address, int ipv4_prefix_length);

// The proxies a front trusts to say who their clients are (an Ingress controller's or a
// Gateway's pods): networks such as "10.0.0.0/8" or "fd00::/8". Behind a proxy every client
// has the proxy's address, so counting by address would hold every client to one client's
// share; a connection from a trusted proxy is instead counted in no client's group, and each
// request on it is its X-Forwarded-For client's: the rightmost address of the header that is
// not itself a trusted proxy (the leftmost entries are whatever the client wrote). From any
// other peer the header is ignored.
class TrustedProxies {
 public:
  // `flag` names the setting in errors; each entry is ADDRESS/PREFIX or a bare address.
  static absl::StatusOr<TrustedProxies> Parse(const std::vector<std::string>& networks,
                                              const std::string& flag);
  bool empty() const { return networks_.empty(); }
  bool Contains(std::string_view address) const;
  // The client of a request that `peer` (a trusted proxy) forwarded with `forwarded_for` (the
  // X-Forwarded-For header, or nullptr): its rightmost address that is not a trusted proxy;
  // `peer` itself when the header is absent, names only proxies, or its candidate does not
  // parse as an address.
  std::string ClientOf(std::string_view peer, const std::string* forwarded_for) const;

 private:
  struct Network {
    std::array<uint8_t, 16> bytes{};  // IPv4 as IPv4-mapped IPv6
    int prefix = 0;                   // of the 128 bits
  };
  std::vector<Network> networks_;
};

class ConnectionSlots {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ConnectionSlots(ConnectionCaps caps) : caps_(caps) {}

  // Takes a slot for a connection from `group`; false (take nothing) when the caps say no. A
  // trusted proxy's connection (`proxy`) is held to the total alone: it carries many clients.
  bool Admit(const std::string& group, Clock::time_point now = Clock::now(), bool proxy = false);
  // Gives back a slot Admit took.
  void Leave(const std::string& group);
  // `group` sent a request its server accepted: it may use the reserved slots until
  // `trust_for` after its last such request.
  void Trust(const std::string& group, Clock::time_point now = Clock::now());
  int open() const;

 private:
  bool TrustedLocked(const std::string& group, Clock::time_point now) const;

  const ConnectionCaps caps_;
  mutable std::mutex mutex_;
  int open_ = 0;
  std::map<std::string, int> per_group_;              // no zeros
  std::map<std::string, Clock::time_point> trusted_;  // group -> last accepted request
};

}  // namespace baton
