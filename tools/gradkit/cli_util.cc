#include "tools/gradkit/cli_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <cstring>
#include <limits>

namespace gk::cli {

namespace {
bool IsWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
}  // namespace

std::string TranslateApiMessage(std::string message, std::span<const OptionName> names) {
  if (names.empty()) return message;
  // "gkFooGetWorkspaceSize: ..." names a function the user of the CLI never called.
  if (message.rfind("gk", 0) == 0) {
    const size_t colon = message.find(": ");
    if (colon != std::string::npos && message.find(' ') > colon) message.erase(0, colon + 2);
  }
  std::string out;
  size_t i = 0;
  while (i < message.size()) {
    if (!IsWordChar(message[i])) {
      out.push_back(message[i++]);
      continue;
    }
    size_t end = i;
    while (end < message.size() && IsWordChar(message[end])) ++end;
    const std::string_view word(message.data() + i, end - i);
    const OptionName* match = nullptr;
    for (const OptionName& n : names) {
      if (word == n.api) match = &n;
    }
    // "weight.shape[2]" stays: only a name that is not followed by '.' is an argument.
    if (match != nullptr && !(end < message.size() && message[end] == '.')) {
      out += match->option;
    } else {
      out.append(word);
    }
    i = end;
  }
  return out;
}

void ThrowIfFailed(gkStatus status, std::span<const OptionName> names) {
  if (status != GK_SUCCESS) throw CliError(TranslateApiMessage(gkGetRecentErrMsg(), names));
}

void CheckThreadsOption(int64_t threads, const std::string& option) {
  if (threads < 0 || threads > kMaxThreads) {
    throw CliError(fmt::format("{} is {}, it must be in [0, {}] (0: GRADKIT_NUM_THREADS or all "
                               "cores)",
                               option, threads, kMaxThreads));
  }
}

void CheckPositiveOption(int64_t value, const std::string& option) {
  if (value < 1) throw CliError(fmt::format("{} is {}, it must be >= 1", option, value));
}

void CheckOutputPath(const std::string& path, const std::string& option) {
  namespace fs = std::filesystem;
  if (path.empty()) throw CliError(fmt::format("{} is empty; give a file name", option));
  std::error_code error;
  if (path.back() == '/' || fs::is_directory(path, error)) {
    throw CliError(fmt::format("{} is '{}', a directory: cannot write a file there; name the "
                               "file, e.g. {}{}out.npy",
                               option, path, path, path.back() == '/' ? "" : "/"));
  }
  const fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) return;
  const fs::file_status status = fs::status(parent, error);
  if (!fs::exists(status)) {
    throw CliError(fmt::format("{} is '{}': cannot write: directory {} does not exist", option,
                               path, parent.string()));
  }
  if (!fs::is_directory(status)) {
    throw CliError(fmt::format("{} is '{}': cannot write: {} is not a directory", option, path,
                               parent.string()));
  }
}

void Note(const std::string& text) { std::fprintf(stderr, "gradkit: note: %s\n", text.c_str()); }
void Warn(const std::string& text) {
  std::fprintf(stderr, "gradkit: warning: %s\n", text.c_str());
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

namespace {
DType NpyDType(const std::string& descr) {
  if (descr == "<f4") return DType::kF32;
  if (descr == "<f2") return DType::kF16;
  if (descr == "<f8") return DType::kF64;
  if (descr == "<i4") return DType::kI32;
  return DType::kI64;
}
void Release(NpyArray& array) { std::vector<uint8_t>().swap(array.bytes); }
}  // namespace

std::vector<uint8_t> TakeAsDType(NpyArray& array, DType dtype, const std::string& option) {
  if (NpyFloatDType(array, option) == dtype) return std::move(array.bytes);
  std::vector<uint8_t> out = ConvertNpyToDType(array, dtype, option);
  Release(array);
  return out;
}

std::vector<uint8_t> TakeAsIndex(NpyArray& array, DType dtype, const std::string& option) {
  if ((array.descr == "<i4" || array.descr == "<i8") && NpyDType(array.descr) == dtype) {
    return std::move(array.bytes);
  }
  std::vector<uint8_t> out = ConvertNpyToIndex(array, dtype, option);
  Release(array);
  return out;
}

std::string NpyDescrFor(DType dtype) { return dtype == DType::kF16 ? "<f2" : "<f4"; }

void WriteNpyFromBuffer(const std::string& path, const void* data, int64_t elems, DType dtype,
                        const std::vector<int64_t>& shape) {
  NpyFileWriter writer(path, NpyDescrFor(dtype), shape);
  if (dtype == DType::kF32 || dtype == DType::kF16) {
    writer.Append(data, static_cast<size_t>(elems * ElementBytes(dtype)));
  } else {
    constexpr int64_t kChunk = 16384;
    std::vector<float> chunk(kChunk);
    for (int64_t begin = 0; begin < elems; begin += kChunk) {
      const int64_t count = std::min(kChunk, elems - begin);
      for (int64_t i = 0; i < count; ++i) chunk[i] = LoadAsF32(data, begin + i, dtype);
      writer.Append(chunk.data(), static_cast<size_t>(count) * 4);
    }
  }
  writer.Commit();
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

TensorHandle MakeTensor(const std::vector<int64_t>& shape, DType dtype, void* data,
                        const std::vector<int64_t>& strides) {
  gkTensor* t = gkCreateTensor(shape.data(), shape.size(), static_cast<gkDataType>(dtype),
                               strides.empty() ? nullptr : strides.data(), 0, data);
  if (t == nullptr) throw CliError(gkGetRecentErrMsg());
  return TensorHandle(t);
}

}  // namespace gk::cli
