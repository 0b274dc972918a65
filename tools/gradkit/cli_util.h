// Helpers shared by the CLI's commands: errors, dtypes, conversions between .npy and tensors.
#pragma once

#include <memory>
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

// Throws CliError with the library's message when status is not GK_SUCCESS.
void ThrowIfFailed(gkStatus status);

// "f32" | "f16" | "bf16" (also "float32", ...) -> DType; throws CliError naming `option`.
DType ParseFloatDType(const std::string& text, const std::string& option);
std::string ShortDTypeName(DType dtype);  // "f32", "f16", "bf16"

// The dtype a .npy float array holds ("<f4" -> f32, "<f2" -> f16); throws for others.
DType NpyFloatDType(const NpyArray& array, const std::string& option);

// A contiguous buffer of `dtype` holding the array's values, rounded to nearest even.
std::vector<uint8_t> ConvertNpyToDType(const NpyArray& array, DType dtype, const std::string& option);
// Integer .npy (<i4 / <i8) as the given integer dtype, checking the range.
std::vector<uint8_t> ConvertNpyToIndex(const NpyArray& array, DType dtype, const std::string& option);

// An .npy array of the buffer's values: float16 stays "<f2", everything else becomes "<f4".
NpyArray NpyFromBuffer(const void* data, int64_t elems, DType dtype,
                       const std::vector<int64_t>& shape);

struct TensorDeleter {
  void operator()(gkTensor* t) const { gkDestroyTensor(t); }
};
using TensorHandle = std::unique_ptr<gkTensor, TensorDeleter>;
TensorHandle MakeTensor(const std::vector<int64_t>& shape, DType dtype, void* data);

struct ExecutorDeleter {
  void operator()(gkOpExecutor* e) const { gkDestroyExecutor(e); }
};
using ExecutorHandle = std::unique_ptr<gkOpExecutor, ExecutorDeleter>;

}  // namespace gk::cli
