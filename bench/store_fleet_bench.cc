// Throughput of the prefix store as a fleet: lookups (each a probe of a chain's keys on their
// owners, in parallel, as the router makes them) and block reads (each block from one owner,
// as a prefill node reads a hit) by many concurrent clients, over the store nodes of a running
// cluster (`baton up --kvstore-nodes N`). Placement is kvstore/placement.h's, as the router's
// and the prefill nodes'.
//
//   baton_store_fleet_bench --stores kvstore=HOST:PORT,kvstore-1=HOST:PORT,... --tls-dir DIR
//                           --model DIR [--replication 1] [--chains 32] [--blocks 16]
//                           [--clients 16] [--seconds 5] [--load both] [--store-pids PID,...]
//                           [--probes coalesced]
//
// --probes coalesced sends a lookup's probes as the router does (kvstore/probe_batcher.h: per
// node, the lookups queued while its call is out go in the next call); per-lookup sends each
// lookup's own call to each owner, as the router did before, for a ratio in the same run.
//
// First writes --chains chains of --blocks blocks (both regions, the model's value sizes) to
// their owners, then runs each load for --seconds and prints one JSON object: lookups/s,
// probes/s (calls, each to one node), reads/s and read MiB/s, and the calls each node served.
// With --store-pids (the store nodes' processes, in --stores order, on this machine) it also
// gives each node's CPU seconds (user + system, from /proc) over each load alone, so that the
// writes before it are not counted.
// Runs as the prefill role (baton up's <data-dir>/tls/nodes/prefill certificate).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_split.h"
#include "baton/common/security.h"
#include "baton/kvstore/chain.h"
#include "baton/kvstore/fleet.h"
#include "baton/kvstore/placement.h"
#include "baton/kvstore/probe_batcher.h"
#include "baton/model/state.h"
#include "baton/model/weights.h"
#include "baton/v1/kvstore.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using baton::Sha256Digest;
namespace v1 = baton::v1;

struct Fleet {
  std::vector<std::string> ids;
  std::vector<std::shared_ptr<v1::KvStore::Stub>> stubs;
  int replication = 1;
};

// Writes every block of `chain` (both regions) to each of its owners, deepest first.
bool WriteChain(const Fleet& fleet, const std::vector<Sha256Digest>& chain,
                const std::string& block_kv, const std::string& swa) {
  std::map<size_t, std::vector<v1::BlockWrite>> owned;
  for (size_t b = chain.size(); b-- > 0;) {
    for (size_t node : baton::kvstore::Owners(chain[b], fleet.ids, fleet.replication)) {
      for (int region = 0; region < 2; ++region) {
        v1::BlockWrite& w = owned[node].emplace_back();
        w.set_key(baton::kvstore::KeyBytes(chain[b]));
        if (b > 0) w.set_parent(baton::kvstore::KeyBytes(chain[b - 1]));
        w.set_region(region == 0 ? v1::STORE_REGION_BLOCK_KV : v1::STORE_REGION_PRODUCER_SWA);
        w.set_payload(region == 0 ? block_kv : swa);
      }
    }
  }
  for (auto& [node, writes] : owned) {
    grpc::ClientContext context;
    v1::WriteBlocksResponse written;
    auto writer = fleet.stubs[node]->WriteBlocks(&context, &written);
    for (const v1::BlockWrite& w : writes) writer->Write(w);
    writer->WritesDone();
    if (grpc::Status s = writer->Finish(); !s.ok()) {
      std::cerr << "write to " << fleet.ids[node] << ": " << s.error_message() << "\n";
      return false;
    }
  }
  return true;
}

struct Load {
  std::atomic<uint64_t> operations{0}, calls{0}, bytes{0}, failures{0};
  std::vector<std::atomic<uint64_t>> per_node;
  explicit Load(size_t nodes) : per_node(nodes) {}
};

// Runs fn(client, rng) on `clients` threads until `seconds` pass.
template <typename Fn>
double RunFor(int clients, double seconds, Fn fn) {
  const auto start = Clock::now();
  const auto until = start + std::chrono::duration<double>(seconds);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937_64 rng(1000 + c);
      while (Clock::now() < until) fn(rng);
    });
  }
  for (std::thread& t : threads) t.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A process's CPU seconds so far (user + system), or -1 when it cannot be read.
double CpuSeconds(const std::string& pid) {
  std::ifstream stat("/proc/" + pid + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return -1;
  // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return -1;
  std::vector<std::string> fields = absl::StrSplit(line.substr(close + 2), ' ');
  if (fields.size() < 13) return -1;
  return static_cast<double>(std::stoull(fields[11]) + std::stoull(fields[12])) /
         static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::vector<double> CpuOf(const std::vector<std::string>& pids) {
  std::vector<double> cpu;
  for (const std::string& pid : pids) cpu.push_back(CpuSeconds(pid));
  return cpu;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"baton prefix-store fleet throughput"};
  std::string stores, tls_dir, model_dir;
  int replication = 1, chains = 32, blocks = 16, clients = 16;
  double seconds = 5;
  std::string load = "both", store_pids, probes = "coalesced";
  app.add_option("--stores", stores, "NODE_ID=HOST:PORT,... of the live store nodes")->required();
  app.add_option("--tls-dir", tls_dir, "baton up's <data-dir>/tls")->required();
  app.add_option("--model", model_dir, "Model directory (value sizes, chain keys)")->required();
  app.add_option("--replication", replication, "Owners per value (as the router's)");
  app.add_option("--chains", chains, "Chains written, then looked up and read at random");
  app.add_option("--blocks", blocks, "Blocks per chain");
  app.add_option("--clients", clients, "Concurrent clients");
  app.add_option("--seconds", seconds, "Length of each load");
  app.add_option("--load", load, "Which loads to run: lookups, reads or both")
      ->check(CLI::IsMember({"lookups", "reads", "both"}));
  app.add_option("--probes", probes, "How lookups send their probes: coalesced or per-lookup")
      ->check(CLI::IsMember({"coalesced", "per-lookup"}));
  app.add_option("--store-pids", store_pids,
                 "The store nodes' process ids, in --stores order: CPU seconds per node and load");
  CLI11_PARSE(app, argc, argv);
  const std::vector<std::string> pids =
      store_pids.empty() ? std::vector<std::string>{} : absl::StrSplit(store_pids, ',');
  if (absl::Status s = baton::security::Configure({.ca_file = tls_dir + "/ca.crt",
                                                   .cert_file = tls_dir + "/nodes/prefill.crt",
                                                   .key_file = tls_dir + "/nodes/prefill.key"});
      !s.ok()) {
    std::cerr << s.message() << "\n";
    return 2;
  }
  auto config = baton::LoadModelConfig(model_dir + "/config.json");
  auto fingerprint = baton::model::ModelFingerprint(model_dir);
  if (!config.ok() || !fingerprint.ok()) return 2;
  const auto layout = baton::model::StateLayout::For(*config);
  const std::string block_kv(sizeof(float) * layout.page_floats(), '\0');
  const std::string swa(sizeof(float) * layout.stored_swa_block_floats(), '\0');

  Fleet fleet;
  fleet.replication = replication;
  for (absl::string_view entry : absl::StrSplit(stores, ',')) {
    std::pair<std::string, std::string> id_address = absl::StrSplit(entry, '=');
    fleet.ids.push_back(id_address.first);
    fleet.stubs.push_back(v1::KvStore::NewStub(
        baton::security::InternalChannel(id_address.second, baton::security::Role::kKvstore)));
  }
  if (pids.size() != 0 && pids.size() != fleet.ids.size()) {
    std::cerr << "--store-pids names " << pids.size() << " processes for " << fleet.ids.size()
              << " store nodes\n";
    return 2;
  }
  std::vector<std::vector<Sha256Digest>> all;
  std::mt19937_64 seed(2026);
  for (int c = 0; c < chains; ++c) {
    std::vector<int32_t> tokens(static_cast<size_t>(blocks) * layout.block_size);
    for (int32_t& t : tokens) t = static_cast<int32_t>(seed() % config->vocab_size);
    all.push_back(
        baton::kvstore::ChainKeys(*fingerprint, "", "fleet-bench", tokens, layout.block_size));
    if (!WriteChain(fleet, all.back(), block_kv, swa)) return 1;
  }

  // Lookups: each asks every owner of the chain's keys once, all owners at once.
  Load lookups(fleet.ids.size());
  baton::kvstore::ProbeBatcher batcher(
      {.max_keys_per_call =
           static_cast<size_t>(config->max_position_embeddings / config->kv_block_size)});
  const std::vector<double> cpu_before_lookups = CpuOf(pids);
  const double lookup_s = load == "reads" ? 0 : RunFor(clients, seconds, [&](std::mt19937_64& rng) {
    const std::vector<Sha256Digest>& chain = all[rng() % all.size()];
    const auto owned = baton::kvstore::KeysByOwner(chain, fleet.ids, fleet.replication);
    if (probes == "coalesced") {
      std::vector<baton::kvstore::ProbeBatcher::Ask> asks;
      std::vector<size_t> nodes;
      for (size_t n = 0; n < owned.size(); ++n) {
        if (owned[n].empty()) continue;
        auto& ask = asks.emplace_back();
        ask.node_id = fleet.ids[n];
        ask.stub = fleet.stubs[n];
        for (size_t k : owned[n]) ask.keys.push_back(baton::kvstore::KeyBytes(chain[k]));
        nodes.push_back(n);
      }
      const auto answers = batcher.Probe(
          std::move(asks), std::chrono::system_clock::now() + std::chrono::seconds(5));
      for (size_t i = 0; i < answers.size(); ++i) {
        if (!answers[i].status.ok()) ++lookups.failures;
        ++lookups.per_node[nodes[i]];
      }
      ++lookups.operations;
      return;
    }
    std::vector<std::thread> threads;
    for (size_t n = 0; n < owned.size(); ++n) {
      if (owned[n].empty()) continue;
      threads.emplace_back([&, n] {
        v1::ProbeRequest request;
        for (size_t k : owned[n]) request.add_keys(baton::kvstore::KeyBytes(chain[k]));
        grpc::ClientContext context;
        v1::ProbeResponse held;
        if (!fleet.stubs[n]->Probe(&context, request, &held).ok()) ++lookups.failures;
        ++lookups.calls;
        ++lookups.per_node[n];
      });
    }
    for (std::thread& t : threads) t.join();
    ++lookups.operations;
  });
  const std::vector<double> cpu_after_lookups = CpuOf(pids);
  if (probes == "coalesced") lookups.calls = batcher.calls();

  // Reads: each block of a chain's block KV from one of its owners (rotated per read).
  Load reads(fleet.ids.size());
  std::atomic<uint64_t> turn{0};
  const std::vector<double> cpu_before_reads = CpuOf(pids);
  const double read_s = load == "lookups" ? 0 : RunFor(clients, seconds, [&](std::mt19937_64& rng) {
    const std::vector<Sha256Digest>& chain = all[rng() % all.size()];
    const uint64_t t = turn++;
    std::map<size_t, std::vector<size_t>> asked;
    for (size_t b = 0; b < chain.size(); ++b) {
      asked[baton::kvstore::ReadOrder(chain[b], fleet.ids, fleet.replication, t).front()].push_back(
          b);
    }
    std::vector<std::thread> calls;
    for (auto& [node, mine] : asked) {
      calls.emplace_back([&, node = node, &mine = mine] {
        v1::ReadBlocksRequest request;
        for (size_t b : mine) request.add_keys(baton::kvstore::KeyBytes(chain[b]));
        request.set_region(v1::STORE_REGION_BLOCK_KV);
        grpc::ClientContext context;
        auto reader = fleet.stubs[node]->ReadBlocks(&context, request);
        v1::StoredBlock block;
        while (reader->Read(&block)) {
          if (!block.found()) ++reads.failures;
          reads.bytes += block.payload().size();
        }
        if (!reader->Finish().ok()) ++reads.failures;
        ++reads.calls;
        ++reads.per_node[node];
      });
    }
    for (std::thread& c : calls) c.join();
    ++reads.operations;
  });
  const std::vector<double> cpu_after_reads = CpuOf(pids);
  auto cpu_by_node = [&](const std::vector<double>& before, const std::vector<double>& after) {
    nlohmann::json out = nlohmann::json::object();
    for (size_t n = 0; n < pids.size(); ++n) out[fleet.ids[n]] = after[n] - before[n];
    return out;
  };

  auto per_node = [&](const Load& load) {
    nlohmann::json out = nlohmann::json::object();
    for (size_t n = 0; n < fleet.ids.size(); ++n) out[fleet.ids[n]] = load.per_node[n].load();
    return out;
  };
  constexpr double kMiB = 1024.0 * 1024.0;
  std::cout << nlohmann::json{{"nodes", fleet.ids.size()},
                              {"replication", replication},
                              {"clients", clients},
                              {"chain_blocks", blocks},
                              {"probes", probes},
                              {"lookups_per_s", lookup_s > 0 ? lookups.operations / lookup_s : 0},
                              {"probes_per_s", lookup_s > 0 ? lookups.calls / lookup_s : 0},
                              {"lookup_failures", lookups.failures.load()},
                              {"lookup_seconds", lookup_s},
                              {"probes_by_node", per_node(lookups)},
                              {"reads_per_s", read_s > 0 ? reads.operations / read_s : 0},
                              {"read_mib_per_s",
                               read_s > 0 ? static_cast<double>(reads.bytes) / kMiB / read_s : 0},
                              {"read_failures", reads.failures.load()},
                              {"read_seconds", read_s},
                              {"read_calls_by_node", per_node(reads)},
                              {"lookup_cpu_s_by_node",
                               cpu_by_node(cpu_before_lookups, cpu_after_lookups)},
                              {"read_cpu_s_by_node",
                               cpu_by_node(cpu_before_reads, cpu_after_reads)}}
                   .dump()
            << std::endl;
  return 0;
}
