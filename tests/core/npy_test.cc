#include "tools/gradkit/npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "tools/gradkit/cli_util.h"

namespace gk::cli {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/gradkit_npy_" + std::to_string(getpid()) + "_" + name;
}

std::vector<uint8_t> Header(const std::string& dict) {
  std::string header = dict;
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                              static_cast<uint8_t>(header.size()), 0};
  out.insert(out.end(), header.begin(), header.end());
  return out;
}

TEST(Npy, WriteThenReadRoundTrips) {
  NpyArray a;
  a.descr = "<f4";
  a.shape = {2, 3};
  for (float v : {1.f, 2.f, 3.f, 4.f, 5.f, 6.f}) {
    const auto* b = reinterpret_cast<const uint8_t*>(&v);
    a.bytes.insert(a.bytes.end(), b, b + 4);
  }
  const std::string path = TempPath("roundtrip.npy");
  WriteNpyAtomic(path, a);
  const NpyArray b = ReadNpy(path);
  EXPECT_EQ(b.descr, "<f4");
  EXPECT_EQ(b.shape, a.shape);
  EXPECT_EQ(b.bytes, a.bytes);
  std::remove(path.c_str());
}

TEST(Npy, ScalarAndOneDimShapes) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{}, std::vector<int64_t>{5}}) {
    NpyArray a{"<i8", shape, std::vector<uint8_t>(8 * (shape.empty() ? 1 : 5), 1)};
    const std::string path = TempPath("shape.npy");
    WriteNpyAtomic(path, a);
    EXPECT_EQ(ReadNpy(path).shape, shape);
    std::remove(path.c_str());
  }
}

TEST(Npy, RejectsMalformedInput) {
  const auto expect_error = [](std::vector<uint8_t> bytes, const std::string& needle) {
    try {
      ParseNpy(bytes.data(), bytes.size(), "f.npy");
      FAIL() << "no error for " << needle;
    } catch (const CliError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({'n', 'o', 't', 'n', 'p', 'y', 0, 0, 0, 0, 0}, "bad magic");
  auto truncated = Header("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }");
  truncated.resize(truncated.size() + 8);
  expect_error(truncated, "truncated");
  expect_error(Header("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }"), "not supported");
  expect_error(Header("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }"), "Fortran");
  expect_error(Header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }"), "bad dimension");
  expect_error(Header("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }"),
               "too large");
  expect_error(Header("{'fortran_order': False, 'shape': (1,), }"), "no descr");
  auto short_header = Header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }");
  short_header.resize(20);
  expect_error(short_header, "header is truncated");
}

TEST(Npy, MissingFileAndUnwritablePath) {
  EXPECT_THROW(ReadNpy("/nonexistent/dir/x.npy"), CliError);
  NpyArray a{"<f4", {1}, std::vector<uint8_t>(4)};
  EXPECT_THROW(WriteNpyAtomic("/nonexistent/dir/x.npy", a), CliError);
}

TEST(Npy, ConversionRoundsToNearestEvenOnce) {
  // float64 1 + 2^-11 + 2^-40 is just above the float16 halfway point: it must round up, which
  // a double rounding through float32 (to 1 + 2^-11, then ties-to-even down) would get wrong.
  const double v = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  NpyArray a{"<f8", {1}, std::vector<uint8_t>(8)};
  std::memcpy(a.bytes.data(), &v, 8);
  const auto half = ConvertNpyToDType(a, DType::kF16, "--x");
  uint16_t bits;
  std::memcpy(&bits, half.data(), 2);
  EXPECT_EQ(bits, 0x3c01);
}

}  // namespace
}  // namespace gk::cli
