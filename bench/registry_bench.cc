// The router's registry and admission at scale, in one process: N prefill nodes (and one decode
// node) registered with a NodeRegistry, each heartbeating at --heartbeats-per-s with a cache
// event batch (blocks stored and dropped, as a busy node's cache churns) on one thread, while
// another admits requests at --requests-per-s through Admission::Admit (the router's own
// placement over every node's cache index lookup) and gives each slot back.
//
// Reports per N: the heartbeat thread's CPU per heartbeat, the request thread's CPU per
// request, each request's admission latency (p50, p99) and the admitting thread's CPU time in
// it (p50, p99), the share of the machine's CPU time its hypervisor stole meanwhile,
// heartbeats and requests done against those asked (a thread that cannot keep up falls
// behind), and the process's resident memory with N nodes' cache indexes filled
// (--blocks-per-node keys in each region).
//
// What it leaves out: gRPC and TLS (a heartbeat's RPC and its certificate check cost the same
// per call at any N), and the request's other stages.
//
//   baton_registry_bench [--nodes 50,200,1000] [--seconds 5] [--heartbeats-per-s 2]
//                        [--requests-per-s 50] [--blocks-per-node 4096] [--events-per-batch 16]
#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "baton/kvstore/chain.h"
#include "baton/model/model_factory.h"
#include "baton/router/admission.h"
#include "baton/router/node_registry.h"
#include "nlohmann/json.hpp"
#include "percentile.h"

namespace {

using namespace baton;
using Clock = std::chrono::steady_clock;

double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// The machine's CPU time so far, all of it and the part its hypervisor gave to others (steal),
// in ticks of /proc/stat's "cpu" line: a virtual CPU that is stolen from stalls whatever runs
// on it, so a latency tail with steal beside it says as much about the machine as the code.
struct MachineTicks {
  double total = 0, steal = 0;
};
MachineTicks ReadMachineTicks() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  MachineTicks ticks;
  stat >> cpu;
  for (int field = 1; field <= 8 && stat; ++field) {
    double value = 0;
    stat >> value;
    ticks.total += value;
    if (field == 8) ticks.steal = value;
  }
  return ticks;
}

double ResidentMiB() {
  std::ifstream statm("/proc/self/statm");
  double size = 0, resident = 0;
  statm >> size >> resident;
  return resident * 4096.0 / (1024.0 * 1024.0);
}

// A distinct chain key per (node, i), as uniform as SHA-256's in the bytes the index hashes.
Sha256Digest Key(uint64_t node, uint64_t i) {
  auto mix = [](uint64_t x) {  // splitmix64's finalizer
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  };
  Sha256Digest key{};
  const uint64_t words[4] = {mix(node * 0x9e3779b97f4a7c15ULL + i), node, i, mix(i ^ node)};
  for (int w = 0; w < 4; ++w) {
    for (int b = 0; b < 8; ++b) key[8 * w + b] = static_cast<uint8_t>(words[w] >> (8 * b));
  }
  return key;
}

v1::RegisterRequest Node(const std::string& id, v1::NodeRole role) {
  v1::RegisterRequest request;
  request.set_node_id(id);
  request.set_role(role);
  request.set_address(id + ".invalid:1");
  request.set_model_fingerprint("weights");
  v1::PrefillRates& rates = *request.mutable_load()->mutable_rates();
  rates.set_compute_ms_per_gflop(10);
  rates.set_local_ms_per_mib(0.5);
  rates.set_store_ms_per_mib(5);
  rates.set_fixed_ms(2);
  if (role == v1::NODE_ROLE_DECODE) request.mutable_load()->set_total_slots(1 << 20);
  return request;
}

// Cache events storing keys [from, to) of node `n` in both regions, and dropping `dropped`.
void AddEvents(v1::CacheEventBatch& batch, uint64_t n, uint64_t from, uint64_t to,
               const std::vector<uint64_t>& dropped) {
  for (v1::StoreRegion region : {v1::STORE_REGION_BLOCK_KV, v1::STORE_REGION_PRODUCER_SWA}) {
    v1::BlockStored& stored = *batch.add_events()->mutable_block_stored();
    stored.set_cache_group(region);
    stored.set_medium("cpu");
    for (uint64_t i = from; i < to; ++i) stored.add_block_hashes(kvstore::KeyBytes(Key(n, i)));
    if (dropped.empty()) continue;
    v1::BlockRemoved& removed = *batch.add_events()->mutable_block_removed();
    removed.set_cache_group(region);
    for (uint64_t i : dropped) removed.add_block_hashes(kvstore::KeyBytes(Key(n, i)));
  }
}

struct Options {
  std::string nodes = "50,200,1000";
  double seconds = 5;
  double heartbeats_per_s = 2;
  double requests_per_s = 50;
  int64_t blocks_per_node = 4096;
  int64_t events_per_batch = 16;
  // "holders": the chain walked once for every node (ChainHolders, as the router does);
  // "per-node": one CacheIndex::Lookup per open node, the way the router looked up before.
  std::string lookup = "holders";
};

nlohmann::json RunOne(int64_t nodes, const Options& o) {
  std::vector<router::ServedModel> models = {{"", *model::PresetConfig("tiny"), nullptr}};
  const ModelConfig& config = models[0].config;
  router::NodeRegistry::Options registry_options;
  registry_options.node_ttl_ms = 600000;
  registry_options.forget_after_ms = 600000;
  registry_options.max_node_ids = 8192;
  router::NodeRegistry registry(models, registry_options);
  router::Admission admission(registry, models, {.prefill_slots = 2});
  const double rss_before = ResidentMiB();
  if (!registry.RegisterFrom("", Node("decode-0", v1::NODE_ROLE_DECODE)).ok()) std::abort();
  std::vector<uint64_t> sequence(static_cast<size_t>(nodes), 0), next(static_cast<size_t>(nodes));
  // Each node's cache index filled, in batches of the largest size a node sends.
  for (int64_t n = 0; n < nodes; ++n) {
    const uint64_t u = static_cast<uint64_t>(n);
    for (uint64_t from = 0; from < static_cast<uint64_t>(o.blocks_per_node); from += 1000) {
      v1::RegisterRequest request = Node(absl::StrCat("prefill-", n), v1::NODE_ROLE_PREFILL);
      v1::CacheEventBatch& batch = *request.mutable_cache_events();
      batch.set_sequence(++sequence[u]);
      batch.set_snapshot(sequence[u] == 1);
      AddEvents(batch, u, from, std::min<uint64_t>(from + 1000, o.blocks_per_node), {});
      if (!registry.RegisterFrom("", request).ok()) std::abort();
    }
    next[u] = static_cast<uint64_t>(o.blocks_per_node);
  }
  const double rss_filled = ResidentMiB();

  const auto start = Clock::now();
  const auto until = start + std::chrono::duration<double>(o.seconds);
  int64_t heartbeats = 0, requests = 0;
  double heartbeat_cpu = 0, request_cpu = 0;
  std::vector<double> admit_ms, admit_cpu_ms;
  const MachineTicks ticks0 = ReadMachineTicks();
  std::thread beats([&] {
    const double cpu0 = ThreadCpuSeconds();
    const double period = 1.0 / (o.heartbeats_per_s * static_cast<double>(nodes));
    for (int64_t k = 0; Clock::now() < until; ++k) {
      std::this_thread::sleep_until(start + std::chrono::duration<double>(period * k));
      const uint64_t n = static_cast<uint64_t>(k % nodes);
      v1::RegisterRequest request = Node(absl::StrCat("prefill-", n), v1::NODE_ROLE_PREFILL);
      request.mutable_load()->set_queued_requests(static_cast<uint32_t>(k % 3));
      v1::CacheEventBatch& batch = *request.mutable_cache_events();
      batch.set_sequence(++sequence[n]);
      // The cache churns: new blocks in, as many of the oldest out.
      const uint64_t half = static_cast<uint64_t>(o.events_per_batch) / 2;
      std::vector<uint64_t> dropped;
      for (uint64_t i = 0; i < half; ++i) dropped.push_back(next[n] - o.blocks_per_node + i);
      AddEvents(batch, n, next[n], next[n] + half, dropped);
      next[n] += half;
      if (!registry.RegisterFrom("", request).ok()) std::abort();
      ++heartbeats;
    }
    heartbeat_cpu = ThreadCpuSeconds() - cpu0;
  });
  std::thread load([&] {
    const double cpu0 = ThreadCpuSeconds();
    std::mt19937_64 random(3);
    const int64_t blocks = 40;
    for (int64_t k = 0; Clock::now() < until; ++k) {
      std::this_thread::sleep_until(start + std::chrono::duration<double>(k / o.requests_per_s));
      // A prompt whose first blocks one node holds (a shared prefix: keys from the middle of its
      // index, which the churn of a run this long does not reach), the rest new.
      const uint64_t owner = random() % static_cast<uint64_t>(nodes);
      std::vector<Sha256Digest> chain;
      for (int64_t b = 0; b < blocks; ++b) {
        chain.push_back(b < 16 ? Key(owner, static_cast<uint64_t>(o.blocks_per_node / 2 + b))
                               : Key(1u << 30, static_cast<uint64_t>(k * blocks + b)));
      }
      router::Admission::Ask ask;
      ask.placement = {.policy = kvstore::RoutingPolicy::kPredictedTtft,
                       .hit = {.prompt_len = blocks * config.kv_block_size,
                               .keep = config.ring_capacity(),
                               .truncation_on = true,
                               .ring_capacity = config.ring_capacity(),
                               .window = config.sliding_window,
                               .block_size = config.kv_block_size},
                       .payload = kvstore::BlockPayloadBytes(config),
                       .config = &config};
      router::ChainHolders local;  // as the router's GenerateCall looks the chain up
      const bool per_node = o.lookup == "per-node";
      ask.tiers = [&](const router::RegisteredNode& node) {
        return kvstore::TierLookups{
            .local = per_node ? registry.cache_index().Lookup(node.id(), chain)
                              : local.On(registry.cache_index(), chain, node.id_hash,
                                         [&]() -> const std::string& { return node.id(); })};
      };
      grpc::ServerContext context;
      router::StreamHold hold;
      int64_t retry_after_ms = 0;
      const auto t0 = Clock::now();
      const double cpu_t0 = ThreadCpuSeconds();
      absl::StatusOr<router::Admission::Admitted> admitted =
          admission.Admit(context, ask, hold, &retry_after_ms);
      admit_cpu_ms.push_back((ThreadCpuSeconds() - cpu_t0) * 1e3);
      admit_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      if (!admitted.ok()) std::abort();
      admitted->slot.Done();
      admission.ReleaseStream(hold);
      ++requests;
    }
    request_cpu = ThreadCpuSeconds() - cpu0;
  });
  beats.join();
  load.join();
  const MachineTicks ticks1 = ReadMachineTicks();
  const double asked_heartbeats = o.heartbeats_per_s * static_cast<double>(nodes) * o.seconds;
  const double asked_requests = o.requests_per_s * o.seconds;
  return {{"nodes", nodes},
          {"lookup", o.lookup},
          {"heartbeats", heartbeats},
          {"heartbeats_asked", asked_heartbeats},
          {"cpu_us_per_heartbeat", heartbeat_cpu / std::max<int64_t>(1, heartbeats) * 1e6},
          {"heartbeat_cpu_cores", heartbeat_cpu / o.seconds},
          {"requests", requests},
          {"requests_asked", asked_requests},
          {"cpu_us_per_request", request_cpu / std::max<int64_t>(1, requests) * 1e6},
          {"admit_ms_p50", Percentile(admit_ms, 0.5)},
          {"admit_ms_p99", Percentile(admit_ms, 0.99)},
          // The admitting thread's own CPU time per admission: where the wall time's tail is
          // far above this one's, the thread waited (a lock, the scheduler, a stolen CPU).
          {"admit_cpu_ms_p50", Percentile(admit_cpu_ms, 0.5)},
          {"admit_cpu_ms_p99", Percentile(admit_cpu_ms, 0.99)},
          {"steal_fraction", ticks1.total > ticks0.total
                                 ? (ticks1.steal - ticks0.steal) / (ticks1.total - ticks0.total)
                                 : 0.0},
          {"rss_mib_nodes_and_indexes", rss_filled - rss_before},
          {"rss_mib", ResidentMiB()}};
}

}  // namespace

int main(int argc, char** argv) {
#if defined(__GLIBC__)
  // malloc as baton-router sets it (router/main.cc), so that what admission allocates is served
  // as it is there.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
#endif
  Options o;
  CLI::App app{"The router's registry and admission with many nodes, in process"};
  app.add_option("--nodes", o.nodes, "Prefill node counts, comma-separated (default 50,200,1000)");
  app.add_option("--lookup", o.lookup,
                 "How a request's chain is looked up in the nodes' caches: holders (one walk for "
                 "every node, as the router does) or per-node (one lookup per open node)")
      ->check(CLI::IsMember({"holders", "per-node"}));
  app.add_option("--seconds", o.seconds, "Seconds of load per count (default 5)");
  app.add_option("--heartbeats-per-s", o.heartbeats_per_s, "Per node (default 2)");
  app.add_option("--requests-per-s", o.requests_per_s, "Requests admitted per second (default 50)");
  app.add_option("--blocks-per-node", o.blocks_per_node,
                 "Keys each node's cache index holds per region (default 4096)");
  app.add_option("--events-per-batch", o.events_per_batch,
                 "Blocks stored plus dropped per heartbeat and region (default 16)");
  CLI11_PARSE(app, argc, argv);
  for (absl::string_view item : absl::StrSplit(o.nodes, ',')) {
    int64_t nodes = 0;
    if (!absl::SimpleAtoi(item, &nodes) || nodes < 1 || nodes > 4096) {
      std::cerr << "--nodes: '" << item << "' must be a count in [1, 4096]\n";
      return 2;
    }
    std::cout << RunOne(nodes, o).dump() << std::endl;
  }
  return 0;
}
