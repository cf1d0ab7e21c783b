// The prefix store's write path as WriteBlocks runs it (KvStoreService::Write: key, parent and
// region checked as wire values, then the store's payload and chain checks) with any
// BlockWrite, against a real RocksDB store with a small budget. Whatever the bytes, the answer
// is a status, and the store never holds more than its budget.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

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
  (void)service->Write(write);
  if (store->counters().stored_bytes > kBudget) std::abort();  // over its budget
  return 0;
}
