// Concurrent callers: many threads, each planning and running with its own executor, get the
// same bytes as the same calls made one after another. Both operators, alone and mixed, every
// caller with its own OpenMP team (run under ThreadSanitizer by scripts/test).
#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/reliability/operator_jobs.h"
#include "tests/reliability/reliability_util.h"

namespace gk::reliability {
namespace {

constexpr int kCallers = 6;
constexpr int kRoundsPerCaller = 3;

class ConcurrentCallers : public ::testing::Test {
 protected:
  void SetUp() override { gkSetNumThreads(3); }  // each call wants several threads
  void TearDown() override { gkSetNumThreads(0); }

  // Each caller runs its jobs kRoundsPerCaller times; every result must equal the sequential one.
  template <typename Job>
  static void Check(const std::vector<Job>& jobs) {
    std::vector<std::vector<uint8_t>> sequential;
    for (const Job& job : jobs) sequential.push_back(job.Run());
    std::vector<std::vector<std::vector<uint8_t>>> results(jobs.size());
    std::vector<std::thread> callers;
    for (size_t c = 0; c < jobs.size(); ++c) {
      callers.emplace_back([&, c] {
        for (int r = 0; r < kRoundsPerCaller; ++r) results[c].push_back(jobs[c].Run());
      });
    }
    for (auto& caller : callers) caller.join();
    for (size_t c = 0; c < jobs.size(); ++c) {
      for (const auto& result : results[c]) EXPECT_TRUE(result == sequential[c]) << "caller " << c;
    }
  }
};

TEST_F(ConcurrentCallers, EluGradV2SameBytesAsSequential) {
  std::vector<EluJob> jobs;
  for (uint32_t seed = 0; seed < kCallers; ++seed) jobs.emplace_back(seed);
  Check(jobs);
}

TEST_F(ConcurrentCallers, MoeGradSameBytesAsSequential) {
  std::vector<MoeJob> jobs;
  for (uint32_t seed = 0; seed < kCallers; ++seed) jobs.emplace_back(seed);
  Check(jobs);
}

TEST_F(ConcurrentCallers, BothOperatorsAtOnce) {
  const EluJob elu(7);
  const MoeJob moe(7);
  const auto elu_expected = elu.Run();
  const auto moe_expected = moe.Run();
  std::vector<std::thread> callers;
  std::vector<int> mismatches(kCallers, 0);
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int r = 0; r < kRoundsPerCaller; ++r) {
        mismatches[c] += c % 2 ? (moe.Run() != moe_expected) : (elu.Run() != elu_expected);
      }
    });
  }
  for (auto& caller : callers) caller.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(mismatches[c], 0) << "caller " << c;
}

// The error message is per thread: a failing call on one thread never shows on another.
TEST_F(ConcurrentCallers, ErrorMessagesStayOnTheirThread) {
  std::vector<std::thread> callers;
  std::vector<int> wrong(kCallers, 0);
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int r = 0; r < 200; ++r) {
        if (c % 2) {
          gkEluGradV2(nullptr, 0, nullptr, nullptr);  // fails: NULL executor
          wrong[c] += std::string(gkGetRecentErrMsg()).find("executor is NULL") == std::string::npos;
        } else {
          gkSetNumThreads(-1);  // fails without changing the setting
          wrong[c] += std::string(gkGetRecentErrMsg()).find("numThreads is -1") == std::string::npos;
        }
      }
    });
  }
  for (auto& caller : callers) caller.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(wrong[c], 0) << "caller " << c;
}

}  // namespace
}  // namespace gk::reliability
