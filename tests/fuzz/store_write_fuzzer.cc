// The prefix store's write path as WriteBlocks runs it (KvStoreService::Write: key, parent,
// region and model checked as wire values, then the store's payload and chain checks) with any
// BlockWrite, against a real RocksDB store with a small budget. Whatever the bytes, the answer
// is a status, the store never holds more than its budget, and a write it took is found by a
// probe and read back for its own model.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>

#include "baton/kvstore/kvstore_service.h"

namespace {

constexpr uint64_t kBudget = 64 << 10;
baton::kvstore::PrefixStore* store = nullptr;
baton::kvstore::KvStoreService* service = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                          "/baton_fuzz_store_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  auto opened = baton::kvstore::PrefixStore::Open({.path = dir,
                                                   .model_fingerprint = "00ff",
                                                   .budget_bytes = kBudget,
                                                   .block_kv_payload_bytes = 64,
                                                   .producer_swa_payload_bytes = 32});
  if (!opened.ok()) std::abort();
  store = opened->release();
  service = new baton::kvstore::KvStoreService(*store, 1024);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  baton::v1::BlockWrite write;
  if (!write.ParseFromArray(data, static_cast<int>(size))) return 0;
  const bool written = service->Write(write).ok();
  if (store->counters().stored_bytes > kBudget) std::abort();  // over its budget
  if (!written) return 0;
  // What was just taken is found, by a probe and by a read for its own model.
  baton::Sha256Digest key;
  std::memcpy(key.data(), write.key().data(), key.size());
  const baton::kvstore::Region region = write.region() == baton::v1::STORE_REGION_BLOCK_KV
                                            ? baton::kvstore::Region::kBlockKv
                                            : baton::kvstore::Region::kProducerSwa;
  const auto held = store->Probe(std::span<const baton::Sha256Digest>(&key, 1));
  if (!(region == baton::kvstore::Region::kBlockKv ? held[0].block_kv : held[0].producer_swa)) {
    std::abort();
  }
  if (!store->Read(key, region, write.model_fingerprint()).ok()) std::abort();
  return 0;
}
