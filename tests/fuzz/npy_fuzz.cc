// Fuzz target: the CLI's .npy reader (header, dtype, shape, truncation, huge sizes) and the
// conversions the commands apply to what it returns.
// Guarantee: any input either parses into a consistent array or throws CliError; nothing else
// escapes, nothing is read past the input, no size arithmetic overflows.
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_support.h"
#include "tools/gradkit/cli_util.h"
#include "tools/gradkit/npy.h"

namespace {

using gk::DType;
using gk::cli::CliError;
using gk::cli::NpyArray;

int64_t DescrBytes(const std::string& descr) {
  if (descr == "<f4" || descr == "<i4") return 4;
  if (descr == "<f2") return 2;
  if (descr == "<f8" || descr == "<i8") return 8;
  return 0;
}

void CheckConsistent(const NpyArray& array, size_t input_size) {
  const int64_t item = DescrBytes(array.descr);
  GK_FUZZ_CHECK(item > 0, "parsed dtype '%s' is not one the reader supports", array.descr.c_str());
  GK_FUZZ_CHECK(array.shape.size() <= 32, "%zu dims", array.shape.size());
  int64_t elems = 1;
  for (int64_t d : array.shape) {
    GK_FUZZ_CHECK(d >= 0, "negative dim %lld", static_cast<long long>(d));
    GK_FUZZ_CHECK(!__builtin_mul_overflow(elems, d, &elems), "element count overflows");
  }
  GK_FUZZ_CHECK(array.elems() == elems, "elems() %lld, product of shape %lld",
                static_cast<long long>(array.elems()), static_cast<long long>(elems));
  GK_FUZZ_CHECK(static_cast<uint64_t>(elems) * static_cast<uint64_t>(item) == array.bytes.size(),
                "%zu payload bytes for %lld elements of %lld bytes", array.bytes.size(),
                static_cast<long long>(elems), static_cast<long long>(item));
  GK_FUZZ_CHECK(array.bytes.size() <= input_size, "more payload than input");
}

// The conversions the CLI applies next: each either succeeds with the right size or throws
// CliError (wrong kind of array, an index outside int32).
void Convert(const NpyArray& array) {
  const int64_t elems = array.elems();
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    try {
      const auto out = gk::cli::ConvertNpyToDType(array, dtype, "--input");
      GK_FUZZ_CHECK(out.size() == static_cast<size_t>(elems * gk::ElementBytes(dtype)),
                    "float conversion size");
      const NpyArray back = gk::cli::NpyFromBuffer(out.data(), elems, dtype, array.shape);
      CheckConsistent(back, static_cast<size_t>(-1));
    } catch (const CliError&) {
    }
  }
  for (DType dtype : {DType::kI32, DType::kI64}) {
    try {
      const auto out = gk::cli::ConvertNpyToIndex(array, dtype, "--index");
      GK_FUZZ_CHECK(out.size() == static_cast<size_t>(elems * gk::ElementBytes(dtype)),
                    "index conversion size");
    } catch (const CliError&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  NpyArray array;
  try {
    array = gk::cli::ParseNpy(data, size, "fuzz.npy");
  } catch (const CliError& e) {
    GK_FUZZ_CHECK(std::string(e.what()).rfind("fuzz.npy: ", 0) == 0,
                  "the message does not name the file: %s", e.what());
    return 0;
  }
  CheckConsistent(array, size);
  Convert(array);
  return 0;
}
