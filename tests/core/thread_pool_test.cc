#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "gradkit/base.h"

namespace gk {
namespace {

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
