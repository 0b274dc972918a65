// A persistent pool of worker threads. Work is split into numbered tasks by the caller's plan,
// so results never depend on which thread runs a task: determinism comes from the plan.
#pragma once

#include <cstdint>
#include <functional>

namespace gk {

// Threads operators plan with: gkSetNumThreads, else GRADKIT_NUM_THREADS, else online cores.
int32_t ConfiguredThreads();

// Runs task(0) ... task(num_tasks - 1) on up to `threads` threads (the caller is one of them) and
// returns when all are done. Concurrent callers are safe: when the pool is busy, the tasks of
// the later caller run on its own thread, with identical results.
void ParallelFor(int32_t threads, int64_t num_tasks, const std::function<void(int64_t)>& task);

}  // namespace gk
