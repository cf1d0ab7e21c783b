// baton-prefill's service (DESIGN sections 4 and 6): runs a prompt through the model in
// chunks of at most `token_budget` rows, straight into staging memory exposed for that request
// alone (transfer/exposure.h), samples the first token, and commits the StateBlock's header
// and checksums to the decode node, which pulls the regions (UCX get, or ReadRegions here)
// during the commit. The exposure ends when the commit returns or times out.
//
// Prefills run one at a time, in arrival order: the model already uses every core, so running
// two at once would only make both slower.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "baton/common/fifo_turns.h"
#include "baton/common/hash.h"
#include "baton/common/trace.h"
#include "baton/common/watchdog.h"
#include "baton/kvstore/block_cache.h"
#include "baton/kvstore/ttft_model.h"
#include "baton/model/engine.h"
#include "baton/model/split.h"
#include "baton/transfer/exposure.h"
#include "baton/transfer/ucx.h"
#include "baton/v1/kvstore.grpc.pb.h"
#include "baton/v1/node.grpc.pb.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace baton::prefill_node {

class StoreFleetClient;
class PrefillCall;

// The prefix store nodes one request reads from and writes to (prefill_node/store_fleet.h):
// the fleet the router sent with it, or the node's --kvstore as a fleet of one; empty: none.
struct StoreFleetRoute {
  std::vector<std::string> ids;
  std::vector<std::shared_ptr<v1::KvStore::StubInterface>> stubs;
  int replication = 0;
  bool empty() const { return ids.empty(); }
};

struct PrefillOptions {
  int64_t token_budget = 512;  // rows per prefill chunk
  bool use_ucx = true;
  // Accept a UCX_TLS with TCP, which lets any peer reaching the port read and write this
  // process's memory (transfer::UcxTransports; --ucx-allow-unprotected-tcp).
  bool ucx_allow_unprotected_tcp = false;
  // The prefix store of a request that names no fleet (--kvstore; empty: none). A request
  // from a router that knows the live store nodes carries them, and their owners are used.
  std::string kvstore_address;
  // A hit's reads from the store end when computing its blocks would have been done: at the
  // predicted compute time of the hit's rows, and no sooner than this (--store-read-min-ms).
  int64_t store_read_min_ms = 50;
  // Payload bytes waiting for the store at most; a prompt whose blocks do not fit is not
  // written back (the store is behind, and memory stays bounded).
  uint64_t write_back_bytes = uint64_t{256} << 20;
  // How long a commit (and so the decode node's read of the exposed regions) may take.
  int64_t commit_timeout_ms = 30000;
  // Idle staging buffers kept for reuse by requests to the same decode node (0: register
  // staging memory per request; transfer/exposure.h).
  uint64_t staging_cache_bytes = uint64_t{1} << 30;
  // Liveness turns NOT_SERVING when a prefill has computed no chunk for this long
  // (common/watchdog.h).
  int64_t watchdog_ms = 30000;
  // Requests holding staging memory at once (from before the model, through the commit and
  // the copies of the write-back after the answer); the rest wait for one to finish, so memory
  // stays bounded however many requests arrive.
  int64_t max_staged_requests = 4;
  // The split this node serves (--split; the engine holds the producers only under
  // replay-on-decode). A request for another split is refused.
  model::Split split = model::Split::kPrefillAll;
  // The node-local tier of the prefix cache (kvstore/block_cache.h): bytes of recently used
  // blocks kept in memory, looked in before the store (0: none).
  uint64_t block_cache_bytes = 0;
  // Tests: runs on the node's copier thread before each answered call's write-back.
  std::function<void()> before_write_back;
};

// The wire bounds of a prefill request, checked before anything is sized from it: the router
// checks too, but a node must not rely on its peers (DESIGN section 6). Token ids and the
// truncation spec are the model's to check.
absl::Status ValidatePrefillRequest(const v1::PrefillRequest& request, const ModelConfig& config);

// ReadRegions is a raw callback method: its chunks go out as slices of the staging memory,
// with no protobuf copy of the payload (ExposureTable::Stream).
class PrefillService final
    : public v1::PrefillNode::WithRawCallbackMethod_ReadRegions<v1::PrefillNode::Service> {
 public:
  PrefillService(model::Engine& model, const PrefillOptions& options);
  ~PrefillService() override;

  grpc::Status Prefill(grpc::ServerContext* context, const v1::PrefillRequest* request,
                       v1::PrefillResponse* reply) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ReadRegions(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request) override;

  // The load report of each heartbeat, with the node's measured rates and its cache's size.
  v1::LoadReport Load() const;
  // The block cache's events since the last batch, and a router's request for a snapshot
  // (the heartbeat's CacheFeed; only with --block-cache-bytes).
  bool has_block_cache() const { return cache_ != nullptr; }
  v1::CacheEventBatch CacheEvents() { return cache_->TakeEvents(); }
  void CacheResync() { cache_->Resync(); }
  // The UCX worker's address, which the node registers with the router (empty without UCX).
  std::string ucx_worker_address() const { return ucx_ != nullptr ? ucx_->address() : ""; }
  size_t open_exposures() const { return exposures_.size(); }
  // The liveness watchdog of the model loop (ServeUntilShutdown's on_started, on_stopping).
  void StartWatchdog(HealthSetter health) { watchdog_->Start(std::move(health)); }
  void StopWatchdog() { watchdog_->Stop(); }
  // Graceful drain (ServeUntilShutdown's `drain`): a new Prefill is refused with UNAVAILABLE
  // (the router, told first, sends none) and the prefills in progress, with their StateBlock
  // reads, run to their end. Returns once none is left, or at `deadline`.
  void Drain(std::chrono::steady_clock::time_point deadline);

 private:
  // One Prefill call, as stages over this service's parts (prefill_node/prefill_call.h).
  friend class PrefillCall;
  struct Metrics;
  // Prefill as an absl::Status, for Prefill to convert: the caller's role, the call, and its
  // metrics and log line.
  absl::Status Serve(grpc::ServerContext& context, const v1::PrefillRequest& request,
                     v1::PrefillResponse& reply);
  v1::DecodeNode::Stub& DecodeStub(const std::string& address);
  // Loads the hit's blocks [0, H / B), each from the local block cache when it holds it and
  // from the prefix store otherwise (and then kept in the cache): block KV into the pages,
  // producer SWA rows of [H - W + 1, H) into the producer rings. `ok` false on any miss (the
  // caller computes the hit instead). The store reads go to the blocks' owners on `route`;
  // they end with `caller`'s call (cancelled or past its deadline) and by ReadDeadline.
  struct PrefixLoad {
    bool ok = false;
    int64_t local_blocks = 0;  // blocks whose block KV came from the local cache
    uint64_t local_bytes = 0, store_bytes = 0;
    double local_ms = 0, store_ms = 0;
  };
  PrefixLoad LoadPrefix(grpc::ServerContext& caller, const trace::Span& span,
                        const StoreFleetRoute& route, const std::vector<Sha256Digest>& keys,
                        int64_t hit_tokens, const std::string& tenant, const std::string& salt,
                        model::SequenceState& state);
  // One served prefill's times, folded into the rates the node reports (moving averages).
  struct Observed {
    int64_t prompt_len = 0;     // L
    int64_t computed_rows = 0;  // L - H, through the producers and block KV
    int64_t replayed_rows = 0;  // through the consumer layers here (0 under replay-on-decode)
    double compute_ms = 0;
    PrefixLoad load;
    double fixed_ms = 0;
  };
  void Observe(const Observed& observed);
  // The engine's prefill over `state` (host memory the transfer exposes), staged through the
  // engine's memory when that is a device's.
  absl::StatusOr<model::PrefillResult> ComputePrefill(std::span<const int32_t> tokens,
                                                      const model::PrefillOptions& options,
                                                      model::SequenceState& state);
  // Queues the prompt's new full blocks for the store; a background thread writes them, so
  // the first token never waits for the store.
  void QueueWriteBack(std::vector<v1::BlockWrite> writes, const trace::Span& span,
                      StoreFleetRoute route);
  int64_t ActivePeak() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return active_peak_;
  }
  // The predicted time of computing a prompt of `prompt_len` tokens after `s_valid` cached
  // ones on this node at its measured rates (the router's priors before it has measured): the
  // rows it computes, the consumer rows it replays (none under replay-on-decode) and its fixed
  // cost per request, as kvstore::PredictPrefill prices them.
  double PredictedWorkMs(int64_t prompt_len, int64_t s_valid, int64_t keep,
                         bool truncation_on) const;
  // When a hit of `hit_tokens` rows must be read by: its predicted compute time on this node,
  // and at least --store-read-min-ms, from now.
  std::chrono::system_clock::time_point ReadDeadline(int64_t hit_tokens) const;
  void WriteBackLoop();
  void UcxProgressLoop();
  // A call answered with computed blocks still to copy out (PrefillCall::WriteBackAfterAnswer):
  // it is no longer active, and copier_ copies them in the order the calls were answered, so
  // that the first token does not wait for the copies. Drain waits for them as well.
  void AfterAnswer(std::unique_ptr<PrefillCall> call);
  void CopyLoop();

  model::Engine& model_;
  PrefillOptions options_;
  FifoTurns model_turns_;  // one prefill at a time, first come first served (file comment)
  mutable std::mutex mutex_;
  int64_t active_ = 0;
  int64_t queued_ = 0;  // of those, waiting for the model
  int64_t staged_ = 0;  // of those, holding staging memory (at most max_staged_requests)
  int64_t active_peak_ = 0;  // the most active_ has been (baton_prefill_requests_active_peak)
  // The predicted work of the active prefills not yet computed (PredictedWorkMs), and of the
  // one computing with its start: what Load reports as prefill_work_ms.
  double held_work_ms_ = 0;
  double computing_work_ms_ = 0;
  std::chrono::steady_clock::time_point computing_since_;
  std::condition_variable staging_free_;
  bool draining_ = false;
  int64_t writing_back_ = 0;      // answered calls in copy_queue_ or being copied
  std::condition_variable idle_;  // active_ and writing_back_ fell to 0
  std::unique_ptr<transfer::UcxWorker> ucx_;
  std::thread ucx_thread_;  // progress for transports that emulate RMA (a get over TCP)
  std::atomic<bool> stop_progress_{false};
  std::unique_ptr<transfer::StagingPool> staging_;
  transfer::ExposureTable exposures_;
  std::map<std::string, std::unique_ptr<v1::DecodeNode::Stub>> decode_stubs_;
  std::unique_ptr<StoreFleetClient> stores_;
  std::unique_ptr<kvstore::BlockCache> cache_;  // null without --block-cache-bytes
  mutable std::mutex rates_mutex_;
  kvstore::PrefillRates rates_;  // 0 where nothing was measured yet
  uint32_t rate_samples_ = 0;
  struct RateSums {
    double ms = 0, units = 0;  // decayed sums of time and of work (GFLOP or MiB)
  };
  RateSums local_sums_, store_sums_;
  RateSums fixed_sums_;               // commit, transfer, sampling: ms per prefill
  kvstore::WorkTimeFit compute_fit_;  // compute ms against GFLOP
  std::mutex write_mutex_;
  std::condition_variable write_ready_;
  // Each request's writes, with its trace (the store logs the write under it).
  struct QueuedWrites {
    std::vector<v1::BlockWrite> writes;
    trace::Span span;
    StoreFleetRoute route;
  };
  std::deque<QueuedWrites> write_queue_;
  uint64_t write_queue_bytes_ = 0;  // payload bytes in write_queue_
  bool stop_writer_ = false;
  std::thread writer_;
  // AfterAnswer's calls: each holds its state (its staging slot) until its blocks are copied.
  std::mutex copy_mutex_;
  std::condition_variable copy_ready_;
  std::deque<std::unique_ptr<PrefillCall>> copy_queue_;
  bool stop_copier_ = false;
  std::thread copier_;
  std::unique_ptr<Metrics> metrics_;
  std::atomic<bool> computing_{false};  // a prefill holds the model (the watchdog's "work")
  std::unique_ptr<Watchdog> watchdog_;
  // baton_prefill_exposures and baton_prefill_staging_buffers (read at scrape time).
  std::shared_ptr<prometheus::Collectable> staging_collector_;
  // What staging_collector_ reports at scrape time: the block cache, the measured rates, the
  // store breaker, the requests held and the staging buffers.
  std::vector<prometheus::MetricFamily> ScrapeFamilies() const;
};

}  // namespace baton::prefill_node
