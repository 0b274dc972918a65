// Helpers shared by the CLI's commands: errors, dtypes, conversions between .npy and tensors.
#pragma once

#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gradkit/gradkit.h"
#include "tools/gradkit/npy.h"

namespace gk::cli {

// A user error: the CLI prints "gradkit: error: <what>" and exits with status 2.
class CliError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How the C API names an argument, and the CLI option the user typed for it.
struct OptionName {
  const char* api;
  const char* option;
};

// Throws CliError with the library's message when status is not GK_SUCCESS. With `names`, the
// message speaks the CLI's language: the API function's prefix goes and each argument name (a
// whole word) becomes the option the user typed, e.g. "expandedRowIdx[3] is 999" ->
// "--expanded-row-idx[3] is 999".
void ThrowIfFailed(gkStatus status, std::span<const OptionName> names = {});
std::string TranslateApiMessage(std::string message, std::span<const OptionName> names);

// The library's limit on thread counts (gkSetNumThreads).
constexpr int kMaxThreads = 1024;
// --threads: 0 (the default: GRADKIT_NUM_THREADS or all cores) .. kMaxThreads.
void CheckThreadsOption(int64_t threads, const std::string& option);
// An option that must be >= 1.
void CheckPositiveOption(int64_t value, const std::string& option);

// Refuses, before any input is read, an output path that cannot be a file written there: a
// directory (or a name ending in '/'), a missing parent directory, a parent that is a file.
void CheckOutputPath(const std::string& path, const std::string& option);

// One line on stderr: "gradkit: note: ..." (what was done, unless --quiet) and
// "gradkit: warning: ..." (something that looks wrong but is legal).
void Note(const std::string& text);
void Warn(const std::string& text);

// "f32" | "f16" | "bf16" (also "float32", ...) -> DType; throws CliError naming `option`.
DType ParseFloatDType(const std::string& text, const std::string& option);
std::string ShortDTypeName(DType dtype);  // "f32", "f16", "bf16"

// The dtype a .npy float array holds ("<f4" -> f32, "<f2" -> f16); throws for others.
DType NpyFloatDType(const NpyArray& array, const std::string& option);

// A contiguous buffer of `dtype` holding the array's values, rounded to nearest even.
std::vector<uint8_t> ConvertNpyToDType(const NpyArray& array, DType dtype, const std::string& option);
// Integer .npy (<i4 / <i8) as the given integer dtype, checking the range.
std::vector<uint8_t> ConvertNpyToIndex(const NpyArray& array, DType dtype, const std::string& option);

// The array's values as `dtype`, taking the array's own buffer when it already holds that dtype
// (no copy); otherwise converted as above, and the array's buffer released.
std::vector<uint8_t> TakeAsDType(NpyArray& array, DType dtype, const std::string& option);
std::vector<uint8_t> TakeAsIndex(NpyArray& array, DType dtype, const std::string& option);

// How a buffer of `dtype` is saved: float16 stays "<f2", everything else becomes "<f4" (NumPy
// has no bfloat16).
std::string NpyDescrFor(DType dtype);
// Writes the buffer as .npy (temp file + rename): float32 and float16 straight from the buffer,
// bfloat16 widened to float32 a small chunk at a time, so no second copy of the output exists.
void WriteNpyFromBuffer(const std::string& path, const void* data, int64_t elems, DType dtype,
                        const std::vector<int64_t>& shape);
// The same array in memory (tests compare the two).
NpyArray NpyFromBuffer(const void* data, int64_t elems, DType dtype,
                       const std::vector<int64_t>& shape);

struct TensorDeleter {
  void operator()(gkTensor* t) const { gkDestroyTensor(t); }
};
using TensorHandle = std::unique_ptr<gkTensor, TensorDeleter>;
// strides: empty for C-contiguous.
TensorHandle MakeTensor(const std::vector<int64_t>& shape, DType dtype, void* data,
                        const std::vector<int64_t>& strides = {});

struct ExecutorDeleter {
  void operator()(gkOpExecutor* e) const { gkDestroyExecutor(e); }
};
using ExecutorHandle = std::unique_ptr<gkOpExecutor, ExecutorDeleter>;

}  // namespace gk::cli
