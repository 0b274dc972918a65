#include "core/tensor.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gradkit/gradkit.h"

namespace gk {
namespace {

struct Owned {
  gkTensor* t;
  ~Owned() { gkDestroyTensor(t); }
};

TEST(Tensor, CreateContiguousAndStrided) {
  std::vector<float> data(24);
  const int64_t dims[3] = {2, 3, 4};
  Owned a{gkCreateTensor(dims, 3, GK_FLOAT, nullptr, 0, data.data())};
  ASSERT_NE(a.t, nullptr);
  EXPECT_TRUE(IsContiguous(*a.t));
  EXPECT_EQ(*NumElements(*a.t), 24);
  EXPECT_EQ(ShapeString(*a.t), "[2, 3, 4]");
  const int64_t transposed[3] = {12, 1, 3};
  Owned b{gkCreateTensor(dims, 3, GK_FLOAT, transposed, 0, data.data())};
  EXPECT_FALSE(IsContiguous(*b.t));
  EXPECT_FALSE(MayOverlapItself(*b.t));
}

TEST(Tensor, CreateRejectsBadArguments) {
  const int64_t dims[2] = {2, -1};
  EXPECT_EQ(gkCreateTensor(dims, 2, GK_FLOAT, nullptr, 0, nullptr), nullptr);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("dims[1] is -1"), std::string::npos);
  EXPECT_EQ(gkCreateTensor(dims, 17, GK_FLOAT, nullptr, 0, nullptr), nullptr);
  EXPECT_EQ(gkCreateTensor(dims, 1, static_cast<gkDataType>(5), nullptr, 0, nullptr), nullptr);
  EXPECT_EQ(gkCreateTensor(nullptr, 1, GK_FLOAT, nullptr, 0, nullptr), nullptr);
  EXPECT_EQ(gkCreateTensor(dims, 1, GK_FLOAT, nullptr, -3, nullptr), nullptr);
  const int64_t huge[3] = {int64_t{1} << 40, int64_t{1} << 40, 2};
  EXPECT_EQ(gkCreateTensor(huge, 3, GK_FLOAT, nullptr, 0, nullptr), nullptr);
}

// The API's one alignment rule (gradkit/base.h): data aligned to the element size.
TEST(Tensor, CreateRequiresElementAlignedData) {
  alignas(64) static uint8_t bytes[256];
  const int64_t dims[1] = {8};
  const struct {
    gkDataType dtype;
    int64_t element_bytes;
  } types[] = {{GK_FLOAT, 4}, {GK_FLOAT16, 2}, {GK_BF16, 2}, {GK_INT32, 4}, {GK_INT64, 8},
               {GK_DOUBLE, 8}};
  for (const auto& [dtype, element_bytes] : types) {
    for (int64_t shift = 0; shift < 16; ++shift) {
      Owned t{gkCreateTensor(dims, 1, dtype, nullptr, 0, bytes + shift)};
      const bool aligned = shift % element_bytes == 0;
      EXPECT_EQ(t.t != nullptr, aligned) << dtype << " at +" << shift;
      if (!aligned) {
        const std::string message = gkGetRecentErrMsg();
        EXPECT_NE(message.find("not aligned to " + std::to_string(element_bytes) + " bytes"),
                  std::string::npos) << message;
      }
    }
  }
}

TEST(Tensor, DetectsSelfOverlap) {
  float data[16];
  const int64_t dims[2] = {4, 4};
  const int64_t zero_stride[2] = {0, 1};
  Owned broadcast{gkCreateTensor(dims, 2, GK_FLOAT, zero_stride, 0, data)};
  EXPECT_TRUE(MayOverlapItself(*broadcast.t));
  const int64_t overlapping[2] = {2, 1};  // rows of 4 every 2 elements
  Owned rows{gkCreateTensor(dims, 2, GK_FLOAT, overlapping, 0, data)};
  EXPECT_TRUE(MayOverlapItself(*rows.t));
  const int64_t negative[2] = {-4, 1};
  Owned flipped{gkCreateTensor(dims, 2, GK_FLOAT, negative, 12, data)};
  EXPECT_FALSE(MayOverlapItself(*flipped.t));
  const auto range = TouchedBytes(*flipped.t);
  ASSERT_TRUE(range.has_value());
  EXPECT_EQ(range->first, reinterpret_cast<uintptr_t>(data));
  EXPECT_EQ(range->last, reinterpret_cast<uintptr_t>(data + 16));
}

TEST(Tensor, CursorWalksInLogicalOrder) {
  float data[24];
  const int64_t dims[3] = {2, 3, 4};
  const int64_t strides[3] = {1, 2, 6};  // a permuted layout
  Owned t{gkCreateTensor(dims, 3, GK_FLOAT, strides, 0, data)};
  for (int64_t start : {0, 5, 23}) {
    StridedCursor cursor(*t.t, start);
    for (int64_t i = start; i < 24; ++i, cursor.Next()) {
      const int64_t expected = (i / 12) * 1 + ((i / 4) % 3) * 2 + (i % 4) * 6;
      ASSERT_EQ(cursor.offset(), expected) << "index " << i;
      ASSERT_EQ(ElementAt(*t.t, i), static_cast<const void*>(data + expected));
    }
  }
}

// A destroyed descriptor is refused by a second destroy and by an operator, without being read
// (the set of live descriptors answers; ASan would report a read of the freed object).
TEST(Tensor, DestroyedDescriptorIsAnError) {
  float data[4] = {};
  const int64_t dims[] = {4};
  gkTensor* t = gkCreateTensor(dims, 1, GK_FLOAT, nullptr, 0, data);
  gkTensor* live = gkCreateTensor(dims, 1, GK_FLOAT, nullptr, 0, data);
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(gkDestroyTensor(t), GK_SUCCESS);
  EXPECT_EQ(gkDestroyTensor(t), GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("destroyed already"), std::string::npos)
      << gkGetRecentErrMsg();
  uint64_t size = 0;
  gkOpExecutor* executor = nullptr;
  EXPECT_EQ(gkEluGradV2GetWorkspaceSize(t, live, 1.0, 1.0, 1.0, false, live, &size, &executor),
            GK_ERROR_PARAM_INVALID);
  EXPECT_NE(std::string(gkGetRecentErrMsg()).find("gradOutput is not a live descriptor"),
            std::string::npos)
      << gkGetRecentErrMsg();
  EXPECT_EQ(executor, nullptr);
  EXPECT_EQ(gkDestroyTensor(live), GK_SUCCESS);
}

TEST(Tensor, DestroyRejectsForeignPointers) {
  EXPECT_EQ(gkDestroyTensor(nullptr), GK_SUCCESS);
  alignas(gkTensor) char fake[sizeof(gkTensor)] = {};
  EXPECT_EQ(gkDestroyTensor(reinterpret_cast<gkTensor*>(fake)), GK_ERROR_PARAM_INVALID);
}

}  // namespace
}  // namespace gk
