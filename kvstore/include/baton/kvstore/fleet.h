// The prefix store as a fleet of store nodes (DESIGN section 5; docs/architecture.md, "The
// store as a fleet"): what the router's lookup and a prefill node's reads and write-back share
// besides placement (placement.h).
//
// - The live set travels as a v1::StoreFleet (node ids sorted, with addresses, and R): the
//   router sends the one it looked a prompt up against with the prefill, and CheckStoreFleet is
//   what a prefill node accepts of it.
// - KeysByOwner groups a chain's keys by the nodes that own them (every owner of every key),
//   so a lookup asks each owner once, in parallel, for only its keys; MergeProbes folds their
//   answers (a key is held when any owner holds it) into the ChainLookup the hit policy takes.
// - ReadOrder is the order in which a reader tries a key's owners: rotated by a counter, so
//   the reads of a hot prefix spread over its R owners.
// - StoreBreaker skips a store node that keeps failing or timing out for a while, and lets one
//   call through when the while is over (closed, open, half-open).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "baton/common/hash.h"
#include "baton/kvstore/prefix_index.h"
#include "baton/v1/kvstore.pb.h"

namespace baton::kvstore {

// Store nodes in one fleet, at most: a bound on what a StoreFleet from the wire may name.
inline constexpr size_t kMaxStoreNodes = 256;

// A StoreFleet a prefill node accepts: at most kMaxStoreNodes nodes, each with a node_id and an
// address within the wire bounds, ids distinct, and replication in [1, nodes] (0 with no
// nodes, the empty fleet). INVALID_ARGUMENT naming `field`'s part at fault, e.g.
// "stores.nodes[2].address".
absl::Status CheckStoreFleet(const v1::StoreFleet& fleet, absl::string_view field = "stores");

// The fleet's node ids, in its order.
std::vector<std::string> FleetIds(const v1::StoreFleet& fleet);

// For each node (by index in `node_ids`), the indexes of the keys it owns (Owners with
// `replication`), in chain order. Nodes that own none get an empty list.
std::vector<std::vector<size_t>> KeysByOwner(std::span<const Sha256Digest> keys,
                                             std::span<const std::string> node_ids,
                                             int replication);

// What one owner answered for its keys (`keys` indexes the chain; the response has one entry
// per key, or is ignored as a failed probe when its sizes differ).
struct OwnerProbe {
  std::span<const size_t> keys;
  const v1::ProbeResponse* response = nullptr;  // null: the probe failed
};

// The chain's lookup from its owners' probes: the leading blocks whose block KV some owner
// holds, and for each of them whether some owner holds its producer SWA rows.
ChainLookup MergeProbes(size_t chain_length, std::span<const OwnerProbe> probes);

// The order in which to try `key`'s owners (indexes in `node_ids`): its Owners, rotated left by
// `turn` modulo their count.
std::vector<size_t> ReadOrder(const Sha256Digest& key, std::span<const std::string> node_ids,
                              int replication, uint64_t turn);

// Per store node: after `failures_to_open` failures in a row the node is skipped for
// `open_for`; then one call goes through (half-open), and its result closes or reopens it.
// Thread-safe. It remembers only nodes with failures, at most kMaxStoreNodes * 4 of them.
class StoreBreaker {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    int failures_to_open = 3;
    std::chrono::milliseconds open_for{10000};
  };
  StoreBreaker() : StoreBreaker(Options{}) {}
  explicit StoreBreaker(Options options) : options_(options) {}

  // May a call go to `node_id` now? False while open, and while a half-open trial is out.
  bool Allow(const std::string& node_id, Clock::time_point now = Clock::now());
  // The call Allow let through ended: `ok` closes the breaker, a failure counts toward opening.
  void Record(const std::string& node_id, bool ok, Clock::time_point now = Clock::now());
  // The call Allow let through was not made after all: a half-open trial is free again.
  void Cancel(const std::string& node_id);
  // Is `node_id` skipped now (open, before its trial)? No side effect.
  bool IsOpen(const std::string& node_id, Clock::time_point now = Clock::now()) const;
  // How many nodes are open (skipped) now, and how many times one opened since the start.
  size_t open(Clock::time_point now = Clock::now()) const;
  uint64_t trips() const;

 private:
  struct State {
    int failures = 0;
    Clock::time_point open_until{};  // past: closed or half-open
    bool trial = false;              // a half-open call is out
  };
  Options options_;
  mutable std::mutex mutex_;
  std::map<std::string, State> nodes_;
  uint64_t trips_ = 0;
};

}  // namespace baton::kvstore
