// Reading and writing NumPy .npy files (format 1.0-3.0, little-endian, C order).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace gk::cli {

struct NpyArray {
  std::string descr;           // "<f4", "<f2", "<f8", "<i4", "<i8"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // C order
  int64_t elems() const;
};

// Throws CliError naming the file and what is wrong (missing, malformed, truncated, too large,
// unsupported dtype or Fortran order). ReadNpy reads the header first and the payload straight
// into `bytes`: the data is in memory once.
NpyArray ReadNpy(const std::string& path);
NpyArray ParseNpy(const uint8_t* data, size_t size, const std::string& name);

// An .npy file written piece by piece into a temporary file beside `path`, renamed over `path`
// by Commit(): an existing file is replaced whole or left untouched. Without Commit() (an error
// on the way) the temporary file is removed. Throws CliError naming `path`.
class NpyFileWriter {
 public:
  NpyFileWriter(const std::string& path, const std::string& descr,
                const std::vector<int64_t>& shape);
  ~NpyFileWriter();
  NpyFileWriter(const NpyFileWriter&) = delete;
  NpyFileWriter& operator=(const NpyFileWriter&) = delete;

  void Append(const void* data, size_t bytes);
  void Commit();

 private:
  [[noreturn]] void Fail(int error);
  std::string path_, temp_;
  FILE* file_ = nullptr;
};

void WriteNpyAtomic(const std::string& path, const NpyArray& array);

}  // namespace gk::cli
