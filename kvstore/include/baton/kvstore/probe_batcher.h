// The probes a store fleet's lookups send, coalesced per store node (docs/architecture.md,
// "The store as a fleet").
//
// A lookup asks every owner of a chain's keys for its keys (fleet.h KeysByOwner). Each value
// is placed by its own chain key, so a chain of more blocks than there are store nodes has
// keys on every node, and every lookup reaches every node. What a probe costs a store node is
// then mostly fixed (the call, TLS, the server's wake-ups: about 0.1 ms on the CI machine,
// against under 1 µs per key), and with one call per lookup every node would pay it for every
// lookup, however many nodes share the keys.
//
// ProbeBatcher sends one node's probes from one thread: while its call is out, the lookups
// that need the node queue, and the next call carries all of them (each key once, within the
// store's bound on keys per call). Under load a node's fixed cost is shared by the lookups of
// a call, so what each lookup costs each node falls towards its share of the keys, 1/N of the
// chain; alone, a lookup is sent at once and waits for nothing. Every lookup keeps its own
// deadline: a node that has not answered a lookup by then is DEADLINE_EXCEEDED for it, whether
// its probe was still queued or out.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "baton/v1/kvstore.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace baton::kvstore {

class ProbeBatcher {
 public:
  using Clock = std::chrono::system_clock;
  struct Options {
    // Keys in one call, at most: the store refuses more than its chain length.
    size_t max_keys_per_call = 1;
    // Lookups in one call, at most.
    size_t max_lookups_per_call = 256;
    // A node's thread ends after this long with nothing to send (a new lookup starts another).
    std::chrono::milliseconds idle_exit{30000};
  };
  // One node's part of a lookup: the node, a stub that reaches it, and its keys (KeyBytes).
  struct Ask {
    std::string node_id;
    std::shared_ptr<v1::KvStore::StubInterface> stub;
    std::vector<std::string> keys;
  };
  // A node's answer for an Ask's keys: one entry per key in the response when the call was OK
  // and the node answered every key it was sent; an empty response when its sizes did not
  // match (MergeProbes ignores it, as any answer of the wrong size).
  struct Answer {
    grpc::Status status;
    v1::ProbeResponse response;
  };

  explicit ProbeBatcher(Options options);
  // Cancels what is queued, and waits for the calls out and for every Probe() to return.
  ~ProbeBatcher();
  ProbeBatcher(const ProbeBatcher&) = delete;
  ProbeBatcher& operator=(const ProbeBatcher&) = delete;

  // Asks each node for its keys, all nodes at once, and waits for their answers until
  // `deadline`: one Answer per ask, in order. `metadata` is added to a call that carries this
  // lookup first (a trace's traceparent). Thread-safe.
  std::vector<Answer> Probe(std::vector<Ask> asks, Clock::time_point deadline,
                            std::vector<std::pair<std::string, std::string>> metadata = {});

  uint64_t calls() const;    // Probe calls sent
  uint64_t lookups() const;  // node parts of lookups those calls carried
  size_t queued() const;     // node parts of lookups waiting for a call now

 private:
  struct Lookup;
  struct Waiter;
  struct Sender;
  void Send(const std::string& node_id, const std::shared_ptr<Sender>& sender);
  // Takes the next call's waiters off `sender`'s queue (settled ones are dropped).
  std::vector<std::shared_ptr<Waiter>> TakeBatch(Sender& sender);
  // Ends `waiter` with `status` (its lookup is woken once every node has answered).
  static void Cancel(Waiter& waiter, const grpc::Status& status);
  // Gives each of `batch` its part of the call's answer.
  void Settle(const std::vector<std::shared_ptr<Waiter>>& batch,
              const std::vector<std::vector<size_t>>& places, const grpc::Status& status,
              const v1::ProbeResponse& response, size_t sent_keys);

  const Options options_;
  mutable std::mutex mutex_;  // all that follows, and every Lookup and Waiter
  std::map<std::string, std::shared_ptr<Sender>> senders_;  // by node id
  size_t threads_ = 0;                                      // senders' threads running
  size_t probing_ = 0;                                      // Probe() calls not yet returned
  std::condition_variable threads_ended_;
  bool stop_ = false;
  uint64_t calls_ = 0, lookups_ = 0;
};

}  // namespace baton::kvstore
