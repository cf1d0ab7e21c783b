// The CPU kernels' thread team (cpu_team.h). A job is published by bumping generation_;
// workers spin on it, then sleep on it as a futex. The caller runs its share and waits for
// running_ (workers still in the job) to reach zero the same way. Every store a worker may miss
// while it goes to sleep is ordered against its count of sleepers (both sequentially
// consistent), and a futex wait returns at once when its word has already moved.
#include "baton/kernels/cpu_team.h"

#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "baton/kernels/cpu_isa.h"

namespace baton::kernels {
namespace {

using Clock = std::chrono::steady_clock;

void FutexWait(std::atomic<uint32_t>& word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

inline void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

// How long an idle thread spins before it sleeps (SetCpuTeamWaitPolicy), in nanoseconds.
std::atomic<int64_t> spin_ns{300'000};

Clock::duration SpinTime() {
  return std::chrono::nanoseconds(spin_ns.load(std::memory_order_relaxed));
}

// True while this thread runs a job (its own or as a worker): a nested call runs inline.
thread_local bool in_job = false;
// Set by KeepCpuWorkOnThisThread: this thread's jobs never use the team.
thread_local bool alone = false;

// Makes OpenBLAS calls on this thread single-threaded while it lives (OpenBLAS's OpenMP build
// takes its thread count from the calling thread's OpenMP setting).
class OneBlasThread {
 public:
  OneBlasThread() : saved_(omp_get_max_threads()) {
    if (saved_ != 1) omp_set_num_threads(1);
  }
  ~OneBlasThread() {
    if (saved_ != 1) omp_set_num_threads(saved_);
  }

 private:
  const int saved_;
};

class Team {
 public:
  explicit Team(int64_t size) : size_(size), spin_(SpinTime()) {}

  int64_t size() const { return size_; }

  // noexcept: a job that threw would leave the workers on the caller's stack.
  void Run(void (*job)(void*, int64_t, int64_t), void* ctx) noexcept {
    if (size_ == 1 || in_job || alone || !busy_.try_lock()) return RunInline(job, ctx);
    std::lock_guard<std::mutex> lock(busy_, std::adopt_lock);
    std::call_once(started_, [this] { Start(); });
    job_ = job;
    ctx_ = ctx;
    running_.store(static_cast<uint32_t>(size_ - 1), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) FutexWakeAll(generation_);
    {
      OneBlasThread one;
      in_job = true;
      job(ctx, 0, size_);
      in_job = false;
    }
    WaitForWorkers();
  }

  static void RunInline(void (*job)(void*, int64_t, int64_t), void* ctx) noexcept {
    const bool outer = !in_job;
    OneBlasThread one;
    in_job = true;
    job(ctx, 0, 1);
    in_job = !outer;
  }

 private:
  void Start() {
    const uint32_t generation = generation_.load();
    for (int64_t t = 1; t < size_; ++t) {
      std::thread([this, t, generation] { Work(t, generation); }).detach();
    }
  }

  void Work(int64_t t, uint32_t seen) {
    omp_set_num_threads(1);
    in_job = true;
    for (;;) {
      WaitForJob(seen);
      seen = generation_.load(std::memory_order_acquire);
      job_(ctx_, t, size_);
      if (running_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
          caller_sleeping_.load(std::memory_order_seq_cst)) {
        FutexWakeAll(running_);
      }
    }
  }

  // Returns once generation_ has moved past `seen`.
  void WaitForJob(uint32_t seen) {
    const Clock::time_point until = Clock::now() + spin_;
    for (uint32_t i = 1; generation_.load(std::memory_order_acquire) == seen; ++i) {
      if (i % 16 == 0 && Clock::now() >= until) {
        sleeping_.fetch_add(1, std::memory_order_seq_cst);
        while (generation_.load(std::memory_order_seq_cst) == seen) FutexWait(generation_, seen);
        sleeping_.fetch_sub(1, std::memory_order_seq_cst);
        return;
      }
      Pause();
    }
  }

  void WaitForWorkers() {
    const Clock::time_point until = Clock::now() + spin_;
    for (uint32_t i = 1; running_.load(std::memory_order_acquire) != 0; ++i) {
      if (i % 16 == 0 && Clock::now() >= until) {
        caller_sleeping_.store(1, std::memory_order_seq_cst);
        for (uint32_t left; (left = running_.load(std::memory_order_seq_cst)) != 0;) {
          FutexWait(running_, left);
        }
        caller_sleeping_.store(0, std::memory_order_relaxed);
        return;
      }
      Pause();
    }
  }

  const int64_t size_;
  const Clock::duration spin_;
  std::mutex busy_;  // held by the thread whose job the team runs
  std::once_flag started_;
  // The job of the current generation (written before generation_ moves, read after).
  void (*job_)(void*, int64_t, int64_t) = nullptr;
  void* ctx_ = nullptr;
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<uint32_t> sleeping_{0};  // workers asleep on generation_
  alignas(64) std::atomic<uint32_t> running_{0};   // workers still in the current job
  std::atomic<uint32_t> caller_sleeping_{0};       // the caller asleep on running_
};

// Made on first use and never destroyed: its workers may still be asleep at exit. A child of
// fork() has none of the parent's workers (and maybe a held lock), so the handler, registered
// when the library loads, leaves it to make a team of its own, of the same size.
std::atomic<Team*> the_team{nullptr};
std::atomic<int64_t> team_size{0};  // settled by the first team, kept across fork()

[[maybe_unused]] const bool fork_handler = [] {
  pthread_atfork(nullptr, nullptr, [] { the_team.store(nullptr, std::memory_order_relaxed); });
  return true;
}();

Team& TheTeam() {
  Team* team = the_team.load(std::memory_order_acquire);
  if (team != nullptr) return *team;
  int64_t size = 0;
  team_size.compare_exchange_strong(size, std::max(1, omp_get_max_threads()));
  Team* made = new Team(team_size.load());
  if (the_team.compare_exchange_strong(team, made, std::memory_order_acq_rel)) return *made;
  delete made;  // another thread's came first (neither has started a thread yet)
  return *team;
}

}  // namespace

int64_t CpuTeamSize() {
  return TheTeam().size();
}

void SetCpuTeamWaitPolicy(const char* policy) {
  int64_t ns = 300'000;
  if (policy != nullptr && strcasecmp(policy, "passive") == 0) ns = 0;
  if (policy != nullptr && strcasecmp(policy, "active") == 0) ns = 10'000'000;
  spin_ns.store(ns, std::memory_order_relaxed);
}

std::string ConfigureCpuKernels(const char* isa, const char* wait_policy) {
  if (std::string error = UseCpuIsa(isa); !error.empty()) return error;
  SetCpuTeamWaitPolicy(wait_policy);
  return "";
}

void KeepCpuWorkOnThisThread() {
  TheTeam();  // sized by the process's setting first: the team may not exist yet
  alone = true;
  omp_set_num_threads(1);  // an OpenBLAS call outside a job, too
}

void RunOnCpuTeam(void (*job)(void* ctx, int64_t t, int64_t team), void* ctx) {
  TheTeam().Run(job, ctx);
}

void RunOnCallingThread(void (*job)(void* ctx, int64_t t, int64_t team), void* ctx) {
  Team::RunInline(job, ctx);
}

void ParallelForEachTask(int64_t count, void (*task)(void* ctx, int64_t i), void* ctx) {
  if (count <= 0) return;
  std::atomic<int64_t> next{0};
  RunOnCpuTeam([&](int64_t, int64_t) {
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < count;) task(ctx, i);
  });
}

}  // namespace baton::kernels
