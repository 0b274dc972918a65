// Concurrent callers: many threads, each planning and running with its own executor, get the
// same bytes as the same calls made one after another. Both operators, alone and mixed, with
// the thread pool contended (run under ThreadSanitizer by scripts/test).
#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/reliability/reliability_util.h"

namespace gk::reliability {
namespace {

constexpr int kCallers = 6;
constexpr int kRoundsPerCaller = 3;

// One EluGradV2 call: large enough that the plan splits it over threads, strided or not.
struct EluJob {
  int64_t elems;
  bool strided;
  std::vector<float> dy, x;

  explicit EluJob(uint32_t seed) : elems(40000 + 1000 * seed), strided(seed % 2 == 1) {
    std::mt19937 generator(seed);
    std::uniform_real_distribution<float> value(-4.0f, 4.0f);
    for (int64_t i = 0; i < 2 * elems; ++i) dy.push_back(value(generator)), x.push_back(value(generator));
  }

  std::vector<uint8_t> Run() const {
    std::vector<uint8_t> y(static_cast<size_t>(elems) * 4, 0);
    // Strided: every second element of dy and x.
    const std::vector<int64_t> strides = strided ? std::vector<int64_t>{2} : std::vector<int64_t>{};
    Tensor dy_t = MakeTensor({elems}, DType::kF32, dy.data(), strides);
    Tensor x_t = MakeTensor({elems}, DType::kF32, x.data(), strides);
    Tensor y_t = MakeTensor({elems}, DType::kF32, y.data());
    gkOpExecutor* raw = nullptr;
    uint64_t size = 0;
    EXPECT_EQ(gkEluGradV2GetWorkspaceSize(dy_t.get(), x_t.get(), 1.5, 1.0, 0.75, false, y_t.get(),
                                          &size, &raw),
              GK_SUCCESS)
        << gkGetRecentErrMsg();
    Executor executor(raw);
    std::vector<uint8_t> workspace(size);
    EXPECT_EQ(gkEluGradV2(workspace.data(), size, executor.get(), nullptr), GK_SUCCESS)
        << gkGetRecentErrMsg();
    return y;
  }
};

// One MoE call: several column blocks and token chunks, scatter or gather routing.
struct MoeJob {
  int64_t batch, top_k = 2, g = 4, k, n = 24, m;
  int64_t row_idx_type;
  std::vector<float> dy, w;
  std::vector<int64_t> row_idx, group_list;

  explicit MoeJob(uint32_t seed) : batch(96 + 8 * seed), k(260 + seed), row_idx_type(seed % 2) {
    std::mt19937 generator(seed);
    std::uniform_int_distribution<int> small(-3, 3);
    const int64_t slots = batch * top_k;
    m = slots - 5;  // a few dropped slots
    std::vector<int64_t> slot_of(static_cast<size_t>(slots));
    for (int64_t p = 0; p < slots; ++p) slot_of[p] = p;
    std::shuffle(slot_of.begin(), slot_of.end(), generator);
    if (row_idx_type == 0) {
      row_idx.assign(slot_of.begin(), slot_of.begin() + m);
    } else {
      row_idx.assign(static_cast<size_t>(slots), -1);
      for (int64_t i = 0; i < m; ++i) row_idx[slot_of[i]] = i;
    }
    group_list = {m / 2, 0, m / 4, m - m / 2 - m / 4};
    for (int64_t i = 0; i < m * n; ++i) dy.push_back(static_cast<float>(small(generator)));
    for (int64_t i = 0; i < g * k * n; ++i) w.push_back(static_cast<float>(small(generator)));
  }

  std::vector<uint8_t> Run() const {
    std::vector<uint8_t> dx(static_cast<size_t>(batch * k) * 4, 0xEE);
    Tensor dy_t = MakeTensor({m, n}, DType::kF32, dy.data());
    Tensor w_t = MakeTensor({g, k, n}, DType::kF32, w.data());
    Tensor idx_t = MakeTensor({static_cast<int64_t>(row_idx.size())}, DType::kI64, row_idx.data());
    Tensor groups_t = MakeTensor({g}, DType::kI64, group_list.data());
    Tensor dx_t = MakeTensor({batch, k}, DType::kF32, dx.data());
    gkOpExecutor* raw = nullptr;
    uint64_t size = 0;
    EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
                  dy_t.get(), w_t.get(), idx_t.get(), groups_t.get(), batch, top_k,
                  static_cast<gkRowIdxType>(row_idx_type),
                  GK_GROUP_LIST_COUNT, dx_t.get(), &size, &raw),
              GK_SUCCESS)
        << gkGetRecentErrMsg();
    Executor executor(raw);
    std::vector<uint8_t> workspace(size);
    EXPECT_EQ(gkMoeInitRoutingGroupedMatmulGrad(workspace.data(), size, executor.get(), nullptr),
              GK_SUCCESS)
        << gkGetRecentErrMsg();
    return dx;
  }
};

class ConcurrentCallers : public ::testing::Test {
 protected:
  void SetUp() override { gkSetNumThreads(3); }  // each call wants the shared pool
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
