#include "tools/gradkit/npy.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
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

namespace {

// Where the header ends and the payload starts, from the first 12 bytes at most (`size` of them
// are at hand) and the size of the whole file.
size_t HeaderEnd(const uint8_t* data, size_t size, uint64_t file_size, const std::string& name) {
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
  if (header_len > file_size - header_start) {
    throw CliError(fmt::format("{}: .npy header is truncated", name));
  }
  return header_start + header_len;
}

// dtype and shape from the header's dict; checks that the file holds the payload they describe.
// Returns the array without its bytes, and the payload's size.
NpyArray ParseHeader(const std::string& header, uint64_t payload_available,
                     const std::string& name, uint64_t* payload_bytes) {
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
  if (static_cast<uint64_t>(bytes) > payload_available) {
    throw CliError(fmt::format("{}: .npy data is truncated: {} bytes for shape {}, {} expected",
                               name, payload_available, shape_text, bytes));
  }
  *payload_bytes = static_cast<uint64_t>(bytes);
  return array;
}

// Reads exactly `size` bytes at the file's current position.
bool ReadFully(int fd, uint8_t* out, size_t size) {
  while (size > 0) {
    const ssize_t got = ::read(fd, out, std::min<size_t>(size, size_t{1} << 30));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    out += got;
    size -= static_cast<size_t>(got);
  }
  return true;
}

}  // namespace

NpyArray ParseNpy(const uint8_t* data, size_t size, const std::string& name) {
  const size_t header_end = HeaderEnd(data, size, size, name);
  const size_t header_start = data[6] == 1 ? 10 : 12;
  const std::string header(reinterpret_cast<const char*>(data) + header_start,
                           header_end - header_start);
  uint64_t payload_bytes = 0;
  NpyArray array = ParseHeader(header, size - header_end, name, &payload_bytes);
  const uint8_t* start = data + header_end;
  array.bytes.assign(start, start + payload_bytes);
  return array;
}

NpyArray ReadNpy(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CliError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    throw CliError(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
  }
  if (S_ISDIR(info.st_mode)) throw CliError(fmt::format("{}: is a directory, not a .npy file", path));
  if (!S_ISREG(info.st_mode)) throw CliError(fmt::format("{}: not a regular file", path));
  const auto file_size = static_cast<uint64_t>(info.st_size);
  if (file_size > static_cast<uint64_t>(kMaxNpyBytes)) {
    throw CliError(fmt::format("{}: file is too large", path));
  }
  uint8_t preamble[12];
  const size_t preamble_size = static_cast<size_t>(std::min<uint64_t>(file_size, sizeof preamble));
  if (!ReadFully(fd, preamble, preamble_size)) throw CliError(fmt::format("{}: cannot read", path));
  const size_t header_end = HeaderEnd(preamble, preamble_size, file_size, path);
  const size_t header_start = preamble[6] == 1 ? 10 : 12;
  std::string header(header_end - header_start, '\0');
  std::memcpy(header.data(), preamble + header_start,
              std::min(header.size(), preamble_size - header_start));
  if (header.size() > preamble_size - header_start &&
      !ReadFully(fd, reinterpret_cast<uint8_t*>(header.data()) + (preamble_size - header_start),
                 header.size() - (preamble_size - header_start))) {
    throw CliError(fmt::format("{}: cannot read", path));
  }
  uint64_t payload_bytes = 0;
  NpyArray array = ParseHeader(header, file_size - header_end, path, &payload_bytes);
  array.bytes.resize(static_cast<size_t>(payload_bytes));
  if (!ReadFully(fd, array.bytes.data(), array.bytes.size())) {
    throw CliError(fmt::format("{}: cannot read", path));
  }
  return array;
}

NpyFileWriter::NpyFileWriter(const std::string& path, const std::string& descr,
                             const std::vector<int64_t>& shape)
    : path_(path), temp_(fmt::format("{}.tmp.{}", path, getpid())) {
  std::string dims;
  for (int64_t d : shape) dims += fmt::format("{}, ", d);
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  if (shape.size() == 1) dims.resize(dims.size() - 1);
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, dims);
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');

  file_ = std::fopen(temp_.c_str(), "wb");
  if (file_ == nullptr) {
    throw CliError(fmt::format("{}: cannot write: {}", path_, std::strerror(errno)));
  }
  const uint8_t preamble[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                static_cast<uint8_t>(header.size() & 0xff),
                                static_cast<uint8_t>(header.size() >> 8)};
  Append(preamble, sizeof preamble);
  Append(header.data(), header.size());
}

NpyFileWriter::~NpyFileWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(temp_.c_str());
  }
}

void NpyFileWriter::Fail(int error) {
  if (file_ != nullptr) std::fclose(file_);
  file_ = nullptr;
  std::remove(temp_.c_str());
  throw CliError(fmt::format("{}: cannot write: {}", path_, std::strerror(error)));
}

void NpyFileWriter::Append(const void* data, size_t bytes) {
  if (bytes > 0 && std::fwrite(data, 1, bytes, file_) != bytes) Fail(errno);
}

void NpyFileWriter::Commit() {
  FILE* file = file_;
  file_ = nullptr;
  if (std::fclose(file) != 0) {
    const int error = errno;
    std::remove(temp_.c_str());
    throw CliError(fmt::format("{}: cannot write: {}", path_, std::strerror(error)));
  }
  if (std::rename(temp_.c_str(), path_.c_str()) != 0) Fail(errno);
}

void WriteNpyAtomic(const std::string& path, const NpyArray& array) {
  NpyFileWriter writer(path, array.descr, array.shape);
  writer.Append(array.bytes.data(), array.bytes.size());
  writer.Commit();
}

}  // namespace gk::cli
