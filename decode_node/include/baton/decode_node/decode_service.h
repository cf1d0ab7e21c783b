// baton-decode's service (DESIGN sections 4 and 6): reservations in the state pool, the
// commit at which this node pulls the StateBlock's regions from the prefill node (UCX get, or
// PrefillNode.ReadRegions) into the reservation and checks their checksums, continuous
// batching of every committed request, sampling and streaming.
//
// Lifecycle of a request: Reserve -> Commit (regions read, verified) -> decode steps -> Stream
// drains the tokens -> freed. The read goes only into a reservation that is live: it ends by
// the reservation's deadline, and the memory returns to the pool only after the transport has
// stopped writing (transfer/transport.h). A reservation not committed within its timeout, a stream
// cancelled by the client or past its deadline, and a Release all free the slot and pages at
// once. When the pool is short, Reserve waits (at most max_waiting requests at a time, each
// until its deadline); past that bound it answers RESOURCE_EXHAUSTED.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "baton/common/security.h"
#include "baton/common/stream_watch.h"
#include "baton/common/trace.h"
#include "baton/common/watchdog.h"
#include "baton/decode_node/decode_step.h"
#include "baton/decode_node/fidelity_shadow.h"
#include "baton/decode_node/speculation.h"
#include "baton/decode_node/state_pool.h"
#include "baton/model/engine.h"
#include "baton/model/sampling.h"
#include "baton/transfer/transport.h"
#include "baton/transfer/ucx.h"
#include "baton/v1/node.grpc.pb.h"
#include "prometheus/collectable.h"

namespace baton::decode_node {

struct Request;  // request.h

struct DecodeOptions {
  int64_t slots = 64;
  int64_t pages = 4096;
  int64_t max_batch = 64;
  // Replay-on-decode: boundary rows replayed per step, over all replaying requests, while
  // streams are decoding (the Sarathi-Serve cut: their steps stay short while prompts arrive;
  // 8 rows keep 8 streams' step within 1.5x on the small preset at L = 2K,
  // bench/replay_step_bench.cc). A step with no stream decoding replays up to 512.
  int64_t replay_rows_per_step = 8;
  // Replay-on-decode: the share of the running streams' step time a step's replay rows may add
  // (--replay-step-budget; StepPolicy), within replay_rows_per_step; 0 leaves the row bound.
  double replay_step_budget = 1.0;
  // Speculative decoding with a draft model: prompt rows the draft model takes in per step, over
  // all requests (--draft-rows-per-step). A long prompt is taken in a piece per step, so the
  // streams' steps stay short (the draft model is meant to be several times smaller than the
  // target, so its budget is several times replay's); the request drafts once it has caught up.
  int64_t draft_rows_per_step = 64;
  int64_t max_waiting = 64;           // Reserve calls that may wait for memory at once
  int64_t attach_timeout_ms = 30000;  // committed but no stream attached
  bool use_ucx = true;
  // UCX endpoints with peer error handling (network transports only; transfer/ucx.h).
  bool ucx_peer_errors = false;
  // Accept a UCX_TLS with TCP, which lets any peer reaching the port read and write this
  // process's memory (transfer::UcxTransports; --ucx-allow-unprotected-tcp).
  bool ucx_allow_unprotected_tcp = false;
  // Fill freed pool memory with a poison pattern and count writes into it (StatePool).
  bool poison_freed_memory = false;
  // Faults injected into every transfer (tests; see transfer::FaultSpec).
  std::optional<transfer::FaultSpec> transfer_faults;
  // Liveness turns NOT_SERVING when the decode loop has not advanced for this long while it
  // has requests (common/watchdog.h).
  int64_t watchdog_ms = 30000;
  // Tests: the decode loop sleeps this long before each step (a wedged worker).
  int64_t inject_step_stall_ms = 0;
  // A stream whose reader takes no message for this long is cancelled and its request freed
  // (common/stream_watch.h); 0 disables.
  std::chrono::milliseconds stream_idle_timeout{60000};
  // Speculative decoding: the node's drafter and tokens per step (--speculative,
  // --speculative-tokens), and the draft model when the drafter is one.
  SpeculativeConfig speculative;
  std::shared_ptr<DraftModel> draft_model;
  // Shadow verifications that may wait for spare capacity (--fidelity-queue); one more is
  // dropped and counted (fidelity_shadow.h). Also the requests that may hold their served rows
  // at once (each fidelity_tokens x vocab_size floats) before their shadow is queued.
  int64_t fidelity_queue = 4;
  // Tests: each shadow verification waits this long before it runs (a busy node's shadows).
  int64_t fidelity_inject_stall_ms = 0;
  // Tests: a consumer replay made wrong. Each request's consumer SWA rings are zeroed once its
  // prompt is in (the first token stands), so what it serves after disagrees with the model.
  bool inject_consumer_ring_fault = false;
};

class DecodeService final : public v1::DecodeNode::Service {
 public:
  // On a device engine the pool's memory is mirrored in the engine's memory (see status()).
  DecodeService(model::Engine& model, const DecodeOptions& options);
  ~DecodeService() override;
  // Not OK when the service cannot serve: no device memory for the pool's mirror.
  const absl::Status& status() const { return status_; }

  grpc::Status Reserve(grpc::ServerContext* context, const v1::ReserveRequest* request,
                       v1::Reservation* reply) override;
  grpc::Status Commit(grpc::ServerContext* context, const v1::CommitRequest* request,
                      v1::CommitResponse* reply) override;
  grpc::Status Stream(grpc::ServerContext* context, const v1::StreamRequest* request,
                      grpc::ServerWriter<v1::DecodeOutput>* writer) override;
  grpc::Status Release(grpc::ServerContext* context, const v1::ReleaseRequest* request,
                       v1::ReleaseResponse* reply) override;
  grpc::Status Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                     v1::StatsResponse* reply) override;

  v1::LoadReport Load() const ABSL_LOCKS_EXCLUDED(mutex_);
  int64_t poison_violations() const { return pool_->poison_violations(); }
  // Starts the liveness watchdog of the decode loop (ServeUntilShutdown's on_started).
  void StartWatchdog(HealthSetter health) { watchdog_->Start(std::move(health)); }
  void StopWatchdog() { watchdog_->Stop(); }
  // Graceful drain (ServeUntilShutdown's `drain`): Reserve is refused with UNAVAILABLE from now
  // on (the router, told first, sends none); the requests held (reserved, transferring or
  // streaming) run to their end. Returns once none is left, or at `deadline`.
  void Drain(std::chrono::steady_clock::time_point deadline) ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  void DecodeLoop();
  // The step log's summary as the node reports it, and its metrics.
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // One step: `plan`, made under mutex_ over the requests `held`, run with mutex_ released and
  // settled under it again.
  void RunStep(std::vector<std::shared_ptr<Request>>& held, const DecodePlan& plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void ReapLoop();
  // Replay-on-decode: a planned piece of a replaying request's boundary rows, gathered from its
  // pool pages, and the step's logits for it.
  struct ReplayPiece;
  ReplayPiece GatherPiece(const std::shared_ptr<Request>& r, int64_t rows) const;
  // After the piece's step: its settle, and at the replay's end the boundary pages freed and
  // the replay's rate folded into what the node reports.
  void FinishPiece(ReplayPiece& piece) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The drafts of the step's requests (prompt lookup, or the draft model's batched rounds).
  void ProposeDrafts(std::span<DraftJob> jobs);
  // A decoding request's verdict applied (SettleDecode) and counted.
  void SettleRequest(Request& r, int64_t drafts, const model::Verdict& verdict)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // A step's engine time over its `requests` decoding with `decode_rows` rows and its replay
  // pieces, folded into the fits the planner prices with; its work kept for the step log
  // (logged_rows_, logged_pieces_).
  void MeasureStep(int64_t requests, int64_t decode_rows, std::span<const ReplayPiece> pieces,
                   double target_seconds);
  void Erase(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The reservation `id` when `caller` (the peer's certificate identity) is its `role` owner
  // (see Request); nullptr when it is absent or another identity's.
  std::shared_ptr<Request> Owned(const std::string& caller, const std::string& id,
                                 security::Role role) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  struct Metrics;

  // Shadow verification (fidelity_shadow.h; shadow_verification.cc). At the reservation: what
  // the request asks for. At the commit: the labels, and under prefill-all the first token's
  // served row; a request served untruncated is not shadowed.
  void StartFidelity(const v1::ReserveRequest& request, Request& r);
  void FidelityAtCommit(const v1::StateHeader& header, Request& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Hands the request's capture to the shadow once it holds every position asked for or the
  // request has finished (a dropped one is counted, and answered when the client asked).
  void MaybeShadow(const std::shared_ptr<Request>& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // On the shadow thread: the outcome into the metrics, and into the request's last output
  // when its client asked.
  void ShadowDone(const std::weak_ptr<Request>& request, const ShadowOutcome& outcome,
                  const std::vector<std::string>& labels) ABSL_LOCKS_EXCLUDED(mutex_);
  void CountDropped() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // DecodeOptions::inject_consumer_ring_fault: zeroes the request's consumer rings.
  void InjectRingFault(Request& r);
  // A run shadow's figures into fidelity_report_'s tally of its labels (mode, keep, hit).
  void Tally(const std::vector<std::string>& labels, const model::FidelitySummary& summary)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  static constexpr int kMaxFidelityTallies = 64;

  // The handlers' work; each handler converts its absl::Status to gRPC's once.
  absl::Status TakeReservation(grpc::ServerContext& context, const v1::ReserveRequest& request,
                               v1::Reservation& reply);
  // A pool slot for `pages` pages, waiting (boundedly: max_waiting) while the pools are full.
  absl::StatusOr<int64_t> WaitForSlot(grpc::ServerContext& context, const std::string& request_id,
                                      int64_t pages) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The reservation's state in `slot`, sized for `positions`.
  absl::StatusOr<std::shared_ptr<Request>> NewRequest(const grpc::ServerContext& context,
                                                      const v1::ReserveRequest& request,
                                                      int64_t slot, int64_t pages,
                                                      int64_t positions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status CommitState(grpc::ServerContext& context, const v1::CommitRequest& request);
  // The transport to read a commit's regions with, once its header and source are checked
  // against reservation `r`; `source` gets the worker address the reservation names.
  absl::StatusOr<transfer::Transport*> CheckCommit(const v1::StateHeader& header, const Request& r,
                                                   v1::RegionSource& source);
  // After the read: the request decodes from the header's first token, or the reservation is
  // freed.
  absl::Status FinishCommit(const std::shared_ptr<Request>& r, const v1::StateHeader& header,
                            v1::Transport transport, uint64_t bytes, absl::Status read,
                            double transfer_seconds) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // What a stream's log line says of its request, set once the request is found.
  struct StreamLog {
    std::string request_id;
    trace::Span span;                        // the span the Reserve call started
    std::map<std::string, double> stage_ms;  // slot_wait, transfer, replay, stream
    size_t tokens = 0;                       // streamed by this node
  };
  absl::Status RunStream(grpc::ServerContext* context, const v1::StreamRequest* request,
                         grpc::ServerWriter<v1::DecodeOutput>* writer, StreamLog* line);
  // Writes `out` to the stream with mutex_ released (a slow reader holds up no one else).
  bool WriteUnlocked(grpc::ServerContext* context, grpc::ServerWriter<v1::DecodeOutput>* writer,
                     const v1::DecodeOutput& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  // The address in the engine's copy of the pool of a pool address (the same address on a
  // host-memory engine).
  float* InEngine(float* pool_address) const;

  model::Engine& model_;
  DecodeOptions options_;
  absl::Status status_;
  std::unique_ptr<transfer::UcxWorker> ucx_;
  std::unique_ptr<transfer::UcxMemory> ucx_memory_;     // the pool's memory when UCX is up
  std::unique_ptr<transfer::Transport> ucx_transport_;  // null without UCX
  std::unique_ptr<transfer::Transport> grpc_transport_;
  std::unique_ptr<StatePool> pool_;
  // A device engine's copy of the pool: the same layout in the engine's memory. Transfers land
  // in the pool (host memory UCX can reach, page-locked for the copies) and are staged in at
  // commit; decode steps run on the copy.
  model::BackendArray<char> engine_pool_;

  // Guards the fields marked so (clang's -Wthread-safety checks every use: the decode_node
  // target builds with it where the compiler has it) and every Request (request.h says what
  // the decode thread does unlocked). Each waiter has its own condition:
  mutable absl::Mutex mutex_;
  absl::CondVar work_;      // the decode loop: a commit, or the node's stop
  absl::CondVar deadline_;  // the reaper: a reservation, a commit, or the stop
  absl::CondVar freed_;     // Reserve waiting for memory, Drain: a request erased
  std::map<std::string, std::shared_ptr<Request>> requests_ ABSL_GUARDED_BY(mutex_);
  int64_t waiting_ ABSL_GUARDED_BY(mutex_) = 0;
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  bool draining_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread decode_thread_;
  std::thread reap_thread_;
  std::unique_ptr<Metrics> metrics_;
  std::shared_ptr<prometheus::Collectable> pool_collector_;  // running, queue and pool gauges
  // The decode thread's own (no lock): what decode steps, draft rounds and replayed rows cost
  // here, for pricing drafts and replay rows.
  DraftCosts costs_;
  ReplayCosts replay_costs_;
  int64_t cost_log_ = 0;  // steps, for a debug line of the costs every 256
  // What the node reports of its costs (LoadReport.decode_rates): replay's time per GFLOP as
  // moving sums weighted by the work, and the tokens a request gains per step (moving average).
  double replay_ms_sum_ ABSL_GUARDED_BY(mutex_) = 0;
  double replay_gflop_sum_ ABSL_GUARDED_BY(mutex_) = 0;
  uint32_t replay_samples_ ABSL_GUARDED_BY(mutex_) = 0;
  double tokens_per_step_ ABSL_GUARDED_BY(mutex_) = 0;
  // The last step's work, set by RunStep on the decode thread (-1 rows: it failed).
  int64_t logged_rows_ = -1;
  std::vector<PieceSize> logged_pieces_;
  // Each step's whole turn of the loop, and what the node reports of it
  // (LoadReport.decode_rates), summarised by the decode loop (Publish).
  StepLog step_log_ ABSL_GUARDED_BY(mutex_);
  StepLog::Summary reported_ ABSL_GUARDED_BY(mutex_);
  std::atomic<bool> stepping_{false};  // the decode loop has a batch (the watchdog's "work")
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<StreamWatch> idle_watch_;
  // What the node reports of its shadows (LoadReport.fidelity).
  v1::FidelityReport fidelity_report_ ABSL_GUARDED_BY(mutex_);
  // Null on a backend that serialises its calls (a shadow would hold up the steps).
  std::unique_ptr<ShadowRunner> shadows_;
};

}  // namespace baton::decode_node
