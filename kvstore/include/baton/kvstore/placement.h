// Where a stored value lives in a fleet of store nodes: rendezvous (highest-random-weight)
// hashing of its chain key. Each value (a block's block KV, a block's producer SWA rows, both
// named by the block's chain key) has R owners among the N live store nodes: the R nodes whose
// weight hash(key, node id) is highest. A node that joins takes from each other node only the
// values it now outweighs (about 1/(N+1) of them); a node that leaves moves only the values it
// owned, each to the node that ranked next. Every component that places or finds a value (the
// router's lookup, a prefill node's reads and write-back, `batonctl simulate`) calls Owners:
// one home for the rule, so they never disagree.
//
// Weights depend only on the key's bytes and the node's id (its registered node id, which a
// restarted store pod keeps), never on the order or count of the nodes: every caller that
// knows the same live set computes the same owners. Pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "baton/common/hash.h"

namespace baton::kvstore {

// The weight of `node_id` for `key`: 64 well-mixed bits of both.
uint64_t PlacementWeight(const Sha256Digest& key, std::string_view node_id);

// The indexes in `node_ids` of `key`'s owners, the highest weight first: min(replication,
// node_ids.size()) of them (none for an empty fleet). Ties, which need equal 64-bit weights,
// go to the smaller id. replication < 1 is taken as 1.
std::vector<size_t> Owners(const Sha256Digest& key, std::span<const std::string> node_ids,
                           int replication);

}  // namespace baton::kvstore
