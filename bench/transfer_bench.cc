// StateBlock transfer throughput into a running baton-decode: block-KV pages moved by UCX put
// + flush (the prefill node's path) and by the gRPC transport (PushRegions), for StateBlocks of
// the given sizes. Pair it with `ucx_perftest -t ucp_put_bw` (bench/run_transfer_bench.sh).
//
//   baton_transfer_bench --model DIR --decode HOST:PORT [--sizes 1,16,256] [--iterations 10]
#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>

#include "CLI/CLI.hpp"
#include "baton/common/parse.h"
#include "baton/model/weights.h"
#include "baton/transfer/grpc_regions.h"
#include "baton/transfer/ucx.h"
#include "baton/v1/node.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"baton StateBlock transfer benchmark"};
  std::string model_dir, decode_address, sizes_text = "1,16,256";
  int iterations = 10;
  app.add_option("--model", model_dir, "Model directory the decode node serves")->required();
  app.add_option("--decode", decode_address, "baton-decode address")->required();
  app.add_option("--sizes", sizes_text, "StateBlock sizes in MiB");
  app.add_option("--iterations", iterations, "Timed transfers per size");
  CLI11_PARSE(app, argc, argv);
  auto sizes = baton::ParseIntList(sizes_text, "--sizes");
  auto weights = baton::model::LoadCedWeights(model_dir);
  if (!sizes.ok() || !weights.ok()) {
    std::cerr << (sizes.ok() ? weights.status() : sizes.status()).message() << "\n";
    return 2;
  }
  auto decode = baton::v1::DecodeNode::NewStub(
      grpc::CreateChannel(decode_address, grpc::InsecureChannelCredentials()));
  auto worker = baton::transfer::UcxWorker::Create();
  if (!worker.ok()) {
    std::cerr << worker.status().message() << "\n";
    return 1;
  }
  nlohmann::json out = nlohmann::json::array();
  for (int64_t mib : *sizes) {
    const uint64_t bytes = static_cast<uint64_t>(mib) << 20;
    baton::v1::ReserveRequest reserve;
    reserve.set_request_id("transfer-bench-" + std::to_string(mib));
    reserve.set_model_fingerprint(weights->fingerprint);
    reserve.mutable_sampling()->set_max_tokens(1);
    reserve.set_timeout_ms(600000);
    // One page first, to learn the page size; then a prompt whose block KV is `bytes`.
    reserve.set_prompt_tokens(1);
    baton::v1::Reservation probe;
    {
      grpc::ClientContext context;
      if (!decode->Reserve(&context, reserve, &probe).ok()) return 1;
      grpc::ClientContext release_context;
      baton::v1::ReleaseRequest release;
      release.set_reservation_id(probe.reservation_id());
      baton::v1::ReleaseResponse ignored;
      decode->Release(&release_context, release, &ignored);
    }
    const uint64_t page_bytes = probe.page_bytes();
    const uint64_t pages = std::max<uint64_t>(1, bytes / page_bytes);
    reserve.set_prompt_tokens(static_cast<uint32_t>(pages * weights->config.kv_block_size));
    baton::v1::Reservation reservation;
    grpc::ClientContext context;
    if (grpc::Status s = decode->Reserve(&context, reserve, &reservation); !s.ok()) {
      std::cerr << "reserve " << mib << " MiB: " << s.error_message() << "\n";
      return 1;
    }
    auto local = (*worker)->Allocate(pages * page_bytes);
    auto endpoint = (*worker)->Connect(reservation.ucx_worker_address(), reservation.rkey());
    if (!local.ok() || !endpoint.ok()) {
      std::cerr << "UCX set-up failed\n";
      return 1;
    }
    auto* source = reinterpret_cast<char*>((*local)->address());
    std::memset(source, 7, pages * page_bytes);
    std::vector<const void*> local_pages;
    for (uint64_t p = 0; p < pages; ++p) local_pages.push_back(source + p * page_bytes);
    const std::vector<uint64_t> remote_pages(reservation.page_addrs().begin(),
                                             reservation.page_addrs().end());
    auto ucx_once = [&] {
      (void)(*endpoint)->PutPages(local_pages, remote_pages, page_bytes, pages * page_bytes);
      (void)(*endpoint)->Flush();
    };
    auto grpc_once = [&] {
      grpc::ClientContext push_context;
      baton::v1::PushRegionsResponse pushed;
      auto writer = decode->PushRegions(&push_context, &pushed);
      for (uint64_t p = 0; p < pages; ++p) {
        baton::transfer::WriteRegionChunks(*writer, reservation.reservation_id(),
                                           baton::v1::REGION_BLOCK_KV, source + p * page_bytes,
                                           page_bytes, p * page_bytes);
      }
      writer->WritesDone();
      (void)writer->Finish();
    };
    auto measure = [&](auto&& once) {
      once();
      once();
      const auto start = Clock::now();
      for (int i = 0; i < iterations; ++i) once();
      return static_cast<double>(pages * page_bytes) * iterations / Seconds(start) / (1 << 20);
    };
    const double ucx = measure(ucx_once);
    const double grpc_rate = measure(grpc_once);
    out.push_back({{"size_mib", mib},
                   {"pages", pages},
                   {"page_bytes", page_bytes},
                   {"ucx_mib_per_s", ucx},
                   {"grpc_mib_per_s", grpc_rate}});
    endpoint->reset();
    grpc::ClientContext release_context;
    baton::v1::ReleaseRequest release;
    release.set_reservation_id(reservation.reservation_id());
    baton::v1::ReleaseResponse ignored;
    decode->Release(&release_context, release, &ignored);
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}
