// Reading and writing NumPy .npy files (format 1.0-3.0, little-endian, C order).
#pragma once

#include <cstdint>
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
// unsupported dtype or Fortran order).
NpyArray ReadNpy(const std::string& path);
NpyArray ParseNpy(const uint8_t* data, size_t size, const std::string& name);

// Writes to a temporary file beside `path`, then renames it over `path`: an existing file is
// replaced whole or left untouched.
void WriteNpyAtomic(const std::string& path, const NpyArray& array);

}  // namespace gk::cli
