// ucx_probe: the two sides of the UCX data-plane attack that tests/transfer/ucx_exposure_test.cc
// runs as separate processes.
//
//   ucx_probe expose --out FILE --secret TEXT [--seconds N] [--allow-unprotected-tcp]
//     A prefill node's side, through baton's own transport code: a UcxWorker (with baton's
//     transport policy), a StagingPool and one Exposure, and beside them a heap buffer holding
//     TEXT that nothing exposes. It writes FILE (the worker address, the packed key and the
//     addresses of both, as an outsider who watched the wire or guessed would know them),
//     progresses its worker for N seconds (or until FILE.stop appears), then prints
//     "outside intact" or "outside overwritten". Exits 2 when the policy refuses UCX_TLS.
//
//   ucx_probe attack --in FILE [--as-user NAME]
//     The outsider: plain ucp calls, as the same user or (as root) after dropping to NAME. It
//     connects to the worker, unpacks the key, gets and then puts the buffer outside the
//     exposure, and prints "get OUTSIDE staging rc=... data=..." and "put OUTSIDE staging
//     rc=...". Every step is bounded in time; a step that fails says so and the rest are
//     skipped.
#include <grp.h>
#include <pwd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "baton/transfer/exposure.h"
#include "baton/transfer/ucx.h"

namespace {

using Clock = std::chrono::steady_clock;

std::map<std::string, std::string> Flags(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 2; i < argc; ++i) {
    std::string name = argv[i];
    if (name.rfind("--", 0) != 0) continue;
    const bool has_value = i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0;
    flags[name.substr(2)] = has_value ? argv[++i] : "1";
  }
  return flags;
}

int Expose(const std::map<std::string, std::string>& flags) {
  using namespace baton::transfer;
  const std::string out = flags.at("out");
  const std::string secret = flags.at("secret");
  const int seconds = flags.contains("seconds") ? std::stoi(flags.at("seconds")) : 20;
  auto worker = UcxWorker::Create({.allow_unprotected_tcp = flags.contains("allow-unprotected-tcp")});
  if (!worker.ok()) {
    std::cerr << "ucx_probe: " << worker.status().message() << "\n";
    return absl::IsInvalidArgument(worker.status()) ? 2 : 1;
  }
  StagingPool pool(worker->get(), 0);
  RegionSizes sizes{.producer_swa = 4096, .consumer_swa = 4096, .page = 4096, .pages = 2};
  sizes.block_kv = 2 * 4096;
  auto exposure = Exposure::Create(pool, sizes, "", "decode");
  if (!exposure.ok()) {
    std::cerr << "ucx_probe: " << exposure.status().message() << "\n";
    return 1;
  }
  std::memset((*exposure)->producer_swa(), 'x', StagingBytes(sizes));
  // What nothing exposes: another request's prompt, say.
  std::vector<char> outside(4096, '\0');
  std::memcpy(outside.data(), secret.data(), std::min(secret.size(), outside.size() - 1));
  const baton::v1::RegionSource source = (*exposure)->Source(baton::v1::TRANSPORT_UCX);
  {
    std::ofstream file(out + ".tmp");
    file << "worker " << absl::BytesToHexString((*worker)->address()) << "\n"
         << "rkey " << absl::BytesToHexString(source.rkey()) << "\n"
         << "staging " << source.address() << "\n"
         << "staging_bytes " << StagingBytes(sizes) << "\n"
         << "outside " << reinterpret_cast<uint64_t>(outside.data()) << "\n"
         << "outside_bytes " << outside.size() << "\n"
         << "transports " << (*worker)->transports() << "\n";
  }
  std::filesystem::rename(out + ".tmp", out);
  const Clock::time_point until = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < until && !std::filesystem::exists(out + ".stop")) {
    if ((*worker)->Progress() == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const bool intact = std::memcmp(outside.data(), secret.data(),
                                  std::min(secret.size(), outside.size() - 1)) == 0;
  std::cout << (intact ? "outside intact" : "outside overwritten") << std::endl;
  return 0;
}

// Waits for a ucp request until `deadline`; UCS_ERR_TIMED_OUT when it did not end by then.
ucs_status_t Wait(ucp_worker_h worker, void* request, Clock::time_point deadline) {
  if (request == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
  ucs_status_t status;
  while ((status = ucp_request_check_status(request)) == UCS_INPROGRESS) {
    if (Clock::now() > deadline) return UCS_ERR_TIMED_OUT;  // left outstanding: we exit next
    ucp_worker_progress(worker);
  }
  ucp_request_free(request);
  return status;
}

int Attack(const std::map<std::string, std::string>& flags) {
  std::map<std::string, std::string> info;
  {
    std::ifstream file(flags.at("in"));
    std::string key, value;
    while (file >> key >> value) info[key] = value;
  }
  if (flags.contains("as-user")) {
    const passwd* user = getpwnam(flags.at("as-user").c_str());
    if (user == nullptr || setgroups(0, nullptr) != 0 || setgid(user->pw_gid) != 0 ||
        setuid(user->pw_uid) != 0) {
      std::cout << "drop to " << flags.at("as-user") << " failed: " << std::strerror(errno)
                << std::endl;
      return 1;
    }
    std::cout << "running as uid " << getuid() << std::endl;
  }
  const std::string address = absl::HexStringToBytes(info["worker"]);
  std::string rkey_buffer = absl::HexStringToBytes(info["rkey"]);
  const uint64_t outside = std::stoull(info["outside"]);
  const uint64_t outside_bytes = std::stoull(info["outside_bytes"]);
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(5);

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA;
  ucp_config_t* config = nullptr;
  ucp_context_h context = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status == UCS_OK) status = ucp_init(&params, config, &context);
  if (config != nullptr) ucp_config_release(config);
  std::cout << "init rc=" << ucs_status_string(status) << std::endl;
  if (status != UCS_OK) return 0;
  ucp_worker_params_t worker_params{};
  ucp_worker_h worker = nullptr;
  status = ucp_worker_create(context, &worker_params, &worker);
  std::cout << "worker rc=" << ucs_status_string(status) << std::endl;
  if (status != UCS_OK) return 0;
  std::string padded = address;
  padded.resize(address.size() + 256, '\0');
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep_params.address = reinterpret_cast<const ucp_address_t*>(padded.data());
  ucp_ep_h ep = nullptr;
  status = ucp_ep_create(worker, &ep_params, &ep);
  std::cout << "ep_create rc=" << ucs_status_string(status) << std::endl;
  if (status != UCS_OK) return 0;
  rkey_buffer.resize(rkey_buffer.size() + 256, '\0');
  ucp_rkey_h rkey = nullptr;
  status = ucp_ep_rkey_unpack(ep, rkey_buffer.data(), &rkey);
  std::cout << "rkey_unpack rc=" << ucs_status_string(status) << std::endl;
  if (status != UCS_OK) return 0;

  std::vector<char> read(outside_bytes, '\0');
  ucp_request_param_t request_params{};
  status = Wait(worker,
                ucp_get_nbx(ep, read.data(), read.size(), outside, rkey, &request_params),
                deadline);
  if (status == UCS_OK) {
    status = Wait(worker, ucp_ep_flush_nbx(ep, &request_params), deadline);
  }
  std::string shown;
  for (char c : read) {
    if (c == '\0') break;
    shown += std::isprint(static_cast<unsigned char>(c)) ? c : '.';
  }
  std::cout << "get OUTSIDE staging rc=" << ucs_status_string(status) << " data=" << shown
            << std::endl;
  std::vector<char> overwrite(outside_bytes, '\0');
  std::memcpy(overwrite.data(), "overwritten by ucx_probe", 24);
  status = Wait(worker,
                ucp_put_nbx(ep, overwrite.data(), overwrite.size(), outside, rkey,
                            &request_params),
                deadline);
  if (status == UCS_OK) {
    status = Wait(worker, ucp_ep_flush_nbx(ep, &request_params), deadline);
  }
  std::cout << "put OUTSIDE staging rc=" << ucs_status_string(status) << std::endl;
  // No orderly teardown: requests may still be outstanding against a peer that refused us.
  std::_Exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: ucx_probe expose|attack ...\n";
    return 2;
  }
  const std::string mode = argv[1];
  const auto flags = Flags(argc, argv);
  try {
    if (mode == "expose") return Expose(flags);
    if (mode == "attack") return Attack(flags);
  } catch (const std::exception& e) {
    std::cerr << "ucx_probe: " << e.what() << "\n";
    return 2;
  }
  std::cerr << "ucx_probe: unknown mode " << mode << "\n";
  return 2;
}
