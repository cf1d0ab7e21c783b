// Time to first token of one long prompt cold and with a share of it already in the prefix
// store, through a running cluster with a kvstore (`baton up`). For each repeat a fresh
// random prompt; a warm-up request of the first m blocks stores the prefix, then the full
// prompt is timed. Reports the median TTFT and the cached tokens per cached share (and how
// many came from the prefill node's local block cache). A share of 1 warms the whole prompt:
// the hit is then the cap, floor((L - C) / B) blocks.
//
//   baton_prefix_bench --addr ROUTER --kvstore KVSTORE [--length 4096] [--block-size 64]
//                      [--shares 0,0.5,0.9] [--repeats 3] [--vocab 4096]
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include "CLI/CLI.hpp"
#include "baton/common/security.h"
#include "baton/v1/generation.grpc.pb.h"
#include "baton/v1/kvstore.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"

namespace {

struct Timed {
  double ttft_ms = -1;
  uint32_t cached = 0;
  uint32_t local = 0;  // of those, from the prefill node's local block cache
  // What the response's timings say of it: the prefill node's part (its load of the hit and
  // its compute) and the state's transfer to the decode node.
  double prefill_ms = 0, transfer_ms = 0;
};

Timed Send(baton::v1::Generation::Stub& stub, const std::vector<int32_t>& prompt) {
  baton::v1::GenerateRequest request;
  for (int32_t t : prompt) request.add_prompt_token_ids(t);
  request.mutable_sampling()->set_max_tokens(1);
  request.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext context;
  const auto start = std::chrono::steady_clock::now();
  auto reader = stub.Generate(&context, request);
  baton::v1::GenerateResponse response;
  Timed timed;
  while (reader->Read(&response)) {
    if (timed.ttft_ms < 0) {
      timed.ttft_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
    }
    if (response.has_usage()) {
      timed.cached = response.usage().cached_tokens();
      timed.local = response.usage().local_cached_tokens();
    }
    if (response.has_timings()) {
      timed.prefill_ms = response.timings().prefill_ms();
      timed.transfer_ms = response.timings().transfer_ms();
    }
  }
  if (const grpc::Status status = reader->Finish(); !status.ok()) {
    std::cerr << "a request of " << prompt.size() << " tokens failed: " << status.error_message()
              << "\n";
    timed.ttft_ms = -1;
  }
  return timed;
}

uint64_t StoredBlocks(baton::v1::KvStore::Stub& store) {
  grpc::ClientContext context;
  baton::v1::KvStoreStats stats;
  store.Stats(&context, baton::v1::KvStoreStatsRequest(), &stats);
  return stats.block_kv_values();
}

// Waits until earlier write-backs are done (the block count stops moving).
uint64_t QuietBlocks(baton::v1::KvStore::Stub& store) {
  uint64_t last = StoredBlocks(store);
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const uint64_t now = StoredBlocks(store);
    if (now == last) return now;
    last = now;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"baton prefix-cache TTFT benchmark"};
  std::string addr, kvstore, tls_dir;
  int length = 4096, block = 64, repeats = 3, vocab = 4096;
  std::vector<double> shares = {0, 0.5, 0.9};
  app.add_option("--addr", addr, "Router address")->required();
  app.add_option("--kvstore", kvstore, "kvstore address (to wait for write-back)")->required();
  app.add_option("--tls-dir", tls_dir,
                 "Folder with ca.crt and router.crt/.key (baton up's <data-dir>/tls): the store "
                 "is read as the router")
      ->required();
  app.add_option("--length", length, "Prompt tokens");
  app.add_option("--block-size", block, "The model's kv_block_size");
  app.add_option("--shares", shares, "Cached shares of the prompt")->delimiter(',');
  app.add_option("--repeats", repeats, "Prompts per share (median reported)");
  app.add_option("--vocab", vocab, "Token ids are drawn from [0, vocab)");
  CLI11_PARSE(app, argc, argv);
  auto stub =
      baton::v1::Generation::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  auto read = [&](const std::string& name) {
    std::ifstream in(tls_dir + "/" + name);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  // As the router reaches the store: mutual TLS, the store known by its SPIFFE id.
  if (absl::Status s = baton::security::Configure({.ca_file = tls_dir + "/ca.crt",
                                                   .cert_file = tls_dir + "/router.crt",
                                                   .key_file = tls_dir + "/router.key"});
      !s.ok()) {
    std::cerr << s.message() << "\n";
    return 2;
  }
  (void)read;
  auto store = baton::v1::KvStore::NewStub(
      baton::security::InternalChannel(kvstore, baton::security::Role::kKvstore));
  std::mt19937_64 rng(2026);
  // The cluster serves once its nodes have registered, a moment after the router is up.
  std::vector<int32_t> probe(static_cast<size_t>(block));
  for (auto& t : probe) t = static_cast<int32_t>(rng() % vocab);
  const auto ready_by = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (Send(*stub, probe).ttft_ms < 0) {
    if (std::chrono::steady_clock::now() > ready_by) {
      std::cerr << "the cluster did not serve within 120 s\n";
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  nlohmann::json out = nlohmann::json::array();
  for (double share : shares) {
    std::vector<double> ttft, prefill, transfer;
    uint32_t cached = 0, local = 0;
    for (int r = 0; r < repeats; ++r) {
      std::vector<int32_t> prompt(length);
      for (auto& t : prompt) t = static_cast<int32_t>(rng() % vocab);
      const int blocks = static_cast<int>(share * length) / block;
      if (blocks > 0) {
        const uint64_t before = QuietBlocks(*store);
        Send(*stub, std::vector<int32_t>(prompt.begin(), prompt.begin() + blocks * block));
        for (int i = 0; i < 500 && StoredBlocks(*store) < before + blocks; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      }
      QuietBlocks(*store);
      const Timed timed = Send(*stub, prompt);
      ttft.push_back(timed.ttft_ms);
      prefill.push_back(timed.prefill_ms);
      transfer.push_back(timed.transfer_ms);
      cached = timed.cached;
      local = timed.local;
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    out.push_back({{"share", share},
                   {"cached_tokens", cached},
                   {"local_cached_tokens", local},
                   {"ttft_ms_median", median(ttft)},
                   {"prefill_ms_median", median(prefill)},
                   {"transfer_ms_median", median(transfer)},
                   {"ttft_ms_all", ttft}});
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}
