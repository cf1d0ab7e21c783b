// A request on the decode node (DecodeService's own, decode_service.cc and reservation.cc): its
// reservation in the state pool, who may use it, its life cycle, and what it generates
// (decode_step.h's Generation).
//
// Threads. Every field is read and written under DecodeService::mutex_, with two exceptions:
// - while the request is kTransferring, the Commit handler that moved it there writes its
//   state's regions without the lock (nothing else touches a transferring reservation's state);
// - while the request is in a decode step, the decode thread runs the step without the lock: it
//   reads and writes `generation.context`, `generation.speculation` (drafts, the draft model's
//   state), `logits` and the computed state's rows, which only that thread writes; it settles
//   the step (every other Generation field) under the lock. Stream handlers read the streamed
//   fields (tokens, logprobs, finish, the replay's figures) under the lock only.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "baton/common/trace.h"
#include "baton/decode_node/decode_step.h"
#include "baton/decode_node/state_pool.h"
#include "baton/model/state.h"
#include "baton/v1/generation.pb.h"
#include "prometheus/histogram.h"

namespace baton::decode_node {

// A request's block-KV pages in the engine's copy of the pool: the pool pages its host state
// (the transfer's target) holds, at the same offsets. The host state allocates and frees them.
class EnginePages : public model::PageAllocator {
 public:
  EnginePages(model::SequenceState& host, std::function<float*(float*)> in_engine)
      : host_(host), in_engine_(std::move(in_engine)) {}
  float* Allocate() override {
    if (!host_.EnsurePages((next_ + 1) * host_.layout().block_size).ok()) return nullptr;
    return in_engine_(host_.pages()[next_++]);
  }
  void Free(float*) override {}

 private:
  model::SequenceState& host_;
  std::function<float*(float*)> in_engine_;
  int64_t next_ = 0;
};

// kReplaying: committed under replay-on-decode, its consumer layers being replayed over the
// boundary rows, a piece each step, until the first token is sampled (then kCommitted).
// kFinished: its last token is sampled, or a step failed (finish UNSPECIFIED).
enum class Phase { kReserved, kTransferring, kReplaying, kCommitted, kFinished };

// Where a request's state lives: its slot and pages in the pool, the state transfers write,
// and on a device engine the copy the steps run on. The slot and the unused page credit go
// back only when the last holder of the Request lets go: an in-flight decode step keeps writing
// the rings of a request that was just cancelled.
struct Reservation {
  ~Reservation();
  // The boundary rows are replayed (or the request ends): their pages go back to the pool.
  void FreeBoundaryPages();
  model::SequenceState& computed() { return engine_state != nullptr ? *engine_state : *state; }

  StatePool* pool = nullptr;  // set once the slot is reserved: from then on it returns with this
  int64_t slot = -1;
  int64_t reserved_pages = 0;
  std::unique_ptr<model::SequenceState> state;  // in the pool: what transfers write
  // On a device engine, the state the decode steps run on (the pool's copy in the engine's
  // memory, staged in at commit); null on a host-memory engine, which runs on `state`.
  std::unique_ptr<EnginePages> engine_pages;
  std::unique_ptr<model::SequenceState> engine_state;
  // Replay-on-decode: the pool pages the boundary rows land in (freed once replayed).
  std::vector<float*> boundary_pages;
  int64_t boundary_pages_taken = 0;
};

// Shadow verification of a request (fidelity_shadow.h): the tokens served and the logits they
// were sampled from, kept until `want` are held or the request ends, then handed to the shadow.
struct FidelityCapture {
  int64_t want = 0;    // positions to compare; 0: none
  bool reply = false;  // the client asked: the last output carries `result`
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> served;
  std::string mode, keep, hit;  // the metrics' labels
  bool submitted = false;
  bool pending = false;  // submitted with reply, `result` not in yet: the last output waits
  v1::Fidelity result;
  // Keeps the served row of the next token (until `want` are held).
  void Keep(int32_t token, std::span<const float> logits) {
    if (static_cast<int64_t>(tokens.size()) >= want) return;
    tokens.push_back(token);
    served.emplace_back(logits.begin(), logits.end());
  }
};

struct Request {
  using Clock = std::chrono::steady_clock;
  ~Request();

  std::string id;          // the reservation id (random, chosen here)
  std::string request_id;  // the client's request id, for logs
  trace::Span span;  // the node's span of the request's trace, a child of the router's Reserve
  // Who may use the reservation (certificate identities; empty without mutual TLS): the
  // router that reserved it streams and releases, the prefill node it named pushes and commits.
  std::string router_identity;
  std::string prefill_identity;
  std::string prefill_address;      // where the gRPC transport reads from
  std::string prefill_ucx_address;  // the UCX worker the prefill node registered (may be empty)
  // The reservation's split and most boundary rows (replay-on-decode).
  v1::Split split = v1::SPLIT_PREFILL_ALL;
  uint32_t boundary_rows = 0;
  uint32_t prompt_len = 0;

  Phase phase = Phase::kReserved;
  Clock::time_point deadline;  // reservation: commit by then; committed: attach by then
  bool attached = false;       // a stream has taken it: the reaper leaves it alone
  // Signalled when the request gains tokens, finishes or leaves the node: what its stream
  // handler waits on (with DecodeService::mutex_).
  absl::CondVar progress;
  double wait_ms = 0, transfer_ms = 0;  // in the slot queue; reading the StateBlock
  Clock::time_point committed_at;
  double replay_ms = -1;  // set once the first token is sampled here; sent with it
  bool replay_reported = false;
  size_t streamed = 0;  // tokens of generation.tokens written to the stream

  Reservation reservation;
  Generation generation;
  std::vector<float> logits;  // the decode thread's: a step's output rows for the request
  prometheus::Histogram* acceptance = nullptr;  // observes the request's acceptance rate
  FidelityCapture fidelity;
};

}  // namespace baton::decode_node
