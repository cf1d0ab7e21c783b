// Turns at one resource taken first come, first served: one holder at a time, and when a turn
// ends the caller that has waited longest goes next. A prefill node computes one prompt at a
// time (prefill_node/prefill_service.h) and promises them in arrival order; a plain mutex makes
// no such promise (glibc's lets a newcomer take a lock just released before the threads that
// were waiting for it), so under load a prompt could wait behind any number of later ones.
//
// Thread-safe. A Turn must end (be destroyed) on the thread that holds it or any other, once.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <utility>

namespace baton {

class FifoTurns {
 public:
  // The right to the resource until destroyed (or moved from and the target destroyed).
  class Turn {
   public:
    Turn(Turn&& other) noexcept : turns_(std::exchange(other.turns_, nullptr)) {}
    Turn& operator=(Turn&&) = delete;
    Turn(const Turn&) = delete;
    ~Turn() {
      if (turns_ != nullptr) turns_->End();
    }

   private:
    friend class FifoTurns;
    explicit Turn(FifoTurns* turns) : turns_(turns) {}
    FifoTurns* turns_;
  };

  // Waits until every caller that came before has had its turn and ended it.
  Turn Take() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t ticket = issued_++;
    next_.wait(lock, [&] { return serving_ == ticket; });
    return Turn(this);
  }

  // Callers waiting for their turn now (not counting the holder).
  int64_t waiting() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(issued_ - serving_) - (issued_ > serving_ ? 1 : 0);
  }

 private:
  void End() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++serving_;
    }
    next_.notify_all();  // each waiter checks its own ticket; only the next one goes on
  }

  mutable std::mutex mutex_;
  std::condition_variable next_;
  uint64_t issued_ = 0;   // tickets handed out: the next caller's
  uint64_t serving_ = 0;  // the ticket whose turn it is
};

}  // namespace baton
