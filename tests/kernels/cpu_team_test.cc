// The CPU kernels' thread team (kernels/cpu_team.h): every job runs once on every thread of the
// team, nested and concurrent calls run on their own thread instead of waiting, as does every
// job of a thread that keeps its work (a decode node's shadow verification), a forked child
// runs jobs on a team of its own, and a BLAS call inside a job starts no threads. CMake runs this
// suite twice, with 3 threads on the machine's cores: once with workers that sleep as soon as they
// are idle (every job wakes them through the futex) and once with workers that spin between jobs.
#include "baton/kernels/cpu_team.h"

#include <cblas.h>
#include <gtest/gtest.h>
#include <omp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <set>
#include <thread>
#include <vector>

#include "testing/eventually.h"

namespace baton::kernels {
namespace {

using ::baton::testing::Eventually;

constexpr int64_t kTeam = 3;  // OMP_NUM_THREADS of both runs (tests/kernels/CMakeLists.txt)

int64_t ThreadsOfThisProcess() {
  int64_t count = 0;
  for ([[maybe_unused]] const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    ++count;
  }
  return count;
}

TEST(CpuTeamTest, EveryJobRunsOnceOnEachThreadOfTheTeam) {
  ASSERT_EQ(CpuTeamSize(), kTeam);
  constexpr int kJobs = 3000;
  std::vector<std::atomic<int64_t>> calls(kTeam);
  std::vector<std::thread::id> threads(kTeam);
  std::atomic<int64_t> wrong_team{0};
  for (int job = 0; job < kJobs; ++job) {
    RunOnCpuTeam([&](int64_t t, int64_t team) {
      if (team != kTeam || t < 0 || t >= kTeam) {
        wrong_team.fetch_add(1);
        return;
      }
      calls[t].fetch_add(1);
      threads[t] = std::this_thread::get_id();
    });
    // Every call of this job has returned: its counts are all here before the next job.
    for (int64_t t = 0; t < kTeam; ++t) ASSERT_EQ(calls[t].load(), job + 1) << "thread " << t;
  }
  EXPECT_EQ(wrong_team.load(), 0);
  EXPECT_EQ(threads[0], std::this_thread::get_id());  // the caller is thread 0
  EXPECT_EQ(std::set<std::thread::id>(threads.begin(), threads.end()).size(), kTeam);
}

TEST(CpuTeamTest, AJobWithinAJobRunsOnTheThreadThatCallsIt) {
  std::vector<std::thread::id> outer(kTeam), inner(kTeam);
  std::vector<int64_t> inner_team(kTeam, 0);
  RunOnCpuTeam([&](int64_t t, int64_t) {
    outer[t] = std::this_thread::get_id();
    RunOnCpuTeam([&](int64_t, int64_t team) {
      inner_team[t] = team;
      inner[t] = std::this_thread::get_id();
    });
  });
  for (int64_t t = 0; t < kTeam; ++t) {
    EXPECT_EQ(inner_team[t], 1) << "thread " << t;
    EXPECT_EQ(inner[t], outer[t]) << "thread " << t;
  }
}

TEST(CpuTeamTest, AThreadThatKeepsItsWorkRunsEveryJobAloneAndOthersKeepTheTeam) {
  std::vector<int64_t> teams;
  std::thread::id ran_on;
  std::thread kept([&] {
    KeepCpuWorkOnThisThread();
    for (int i = 0; i < 3; ++i) {
      RunOnCpuTeam([&](int64_t, int64_t team) {
        teams.push_back(team);
        ran_on = std::this_thread::get_id();
      });
    }
    EXPECT_EQ(omp_get_max_threads(), 1);  // and its BLAS calls outside a job
    EXPECT_EQ(ran_on, std::this_thread::get_id());
  });
  kept.join();
  EXPECT_EQ(teams, std::vector<int64_t>(3, 1));
  // The setting is the thread's: this one still runs on the whole team.
  std::atomic<int64_t> calls{0};
  RunOnCpuTeam([&](int64_t, int64_t team) { calls.fetch_add(team == kTeam ? 1 : 0); });
  EXPECT_EQ(calls.load(), kTeam);
}

TEST(CpuTeamTest, ACallWhileAnotherThreadsJobRunsRunsAloneInsteadOfWaiting) {
  // The first job holds the team until the second call has finished; were the second to wait
  // for the team, the first would give up after its deadline and the test would fail.
  std::atomic<bool> second_done{false}, first_running{false};
  std::atomic<int64_t> second_team{0};
  std::thread::id second_thread;
  std::thread other;
  ::testing::AssertionResult second_ended = ::testing::AssertionFailure();
  RunOnCpuTeam([&](int64_t t, int64_t) {
    if (t != 0) return;
    first_running = true;
    other = std::thread([&] {
      RunOnCpuTeam([&](int64_t, int64_t team) {
        second_team = team;
        second_thread = std::this_thread::get_id();
      });
      second_done = true;
    });
    second_ended = Eventually([&] { return second_done.load(); }, std::chrono::seconds(20),
                              std::chrono::milliseconds(1));
  });
  const std::thread::id other_id = other.get_id();
  other.join();
  EXPECT_TRUE(first_running);
  EXPECT_TRUE(second_ended) << "the second call waited for the team";
  EXPECT_EQ(second_team.load(), 1);
  EXPECT_EQ(second_thread, other_id);
}

TEST(CpuTeamTest, EachTaskRunsExactlyOnce) {
  for (int64_t count : {0, 1, 2, 5, 10007}) {
    std::vector<std::atomic<int>> runs(count);
    ParallelForEachTask(count, [&](int64_t i) { runs[i].fetch_add(1); });
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(runs[i].load(), 1) << "task " << i;
  }
}

TEST(CpuTeamTest, RangesCoverTheCountOnceInOrder) {
  for (int64_t count : {1, 2, 3, 4, 1000}) {
    std::vector<std::atomic<int>> runs(count);
    ParallelForRanges(count, [&](int64_t begin, int64_t end) {
      ASSERT_LT(begin, end);
      for (int64_t i = begin; i < end; ++i) runs[i].fetch_add(1);
    });
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(runs[i].load(), 1) << "of " << count;
  }
}

// One indivisible piece (a GEMM of one panel) runs on the calling thread, marked as inside a job:
// a team call it makes runs there too.
TEST(CpuTeamTest, ARangeOfOneRunsOnTheCallingThread) {
  std::thread::id ran_on, nested_on;
  int64_t nested_team = 0;
  ParallelForRanges(1, [&](int64_t, int64_t) {
    ran_on = std::this_thread::get_id();
    RunOnCpuTeam([&](int64_t, int64_t team) {
      nested_team = team;
      nested_on = std::this_thread::get_id();
    });
  });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_EQ(nested_on, std::this_thread::get_id());
  EXPECT_EQ(nested_team, 1);
}

TEST(CpuTeamTest, AForkedChildRunsJobsOnATeamOfItsOwn) {
  RunOnCpuTeam([](int64_t, int64_t) {});  // the parent's workers exist
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The parent's workers are not in this process: a job waiting for them would never end.
    std::atomic<int64_t> calls{0}, team{0};
    RunOnCpuTeam([&](int64_t, int64_t size) {
      calls.fetch_add(1);
      team = size;
    });
    _exit(calls.load() == kTeam && team == kTeam ? 0 : 3);
  }
  int status = 0;
  if (!Eventually([&] { return waitpid(child, &status, WNOHANG) != 0; }, std::chrono::seconds(30),
                  std::chrono::milliseconds(5))) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    FAIL() << "the child's job did not end within 30 s";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(CpuTeamTest, BlasInsideAJobStartsNoThreadsAndTheCallersSettingIsKept) {
  RunOnCpuTeam([](int64_t, int64_t) {});  // the team's workers exist from here on
  const int64_t before = ThreadsOfThisProcess();
  ASSERT_EQ(omp_get_max_threads(), kTeam);
  // Large enough that OpenBLAS would split it over an OpenMP team of its own.
  constexpr int n = 512;
  std::vector<float> a(n * n, 1.0f), b(n * n, 2.0f), c(kTeam * n * n, 0.0f);
  RunOnCpuTeam([&](int64_t t, int64_t) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data() + t * n * n, n);
  });
  for (int64_t t = 0; t < kTeam; ++t) EXPECT_EQ(c[t * n * n + 7], 2.0f * n) << "thread " << t;
  EXPECT_EQ(ThreadsOfThisProcess(), before);
  EXPECT_EQ(omp_get_max_threads(), kTeam);
}

}  // namespace
}  // namespace baton::kernels
