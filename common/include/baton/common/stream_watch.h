// Slow readers do not hold resources: a server stream whose client has not taken a message for
// `--stream-idle-timeout` is cancelled. gRPC's sync Write blocks once the client's HTTP/2
// flow-control window is full, so "has not read" is "a Write has been pending that long"; the
// watch's thread then cancels the call, the Write returns false and the handler frees what the
// stream held (a decode slot and its pages).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "grpcpp/server_context.h"

namespace prometheus {
class Counter;
}  // namespace prometheus

namespace baton {

class StreamWatch {
 public:
  // `limit` 0 disables the watch (Writing then costs nothing). `component` labels the metric
  // baton_stream_idle_cancels_total.
  StreamWatch(std::chrono::milliseconds limit, const std::string& component);
  ~StreamWatch();
  StreamWatch(const StreamWatch&) = delete;
  StreamWatch& operator=(const StreamWatch&) = delete;

  // Held across one Write on `context`'s stream.
  class Writing {
   public:
    Writing(StreamWatch& watch, grpc::ServerContext* context);
    ~Writing();
    Writing(const Writing&) = delete;
    Writing& operator=(const Writing&) = delete;
    // Whether the watch cancelled the call during this Write.
    bool timed_out() const;

   private:
    StreamWatch& watch_;
    uint64_t ticket_ = 0;
  };

  std::chrono::milliseconds limit() const { return limit_; }

 private:
  struct Pending {
    grpc::ServerContext* context;
    std::chrono::steady_clock::time_point since;
    bool cancelled = false;
  };
  void Run();

  const std::chrono::milliseconds limit_;
  prometheus::Counter* cancels_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<uint64_t, Pending> pending_;
  uint64_t next_ticket_ = 1;
  bool stop_ = false;
  std::thread thread_;
};

// Parses --stream-idle-timeout: an absl duration ("30s", "500ms", "2m") or a bare number of
// seconds; "0" disables. Errors name the flag and what is allowed.
absl::StatusOr<std::chrono::milliseconds> ParseStreamIdleTimeout(const std::string& text);
// The same syntax for any duration flag named `flag`; `zero` is appended to the allowed forms'
// description (what 0 means, if anything).
absl::StatusOr<std::chrono::milliseconds> ParseDurationFlag(const std::string& flag,
                                                            const std::string& text,
                                                            const std::string& zero = "");

}  // namespace baton
