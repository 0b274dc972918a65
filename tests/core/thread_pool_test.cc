#include "core/thread_pool.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "core/c_api_guard.h"
#include "gradkit/base.h"

namespace gk {
namespace {

using Clock = std::chrono::steady_clock;

// Waits until `count` reaches `target`; false after 20 s. Tasks that wait for each other prove
// they ran at the same time, on different threads.
bool WaitFor(const std::atomic<int>& count, int target) {
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (count.load() < target) {
    if (Clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(ThreadPool, RunsEveryTaskOnce) {
  for (int32_t threads : {1, 2, 3, 8}) {
    for (int64_t tasks : {0, 1, 2, 7, 100}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(tasks));
      ParallelFor(threads, tasks, [&](int64_t i) { runs[i]++; });
      for (auto& r : runs) ASSERT_EQ(r.load(), 1);
    }
  }
}

TEST(ThreadPool, ConcurrentCallersAllComplete) {
  std::vector<std::thread> callers;
  std::atomic<int64_t> total{0};
  for (int c = 0; c < 6; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep) ParallelFor(3, 10, [&](int64_t) { total++; });
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 6 * 50 * 10);
}

// Two callers at once each get two threads: in each call, task 0 and task 1 wait for each
// other, which a caller left to run its tasks alone could never satisfy.
TEST(ThreadPool, ConcurrentCallersEachGetTheirThreads) {
  std::atomic<int> callers_in{0};
  std::atomic<int> timeouts{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 2; ++c) {
    callers.emplace_back([&] {
      callers_in++;
      WaitFor(callers_in, 2);
      std::atomic<int> started{0};
      ParallelFor(2, 2, [&](int64_t) {
        started++;
        if (!WaitFor(started, 2)) timeouts++;
      });
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(timeouts.load(), 0);
}

// A task that throws on a worker: the exception reaches the caller after every running task
// has returned, no later task starts, and the next call runs normally.
TEST(ThreadPool, ExceptionOnAWorkerIsRethrownOnTheCaller) {
  const auto caller = std::this_thread::get_id();
  std::atomic<int> started{0};
  std::atomic<int> finished{0};
  EXPECT_THROW(ParallelFor(2, 1000,
                           [&](int64_t i) {
                             if (i < 2) {
                               started++;
                               ASSERT_TRUE(WaitFor(started, 2));
                               if (std::this_thread::get_id() != caller) {
                                 throw std::runtime_error("task failed on a worker");
                               }
                             } else {
                               std::this_thread::sleep_for(std::chrono::milliseconds(1));
                             }
                             finished++;
                           }),
               std::runtime_error);
  EXPECT_LT(finished.load(), 1000);
  std::vector<std::atomic<int>> runs(100);
  ParallelFor(4, 100, [&](int64_t i) { runs[i]++; });
  for (auto& r : runs) ASSERT_EQ(r.load(), 1);
}

// A task that throws on the calling thread while a worker still runs a task: the caller waits
// for it (the task object stays alive), then the exception propagates.
TEST(ThreadPool, ExceptionOnTheCallerWaitsForTheWorkers) {
  const auto caller = std::this_thread::get_id();
  std::atomic<int> started{0};
  std::atomic<bool> worker_done{false};
  try {
    ParallelFor(2, 2, [&](int64_t) {
      started++;
      ASSERT_TRUE(WaitFor(started, 2));
      if (std::this_thread::get_id() == caller) throw std::out_of_range("task failed on the caller");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      worker_done = true;
    });
    ADD_FAILURE() << "no exception";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "task failed on the caller");
    EXPECT_TRUE(worker_done.load()) << "ParallelFor returned while a worker was running";
  }
}

// What RunExecutor's callers see: the exception of a task, on any thread, becomes a status.
TEST(ThreadPool, ExceptionInATaskBecomesAStatusAtTheCBoundary) {
  const gkStatus status = GuardCApi("gkTest", [&] {
    ParallelFor(3, 64, [&](int64_t i) {
      if (i % 7 == 3) throw std::bad_alloc();
    });
    return GK_SUCCESS;
  });
  EXPECT_EQ(status, GK_ERROR_RUNTIME);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("gkTest: out of memory"), std::string::npos)
      << gkGetRecentErrMsg();
  EXPECT_EQ(GuardCApi("gkTest", [] { ParallelFor(3, 8, [](int64_t) {}); return GK_SUCCESS; }),
            GK_SUCCESS);
}

// ---- floating-point mode ----------------------------------------------------------------------

#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
// Flush-to-zero and denormals-are-zero on (x86: MXCSR FTZ | DAZ; ARM: FPCR.FZ) or off for the
// calling thread.
void SetFlushSubnormals(bool on) {
#if defined(__x86_64__) || defined(__i386__)
  constexpr unsigned kFtzDaz = 0x8040;
  _mm_setcsr(on ? (_mm_getcsr() | kFtzDaz) : (_mm_getcsr() & ~kFtzDaz));
#else
  uint64_t fpcr;
  __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
  constexpr uint64_t kFz = uint64_t{1} << 24;
  fpcr = on ? (fpcr | kFz) : (fpcr & ~kFz);
  __asm__ volatile("msr fpcr, %0" : : "r"(fpcr));
#endif
}

// Each task multiplies a subnormal by 0.5: the product is subnormal, or 0 when flushed.
std::vector<float> HalfOfASubnormalPerTask(int32_t threads, std::set<std::thread::id>* ran_on) {
  constexpr int64_t kTasks = 64;
  std::vector<float> out(kTasks);
  std::atomic<int> started{0};
  std::mutex mutex;
  ParallelFor(threads, kTasks, [&](int64_t i) {
    if (i < 2) {  // two threads at least
      started++;
      WaitFor(started, 2);
    }
    volatile float subnormal = 1e-39f;
    volatile float half = 0.5f;
    out[i] = subnormal * half;
    std::lock_guard<std::mutex> lock(mutex);
    ran_on->insert(std::this_thread::get_id());
  });
  return out;
}

TEST(ThreadPool, WorkersComputeInTheCallersFloatMode) {
  volatile float subnormal = 1e-39f;
  const float half_of_it = subnormal * 0.5f;  // this thread: no flushing
  ASSERT_GT(half_of_it, 0.0f);
  for (const bool flush : {true, false, true}) {
    SetFlushSubnormals(flush);
    std::set<std::thread::id> ran_on;
    const std::vector<float> results = HalfOfASubnormalPerTask(4, &ran_on);
    SetFlushSubnormals(false);
    EXPECT_GE(ran_on.size(), 2u);
    for (size_t i = 0; i < results.size(); ++i) {
      if (flush) {
        ASSERT_EQ(results[i], 0.0f) << "task " << i;
      } else {
        ASSERT_EQ(results[i], half_of_it) << "task " << i;
      }
    }
  }
}
#endif

// ---- fork -------------------------------------------------------------------------------------

// Runs `child` in a forked process; true when it exits 0 within 60 s.
::testing::AssertionResult ChildSucceeds(const std::function<int()>& child) {
  const pid_t pid = fork();
  if (pid < 0) return ::testing::AssertionFailure() << "fork failed";
  if (pid == 0) {
    alarm(120);  // a backstop if the parent is gone
    _exit(child());
  }
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return ::testing::AssertionFailure() << "the child hung";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!WIFEXITED(status)) return ::testing::AssertionFailure() << "the child died: " << status;
  if (WEXITSTATUS(status) != 0) {
    return ::testing::AssertionFailure() << "the child exited " << WEXITSTATUS(status);
  }
  return ::testing::AssertionSuccess();
}

// libgomp's workers do not survive fork and its next region in the child would wait for them
// forever: the child runs every task itself, and plans with one thread.
TEST(ThreadPool, ForkedChildRunsEveryTask) {
  std::atomic<int> total{0};
  ParallelFor(4, 100, [&](int64_t) { total++; });
  ASSERT_EQ(total.load(), 100);
  EXPECT_TRUE(ChildSucceeds([] {
    std::vector<std::atomic<int>> runs(100);
    ParallelFor(4, 100, [&](int64_t i) { runs[i]++; });
    for (auto& r : runs) {
      if (r.load() != 1) return 1;
    }
    return gkGetNumThreads() == 1 ? 0 : 2;
  }));
  total = 0;
  ParallelFor(4, 100, [&](int64_t) { total++; });  // the parent's workers are unaffected
  EXPECT_EQ(total.load(), 100);
}

// ---- the default thread count -----------------------------------------------------------------

TEST(ThreadPool, AffinityCoresFollowTheMask) {
  const int32_t cores = AffinityCores();
  ASSERT_GE(cores, 1);
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  EXPECT_EQ(cores, CPU_COUNT(&allowed));
  EXPECT_TRUE(ChildSucceeds([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &allowed)) {
        CPU_SET(cpu, &one);
        break;
      }
    }
    if (sched_setaffinity(0, sizeof one, &one) != 0) return 3;
    return AffinityCores() == 1 ? 0 : 1;
  }));
}

TEST(ThreadPool, CgroupCpuMaxLines) {
  EXPECT_EQ(ThreadsFromCpuMax("max 100000"), std::nullopt);
  EXPECT_EQ(ThreadsFromCpuMax("max 100000\n"), std::nullopt);
  EXPECT_EQ(ThreadsFromCpuMax("200000 100000\n"), 2);
  EXPECT_EQ(ThreadsFromCpuMax("150000 100000"), 2);  // 1.5 cores: two threads, as Go and Java do
  EXPECT_EQ(ThreadsFromCpuMax("50000 100000"), 1);
  EXPECT_EQ(ThreadsFromCpuMax("1 100000"), 1);
  EXPECT_EQ(ThreadsFromCpuMax("800000000 1000"), 1024);  // at most gkSetNumThreads' limit
  EXPECT_EQ(ThreadsFromCpuMax(""), std::nullopt);
  EXPECT_EQ(ThreadsFromCpuMax("100000"), std::nullopt);
  EXPECT_EQ(ThreadsFromCpuMax("-5 100000"), std::nullopt);
  EXPECT_EQ(ThreadsFromCpuMax("100000 0"), std::nullopt);
  EXPECT_EQ(ThreadsFromCpuMax("12x 100000"), std::nullopt);
}

TEST(ThreadPool, CgroupV1CfsQuota) {
  EXPECT_EQ(ThreadsFromCfsQuota("-1\n", "100000\n"), std::nullopt);
  EXPECT_EQ(ThreadsFromCfsQuota("400000\n", "100000\n"), 4);
  EXPECT_EQ(ThreadsFromCfsQuota("250000", "100000"), 3);
  EXPECT_EQ(ThreadsFromCfsQuota("", "100000"), std::nullopt);  // file absent
  EXPECT_EQ(ThreadsFromCfsQuota("100000", "0"), std::nullopt);
}

// The mount and this process's directory, from the texts of /proc/self/{mountinfo,cgroup}.
TEST(ThreadPool, CgroupPlaces) {
  // A hybrid system: the unified v2 mount holds no controller, cpu is in v1.
  const std::string mountinfo =
      "25 1 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
      "26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
      "30 25 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
      "31 25 0:29 / /sys/fs/cgroup/cpuset rw,nosuid - cgroup cgroup rw,cpuset\n";
  const std::string cgroups =
      "12:cpuset:/\n"
      "4:cpu,cpuacct:/user.slice/job-7/\n"
      "0::/user.slice/job-7\n";
  const CgroupPlace v2 = FindCgroup(mountinfo, cgroups, /*v1=*/false);
  EXPECT_EQ(v2.mount_point, "/sys/fs/cgroup/unified");
  EXPECT_EQ(v2.directory, "/sys/fs/cgroup/unified/user.slice/job-7");
  EXPECT_FALSE(v2.v1);
  const CgroupPlace v1 = FindCgroup(mountinfo, cgroups, /*v1=*/true);
  EXPECT_EQ(v1.mount_point, "/sys/fs/cgroup/cpu,cpuacct");
  EXPECT_EQ(v1.directory, "/sys/fs/cgroup/cpu,cpuacct/user.slice/job-7");
  EXPECT_TRUE(v1.v1);
  // A container: the mount's root is the container's cgroup, which /proc/self/cgroup names in full.
  const CgroupPlace inside = FindCgroup(
      "40 30 0:30 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "0::/docker/abc/worker\n",
      false);
  EXPECT_EQ(inside.directory, "/sys/fs/cgroup/worker");
  // No cgroup of the kind; a path that would leave the mount.
  EXPECT_TRUE(FindCgroup("26 25 0:24 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "0::/a\n", true)
                  .directory.empty());
  EXPECT_TRUE(FindCgroup("26 25 0:24 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
                         "0::/a/../../etc\n", false)
                  .directory.empty());
}

TEST(ThreadPool, NumThreadsSetting) {
  const int32_t initial = gkGetNumThreads();
  EXPECT_GE(initial, 1);
  EXPECT_EQ(gkSetNumThreads(3), GK_SUCCESS);
  EXPECT_EQ(gkGetNumThreads(), 3);
  EXPECT_EQ(gkSetNumThreads(-1), GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("numThreads is -1"), std::string::npos);
  EXPECT_EQ(gkSetNumThreads(0), GK_SUCCESS);
  EXPECT_EQ(gkGetNumThreads(), initial);
}

}  // namespace
}  // namespace gk
