// The router at scale over the wire (issue 51): --nodes simulated prefill nodes register with a
// running router (`baton up`'s) through its Registry, each over its own mutual-TLS connection
// with a certificate of its own from the cluster's CA (spiffe://baton/prefill/<name>), and
// heartbeat every --heartbeat-ms with a batch of cache events, while requests flow through the
// router's client API to the cluster's real prefill and decode nodes.
//
//   baton_registry_grpc_bench --registry HOST:PORT --router HOST:PORT --tls-dir DIR
//       --model DIR --router-pid PID [--nodes 200] [--seconds 10] [--blocks-per-node 4096]
//       [--heartbeat-ms 500] [--requests-per-s 10] [--prompt-tokens 256] [--threads 16]
//
// Each simulated node holds --blocks-per-node chain keys (its first registration's snapshot)
// and stores and removes 8 at each heartbeat; one in ten also holds the first blocks of the
// prompts the requests send, so the router's lookup finds holders. They report a queue of an
// hour, so the router prices every one of them for every request and sends none there.
//
// Three phases of --seconds: heartbeats alone; requests at --requests-per-s with the heartbeats
// paused (the router must keep nodes live that long: its node expiry, `router: node-expiry-ms`
// in baton up's config); both. Prints one JSON object: heartbeats and requests sent, the
// router's CPU (from /proc) per heartbeat (first phase, less the router's idle background
// measured before any node registers) and per request (second phase, less its background with
// the nodes registered and silent: the lower of one keepalive period before it and one after), its
// resident memory, and the requests' time to first token (p50, p99) in the second and third phases.
// With --nodes 0 the same requests give the cluster's own time to first token: the difference
// is what routing over the simulated nodes adds.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "baton/common/pki.h"
#include "baton/common/security.h"
#include "baton/kvstore/chain.h"
#include "baton/model/weights.h"
#include "baton/v1/generation.grpc.pb.h"
#include "baton/v1/node.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = baton::v1;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The router process's CPU seconds so far (utime + stime) and resident memory in MiB.
double CpuSeconds(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line) || line.rfind(')') == std::string::npos) {
    std::cerr << "the router (pid " << pid << ") is gone\n";
    std::exit(1);
  }
  // Fields after the command's closing parenthesis; utime and stime are the 14th and 15th.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i >= 14) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}
double StatusMiB(int pid, const std::string& key) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) / 1024;
  }
  return 0;
}

std::string KeyOf(uint64_t node, uint64_t i) {
  std::string key(32, '\0');
  std::mt19937_64 mix(node * 1000003 + i);
  for (size_t b = 0; b < key.size(); b += 8) {
    const uint64_t word = mix();
    std::memcpy(key.data() + b, &word, 8);
  }
  return key;
}

// Both regions' events for `keys`: that the node now holds them, or (`stored` false) no longer.
void AddEvents(v1::CacheEventBatch& batch, const std::vector<std::string>& keys, bool stored) {
  for (v1::StoreRegion group : {v1::STORE_REGION_BLOCK_KV, v1::STORE_REGION_PRODUCER_SWA}) {
    v1::CacheEvent& event = *batch.add_events();
    auto fill = [&](auto& blocks) {
      for (const std::string& key : keys) blocks.add_block_hashes(key);
      blocks.set_cache_group(group);
      blocks.set_medium("cpu");
    };
    if (stored) {
      fill(*event.mutable_block_stored());
    } else {
      fill(*event.mutable_block_removed());
    }
  }
}

struct SimNode {
  std::string id;
  std::unique_ptr<v1::Registry::Stub> stub;
  uint64_t sequence = 0;
  uint64_t oldest = 0, next_key = 0;  // its own keys [oldest, next_key) are held
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The router's registry and admission over gRPC with simulated prefill nodes"};
  std::string registry, router, tls_dir, model_dir;
  int router_pid = 0, nodes = 200, blocks = 4096, heartbeat_ms = 500, prompt_tokens = 256;
  int threads = 16;
  double seconds = 10, requests_per_s = 10;
  app.add_option("--registry", registry, "The router's internal (Registry) address")->required();
  app.add_option("--router", router, "The router's client API address")->required();
  app.add_option("--tls-dir", tls_dir, "baton up's <data-dir>/tls (its CA issues the nodes')")
      ->required();
  app.add_option("--model", model_dir, "The served model (its fingerprint)")->required();
  app.add_option("--router-pid", router_pid, "The router's process")->required();
  app.add_option("--nodes", nodes, "Simulated prefill nodes")->check(CLI::Range(0, 4000));
  app.add_option("--seconds", seconds, "Each phase's length")->check(CLI::Range(1.0, 600.0));
  app.add_option("--blocks-per-node", blocks, "Chain keys each node holds")
      ->check(CLI::Range(16, 1 << 20));
  app.add_option("--heartbeat-ms", heartbeat_ms, "Each node's heartbeat period")
      ->check(CLI::Range(50, 10000));
  app.add_option("--requests-per-s", requests_per_s, "Requests in the second phase")
      ->check(CLI::Range(0.1, 1000.0));
  app.add_option("--prompt-tokens", prompt_tokens, "Each request's prompt")
      ->check(CLI::Range(16, 8192));
  app.add_option("--threads", threads, "Threads sending the heartbeats")->check(CLI::Range(1, 64));
  CLI11_PARSE(app, argc, argv);

  const absl::StatusOr<std::string> fingerprint = baton::model::ModelFingerprint(model_dir);
  if (!fingerprint.ok()) {
    std::cerr << fingerprint.status() << "\n";
    return 1;
  }
  nlohmann::json config = nlohmann::json::parse(ReadAll(model_dir + "/config.json"));
  const int64_t block_size = config.value("kv_block_size", 64);
  const int vocab = config.value("vocab_size", 256);

  // The prompts the requests send, made up front: one in ten simulated nodes claims to hold
  // each one's first 16 blocks.
  std::mt19937_64 rng(51);
  // Each phase sends its own prompts (a prompt sent again would be a prefix hit).
  const size_t per_phase = static_cast<size_t>(requests_per_s * seconds);
  std::vector<std::vector<int32_t>> prompts(2 * per_phase);
  std::vector<std::vector<std::string>> prompt_keys(prompts.size());
  for (size_t r = 0; r < prompts.size(); ++r) {
    for (int t = 0; t < prompt_tokens; ++t) {
      prompts[r].push_back(static_cast<int32_t>(3 + rng() % static_cast<uint64_t>(vocab - 3)));
    }
    const auto chain = baton::kvstore::ChainKeys(*fingerprint, "", "", prompts[r], block_size);
    for (size_t b = 0; b < std::min<size_t>(16, chain.size()); ++b) {
      prompt_keys[r].push_back(baton::kvstore::KeyBytes(chain[b]));
    }
  }

  // The router's own background (its nodes' heartbeats, metrics), before any simulated node.
  const double idle0 = CpuSeconds(router_pid);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const double idle_cores = (CpuSeconds(router_pid) - idle0) / 3;

  // Certificates and connections: one per simulated node.
  const auto made = Clock::now();
  const std::string ca = ReadAll(tls_dir + "/ca.crt");
  std::vector<SimNode> sims(static_cast<size_t>(nodes));
  for (int n = 0; n < nodes; ++n) {
    SimNode& sim = sims[static_cast<size_t>(n)];
    sim.id = absl::StrCat("sim-", n);
    if (absl::Status issued = baton::pki::IssueNodeCertificate(tls_dir, "prefill", sim.id);
        !issued.ok()) {
      std::cerr << issued << "\n";
      return 1;
    }
    const std::string stem = baton::pki::NodeCertificateStem(tls_dir, sim.id);
    grpc::SslCredentialsOptions tls{.pem_root_certs = ca,
                                    .pem_private_key = ReadAll(stem + ".key"),
                                    .pem_cert_chain = ReadAll(stem + ".crt")};
    sim.stub = v1::Registry::NewStub(grpc::CreateChannel(registry, grpc::SslCredentials(tls)));
  }
  const double certificates_s = std::chrono::duration<double>(Clock::now() - made).count();

  auto registration = [&](SimNode& sim, size_t n) {
    v1::RegisterRequest request;
    request.set_node_id(sim.id);
    request.set_role(v1::NODE_ROLE_PREFILL);
    request.set_address("127.0.0.1:9");  // never called: the node reports an hour of work
    request.set_model_fingerprint(*fingerprint);
    request.set_state_format_version(2);  // transfer::kStateFormatVersion
    v1::LoadReport& load = *request.mutable_load();
    load.set_queued_requests(1000);
    load.set_prefill_work_ms(3600e3);
    load.set_routers(1);
    load.mutable_rates()->set_compute_ms_per_gflop(20);
    load.mutable_rates()->set_store_ms_per_mib(8);
    load.mutable_rates()->set_local_ms_per_mib(0.5);
    load.mutable_rates()->set_fixed_ms(20);
    v1::CacheEventBatch& batch = *request.mutable_cache_events();
    batch.set_sequence(++sim.sequence);
    std::vector<std::string> stored, removed;
    if (sim.sequence == 1) {
      batch.set_snapshot(true);
      if (n % 10 == 0) {
        const size_t stride = std::max<size_t>(1, sims.size() / 10);
        for (size_t r = n / 10 % prompts.size(); r < prompts.size() && stored.size() < 512;
             r += stride) {
          stored.insert(stored.end(), prompt_keys[r].begin(), prompt_keys[r].end());
        }
      }
      // A batch carries at most 8,192 hashes (both regions): the rest of the snapshot is the
      // node's own keys.
      const size_t own =
          static_cast<size_t>(blocks) - std::min(stored.size(), static_cast<size_t>(blocks));
      for (size_t i = 0; i < own; ++i) stored.push_back(KeyOf(n, sim.next_key++));
    } else {
      for (int i = 0; i < 8; ++i) {
        removed.push_back(KeyOf(n, sim.oldest++));
        stored.push_back(KeyOf(n, sim.next_key++));
      }
      AddEvents(batch, removed, /*stored=*/false);
    }
    AddEvents(batch, stored, /*stored=*/true);
    return request;
  };
  std::atomic<uint64_t> heartbeats{0}, refused{0};
  std::string first_refusal;
  std::mutex refusal_mutex;
  auto beat = [&](size_t n) {
    SimNode& sim = sims[n];
    const v1::RegisterRequest request = registration(sim, n);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::RegisterResponse response;
    const grpc::Status status = sim.stub->Register(&context, request, &response);
    if (!status.ok() || response.cache_resync()) {
      ++refused;
      std::lock_guard<std::mutex> lock(refusal_mutex);
      if (first_refusal.empty()) {
        first_refusal = status.ok() ? "cache_resync" : status.error_message();
      }
      sim.sequence = 0;  // the next is a snapshot
      sim.oldest = sim.next_key = 0;
      return;
    }
    ++heartbeats;
  };
  // Every node once (the snapshots), then heartbeats at the period until `stop`.
  auto on_threads = [&](const std::function<void(int)>& fn) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(fn, t);
    for (std::thread& t : pool) t.join();
  };
  on_threads([&](int t) {
    for (size_t n = static_cast<size_t>(t); n < sims.size(); n += static_cast<size_t>(threads)) {
      beat(n);
    }
  });
  const uint64_t snapshots = heartbeats.exchange(0);
  std::atomic<bool> stop{false}, paused{false};
  std::thread beating([&] {
    on_threads([&](int t) {
      const size_t mine =
          (sims.size() + static_cast<size_t>(threads) - 1 - static_cast<size_t>(t)) /
          static_cast<size_t>(threads);
      if (mine == 0) return;
      const auto gap = std::chrono::microseconds(heartbeat_ms * 1000 / static_cast<int64_t>(mine));
      auto next = Clock::now();
      while (!stop) {
        for (size_t n = static_cast<size_t>(t); n < sims.size() && !stop;
             n += static_cast<size_t>(threads)) {
          if (!paused) beat(n);
          next += gap;
          std::this_thread::sleep_until(next);
        }
      }
    });
  });

  // Phase 1: heartbeats alone.
  const double cpu0 = CpuSeconds(router_pid);
  const uint64_t beats0 = heartbeats.load();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const double cpu1 = CpuSeconds(router_pid);
  const uint64_t beats1 = heartbeats.load();
  const double cpu_per_heartbeat =
      beats1 > beats0 ? (cpu1 - cpu0 - idle_cores * seconds) / static_cast<double>(beats1 - beats0)
                      : 0;

  // Phases 2 and 3: the requests with the heartbeats paused (the nodes stay live for the
  // router's node expiry), then with them.
  auto client =
      v1::Generation::NewStub(grpc::CreateChannel(router, grpc::InsecureChannelCredentials()));
  struct Phase {
    std::vector<double> ttft;
    int failed = 0;
    double cpu_s = 0, seconds = 0;
  };
  std::string first_failure;
  auto send = [&](Phase& phase, size_t first_prompt) {
    const auto start = Clock::now();
    const double cpu = CpuSeconds(router_pid);
    for (size_t r = first_prompt; r < first_prompt + per_phase; ++r) {
      std::this_thread::sleep_until(
          start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                      static_cast<double>(r - first_prompt) / requests_per_s)));
      v1::GenerateRequest request;
      for (int32_t t : prompts[r]) request.add_prompt_token_ids(t);
      request.mutable_sampling()->set_max_tokens(1);
      request.mutable_sampling()->set_ignore_eos(true);
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      const auto sent = Clock::now();
      auto reader = client->Generate(&context, request);
      v1::GenerateResponse response;
      double first = -1;
      while (reader->Read(&response)) {
        if (first < 0) {
          first = std::chrono::duration<double, std::milli>(Clock::now() - sent).count();
        }
      }
      const grpc::Status status = reader->Finish();
      if (status.ok() && first >= 0) {
        phase.ttft.push_back(first);
      } else if (++phase.failed == 1 && first_failure.empty()) {
        first_failure = status.error_message();
      }
    }
    phase.cpu_s = CpuSeconds(router_pid) - cpu;
    phase.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  };
  Phase quiet, loaded;
  paused = true;
  // The router's background with the nodes registered and silent: what a quiet request's CPU
  // is measured above. Measured once the heartbeats already sent have been served (a second),
  // and again after the quiet phase, the lower taken: a background measured while the router
  // still works through the last heartbeats exceeds the whole quiet phase's CPU at a thousand
  // nodes, and would price a request below zero. Each window is one HTTP/2 keepalive period:
  // the router pings every connection once a period and answers each node's ping, and the
  // nodes, connected together, ping together (at a thousand nodes a burst of about 0.1 CPU s
  // each period, by perf). A shorter window holds a burst or none, and the lower of two such
  // windows left the quiet phase's bursts out of the background and charged them to requests.
  auto background_cores = [&] {
    const double held0 = CpuSeconds(router_pid);
    const double window_s = baton::security::kKeepaliveMs / 1000.0;
    std::this_thread::sleep_for(std::chrono::duration<double>(window_s));
    return (CpuSeconds(router_pid) - held0) / window_s;
  };
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double held_before = background_cores();
  send(quiet, 0);
  const double held_cores = std::min(held_before, background_cores());
  paused = false;
  const uint64_t beats4 = heartbeats.load();
  send(loaded, per_phase);
  const uint64_t beats5 = heartbeats.load();
  stop = true;
  beating.join();
  const double requests = static_cast<double>(per_phase);
  // What the router spends on a request: the quiet phase's CPU less its background then.
  const double request_cpu = quiet.cpu_s - held_cores * quiet.seconds;
  nlohmann::json out = {{"nodes", nodes},
                        {"blocks_per_node", blocks},
                        {"certificates_s", certificates_s},
                        {"snapshots", snapshots},
                        {"heartbeats", beats1 - beats0},
                        {"heartbeats_per_s", static_cast<double>(beats1 - beats0) / seconds},
                        {"heartbeats_refused", refused.load()},
                        {"first_refusal", first_refusal},
                        {"router_cpu_us_per_heartbeat", cpu_per_heartbeat * 1e6},
                        {"router_heartbeat_cores", (cpu1 - cpu0) / seconds},
                        {"router_idle_cores", idle_cores},
                        {"router_idle_cores_with_nodes", held_cores},
                        {"requests", requests},
                        {"requests_failed", quiet.failed + loaded.failed},
                        {"first_failure", first_failure},
                        {"router_cpu_us_per_request", request_cpu / requests * 1e6},
                        {"ttft_ms_p50", Percentile(quiet.ttft, 0.5)},
                        {"ttft_ms_p99", Percentile(quiet.ttft, 0.99)},
                        {"heartbeats_during_requests", beats5 - beats4},
                        {"ttft_ms_p50_with_heartbeats", Percentile(loaded.ttft, 0.5)},
                        {"ttft_ms_p99_with_heartbeats", Percentile(loaded.ttft, 0.99)},
                        {"router_rss_mib", StatusMiB(router_pid, "VmRSS")},
                        {"router_peak_rss_mib", StatusMiB(router_pid, "VmHWM")}};
  std::cout << out.dump() << "\n";
  return refused > 0 && heartbeats == 0 ? 1 : 0;
}
