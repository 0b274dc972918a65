// The CLI as a process, inside ctest (so under ASan + UBSan in the asan preset): malformed input
// exits 2 with one line, and the reproducer of an open bug in the moe-grad command.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tools/gradkit/npy.h"

namespace gk::reliability {
namespace {

std::string TempDir() {
  static const std::string dir = [] {
    std::string pattern = ::testing::TempDir() + "/gradkit_cli_XXXXXX";
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    const char* made = mkdtemp(buffer.data());
    return std::string(made ? made : ::testing::TempDir().c_str());
  }();
  return dir;
}

template <typename T>
std::string SaveNpy(const std::string& name, const char* descr, const std::vector<int64_t>& shape,
                    const std::vector<T>& values) {
  cli::NpyArray array;
  array.descr = descr;
  array.shape = shape;
  array.bytes.resize(values.size() * sizeof(T));
  std::memcpy(array.bytes.data(), values.data(), array.bytes.size());
  const std::string path = TempDir() + "/" + name;
  cli::WriteNpyAtomic(path, array);
  return path;
}

struct Outcome {
  int exit_status;
  std::string stderr_text;
};

Outcome RunCli(const std::string& args) {
  const std::string err = TempDir() + "/stderr.txt";
  const int status = std::system((std::string(GRADKIT_CLI_PATH) + " " + args + " 2>" + err).c_str());
  std::ifstream in(err);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), text};
}

bool OneErrorLine(const std::string& text) {
  return text.rfind("gradkit: error: ", 0) == 0 && text.find('\n') == text.size() - 1;
}

std::string MoeArgs(const std::string& batch) {
  const std::string dy = SaveNpy<float>("dy.npy", "<f4", {3, 4}, std::vector<float>(12, 1.0f));
  const std::string w = SaveNpy<float>("w.npy", "<f4", {2, 3, 4}, std::vector<float>(24, 1.0f));
  const std::string idx = SaveNpy<int64_t>("idx.npy", "<i8", {3}, {0, 3, 1});
  const std::string groups = SaveNpy<int64_t>("groups.npy", "<i8", {2}, {1, 2});
  return "moe-grad --grad-y " + dy + " --weight " + w + " --expanded-row-idx " + idx +
         " --group-list " + groups + " --topk 2 --out " + TempDir() + "/dx.npy --batch " + batch;
}

TEST(CliReliability, MalformedNpyExitsTwoWithOneLine) {
  const std::string bad = TempDir() + "/bad.npy";
  std::ofstream(bad) << "\x93NUMPY\x01\x00\xff\xff{'descr': '<f4'";
  const std::string x = SaveNpy<float>("x.npy", "<f4", {4}, {1, 2, 3, 4});
  const Outcome outcome = RunCli("elu-grad --dy " + bad + " --x " + x + " --out " + TempDir() + "/y.npy");
  EXPECT_EQ(outcome.exit_status, 2);
  EXPECT_TRUE(OneErrorLine(outcome.stderr_text)) << outcome.stderr_text;
}

TEST(CliReliability, MoeGradValidCallRuns) {
  const Outcome outcome = RunCli(MoeArgs("2"));
  EXPECT_EQ(outcome.exit_status, 0) << outcome.stderr_text;
}

// Regression: gradX was allocated as batch * K floats before anything checked batch, so
// --batch 2^63 - 1 overflowed int64 (undefined; UBSan aborted) and --batch 2^40 asked for 12 TB
// (std::bad_alloc, exit 3 "internal error"). Both are now exit 2 with one line.
TEST(CliReliability, MoeGradHugeBatchExitsTwo) {
  for (const char* batch : {"9223372036854775807", "1099511627776"}) {
    const Outcome outcome = RunCli(MoeArgs(batch));
    EXPECT_EQ(outcome.exit_status, 2) << batch << ": " << outcome.stderr_text;
    EXPECT_TRUE(OneErrorLine(outcome.stderr_text)) << outcome.stderr_text;
  }
}

}  // namespace
}  // namespace gk::reliability
