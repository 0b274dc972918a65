// Whole calls of both operators with their inputs, run as a caller would (phase 1, workspace,
// phase 2): shared by the tests that compare bytes across threads, callers and processes.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "tests/reliability/reliability_util.h"

namespace gk::reliability {

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

}  // namespace gk::reliability
