// StateBlock transfer throughput by pull, as the nodes move it: one process exposes staging
// memory per StateBlock as the prefill node does (transfer::Exposure in a StagingPool, UCX
// allocated and registered, served to ReadRegions), the other reads it into UCX-allocated
// memory as the decode node reads into its pool, through the same Transports (UCX get, and the
// gRPC transport, under mutual TLS with --tls). It also times what exposing costs the prefill
// node, per request and with a reused staging buffer. Pair it with `ucx_perftest -t ucp_get`
// (bench/run_transfer_bench.sh runs it on shared memory and on TCP).
//
//   baton_transfer_bench --expose FILE [--sizes 1,16,256] [--tls DIR]   (stays up until killed)
//   baton_transfer_bench --read FILE [--sizes 1,16,256] [--iterations 10] [--tls DIR]
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/escaping.h"
#include "baton/common/parse.h"
#include "baton/common/pki.h"
#include "baton/common/security.h"
#include "baton/transfer/exposure.h"
#include "baton/transfer/transport.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"

namespace {

using baton::transfer::Clock;
constexpr uint64_t kPageBytes = 64 << 10;  // block-KV page of the bench's StateBlocks

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

baton::transfer::RegionSizes SizesOf(int64_t mib) {
  baton::transfer::RegionSizes sizes;
  sizes.page = kPageBytes;
  sizes.pages = (static_cast<uint64_t>(mib) << 20) / kPageBytes;
  sizes.block_kv = sizes.pages * sizes.page;
  return sizes;
}

class ReadRegionsServer final
    : public baton::v1::PrefillNode::WithRawCallbackMethod_ReadRegions<
          baton::v1::PrefillNode::Service> {
 public:
  explicit ReadRegionsServer(const baton::transfer::ExposureTable& table) : table_(table) {}
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ReadRegions(grpc::CallbackServerContext*,
                                                         const grpc::ByteBuffer* request) override {
    return table_.Stream("", *request);
  }

 private:
  const baton::transfer::ExposureTable& table_;
};

// Mutual TLS as between the nodes: a throwaway PKI in `dir` (made by whichever process comes
// first), this process presenting `role`'s certificate.
bool ConfigureTls(const std::string& dir, const std::string& role) {
  if (dir.empty()) return true;
  if (absl::Status s = baton::pki::EnsureLocalPki(dir, {"prefill", "decode"}); !s.ok()) {
    std::cerr << s.message() << "\n";
    return false;
  }
  const absl::Status s = baton::security::Configure(
      {.ca_file = dir + "/ca.crt", .cert_file = dir + "/" + role + ".crt",
       .key_file = dir + "/" + role + ".key"});
  if (!s.ok()) std::cerr << s.message() << "\n";
  return s.ok();
}

int Expose(const std::string& file, const std::vector<int64_t>& sizes, int iterations,
           const baton::transfer::UcxOptions& ucx, const std::string& tls) {
  if (!ConfigureTls(tls, "prefill")) return 1;
  auto worker = baton::transfer::UcxWorker::Create(ucx);
  if (!worker.ok()) {
    std::cerr << worker.status().message() << "\n";
    return 1;
  }
  // What one exposure costs the prefill node: registered for one request (allocate, register,
  // pack the key, zero, free), and a staging buffer reused for the same reader (zero).
  nlohmann::json out;
  baton::transfer::StagingPool strict(worker->get(), 0);
  baton::transfer::StagingPool pool(worker->get(), uint64_t{1} << 30);
  for (int64_t mib : sizes) {
    for (auto [name, staging] : {std::pair{"expose_ms", &strict}, {"expose_reused_ms", &pool}}) {
      (void)baton::transfer::Exposure::Create(*staging, SizesOf(mib), "", "reader");
      const auto start = Clock::now();
      for (int i = 0; i < iterations; ++i) {
        (void)baton::transfer::Exposure::Create(*staging, SizesOf(mib), "", "reader");
      }
      out[name][std::to_string(mib)] = Seconds(start) * 1000 / iterations;
    }
  }
  baton::transfer::ExposureTable table;
  std::vector<std::shared_ptr<baton::transfer::Exposure>> held;
  for (int64_t mib : sizes) {
    auto exposure = baton::transfer::Exposure::Create(pool, SizesOf(mib), "", "reader");
    if (!exposure.ok()) {
      std::cerr << exposure.status().message() << "\n";
      return 1;
    }
    std::memset((*exposure)->block_kv(), 7, SizesOf(mib).block_kv);
    table.Add(*exposure);
    const auto source = (*exposure)->Source(baton::v1::TRANSPORT_UCX);
    out["sources"][std::to_string(mib)] = absl::BytesToHexString(source.SerializeAsString());
    held.push_back(*exposure);
  }
  ReadRegionsServer service(table);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", baton::security::InternalServerCredentials(), &port);
  builder.SetMaxSendMessageSize(64 << 20);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  out["grpc_address"] = "127.0.0.1:" + std::to_string(port);
  std::ofstream(file + ".tmp") << out.dump();
  std::filesystem::rename(file + ".tmp", file);
  // Progress for transports that emulate RMA (tcp); shared memory needs none.
  while (true) {
    if ((*worker)->Progress() == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

int Read(const std::string& file, const std::vector<int64_t>& sizes, int iterations,
         bool with_grpc, const baton::transfer::UcxOptions& ucx_options, const std::string& tls) {
  nlohmann::json in;
  for (int i = 0; i < 600 && in.is_null(); ++i) {
    std::ifstream f(file);
    if (f) {
      in = nlohmann::json::parse(f);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  if (in.is_null()) {
    std::cerr << "no exposures in " << file << "\n";
    return 1;
  }
  if (!ConfigureTls(tls, "decode")) return 1;
  auto worker = baton::transfer::UcxWorker::Create(ucx_options);
  if (!worker.ok()) {
    std::cerr << worker.status().message() << "\n";
    return 1;
  }
  auto ucx = baton::transfer::MakeUcxTransport(**worker);
  auto grpc = baton::transfer::MakeGrpcTransport();
  nlohmann::json out = nlohmann::json::array();
  for (int64_t mib : sizes) {
    const baton::transfer::RegionSizes region_sizes = SizesOf(mib);
    // Destination like the decode node's pool: UCX-allocated, the request's pages in a row.
    auto memory = (*worker)->Allocate(region_sizes.block_kv);
    if (!memory.ok()) return 1;
    baton::transfer::RegionSpans into;
    into.sizes = region_sizes;
    for (uint64_t p = 0; p < region_sizes.pages; ++p) {
      into.pages.push_back(static_cast<char*>((*memory)->data()) + p * kPageBytes);
    }
    baton::v1::RegionSource source;
    if (!source.ParseFromString(
            absl::HexStringToBytes(in["sources"][std::to_string(mib)].get<std::string>()))) {
      return 1;
    }
    const std::string address = in["grpc_address"];
    bool ok = true;
    auto measure = [&](baton::transfer::Transport& transport, baton::v1::Transport kind,
                       int iterations) {
      source.set_transport(kind);
      auto once = [&] {
        const absl::Status s =
            transport.Read(source, address, into, Clock::now() + std::chrono::seconds(60));
        if (!s.ok()) {
          std::cerr << s.message() << "\n";
          ok = false;
        }
      };
      once();
      once();
      const auto start = Clock::now();
      for (int i = 0; i < iterations; ++i) once();
      return static_cast<double>(region_sizes.block_kv) * iterations / Seconds(start) / (1 << 20);
    };
    const double ucx_rate = measure(*ucx, baton::v1::TRANSPORT_UCX, iterations);
    const double grpc_rate =
        with_grpc ? measure(*grpc, baton::v1::TRANSPORT_GRPC, iterations) : 0;
    if (!ok || static_cast<unsigned char>(into.pages[0][0]) != 7) return 1;
    out.push_back({{"size_mib", mib},
                   {"ucx_mib_per_s", ucx_rate},
                   {"grpc_mib_per_s", grpc_rate},
                   {"expose_ms", in["expose_ms"][std::to_string(mib)]},
                   {"expose_reused_ms", in["expose_reused_ms"][std::to_string(mib)]}});
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"baton StateBlock transfer benchmark (pull)"};
  std::string expose_file, read_file, sizes_text = "1,16,256";
  int iterations = 10;
  auto* expose = app.add_option("--expose", expose_file,
                                "Expose one StateBlock per size and describe them in this file");
  app.add_option("--read", read_file, "Read the StateBlocks that file describes")
      ->excludes(expose);
  app.add_option("--sizes", sizes_text, "StateBlock sizes in MiB");
  app.add_option("--iterations", iterations, "Timed transfers per size")->check(CLI::Range(1, 1000));
  bool no_grpc = false;
  app.add_flag("--no-grpc", no_grpc, "Time the UCX transport only");
  baton::transfer::UcxOptions ucx;
  app.add_flag("--ucx-allow-unprotected-tcp", ucx.allow_unprotected_tcp,
               baton::transfer::kUcxAllowUnprotectedTcpHelp);
  std::string tls;
  app.add_option("--tls", tls,
                 "gRPC under mutual TLS with a throwaway PKI in this folder (made when missing)");
  CLI11_PARSE(app, argc, argv);
  auto sizes = baton::ParseIntList(sizes_text, "--sizes");
  if (!sizes.ok()) {
    std::cerr << sizes.status().message() << "\n";
    return 2;
  }
  if (!expose_file.empty()) return Expose(expose_file, *sizes, iterations, ucx, tls);
  if (!read_file.empty()) return Read(read_file, *sizes, iterations, !no_grpc, ucx, tls);
  std::cerr << "one of --expose FILE or --read FILE is required\n";
  return 2;
}
