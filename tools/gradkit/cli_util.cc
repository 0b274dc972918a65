#include "tools/gradkit/cli_util.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace gk::cli {

void ThrowIfFailed(gkStatus status) {
  if (status != GK_SUCCESS) throw CliError(gkGetRecentErrMsg());
}

DType ParseFloatDType(const std::string& text, const std::string& option) {
  if (text == "f32" || text == "float32" || text == "fp32") return DType::kF32;
  if (text == "f16" || text == "float16" || text == "fp16") return DType::kF16;
  if (text == "bf16" || text == "bfloat16") return DType::kBF16;
  throw CliError(fmt::format("{} is '{}', it must be one of f32, f16, bf16", option, text));
}

std::string ShortDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    default: return "f32";
  }
}

DType NpyFloatDType(const NpyArray& array, const std::string& option) {
  if (array.descr == "<f4") return DType::kF32;
  if (array.descr == "<f2") return DType::kF16;
  if (array.descr == "<f8") return DType::kF64;
  throw CliError(fmt::format("{} holds {} values; a float array (<f4, <f2, <f8) is required",
                             option, array.descr));
}

std::vector<uint8_t> ConvertNpyToDType(const NpyArray& array, DType dtype,
                                       const std::string& option) {
  const DType source = NpyFloatDType(array, option);
  const int64_t n = array.elems();
  std::vector<uint8_t> out(static_cast<size_t>(n * ElementBytes(dtype)));
  for (int64_t i = 0; i < n; ++i) {
    if (source == DType::kF64) {
      // Round float64 straight to the target (float32 first would round twice for 16-bit).
      const double v = reinterpret_cast<const double*>(array.bytes.data())[i];
      float f = static_cast<float>(v);
      if (dtype != DType::kF32 && std::isfinite(v) && static_cast<double>(f) != v) {
        // Round to odd: truncate toward zero, then set the lowest bit. A float32 rounded so
        // keeps enough information for one correct rounding to 16 bits.
        if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
        f = F32FromBits(F32Bits(f) | 1u);
      }
      StoreFromF32(out.data(), i, dtype, f);
    } else {
      StoreFromF32(out.data(), i, dtype, LoadAsF32(array.bytes.data(), i, source));
    }
  }
  return out;
}

std::vector<uint8_t> ConvertNpyToIndex(const NpyArray& array, DType dtype,
                                       const std::string& option) {
  const int64_t n = array.elems();
  std::vector<uint8_t> out(static_cast<size_t>(n * ElementBytes(dtype)));
  for (int64_t i = 0; i < n; ++i) {
    int64_t v;
    if (array.descr == "<i8") {
      std::memcpy(&v, array.bytes.data() + 8 * i, 8);
    } else if (array.descr == "<i4") {
      int32_t v32;
      std::memcpy(&v32, array.bytes.data() + 4 * i, 4);
      v = v32;
    } else {
      throw CliError(fmt::format("{} holds {} values; an integer array (<i8, <i4) is required",
                                 option, array.descr));
    }
    if (dtype == DType::kI32) {
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
        throw CliError(fmt::format("{}[{}] is {}, outside int32", option, i, v));
      }
      const auto v32 = static_cast<int32_t>(v);
      std::memcpy(out.data() + 4 * i, &v32, 4);
    } else {
      std::memcpy(out.data() + 8 * i, &v, 8);
    }
  }
  return out;
}

NpyArray NpyFromBuffer(const void* data, int64_t elems, DType dtype,
                       const std::vector<int64_t>& shape) {
  NpyArray array;
  array.shape = shape;
  if (dtype == DType::kF16) {
    array.descr = "<f2";
    array.bytes.assign(static_cast<const uint8_t*>(data),
                       static_cast<const uint8_t*>(data) + elems * 2);
    return array;
  }
  array.descr = "<f4";
  array.bytes.resize(static_cast<size_t>(elems * 4));
  for (int64_t i = 0; i < elems; ++i) {
    StoreFromF32(array.bytes.data(), i, DType::kF32, LoadAsF32(data, i, dtype));
  }
  return array;
}

TensorHandle MakeTensor(const std::vector<int64_t>& shape, DType dtype, void* data) {
  gkTensor* t = gkCreateTensor(shape.data(), shape.size(), static_cast<gkDataType>(dtype),
                               nullptr, 0, data);
  if (t == nullptr) throw CliError(gkGetRecentErrMsg());
  return TensorHandle(t);
}

}  // namespace gk::cli
