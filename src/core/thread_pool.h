// Parallel loops on OpenMP, the runtime oneDNN here is built on: one pool of workers per process
// for both, so the two never oversubscribe the cores. Work is split into numbered tasks by the
// caller's plan, a function of the shape alone, so results never depend on which thread runs a
// task or on how many threads the runtime actually gives.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace gk {

// Threads operators plan with: gkSetNumThreads, else GRADKIT_NUM_THREADS, else the cores this
// process may use (its CPU affinity mask, bounded by its cgroup CPU quota, v2 or v1). 1 in a forked
// child (see ParallelFor).
int32_t ConfiguredThreads();

// Runs task(0) ... task(num_tasks - 1) on up to `threads` threads (the caller is one of them) and
// returns when all are done.
// - Each top-level caller gets its own team: concurrent callers all run in parallel.
// - Workers compute in the caller's floating-point mode (MXCSR on x86, FPCR on ARM: FTZ, DAZ,
//   rounding) for the duration of the call.
// - A task that throws, on any thread, stops the hand-out of further tasks; once every running
//   task has returned, the first exception caught is rethrown on the caller.
// - Runs every task on the calling thread when threads <= 1, when called from inside a parallel
//   region (no nesting: the outer region already uses the cores), and in a forked child
//   (libgomp's workers do not survive fork, and its next region would wait for them forever).
void ParallelFor(int32_t threads, int64_t num_tasks, const std::function<void(int64_t)>& task);

// The default thread count's parts, exposed for tests.
// Cores in this process's CPU affinity mask (sched_getaffinity).
int32_t AffinityCores();
// Threads a cgroup v2 `cpu.max` line allows ("max 100000": no limit, nullopt; "150000 100000":
// 2, the quota over the period rounded up). nullopt also for a line that does not parse.
std::optional<int32_t> ThreadsFromCpuMax(std::string_view cpu_max);
// The same for cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us ("-1": no limit).
std::optional<int32_t> ThreadsFromCfsQuota(std::string_view quota, std::string_view period);
// Where this process's CPU quota lives, from the texts of /proc/self/mountinfo and
// /proc/self/cgroup: the cgroup v2 mount (or, with v1, the mount of the v1 `cpu` controller) and
// this process's directory under it. Empty strings when there is none.
struct CgroupPlace {
  std::string mount_point;
  std::string directory;
  bool v1 = false;
};
CgroupPlace FindCgroup(std::string_view mountinfo, std::string_view proc_cgroup, bool v1);

}  // namespace gk
