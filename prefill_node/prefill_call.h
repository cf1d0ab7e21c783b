// One Prefill call on the prefill node as a pipeline of stages (DESIGN sections 4 and 6), in
// the manner of the router's GenerateCall: each stage is one method returning absl::Status, the
// first error ends the call, and PrefillService::Prefill turns the result into the call's
// grpc::Status.
//
//   Admit -> StageMemory -> LoadPrefix -> Compute -> Commit -> WriteBack, then Respond
//   and, once answered, WriteBackAfterAnswer
//
// What a stage takes is held by the call and let go, in the reverse order, when the call is
// destroyed: the model (taken by Compute; Commit gives it up as soon as the header is sealed),
// the exposed staging memory and its slot (StageMemory), and the call's place among the node's
// active requests (Admit), which Drain waits on. All of it is let go before the service counts
// and logs the call's outcome, but for a call with computed blocks to write back: answered, it
// is no longer active (Answered), and it keeps the state's memory until the node's copier
// thread has copied the blocks out of it (PrefillService::AfterAnswer), so that the first
// token does not wait for those copies.
//
// Threading: a PrefillCall belongs to the gRPC thread serving its call, and after its answer
// to the node's copier thread, which uses none of the call's gRPC objects (gone by then).
// Private to prefill_node/; a friend of PrefillService, whose parts it uses.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "baton/common/fifo_turns.h"
#include "baton/common/hash.h"
#include "baton/common/trace.h"
#include "baton/model/engine.h"
#include "baton/model/sampling.h"
#include "baton/model/truncation.h"
#include "baton/prefill_node/prefill_service.h"
#include "baton/transfer/exposure.h"
#include "baton/transfer/state_block.h"
#include "baton/v1/node.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace baton::prefill_node {

class PrefillCall {
 public:
  // `span` is the node's span of the request's trace (carried on its calls to the store and
  // the decode node); `stage_ms` receives each stage's milliseconds, for the node's log line.
  PrefillCall(PrefillService& node, grpc::ServerContext& context, const v1::PrefillRequest& request,
              v1::PrefillResponse& reply, const trace::Span& span,
              std::map<std::string, double>& stage_ms);
  PrefillCall(const PrefillCall&) = delete;
  PrefillCall& operator=(const PrefillCall&) = delete;

  // Serves the request to its end: OK once the decode node has committed the state and `reply`
  // holds the first token, or the error for the router (with the baton-failed-node trailer
  // when the decode node failed, not this one).
  absl::Status Run();

  // After an OK Run: blocks computed here are still to go to the block cache and the store.
  bool write_back_pending() const { return write_back_pending_; }
  // The call is answered: it is no longer one of the node's active requests.
  void Answered() { active_.reset(); }
  // On the node's copier thread, after the answer: the computed blocks' payloads, copied out
  // of the state into the local block cache and the store's write-back queue.
  void WriteBackAfterAnswer();

 private:
  using Stage = absl::Status (PrefillCall::*)();

  // The call is one of the node's active requests while this lives. Made under node.mutex_,
  // held by the caller, by the check that the node is not draining. Its predicted work
  // (`work_ms`) counts in the node's reported prefill_work_ms until it has been computed.
  class Active {
   public:
    Active(PrefillService& node, double work_ms);
    Active(const Active&) = delete;
    Active& operator=(const Active&) = delete;
    ~Active();
    // The model took it now; then it has been computed (or failed), its work no longer ahead.
    void Computing();
    void Computed();

   private:
    PrefillService& node_;
    double work_ms_;
    bool computing_ = false;
  };

  // One of the node's max_staged_requests staging slots, held while this lives. Made under
  // node.mutex_, held by the caller, once a slot is free.
  class Staged {
   public:
    explicit Staged(PrefillService& node);
    Staged(const Staged&) = delete;
    Staged& operator=(const Staged&) = delete;
    ~Staged();

   private:
    PrefillService& node_;
  };

  // The model, this call's alone while this lives: made once the call's turn comes, after every
  // call that asked before it (counted as queued until then), and the watchdog's work
  // (computing_) meanwhile.
  class ModelTurn {
   public:
    explicit ModelTurn(PrefillService& node);
    ModelTurn(const ModelTurn&) = delete;
    ModelTurn& operator=(const ModelTurn&) = delete;
    ~ModelTurn();

   private:
    PrefillService& node_;
    std::optional<FifoTurns::Turn> turn_;
  };

  // The stages, in order. LoadPrefix and WriteBack never fail the call: a prefix that cannot
  // be loaded is computed, and a write-back the store cannot take is skipped.
  absl::Status Admit();        // bounds, the drain gate, the transport, the reservation's sizes
  absl::Status StageMemory();  // a staging slot, and the state's memory exposed in it
  absl::Status LoadPrefix();   // the prefix hit's blocks from the store
  absl::Status Compute();      // the prompt through the model, and the first token sampled
  absl::Status Commit();       // the header to the decode node, which reads the state meanwhile
  absl::Status WriteBack();    // the blocks computed here to write back after the answer
  void Respond();              // the first token, usage and timings into the reply
  // The client asked for prompt logprobs and may have them (truncation off, no prefix hit).
  bool WantsPromptLogprobs() const;

  // The engine's prefill options: chunks, cancellation, and the rows the store and the prompt
  // logprobs need.
  model::PrefillOptions ModelOptions();
  // The commit request: where the decode node reads the state, and the sealed header.
  v1::CommitRequest SealedCommit() const;
  // The status of a commit that failed with `status`, the decode node named as the failed one.
  absl::Status CommitFailed(const grpc::Status& status,
                            std::chrono::system_clock::time_point deadline);

  PrefillService& node_;
  grpc::ServerContext& context_;
  const trace::Span span_;  // a copy: the write-back after the answer logs under it
  std::map<std::string, double>& stage_ms_;
  const v1::PrefillRequest& request_;
  const v1::GenerateRequest& generate_;  // request_.request()
  v1::PrefillResponse& reply_;
  const std::chrono::steady_clock::time_point start_;
  const std::vector<int32_t> tokens_;  // the prompt
  const int64_t prompt_len_;           // L
  const model::StateLayout layout_;

  // Fixed by Admit.
  model::TruncationMode mode_ = model::TruncationMode::kOff;
  transfer::RegionSizes sizes_{};
  std::optional<Active> active_;

  // Taken by StageMemory and held through the commit: the state lives in the exposed memory.
  std::optional<Staged> staged_;
  std::shared_ptr<transfer::Exposure> exposure_;
  std::optional<model::ContiguousPageAllocator> page_buffer_;
  std::optional<model::SequenceState> state_;

  // LoadPrefix: the prompt's chain keys (with a prefix store) and the tokens loaded.
  StoreFleetRoute route_;  // the store nodes of this request (LoadPrefix on)
  std::vector<Sha256Digest> keys_;
  int64_t cached_ = 0;
  PrefillService::PrefixLoad load_;

  // Compute.
  std::vector<float> producer_rows_;  // [P][2][L][kv_dim], for the store
  std::optional<ModelTurn> model_turn_;
  model::PrefillResult result_;
  model::SampledToken first_;
  bool replay_on_decode_ = false;   // the split this node serves (request checked in Admit)
  std::span<float> boundary_rows_;  // replay-on-decode: the exposed boundary-rows region
  double prefill_ms_ = 0;
  double wait_ms_ = 0;     // for a staging slot and for the model
  double compute_ms_ = 0;  // the engine's prefill

  // Commit.
  std::chrono::steady_clock::time_point transfer_start_;

  // WriteBack: what the write-back after the answer needs of the request.
  bool write_back_pending_ = false;
  std::string tenant_, cache_salt_;
};

}  // namespace baton::prefill_node
