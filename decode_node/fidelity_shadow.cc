#include "baton/decode_node/fidelity_shadow.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "baton/common/log.h"
#include "baton/kernels/cpu_team.h"

namespace baton::decode_node {
namespace {

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

ShadowRunner::ShadowRunner(model::Engine& engine, int64_t queue_limit,
                           std::chrono::milliseconds stall)
    : engine_(engine),
      queue_limit_(static_cast<size_t>(std::max<int64_t>(queue_limit, 1))),
      stall_(stall) {}

ShadowRunner::~ShadowRunner() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool ShadowRunner::Submit(ShadowJob& job) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_ || queue_.size() >= queue_limit_) return false;
  // The thread starts with the first job: a node that never samples a request (the router's
  // --fidelity-sample-rate 0, the default) holds no shadow thread.
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  queue_.push_back(std::move(job));
  work_.notify_one();
  return true;
}

void ShadowRunner::Run() {
  const sched_param idle{.sched_priority = 0};
  if (int error = pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle); error != 0) {
    log::Warn("shadow verification runs at normal priority: SCHED_IDLE refused",
              {{"errno", error}});
  }
  kernels::KeepCpuWorkOnThisThread();
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) break;
    ShadowJob job = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    if (stall_.count() > 0) std::this_thread::sleep_for(stall_);
    ShadowOutcome outcome;
    const double cpu_start = ThreadCpuSeconds();
    absl::StatusOr<std::vector<std::vector<float>>> full =
        model::TeacherForcedLogits(engine_, job.prompt, job.tokens, {});
    outcome.cpu_seconds = ThreadCpuSeconds() - cpu_start;
    outcome.status = full.status();
    if (full.ok()) outcome.summary = model::CompareRuns(*full, job.served);
    job.done(outcome);
    lock.lock();
  }
  std::deque<ShadowJob> left = std::move(queue_);
  lock.unlock();
  for (ShadowJob& job : left) job.done({.dropped = true});
}

std::string KeepBucket(int64_t keep) {
  int64_t bucket = 1;
  while (bucket < keep) bucket *= 2;
  return std::to_string(bucket);
}

}  // namespace baton::decode_node
