#include "baton/kvstore/placement.h"

#include <xxhash.h>

#include <algorithm>
#include <numeric>

namespace baton::kvstore {

uint64_t PlacementWeight(const Sha256Digest& key, std::string_view node_id) {
  // The node's id seeds a hash of the key: for one key, the weights of different nodes are
  // independent draws, which is what makes every node equally likely to rank first.
  const uint64_t seed = XXH3_64bits(node_id.data(), node_id.size());
  return XXH3_64bits_withSeed(key.data(), key.size(), seed);
}

std::vector<size_t> Owners(const Sha256Digest& key, std::span<const std::string> node_ids,
                           int replication) {
  if (node_ids.size() == 1) return {0};  // a store of one node owns every key
  const size_t r = std::min<size_t>(static_cast<size_t>(std::max(replication, 1)), node_ids.size());
  std::vector<uint64_t> weight(node_ids.size());
  for (size_t i = 0; i < node_ids.size(); ++i) weight[i] = PlacementWeight(key, node_ids[i]);
  std::vector<size_t> order(node_ids.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto higher = [&](size_t a, size_t b) {
    return weight[a] != weight[b] ? weight[a] > weight[b] : node_ids[a] < node_ids[b];
  };
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(r), order.end(),
                    higher);
  order.resize(r);
  return order;
}

}  // namespace baton::kvstore
