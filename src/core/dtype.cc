#include "core/dtype.h"

namespace gk {

bool IsKnownDType(int32_t value) {
  switch (value) {
    case GK_FLOAT: case GK_FLOAT16: case GK_INT32: case GK_INT64: case GK_DOUBLE: case GK_BF16:
      return true;
    default:
      return false;
  }
}

int64_t ElementBytes(DType dtype) {
  switch (dtype) {
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF64: case DType::kI64: return 8;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kF64: return "float64";
  }
  return "unknown";
}

}  // namespace gk
