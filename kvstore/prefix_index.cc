#include "baton/kvstore/prefix_index.h"

#include <algorithm>
#include <cassert>

namespace baton::kvstore {

bool PrefixIndex::Current(const LeafEntry& entry) const {
  auto it = nodes_.find(entry.second);
  return it != nodes_.end() && it->second.children == 0 && it->second.last_used == entry.first;
}

void PrefixIndex::Compact() {
  if (used_.size() + orphaned_.size() < 2 * nodes_.size() + 1024) return;
  std::erase_if(used_, [&](const LeafEntry& e) { return !Current(e); });
  std::erase_if(orphaned_, [&](const LeafEntry& e) { return !Current(e); });
  std::make_heap(orphaned_.begin(), orphaned_.end(), Later{});
}

void PrefixIndex::Use(Node& node, const Sha256Digest& key) {
  node.last_used = ++clock_;
  if (node.children != 0) return;
  Compact();
  used_.emplace_back(node.last_used, key);
}

void PrefixIndex::Orphaned(const Node& node, const Sha256Digest& key) {
  Compact();
  orphaned_.emplace_back(node.last_used, key);
  std::push_heap(orphaned_.begin(), orphaned_.end(), Later{});
}

const PrefixIndex::LeafEntry* PrefixIndex::OldestLeaf() {
  while (!used_.empty() && !Current(used_.front())) used_.pop_front();
  while (!orphaned_.empty() && !Current(orphaned_.front())) {
    std::pop_heap(orphaned_.begin(), orphaned_.end(), Later{});
    orphaned_.pop_back();
  }
  if (used_.empty()) return orphaned_.empty() ? nullptr : &orphaned_.front();
  if (orphaned_.empty() || used_.front().first < orphaned_.front().first) return &used_.front();
  return &orphaned_.front();
}

ChainLookup PrefixIndex::Lookup(std::span<const Sha256Digest> chain) {
  const ChainLookup result = Peek(chain);
  // In chain order, as used: a second probe of keys just probed (in cache by now).
  for (int64_t b = 0; b < result.block_kv_blocks; ++b) Touch(chain[static_cast<size_t>(b)]);
  return result;
}

ChainLookup PrefixIndex::Peek(std::span<const Sha256Digest> chain) const {
  ChainLookup result;
  for (const Sha256Digest& key : chain) {
    auto it = nodes_.find(key);
    if (it == nodes_.end() || it->second.bytes[0] == 0) break;
    result.swa_present.push_back(it->second.bytes[1] != 0);
    ++result.block_kv_blocks;
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
  if (inserted) {
    Node& node = it->second;
    node.parent = parent;
    if (auto waiting = waiting_children_.find(key); waiting != waiting_children_.end()) {
      node.children = waiting->second;
      waiting_children_.erase(waiting);
    }
    if (parent.has_value()) {
      // The parent, having a child, is no leaf: its entries go stale where they are, but for
      // the newest, which a chain written block after block just put at the back of `used_`:
      // it goes now, so that eviction need not look it up to skip it.
      auto p = nodes_.find(*parent);
      if (p == nodes_.end()) {
        ++waiting_children_[*parent];
      } else if (p->second.children++ == 0 && !used_.empty() &&
                 used_.back().first == p->second.last_used) {
        used_.pop_back();
      }
    }
    Use(node, key);  // no insertion into nodes_ since try_emplace: `node` is still valid
  }
  Node& node = it->second;
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
  // The node goes (its leaf entry, if any, goes stale). Its children (possible only when a
  // value was dropped out of order, e.g. as corrupt) wait for it to come back; its parent
  // loses a child, and with its last one becomes a leaf at its own (older) recency.
  if (node.children != 0) waiting_children_[key] = node.children;
  const std::optional<Sha256Digest> parent = node.parent;
  nodes_.erase(it);
  if (parent.has_value()) {
    auto p = nodes_.find(*parent);
    if (p != nodes_.end()) {
      if (--p->second.children == 0) Orphaned(p->second, *parent);
    } else if (auto waiting = waiting_children_.find(*parent);
               waiting != waiting_children_.end() && --waiting->second == 0) {
      waiting_children_.erase(waiting);
    }
  }
}

void PrefixIndex::Touch(const Sha256Digest& key) {
  auto it = nodes_.find(key);
  if (it != nodes_.end()) Use(it->second, key);
}

bool PrefixIndex::TouchIfPresent(const Sha256Digest& key, Region region) {
  auto it = nodes_.find(key);
  if (it == nodes_.end() || it->second.bytes[static_cast<int>(region)] == 0) return false;
  Use(it->second, key);
  return true;
}

uint64_t PrefixIndex::EvictToBudget(uint64_t budget_bytes, const EvictFn& on_evict) {
  uint64_t evicted = 0;
  while (stored_bytes_ > budget_bytes) {
    const LeafEntry* oldest = OldestLeaf();
    if (oldest == nullptr) break;
    const Sha256Digest key = oldest->second;
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
