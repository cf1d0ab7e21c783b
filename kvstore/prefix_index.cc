#include "baton/kvstore/prefix_index.h"

#include <cassert>

namespace baton::kvstore {

ChainLookup PrefixIndex::Lookup(std::span<const Sha256Digest> chain) {
  ChainLookup result;
  for (const Sha256Digest& key : chain) {
    auto it = nodes_.find(key);
    if (it == nodes_.end() || it->second.bytes[0] == 0) break;
    result.swa_present.push_back(it->second.bytes[1] != 0);
    ++result.block_kv_blocks;
    Touch(key);
  }
  return result;
}

bool PrefixIndex::Contains(const Sha256Digest& key, Region region) const {
  auto it = nodes_.find(key);
  return it != nodes_.end() && it->second.bytes[static_cast<int>(region)] != 0;
}

void PrefixIndex::Add(const Sha256Digest& key, const std::optional<Sha256Digest>& parent,
                      Region region, uint64_t bytes) {
  assert(bytes > 0);  // a size of 0 means "absent" in Node::bytes
  auto [it, inserted] = nodes_.try_emplace(key);
  Node& node = it->second;
  if (inserted) {
    node.parent = parent;
    node.last_used = ++clock_;
    if (auto waiting = waiting_children_.find(key); waiting != waiting_children_.end()) {
      node.children = waiting->second;
      waiting_children_.erase(waiting);
    }
    if (parent.has_value()) {
      auto p = nodes_.find(*parent);
      if (p == nodes_.end()) {
        ++waiting_children_[*parent];
      } else if (p->second.children++ == 0) {
        leaves_.erase({p->second.last_used, *parent});
      }
    }
    if (node.children == 0) leaves_.insert({node.last_used, key});
  }
  const int r = static_cast<int>(region);
  stored_bytes_ += bytes - node.bytes[r];
  if (node.bytes[r] == 0) ++values_[r];
  node.bytes[r] = bytes;
}

void PrefixIndex::Remove(const Sha256Digest& key, Region region) {
  auto it = nodes_.find(key);
  if (it == nodes_.end()) return;
  Node& node = it->second;
  const int r = static_cast<int>(region);
  if (node.bytes[r] == 0) return;
  stored_bytes_ -= node.bytes[r];
  --values_[r];
  node.bytes[r] = 0;
  if (node.bytes[0] != 0 || node.bytes[1] != 0) return;
  // The node goes. Its children (possible only when a value was dropped out of order, e.g. as
  // corrupt) wait for it to come back; its parent loses a child.
  if (node.children == 0) {
    leaves_.erase({node.last_used, key});
  } else {
    waiting_children_[key] = node.children;
  }
  if (node.parent.has_value()) {
    auto p = nodes_.find(*node.parent);
    if (p != nodes_.end()) {
      if (--p->second.children == 0) leaves_.insert({p->second.last_used, *node.parent});
    } else if (auto waiting = waiting_children_.find(*node.parent);
               waiting != waiting_children_.end() && --waiting->second == 0) {
      waiting_children_.erase(waiting);
    }
  }
  nodes_.erase(it);
}

void PrefixIndex::Touch(const Sha256Digest& key) {
  auto it = nodes_.find(key);
  if (it == nodes_.end()) return;
  Node& node = it->second;
  const bool leaf = node.children == 0;
  if (leaf) leaves_.erase({node.last_used, key});
  node.last_used = ++clock_;
  if (leaf) leaves_.insert({node.last_used, key});
}

uint64_t PrefixIndex::EvictToBudget(uint64_t budget_bytes, const EvictFn& on_evict) {
  uint64_t evicted = 0;
  while (stored_bytes_ > budget_bytes && !leaves_.empty()) {
    const Sha256Digest key = leaves_.begin()->second;
    const Node& node = nodes_.at(key);
    const Region region = node.bytes[1] != 0 ? Region::kProducerSwa : Region::kBlockKv;
    const uint64_t bytes = node.bytes[static_cast<int>(region)];
    Remove(key, region);
    ++evicted;
    if (on_evict) on_evict(key, region, bytes);
  }
  return evicted;
}

}  // namespace baton::kvstore
