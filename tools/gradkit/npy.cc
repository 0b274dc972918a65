#include "tools/gradkit/npy.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tools/gradkit/cli_util.h"

namespace gk::cli {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr int64_t kMaxNpyBytes = int64_t{1} << 40;  // refuse absurd sizes before allocating

int64_t DescrBytes(const std::string& descr) {
  if (descr == "<f4" || descr == "<i4") return 4;
  if (descr == "<f2") return 2;
  if (descr == "<f8" || descr == "<i8") return 8;
  return 0;
}

// The value of `key` in the header's Python dict literal, as raw text.
std::string HeaderValue(const std::string& header, const std::string& key,
                        const std::string& name) {
  const std::string quoted = "'" + key + "'";
  const size_t at = header.find(quoted);
  if (at == std::string::npos) throw CliError(fmt::format("{}: .npy header has no {}", name, key));
  size_t colon = header.find(':', at + quoted.size());
  if (colon == std::string::npos) {
    throw CliError(fmt::format("{}: .npy header is malformed near {}", name, key));
  }
  size_t begin = colon + 1;
  while (begin < header.size() && header[begin] == ' ') ++begin;
  if (begin >= header.size()) throw CliError(fmt::format("{}: .npy header ends after {}", name, key));
  size_t end;
  if (header[begin] == '(') {
    end = header.find(')', begin);
    if (end == std::string::npos) throw CliError(fmt::format("{}: .npy shape is not closed", name));
    ++end;
  } else if (header[begin] == '\'' || header[begin] == '"') {
    end = header.find(header[begin], begin + 1);
    if (end == std::string::npos) throw CliError(fmt::format("{}: .npy {} is not closed", name, key));
    ++end;
  } else {
    end = header.find_first_of(",}", begin);
    if (end == std::string::npos) end = header.size();
  }
  return header.substr(begin, end - begin);
}

std::vector<int64_t> ParseShape(const std::string& text, const std::string& name) {
  std::vector<int64_t> shape;
  std::string inner = text.substr(1, text.size() - 2);
  std::stringstream items(inner);
  std::string item;
  while (std::getline(items, item, ',')) {
    const size_t first = item.find_first_not_of(' ');
    if (first == std::string::npos) continue;
    const std::string digits = item.substr(first, item.find_last_not_of(' ') - first + 1);
    if (digits.empty() || digits.size() > 18 ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      throw CliError(fmt::format("{}: .npy shape {} has a bad dimension '{}'", name, text, digits));
    }
    shape.push_back(std::stoll(digits));
    if (shape.size() > 32) throw CliError(fmt::format("{}: .npy shape has too many dims", name));
  }
  return shape;
}

}  // namespace

int64_t NpyArray::elems() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

NpyArray ParseNpy(const uint8_t* data, size_t size, const std::string& name) {
  if (size < 10 || std::memcmp(data, kMagic, 6) != 0) {
    throw CliError(fmt::format("{}: not a .npy file (bad magic)", name));
  }
  const int major = data[6];
  size_t header_len, header_start;
  if (major == 1) {
    header_len = data[8] | (data[9] << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) throw CliError(fmt::format("{}: .npy header is truncated", name));
    header_len = static_cast<size_t>(data[8]) | (static_cast<size_t>(data[9]) << 8) |
                 (static_cast<size_t>(data[10]) << 16) | (static_cast<size_t>(data[11]) << 24);
    header_start = 12;
  } else {
    throw CliError(fmt::format("{}: .npy format version {} is not supported", name, major));
  }
  if (header_len > size - header_start) {
    throw CliError(fmt::format("{}: .npy header is truncated", name));
  }
  const std::string header(reinterpret_cast<const char*>(data) + header_start, header_len);
  NpyArray array;
  std::string descr = HeaderValue(header, "descr", name);
  array.descr = descr.size() >= 2 ? descr.substr(1, descr.size() - 2) : descr;
  if (array.descr == "|f2" || array.descr == "=f2") array.descr = "<f2";
  const int64_t item = DescrBytes(array.descr);
  if (item == 0) {
    throw CliError(fmt::format(
        "{}: .npy dtype '{}' is not supported (use <f4, <f2, <f8, <i4 or <i8)", name, array.descr));
  }
  const std::string fortran = HeaderValue(header, "fortran_order", name);
  if (fortran != "False") {
    throw CliError(fmt::format("{}: .npy is in Fortran order; save it in C order", name));
  }
  const std::string shape_text = HeaderValue(header, "shape", name);
  if (shape_text.size() < 2 || shape_text.front() != '(') {
    throw CliError(fmt::format("{}: .npy shape '{}' is malformed", name, shape_text));
  }
  array.shape = ParseShape(shape_text, name);
  int64_t bytes = item;
  for (int64_t d : array.shape) {
    if (__builtin_mul_overflow(bytes, d, &bytes) || bytes > kMaxNpyBytes) {
      throw CliError(fmt::format("{}: .npy shape {} is too large", name, shape_text));
    }
  }
  const size_t payload = size - header_start - header_len;
  if (static_cast<uint64_t>(bytes) > payload) {
    throw CliError(fmt::format("{}: .npy data is truncated: {} bytes for shape {}, {} expected",
                               name, payload, shape_text, bytes));
  }
  const uint8_t* start = data + header_start + header_len;
  array.bytes.assign(start, start + bytes);
  return array;
}

NpyArray ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CliError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) throw CliError(fmt::format("{}: cannot read", path));
  if (size > kMaxNpyBytes) throw CliError(fmt::format("{}: file is too large", path));
  in.seekg(0, std::ios::beg);
  std::vector<uint8_t> data(static_cast<size_t>(size));
  if (size > 0 && !in.read(reinterpret_cast<char*>(data.data()), size)) {
    throw CliError(fmt::format("{}: cannot read", path));
  }
  return ParseNpy(data.data(), data.size(), path);
}

void WriteNpyAtomic(const std::string& path, const NpyArray& array) {
  std::string shape;
  for (int64_t d : array.shape) shape += fmt::format("{}, ", d);
  if (array.shape.size() > 1) shape.resize(shape.size() - 2);
  if (array.shape.size() == 1) shape.resize(shape.size() - 1);
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}",
                                   array.descr, shape);
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');

  const std::string temp = fmt::format("{}.tmp.{}", path, getpid());
  FILE* f = std::fopen(temp.c_str(), "wb");
  if (f == nullptr) {
    throw CliError(fmt::format("{}: cannot write: {}", path, std::strerror(errno)));
  }
  const uint8_t preamble[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                static_cast<uint8_t>(header.size() & 0xff),
                                static_cast<uint8_t>(header.size() >> 8)};
  bool ok = std::fwrite(preamble, 1, sizeof preamble, f) == sizeof preamble &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            std::fwrite(array.bytes.data(), 1, array.bytes.size(), f) == array.bytes.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temp.c_str());
    throw CliError(fmt::format("{}: cannot write: {}", path, reason));
  }
}

}  // namespace gk::cli
