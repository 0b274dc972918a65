// The libtorch peer as `gradkit bench` runs it, interleaved with gradkit's candidates: once its
// call returns, none of its threads may keep a core busy, or the candidate timed next runs on
// fewer cores than it was given (bench/torch_peer_loader.cc).
#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "bench/torch_peer_moe.h"

namespace gk::bench {
namespace {

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

TEST(TorchPeer, LeavesNoThreadSpinningAfterItsCall) {
  setenv("GRADKIT_TORCH_PEER", GRADKIT_TEST_TORCH_PEER, /*overwrite=*/1);
  unsetenv("OPENBLAS_THREAD_TIMEOUT");  // the default the loader sets, not the caller's
  // Two experts of 256 rows, 512 x 512: large enough for the peer's BLAS to use its threads.
  const int64_t batch = 256, top_k = 2, g = 2, n = 512, k = 512, m = batch * top_k;
  std::vector<float> dy(static_cast<size_t>(m * n), 0.5f), w(static_cast<size_t>(g * k * n), 0.25f);
  std::vector<float> dx(static_cast<size_t>(batch * k));
  const std::vector<int64_t> group_counts{m / 2, m / 2};
  std::vector<int64_t> row_token(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) row_token[i] = i % batch;
  std::string why;
  const auto run = MakeTorchMoeGradComposite(dy.data(), w.data(), dx.data(), DType::kF32, m, n, k,
                                             batch, group_counts, row_token, /*threads=*/2, &why);
  if (!run) GTEST_SKIP() << "no libtorch peer: " << why;
  for (int i = 0; i < 3; ++i) (*run)();
  EXPECT_EQ(dx[0], 2.0f * n * 0.5f * 0.25f);  // the call ran: two rows of n products each
  const double before = ProcessCpuSeconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double busy = ProcessCpuSeconds() - before;
  // Spinning OpenBLAS workers burned 100-118 ms of CPU in 100 ms of sleep.
  EXPECT_LT(busy, 0.04) << "the process used " << busy * 1e3
                        << " ms of CPU while the test's thread slept 200 ms after the peer's call";
}

}  // namespace
}  // namespace gk::bench
