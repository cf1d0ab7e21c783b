// The decode node's UCX read of a Commit's RegionSource (issue 48 item 7): any bytes as the
// source, with the real prefill worker's address and key, and (when the first byte says so)
// the staging address and the exposure it claims moved by the next 24 bytes
// (offsets from the real ones, so that the fuzzer reaches the edges of the attached segment).
// Whatever the bytes, the read answers a status without touching memory it should not (the
// sanitizers watch), and a read that succeeds named staging memory inside the real exposure,
// the memory the key's segment holds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "baton/transfer/exposure.h"
#include "baton/transfer/transport.h"
#include "baton/transfer/ucx.h"

namespace {

namespace t = baton::transfer;

const t::RegionSizes kSizes{.producer_swa = 3000, .consumer_swa = 5000, .page = 4096,
                            .pages = 3, .block_kv = 3 * 4096 - 700};
t::UcxWorker* exposer = nullptr;
t::UcxWorker* reader = nullptr;
t::StagingPool* pool = nullptr;
std::shared_ptr<t::Exposure>* exposure = nullptr;
t::Transport* transport = nullptr;
baton::v1::RegionSource real;

// Everything goes before exit, readers first, so that the leak check sees UCX's own state
// released (some of it is referenced only from shared segments, which it does not scan).
void TearDown() {
  delete transport;
  delete exposure;
  delete pool;
  delete reader;
  delete exposer;
}

uint64_t Load64(const uint8_t* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  auto a = t::UcxWorker::Create();
  auto b = t::UcxWorker::Create();
  if (!a.ok() || !b.ok()) std::abort();
  exposer = a->release();
  reader = b->release();
  pool = new t::StagingPool(exposer, 0);
  auto created = t::Exposure::Create(*pool, kSizes, "", "decode");
  if (!created.ok()) std::abort();
  exposure = new std::shared_ptr<t::Exposure>(*created);
  real = (*exposure)->Source(baton::v1::TRANSPORT_UCX);
  transport = t::MakeUcxTransport(*reader).release();
  std::atexit(TearDown);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 25) return 0;
  baton::v1::RegionSource source;
  if (!source.ParseFromArray(data + 25, static_cast<int>(size - 25))) return 0;
  const uint8_t flags = data[0];
  // The worker address and key are the real ones: baton's checks are of the addresses, and
  // UCX 1.13 parses the other two itself, asserting on malformed ones (ucp_address_unpack,
  // the posix key's length; docs/deploy.md says what that leaves a prefill pod).
  source.set_ucx_worker_address(real.ucx_worker_address());
  source.set_rkey(real.rkey());
  if (flags & 4) {
    // Offsets from the real address and exposure (wrapping, as a forged one may).
    source.set_address(real.address() + Load64(data + 1));
    source.set_exposed_address(real.exposed_address() + Load64(data + 9));
    source.set_exposed_bytes(real.exposed_bytes() + Load64(data + 17));
  }
  std::vector<char> rings(kSizes.producer_swa + kSizes.consumer_swa);
  std::vector<char> pages(kSizes.pages * kSizes.page);
  t::RegionSpans into{.sizes = kSizes, .producer_swa = rings.data(),
                      .consumer_swa = rings.data() + kSizes.producer_swa};
  for (uint64_t p = 0; p < kSizes.pages; ++p) into.pages.push_back(pages.data() + p * kSizes.page);
  const absl::Status status = transport->Read(
      source, "", into, std::chrono::steady_clock::now() + std::chrono::milliseconds(200));
  if (status.ok()) {
    const uint64_t begin = real.exposed_address(), end = begin + real.exposed_bytes();
    const uint64_t total = t::StagingBytes(kSizes);
    if (source.address() < begin || source.address() > end || total > end - source.address()) {
      std::abort();  // read staging memory outside the real exposure
    }
  }
  return 0;
}
