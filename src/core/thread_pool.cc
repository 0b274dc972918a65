#include "core/thread_pool.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace gk {
namespace {

std::atomic<int32_t> requested_threads{0};

int32_t DefaultThreads() {
  if (const char* env = std::getenv("GRADKIT_NUM_THREADS")) {
    char* end = nullptr;
    const long value = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && value > 0 && value <= 1024) return static_cast<int32_t>(value);
  }
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return cores > 0 ? static_cast<int32_t>(cores) : 1;
}

class ThreadPool {
 public:
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& worker : workers_) worker.join();
  }

  // Returns false (running nothing) when another caller holds the pool.
  bool TryRun(int32_t threads, int64_t num_tasks, const std::function<void(int64_t)>& task) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (static_cast<int32_t>(workers_.size()) < threads - 1) {
        workers_.emplace_back([this, id = workers_.size()] { WorkerLoop(id); });
      }
      task_ = &task;
      num_tasks_ = num_tasks;
      next_task_.store(0);
      active_workers_ = threads - 1;
      pending_workers_ = threads - 1;
      ++generation_;
    }
    wake_.notify_all();
    Drain();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_workers_ == 0; });
    task_ = nullptr;
    return true;
  }

 private:
  void Drain() {
    for (int64_t i = next_task_.fetch_add(1); i < num_tasks_; i = next_task_.fetch_add(1)) {
      (*task_)(i);
    }
  }

  void WorkerLoop(size_t id) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      if (static_cast<int64_t>(id) >= active_workers_) continue;
      lock.unlock();
      Drain();
      lock.lock();
      if (--pending_workers_ == 0) done_.notify_one();
    }
  }

  std::mutex busy_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t)>* task_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
  int64_t active_workers_ = 0;
  int64_t pending_workers_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
};

ThreadPool& Pool() {
  static ThreadPool pool;
  return pool;
}

}  // namespace

int32_t ConfiguredThreads() {
  const int32_t requested = requested_threads.load();
  if (requested > 0) return requested;
  static const int32_t default_threads = DefaultThreads();
  return default_threads;
}

void ParallelFor(int32_t threads, int64_t num_tasks, const std::function<void(int64_t)>& task) {
  if (num_tasks <= 0) return;
  const int32_t used = static_cast<int32_t>(std::min<int64_t>(threads, num_tasks));
  if (used <= 1 || !Pool().TryRun(used, num_tasks, task)) {
    for (int64_t i = 0; i < num_tasks; ++i) task(i);
  }
}

}  // namespace gk

extern "C" gkStatus gkSetNumThreads(int32_t numThreads) {
  if (numThreads < 0 || numThreads > 1024) {
    return gk::Fail(GK_ERROR_PARAM_INVALID, "gkSetNumThreads",
                    "numThreads is {}, it must be in [0, 1024] (0 = default)", numThreads);
  }
  gk::requested_threads.store(numThreads);
  return GK_SUCCESS;
}

extern "C" int32_t gkGetNumThreads(void) { return gk::ConfiguredThreads(); }
