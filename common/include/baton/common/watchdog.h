// Liveness that means something (grpc.health.v1 service "liveness"): a node's worker loop
// beats as it advances; while the node has work and the loop has not beaten for `limit`, the
// watchdog sets "liveness" NOT_SERVING (and logs it), so Kubernetes restarts a wedged pod. It
// turns SERVING again when the loop advances. A node with no work is never wedged.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "baton/common/rpc.h"

namespace baton {

class Watchdog {
 public:
  // `has_work` is asked from the watchdog's thread.
  Watchdog(std::string loop, std::chrono::milliseconds limit, std::function<bool()> has_work);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The loop advanced (call it before taking work on). Cheap: one atomic store.
  void Beat();
  // Starts watching, setting "liveness" through `health` (ServeUntilShutdown's on_started).
  void Start(HealthSetter health);
  // Stops watching; call before the servers `health` reaches go away (on_stopping).
  void Stop();

 private:
  void Run();
  std::string loop_;
  std::chrono::milliseconds limit_;
  std::function<bool()> has_work_;
  std::atomic<int64_t> last_beat_ns_;
  HealthSetter health_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace baton
