// The prefix store under a crash, in the manner of RocksDB's db_stress: a child process writes
// chains of blocks with --sync-writes and reports each acknowledged write down a pipe; the test
// kills it with SIGKILL mid-burst, reopens the same folder, and checks that every acknowledged
// value is present and intact and that the rebuilt index equals what RocksDB holds. With a
// budget, evictions (deletes) run during the burst too. A process kill leaves the write-ahead
// log in the page cache, so this checks the store's recovery, not the fsync of --sync-writes
// (which only a machine crash tells apart).
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <vector>

#include "baton/common/hash.h"
#include "baton/kvstore/prefix_store.h"
#include "gtest/gtest.h"
#include "test_dir.h"

namespace baton::kvstore {
namespace {

constexpr uint64_t kBlockKvBytes = 256;
constexpr uint64_t kSwaBytes = 128;
constexpr int kChain = 8;  // blocks per chain; chains follow one another

Sha256Digest KeyOf(int block) { return Sha256Of(&block, sizeof(block)); }

std::string PayloadOf(int block, Region region) {
  std::string payload(region == Region::kBlockKv ? kBlockKvBytes : kSwaBytes, '\0');
  for (size_t i = 0; i < payload.size(); i += sizeof(float)) {
    const float value = static_cast<float>(block) + 0.25f * static_cast<float>(i);
    std::memcpy(payload.data() + i, &value, sizeof(float));
  }
  return payload;
}

StoreOptions Options(const std::string& dir, uint64_t budget) {
  return {.path = dir,
          .model_fingerprint = "00ff",
          .budget_bytes = budget,
          .block_kv_payload_bytes = kBlockKvBytes,
          .producer_swa_payload_bytes = kSwaBytes,
          .sync_writes = true};
}

// Runs a writer child until `acks` writes are acknowledged, kills it, and returns the blocks
// whose two writes were both acknowledged.
std::vector<int> CrashDuringBurst(const std::string& dir, uint64_t budget, int acks) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    auto store = PrefixStore::Open(Options(dir, budget));
    if (!store.ok()) _exit(3);
    for (int block = 0;; ++block) {
      const std::optional<Sha256Digest> parent =
          block % kChain == 0 ? std::nullopt : std::optional<Sha256Digest>(KeyOf(block - 1));
      for (Region region : {Region::kBlockKv, Region::kProducerSwa}) {
        if (!(*store)->Write(KeyOf(block), parent, region, PayloadOf(block, region)).ok()) {
          _exit(4);
        }
      }
      if (write(fds[1], &block, sizeof(block)) != sizeof(block)) _exit(5);
    }
  }
  close(fds[1]);
  std::vector<int> acknowledged;
  int block;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (static_cast<int>(acknowledged.size()) < acks && std::chrono::steady_clock::now() < until) {
    pollfd ready{.fd = fds[0], .events = POLLIN};
    if (poll(&ready, 1, 100) <= 0) continue;
    if (read(fds[0], &block, sizeof(block)) != sizeof(block)) break;  // the writer died
    acknowledged.push_back(block);
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status)) << "the writer stopped by itself: exit " << WEXITSTATUS(status);
  // Acknowledgements already in the pipe when it died count too.
  while (read(fds[0], &block, sizeof(block)) == sizeof(block)) acknowledged.push_back(block);
  close(fds[0]);
  return acknowledged;
}

// Both writers run (and die) before this process opens RocksDB itself, so neither child is
// forked from a process with RocksDB's threads.
TEST(StoreCrashTest, KillDuringAWriteBurstLosesNoAcknowledgedWriteAndKeepsTheIndexTrue) {
  const std::string dir = baton::testing::ProcessTempDir() + "/crash_store";
  const std::string budget_dir = baton::testing::ProcessTempDir() + "/crash_store_budget";
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(budget_dir);
  // Room for about 40 blocks: that burst evicts (deletes) all the while.
  const uint64_t budget =
      40 * (StoredValueBytes(kBlockKvBytes) + StoredValueBytes(kSwaBytes));
  const std::vector<int> acknowledged = CrashDuringBurst(dir, 0, 200);
  const std::vector<int> evicting = CrashDuringBurst(budget_dir, budget, 200);
  ASSERT_GE(acknowledged.size(), 200u);
  ASSERT_GE(evicting.size(), 200u);

  // Without a budget every acknowledged block is there, byte for byte.
  auto store = PrefixStore::Open(Options(dir, 0));
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->Verify().ok()) << (*store)->Verify();
  for (int block : acknowledged) {
    for (Region region : {Region::kBlockKv, Region::kProducerSwa}) {
      absl::StatusOr<std::string> payload = (*store)->Read(KeyOf(block), region);
      ASSERT_TRUE(payload.ok()) << "block " << block << ": " << payload.status();
      EXPECT_EQ(*payload, PayloadOf(block, region)) << "block " << block;
    }
  }
  EXPECT_GE((*store)->counters().block_kv_values, acknowledged.size());
  EXPECT_EQ((*store)->counters().corrupt_values, 0u);

  // Killed between writes and their evictions: the reopened index equals RocksDB, within
  // budget, and what it holds is intact.
  auto evicted = PrefixStore::Open(Options(budget_dir, budget));
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_TRUE((*evicted)->Verify().ok()) << (*evicted)->Verify();
  const StoreCounters counters = (*evicted)->counters();
  EXPECT_LE(counters.stored_bytes, budget);
  EXPECT_GT(counters.block_kv_values, 0u);
  EXPECT_EQ(counters.failed_deletes, 0u);
  EXPECT_EQ(counters.corrupt_values, 0u);
}

}  // namespace
}  // namespace baton::kvstore
