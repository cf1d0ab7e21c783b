#include "baton/common/watchdog.h"

#include "baton/common/log.h"

namespace baton {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Watchdog::Watchdog(std::string loop, std::chrono::milliseconds limit,
                   std::function<bool()> has_work)
    : loop_(std::move(loop)), limit_(limit), has_work_(std::move(has_work)), last_beat_ns_(NowNs()) {}

Watchdog::~Watchdog() { Stop(); }

void Watchdog::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::Beat() { last_beat_ns_.store(NowNs(), std::memory_order_release); }

void Watchdog::Start(HealthSetter health) {
  health_ = std::move(health);
  thread_ = std::thread([this] { Run(); });
}

void Watchdog::Run() {
  bool live = true;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, std::max<std::chrono::milliseconds>(limit_ / 4,
                                                             std::chrono::milliseconds(10)));
    if (stop_) return;
    // Work first: a loop beats before it takes work on, so a beat read after seeing work is
    // at least as fresh as the work (an idle node's old beat never counts against new work).
    const bool work = has_work_();
    const int64_t silent_ms = (NowNs() - last_beat_ns_.load(std::memory_order_acquire)) / 1000000;
    const bool wedged = work && silent_ms > limit_.count();
    if (wedged == live) {
      live = !wedged;
      health_("liveness", live);
      if (wedged) {
        log::Error("worker loop wedged; liveness NOT_SERVING",
                   {{"loop", loop_}, {"silent_ms", silent_ms}, {"limit_ms", limit_.count()}});
      } else {
        log::Info("worker loop advancing again; liveness SERVING", {{"loop", loop_}});
      }
    }
  }
}

}  // namespace baton
