// The runtime under the operators, as processes meet it: fork after multi-threaded calls (a
// PyTorch DataLoader), a CPU affinity mask (taskset, a container's cpuset), the caller's
// flush-to-zero mode, executors planned up front and run from many threads, executors used after
// they were destroyed.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "tests/reliability/operator_jobs.h"
#include "tests/reliability/reliability_util.h"

extern char** environ;

namespace gk::reliability {
namespace {

using Clock = std::chrono::steady_clock;

// Waits for a child; false (and the child killed) past the deadline.
bool WaitForChild(pid_t pid, std::chrono::seconds limit, int* status) {
  const auto deadline = Clock::now() + limit;
  while (waitpid(pid, status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, status, 0);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

class RuntimeTest : public ::testing::Test {
 protected:
  void TearDown() override { gkSetNumThreads(0); }
};

// ---- fork ---------------------------------------------------------------------------------------

// A process that ran both operators on several threads forks (as a DataLoader does); the child
// runs both again, on its calling thread, and gets the same bytes.
TEST_F(RuntimeTest, ForkedChildRunsBothOperators) {
  ASSERT_EQ(gkSetNumThreads(3), GK_SUCCESS);
  const EluJob elu(3);
  const MoeJob moe(3);
  const std::vector<uint8_t> elu_expected = elu.Run();
  const std::vector<uint8_t> moe_expected = moe.Run();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(120);  // a backstop if the parent is gone
    int code = 0;
    if (gkGetNumThreads() != 1) code |= 1;
    if (elu.Run() != elu_expected) code |= 2;
    if (moe.Run() != moe_expected) code |= 4;
    if (::testing::Test::HasFailure()) code |= 8;  // a call returned an error (printed above)
    _exit(code);
  }
  int status = 0;
  ASSERT_TRUE(WaitForChild(pid, std::chrono::seconds(60), &status)) << "the child hung";
  ASSERT_TRUE(WIFEXITED(status)) << "the child died, status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "1: threads != 1, 2: EluGradV2 bytes differ, 4: MoE bytes differ, 8: a call failed";
  EXPECT_EQ(elu.Run(), elu_expected);  // the parent's workers are unaffected
  EXPECT_EQ(moe.Run(), moe_expected);
}

// ---- the default thread count -------------------------------------------------------------------

// `gradkit info` run under a one-CPU affinity mask (what `taskset -c 0` does), with the given
// GRADKIT_NUM_THREADS (or none): the thread count it reports.
int32_t CliThreadsOnOneCpu(const char* gradkit_num_threads) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return -1;
  int first_cpu = 0;
  while (!CPU_ISSET(first_cpu, &allowed)) ++first_cpu;
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "GRADKIT_NUM_THREADS=", 20) != 0) env_strings.emplace_back(*e);
  }
  if (gradkit_num_threads != nullptr) {
    env_strings.push_back(std::string("GRADKIT_NUM_THREADS=") + gradkit_num_threads);
  }
  std::vector<char*> env;
  for (auto& s : env_strings) env.push_back(s.data());
  env.push_back(nullptr);
  int out[2];
  if (pipe(out) != 0) return -1;
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first_cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) _exit(90);
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    char* argv[] = {const_cast<char*>(GRADKIT_CLI_PATH), const_cast<char*>("info"), nullptr};
    execve(GRADKIT_CLI_PATH, argv, env.data());
    _exit(91);
  }
  close(out[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = read(out[0], buffer, sizeof buffer)) > 0;) text.append(buffer, n);
  close(out[0]);
  int status = 0;
  if (!WaitForChild(pid, std::chrono::seconds(60), &status) || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    ADD_FAILURE() << "gradkit info failed, status " << status << ", output:\n" << text;
    return -1;
  }
  const size_t at = text.find("threads:");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no threads line in:\n" << text;
    return -1;
  }
  return static_cast<int32_t>(std::stol(text.substr(at + 8)));
}

TEST_F(RuntimeTest, DefaultThreadsFollowTheAffinityMaskAndTheEnvironmentWins) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "one CPU allowed: a one-CPU mask changes nothing";
  EXPECT_EQ(CliThreadsOnOneCpu(nullptr), 1);
  EXPECT_EQ(CliThreadsOnOneCpu("3"), 3);
}

// ---- floating-point mode ------------------------------------------------------------------------

#if defined(__x86_64__) || defined(__i386__)
class ScopedFlushSubnormals {
 public:
  explicit ScopedFlushSubnormals(bool on) : saved_(_mm_getcsr()) {
    constexpr unsigned kFtzDaz = 0x8040;
    _mm_setcsr(on ? (saved_ | kFtzDaz) : (saved_ & ~kFtzDaz));
  }
  ~ScopedFlushSubnormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
};

// EluGradV2 with subnormal gradients and results: the bytes for one thread and for four are
// the same whether the caller flushes subnormals or not, and flushing does change them (so the
// workers really computed in the caller's mode).
TEST_F(RuntimeTest, EluGradV2SubnormalsSameBytesForOneAndFourThreadsInTheCallersMode) {
  constexpr int64_t kElems = int64_t{1} << 20;
  std::vector<float> dy(kElems), x(kElems);
  for (int64_t i = 0; i < kElems; ++i) {
    dy[i] = (i % 3 == 0 ? 3e-39f : 1e-30f) * static_cast<float>(1 + i % 7);  // some subnormal
    x[i] = static_cast<float>(i % 11) - 5.5f;                               // both branches
  }
  const auto run = [&](int32_t threads) {
    EXPECT_EQ(gkSetNumThreads(threads), GK_SUCCESS);
    std::vector<float> y(kElems, -1.0f);
    Tensor dy_t = MakeTensor({kElems}, DType::kF32, dy.data());
    Tensor x_t = MakeTensor({kElems}, DType::kF32, x.data());
    Tensor y_t = MakeTensor({kElems}, DType::kF32, y.data());
    gkOpExecutor* raw = nullptr;
    uint64_t size = 0;
    EXPECT_EQ(gkEluGradV2GetWorkspaceSize(dy_t.get(), x_t.get(), 1.0, 0.5, 1.0, false, y_t.get(),
                                          &size, &raw),
              GK_SUCCESS)
        << gkGetRecentErrMsg();
    Executor executor(raw);
    std::vector<uint8_t> workspace(size);
    EXPECT_EQ(gkEluGradV2(workspace.data(), size, executor.get(), nullptr), GK_SUCCESS)
        << gkGetRecentErrMsg();
    return y;
  };
  std::vector<float> flushed, kept;
  {
    const ScopedFlushSubnormals flush(true);
    flushed = run(1);
    EXPECT_TRUE(run(4) == flushed) << "flushing caller: 4 threads differ from 1";
  }
  {
    const ScopedFlushSubnormals flush(false);
    kept = run(1);
    EXPECT_TRUE(run(4) == kept) << "caller keeping subnormals: 4 threads differ from 1";
  }
  EXPECT_FALSE(flushed == kept) << "the input has no subnormal result: the test shows nothing";
}
#endif

// ---- executors ----------------------------------------------------------------------------------

// Executors planned up front, each run repeatedly from its own thread at the same time: no
// executor shares state with another (workspace pointers live in the call).
TEST_F(RuntimeTest, DifferentExecutorsRunConcurrently) {
  ASSERT_EQ(gkSetNumThreads(2), GK_SUCCESS);
  constexpr int kExecutors = 4;
  std::vector<MoeJob> jobs;
  for (uint32_t seed = 0; seed < kExecutors; ++seed) jobs.emplace_back(seed);
  std::vector<std::vector<uint8_t>> expected;
  for (const MoeJob& job : jobs) expected.push_back(job.Run());

  struct Planned {
    std::vector<uint8_t> dx;
    Tensor dy, w, idx, groups, dx_t;
    Executor executor;
    std::vector<uint8_t> workspace;
  };
  std::vector<Planned> planned(kExecutors);
  for (int e = 0; e < kExecutors; ++e) {
    const MoeJob& j = jobs[e];
    Planned& p = planned[e];
    p.dx.assign(static_cast<size_t>(j.batch * j.k) * 4, 0xEE);
    p.dy = MakeTensor({j.m, j.n}, DType::kF32, j.dy.data());
    p.w = MakeTensor({j.g, j.k, j.n}, DType::kF32, j.w.data());
    p.idx = MakeTensor({static_cast<int64_t>(j.row_idx.size())}, DType::kI64, j.row_idx.data());
    p.groups = MakeTensor({j.g}, DType::kI64, j.group_list.data());
    p.dx_t = MakeTensor({j.batch, j.k}, DType::kF32, p.dx.data());
    gkOpExecutor* raw = nullptr;
    uint64_t size = 0;
    ASSERT_EQ(gkMoeInitRoutingGroupedMatmulGradGetWorkspaceSize(
                  p.dy.get(), p.w.get(), p.idx.get(), p.groups.get(), j.batch, j.top_k,
                  static_cast<gkRowIdxType>(j.row_idx_type), GK_GROUP_LIST_COUNT, p.dx_t.get(),
                  &size, &raw),
              GK_SUCCESS)
        << gkGetRecentErrMsg();
    p.executor.reset(raw);
    ASSERT_EQ(gkSetExecutorRepeatable(raw), GK_SUCCESS);
    p.workspace.resize(size);
  }
  std::vector<int> mismatches(kExecutors, 0);
  std::vector<std::thread> callers;
  for (int e = 0; e < kExecutors; ++e) {
    callers.emplace_back([&, e] {
      Planned& p = planned[e];
      for (int round = 0; round < 5; ++round) {
        std::fill(p.dx.begin(), p.dx.end(), uint8_t{0xEE});
        const gkStatus status = gkMoeInitRoutingGroupedMatmulGrad(
            p.workspace.data(), p.workspace.size(), p.executor.get(), nullptr);
        mismatches[e] += status != GK_SUCCESS || p.dx != expected[e];
      }
    });
  }
  for (auto& caller : callers) caller.join();
  for (int e = 0; e < kExecutors; ++e) EXPECT_EQ(mismatches[e], 0) << "executor " << e;
}

// A destroyed executor is refused by phase 2 and by a second destroy, without being read (the
// registry of live executors answers; ASan would report a read of the freed object).
TEST_F(RuntimeTest, DestroyedExecutorIsAnError) {
  const EluJob job(1);
  std::vector<uint8_t> y(static_cast<size_t>(job.elems) * 4);
  Tensor dy = MakeTensor({job.elems}, DType::kF32, job.dy.data());
  Tensor x = MakeTensor({job.elems}, DType::kF32, job.x.data());
  Tensor y_t = MakeTensor({job.elems}, DType::kF32, y.data());
  gkOpExecutor* raw = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(gkEluGradV2GetWorkspaceSize(dy.get(), x.get(), 1.0, 1.0, 1.0, false, y_t.get(), &size,
                                        &raw),
            GK_SUCCESS);
  ASSERT_EQ(gkDestroyExecutor(raw), GK_SUCCESS);
  std::vector<uint8_t> workspace(size + 1);
  EXPECT_EQ(gkEluGradV2(workspace.data(), size, raw, nullptr), GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("not a live gradkit executor"),
            std::string::npos)
      << gkGetRecentErrMsg();
  EXPECT_EQ(gkSetExecutorRepeatable(raw), GK_ERROR_PARAM_INVALID);
  EXPECT_EQ(gkDestroyExecutor(raw), GK_ERROR_PARAM_INVALID);
  // Not an executor at all: the address of some other object.
  int not_an_executor = 0;
  EXPECT_EQ(gkEluGradV2(workspace.data(), size,
                        reinterpret_cast<gkOpExecutor*>(&not_an_executor), nullptr),
            GK_ERROR_PARAM_INVALID);
}

}  // namespace
}  // namespace gk::reliability
