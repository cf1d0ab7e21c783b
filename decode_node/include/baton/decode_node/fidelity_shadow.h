// Shadow verification on the decode node (docs/fidelity.md, docs/architecture.md): a request
// served with truncation is computed again by the untruncated model (mode off, no hit),
// teacher-forced along the tokens it was served, and each position's served distribution is
// compared with the untruncated one.
//
// Why here: the decode node holds the tokens served and the logits they were sampled from
// (the prefill node's first row comes with the StateBlock), and it holds every layer's weights
// under either split (replay-on-decode moves only the consumers' prompt rows here; a decode step
// runs every layer), so the whole untruncated computation runs here without moving a logit.
//
// Priority: the shadows run on one thread of their own at the kernel's idle class
// (SCHED_IDLE: it runs only on a core that no other thread of the machine wants), with every
// CPU job of theirs kept on that thread (KeepCpuWorkOnThisThread), so that no decode step waits
// for the kernels' team or a core. A shadow that finds the queue full (`queue_limit` waiting) is
// dropped, and counted. Only a concurrent backend (the CPU) runs shadows: a device engine
// serialises its calls, and a shadow holding it would delay the steps.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "baton/model/engine.h"
#include "baton/model/fidelity.h"

namespace baton::decode_node {

struct ShadowOutcome {
  bool dropped = false;  // not run: the queue was full, or the node stopped first
  absl::Status status;   // the untruncated computation's, when run
  model::FidelitySummary summary;
  double cpu_seconds = 0;  // the shadow thread's CPU time for this job
};

struct ShadowJob {
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;             // the tokens served, in order
  std::vector<std::vector<float>> served;  // the logits each was sampled from
  // Called once on the shadow thread, with no lock of the runner's held: run, or dropped at
  // the node's stop.
  std::function<void(const ShadowOutcome&)> done;
};

class ShadowRunner {
 public:
  // `stall`: tests only, each job waits this long on the shadow thread before it runs.
  ShadowRunner(model::Engine& engine, int64_t queue_limit,
               std::chrono::milliseconds stall = std::chrono::milliseconds(0));
  ~ShadowRunner();  // the job running finishes; those waiting are dropped
  ShadowRunner(const ShadowRunner&) = delete;
  ShadowRunner& operator=(const ShadowRunner&) = delete;

  // Queues `job` (moved from) and returns true; false, leaving `job` and never calling its
  // `done`, when `queue_limit` jobs are waiting already or the runner is stopping: the caller
  // drops it.
  bool Submit(ShadowJob& job);

 private:
  void Run();

  model::Engine& engine_;
  const size_t queue_limit_;
  const std::chrono::milliseconds stall_;
  std::mutex mutex_;
  std::condition_variable work_;
  std::deque<ShadowJob> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// The keep's label: the power of two at or above K ("64", "128", ...), so that a deployment's
// few keeps fall in few series.
std::string KeepBucket(int64_t keep);

}  // namespace baton::decode_node
