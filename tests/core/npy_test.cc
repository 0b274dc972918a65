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

std::vector<uint8_t> FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), {});
}

// The CLI writes its output straight from the result buffer; the file must be the one the
// in-memory conversion (NpyFromBuffer) describes, for every dtype, including a bfloat16 buffer
// longer than the writer's conversion chunk.
TEST(Npy, WriteFromBufferMatchesTheInMemoryArray) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const int64_t elems = 40000;
    std::vector<uint8_t> buffer(static_cast<size_t>(elems * ElementBytes(dtype)));
    for (int64_t i = 0; i < elems; ++i) StoreFromF32(buffer.data(), i, dtype, 0.37f * (i - 20000));
    const std::string direct = TempPath("direct.npy"), via = TempPath("via.npy");
    WriteNpyFromBuffer(direct, buffer.data(), elems, dtype, {200, 200});
    WriteNpyAtomic(via, NpyFromBuffer(buffer.data(), elems, dtype, {200, 200}));
    EXPECT_EQ(FileBytes(direct), FileBytes(via)) << DTypeName(dtype);
    const NpyArray back = ReadNpy(direct);
    EXPECT_EQ(back.descr, dtype == DType::kF16 ? "<f2" : "<f4");
    EXPECT_EQ(back.shape, (std::vector<int64_t>{200, 200}));
    std::remove(direct.c_str());
    std::remove(via.c_str());
  }
}

TEST(Npy, TakeUsesTheArraysBufferWhenNoConversionIsNeeded) {
  NpyArray a{"<f4", {3}, std::vector<uint8_t>(12, 0)};
  const uint8_t* data = a.bytes.data();
  const auto taken = TakeAsDType(a, DType::kF32, "--x");
  EXPECT_EQ(taken.data(), data);
  NpyArray b{"<f4", {3}, std::vector<uint8_t>(12, 0)};
  const auto converted = TakeAsDType(b, DType::kF16, "--x");
  EXPECT_EQ(converted.size(), 6u);
  EXPECT_TRUE(b.bytes.empty());  // released once converted
  NpyArray i{"<i4", {2}, std::vector<uint8_t>(8, 0)};
  const uint8_t* index = i.bytes.data();
  EXPECT_EQ(TakeAsIndex(i, DType::kI32, "--idx").data(), index);
  NpyArray j{"<i4", {2}, std::vector<uint8_t>(8, 0)};
  EXPECT_EQ(TakeAsIndex(j, DType::kI64, "--idx").size(), 16u);
}

TEST(Npy, ReadRefusesADirectoryAndWriterLeavesNoTemporaryOnError) {
  try {
    ReadNpy(::testing::TempDir());
    FAIL() << "no error for a directory";
  } catch (const CliError& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
  const std::string path = TempPath("abandoned.npy");
  {
    NpyFileWriter writer(path, "<f4", {1});
    writer.Append("\0\0\0\0", 4);
  }  // destroyed without Commit()
  EXPECT_FALSE(std::ifstream(path).good());
  EXPECT_FALSE(std::ifstream(path + ".tmp." + std::to_string(getpid())).good());
}

TEST(Npy, ApiMessagesSpeakTheOptionsNames) {
  const OptionName names[] = {{"gradY", "--grad-y"}, {"weight", "--weight"}, {"topK", "--topk"}};
  EXPECT_EQ(TranslateApiMessage("gkFooGetWorkspaceSize: gradY has 3 rows, topK 2 (weight.shape[2])",
                                names),
            "--grad-y has 3 rows, --topk 2 (weight.shape[2])");
  EXPECT_EQ(TranslateApiMessage("gradYs and xgradY stay", names), "gradYs and xgradY stay");
  EXPECT_EQ(TranslateApiMessage("gkFoo: unchanged without names", {}), "gkFoo: unchanged without names");
}

}  // namespace
}  // namespace gk::cli
