// Cache-event batches as the router receives them with a prefill node's registration: any
// bytes parse or not, a batch is applied only when CheckCacheEvents passes, and the index then
// never holds more than its bound nor answers a lookup past the chain it is given. No input
// may crash, hang or leak.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "baton/router/cache_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  baton::v1::CacheEventBatch batch;
  if (!batch.ParseFromArray(data, static_cast<int>(size))) return 0;
  baton::router::CacheIndex index;
  if (!baton::router::CheckCacheEvents(batch).ok()) return 0;
  // Twice: a batch that follows itself is a gap unless it is a snapshot.
  index.Apply("node", batch);
  index.Apply("node", batch);
  if (index.blocks("node") > 2 * baton::router::kMaxIndexedBlocks) std::abort();
  std::vector<baton::Sha256Digest> chain;
  for (const baton::v1::CacheEvent& event : batch.events()) {
    for (const std::string& hash : event.block_stored().block_hashes()) {
      baton::Sha256Digest key;
      std::copy(hash.begin(), hash.end(), key.begin());  // checked: 32 bytes
      chain.push_back(key);
    }
  }
  const baton::kvstore::ChainLookup lookup = index.Lookup("node", chain);
  if (lookup.block_kv_blocks > static_cast<int64_t>(chain.size()) ||
      lookup.swa_present.size() != static_cast<size_t>(lookup.block_kv_blocks)) {
    std::abort();
  }
  return 0;
}
