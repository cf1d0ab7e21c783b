// The CPU kernels' thread team: one set of worker threads per process, kept for its life, that
// every parallel CPU kernel runs on. A decode step runs about 80 parallel operations of tens of
// microseconds each, so the cost of starting one matters: an OpenMP parallel region costs about
// 3 us on 2 cores, a hand-off to workers that are still spinning about 0.5 us. Workers spin for
// a while after each job (so the next operation of a step finds them awake), then sleep on a
// futex (so an idle node costs nothing).
//
// Size: OMP_NUM_THREADS's rules (the variable, as the OpenMP runtime reads it, else the CPUs this
// process may run on), so the deployments' settings keep their meaning. Spinning: what the
// process's main hands SetCpuTeamWaitPolicy (OMP_WAIT_POLICY's value, read there, so the
// variable keeps its meaning too): passive makes workers sleep as soon as they are idle (tests
// that share the cores between processes), active makes them spin for 10 ms, and anything else
// gives 300 us.
//
// One job at a time: a call while another thread's job runs (two prefills on one node) runs its
// whole job on the calling thread instead of waiting, and so does a call from inside a job. A
// job's result must therefore not depend on how many threads ran it: what is computed may be
// cut by CpuTeamSize (a constant), and only who computes which part by the `team` a job is given
// (ParallelForRanges, ParallelForEachTask). Jobs must not throw (the process ends if one does:
// the other threads may still be running on the caller's stack).
//
// OpenBLAS (the OpenMP build) is run single-threaded by the workers: a BLAS call inside a job
// computes on the thread that makes it, and starts no OpenMP team beside this one.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

namespace baton::kernels {

// The number of threads a job runs on when the team is free (>= 1), fixed for the process.
int64_t CpuTeamSize();

// How long idle workers spin before they sleep, by an OMP_WAIT_POLICY value ("passive",
// "active", any case; null or anything else: 300 us). For the team made after it: a process's
// main calls it before the first kernel runs (ConfigureCpuKernels).
void SetCpuTeamWaitPolicy(const char* policy);

// What a process's main hands the CPU kernels before the first runs, read from its environment
// once: the instruction-set level (BATON_CPU_ISA's value, UseCpuIsa) and the team's wait policy
// (OMP_WAIT_POLICY's). The error, naming BATON_CPU_ISA and what is allowed, or "".
std::string ConfigureCpuKernels(const char* isa, const char* wait_policy);

// From now on, every job this thread starts runs on this thread alone (team 1), and its OpenBLAS
// calls too: for work at a lower priority than the process's own (a decode node's shadow
// verification on a SCHED_IDLE thread), which must never hold the team, whose workers run at
// the normal priority, while a decode step waits for it.
void KeepCpuWorkOnThisThread();

// Runs job(ctx, t, team) once for each t in [0, team) at the same time, the calling thread
// taking t = 0, and returns when every call has returned. team is CpuTeamSize(), or 1 when the
// job runs on the calling thread alone (see above).
void RunOnCpuTeam(void (*job)(void* ctx, int64_t t, int64_t team), void* ctx);

// RunOnCpuTeam for any callable fn(t, team).
template <typename Fn>
void RunOnCpuTeam(Fn&& fn) {
  using F = std::remove_reference_t<Fn>;
  RunOnCpuTeam([](void* ctx, int64_t t, int64_t team) { (*static_cast<F*>(ctx))(t, team); },
               const_cast<void*>(static_cast<const void*>(&fn)));
}

// Runs job(ctx, 0, 1) on the calling thread, as RunOnCpuTeam runs a job it cannot share: for work
// of one indivisible piece (a GEMM of one panel), which a hand-off would only delay.
void RunOnCallingThread(void (*job)(void* ctx, int64_t t, int64_t team), void* ctx);

// fn(begin, end) over [0, count) cut into one contiguous range per thread; a count of one runs
// on the calling thread.
template <typename Fn>
void ParallelForRanges(int64_t count, Fn&& fn) {
  if (count <= 0) return;
  if (count == 1) {
    using F = std::remove_reference_t<Fn>;
    return RunOnCallingThread([](void* ctx, int64_t, int64_t) { (*static_cast<F*>(ctx))(0, 1); },
                              const_cast<void*>(static_cast<const void*>(&fn)));
  }
  RunOnCpuTeam([&](int64_t t, int64_t team) {
    const int64_t begin = count * t / team, end = count * (t + 1) / team;
    if (begin < end) fn(begin, end);
  });
}

// fn(i) for each i in [0, count), handed out one at a time to whichever thread is free (tasks of
// uneven cost).
void ParallelForEachTask(int64_t count, void (*task)(void* ctx, int64_t i), void* ctx);

template <typename Fn>
void ParallelForEachTask(int64_t count, Fn&& fn) {
  using F = std::remove_reference_t<Fn>;
  ParallelForEachTask(
      count, [](void* ctx, int64_t i) { (*static_cast<F*>(ctx))(i); },
      const_cast<void*>(static_cast<const void*>(&fn)));
}

}  // namespace baton::kernels
