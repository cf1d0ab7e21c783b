// The prefill node's side of the prefix store fleet (DESIGN section 5): a stub per store node,
// the reads of a hit's blocks from their owners, and the write-back to every owner. Private to
// prefill_node/.
//
// - A request's route is the fleet the router looked its prompt up against (PrefillRequest
//   .stores), or without one the node's own --kvstore as a fleet of one.
// - A block is read from one of its owners, the owners taken in ReadOrder (rotated per request,
//   so a hot prefix's reads spread over its R owners). Each round asks every owner its blocks
//   in parallel; a block that one owner could not give (absent, failed its checks there, the
//   call failed) is asked of its next owner in the next round, until none is left. Owners
//   whose breaker is open are passed over. Every call ends at the load's deadline, and a call
//   whose blocks all have another owner left ends at half the time left (a hedge against an
//   owner that stops mid-read).
// - A write goes to every owner: one stream per owner, in parallel, each holding its blocks
//   deepest first (PrefixStore::Probe's comment says why the order matters).
//
// Thread-safe: calls from any thread.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "baton/common/hash.h"
#include "baton/common/trace.h"
#include "baton/kvstore/fleet.h"
#include "baton/kvstore/prefix_index.h"
#include "baton/prefill_node/prefill_service.h"
#include "baton/v1/kvstore.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace baton::prefill_node {

class StoreFleetClient {
 public:
  // `fixed_address`: the --kvstore store used when a request names no fleet ("": none).
  explicit StoreFleetClient(std::string fixed_address);

  using Route = StoreFleetRoute;
  // The route of a request whose (checked) fleet is `fleet`.
  Route RouteFor(const v1::StoreFleet& fleet);

  // Reads `blocks` (indexes into `keys`) of `region`, values of `model_fingerprint`, from
  // their owners, each payload checked to be `payload_bytes`; `use` gets each block read, on
  // this thread. True when every block was read. The calls carry `caller`'s cancellation and
  // end by `deadline`.
  bool Read(const Route& route, grpc::ServerContext& caller, const trace::Span& span,
            std::span<const Sha256Digest> keys, std::span<const int64_t> blocks,
            kvstore::Region region, const std::string& model_fingerprint, uint64_t payload_bytes,
            std::chrono::system_clock::time_point deadline,
            const std::function<void(int64_t, const std::string&)>& use);

  // Writes each value to all its owners; the owners whose write failed (or were skipped by
  // their breaker), by node id.
  std::vector<std::string> Write(const Route& route, const std::vector<v1::BlockWrite>& writes,
                                 const trace::Span& span);

  const kvstore::StoreBreaker& breaker() const { return breaker_; }

 private:
  std::shared_ptr<v1::KvStore::StubInterface> Stub(const std::string& address);

  std::string fixed_address_;
  uint64_t turn_ = 0;  // read rotation; under mutex_
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<v1::KvStore::StubInterface>> stubs_;  // by address
  kvstore::StoreBreaker breaker_;
};

}  // namespace baton::prefill_node
