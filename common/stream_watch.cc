#include "baton/common/stream_watch.h"

#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "baton/common/log.h"
#include "baton/common/metrics.h"

namespace baton {

StreamWatch::StreamWatch(std::chrono::milliseconds limit, const std::string& component)
    : limit_(limit),
      cancels_(&metrics::Counter("baton_stream_idle_cancels_total",
                                 "Streams cancelled because their client took no message for "
                                 "--stream-idle-timeout")
                    .Add({{"component", component}})) {
  if (limit_.count() > 0) thread_ = std::thread([this] { Run(); });
}

StreamWatch::~StreamWatch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

StreamWatch::Writing::Writing(StreamWatch& watch, grpc::ServerContext* context) : watch_(watch) {
  if (watch_.limit_.count() == 0) return;
  std::lock_guard<std::mutex> lock(watch_.mutex_);
  ticket_ = watch_.next_ticket_++;
  watch_.pending_[ticket_] = {context, std::chrono::steady_clock::now()};
}

StreamWatch::Writing::~Writing() {
  if (ticket_ == 0) return;
  std::lock_guard<std::mutex> lock(watch_.mutex_);
  watch_.pending_.erase(ticket_);
}

bool StreamWatch::Writing::timed_out() const {
  if (ticket_ == 0) return false;
  std::lock_guard<std::mutex> lock(watch_.mutex_);
  auto it = watch_.pending_.find(ticket_);
  return it != watch_.pending_.end() && it->second.cancelled;
}

void StreamWatch::Run() {
  // Checks a few times per limit, so a stream is cancelled between limit and 1.25 x limit.
  const auto period = std::max(std::chrono::milliseconds(20), limit_ / 4);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, period);
    const auto now = std::chrono::steady_clock::now();
    for (auto& [ticket, p] : pending_) {
      if (p.cancelled || now - p.since < limit_) continue;
      p.cancelled = true;
      // TryCancel only marks the call and wakes its blocked Write; safe under our lock.
      p.context->TryCancel();
      cancels_->Increment();
      log::Warn("stream cancelled: its client took no message for the idle limit",
                {{"ms", limit_.count()}});
    }
  }
}

absl::StatusOr<std::chrono::milliseconds> ParseStreamIdleTimeout(const std::string& text) {
  return ParseDurationFlag("--stream-idle-timeout", text, "; 0 disables");
}

absl::StatusOr<std::chrono::milliseconds> ParseDurationFlag(const std::string& flag,
                                                            const std::string& text,
                                                            const std::string& zero) {
  const std::string allowed =
      absl::StrCat(flag,
                   ": must be a duration such as 30s, 500ms or 2m (a bare number is "
                   "seconds",
                   zero, "), at most 24h");
  absl::Duration d;
  int64_t seconds = 0;
  if (absl::SimpleAtoi(text, &seconds)) {
    if (seconds < 0) return absl::InvalidArgumentError(absl::StrCat(allowed, "; got ", text));
    d = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(text, &d) || d < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(allowed, "; got '", text, "'"));
  }
  if (d > absl::Hours(24)) return absl::InvalidArgumentError(absl::StrCat(allowed, "; got ", text));
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

}  // namespace baton
