// The tensor descriptor behind gkTensor and the checks every operator shares.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "gradkit/base.h"

// Live descriptors (from gkCreateTensor, not yet destroyed) are in gk::LiveHandles<gkTensor>;
// operators copy them by value into their executors.
struct gkTensor {
  gk::DType dtype = gk::DType::kF32;
  int32_t ndims = 0;
  std::array<int64_t, GK_MAX_DESCRIPTOR_DIMS> dims{};
  std::array<int64_t, GK_MAX_DESCRIPTOR_DIMS> strides{};  // in elements
  int64_t offset = 0;                                       // in elements
  void* data = nullptr;
};

namespace gk {

// "[2, 3, 4]"
std::string ShapeString(const gkTensor& t);
std::string StridesString(const gkTensor& t);

// Number of elements; nullopt when the product overflows int64.
std::optional<int64_t> NumElements(const gkTensor& t);
bool IsContiguous(const gkTensor& t);  // C order, offset 0 not required
bool SameShape(const gkTensor& a, const gkTensor& b);

// The byte range [first, last) that the view can touch; nullopt for an empty view or when the
// range overflows. Used to detect overlap between outputs and inputs.
struct ByteRange {
  uintptr_t first;
  uintptr_t last;
};
std::optional<ByteRange> TouchedBytes(const gkTensor& t);

// True when distinct indices of the view may address the same element (e.g. a zero stride).
bool MayOverlapItself(const gkTensor& t);

// Pointer to the element at logical (C-order) linear index `index` of the view.
const void* ElementAt(const gkTensor& t, int64_t index);

// The address of t's element at its offset (data + offset elements), where its first logical
// element lives. A tensor without elements, whose offset no check bounds (any value is valid
// there), gives its data pointer: nothing is ever read through it, and the product
// offset * element size, which may overflow, is not formed. (Inline: executors call it per row.
// A tensor with elements passed CheckAddressable, so its product fits.)
inline char* TensorBase(const gkTensor& t) {
  for (int d = 0; d < t.ndims; ++d) {
    if (t.dims[d] == 0) return static_cast<char*>(t.data);
  }
  return static_cast<char*>(t.data) + t.offset * ElementBytes(t.dtype);
}

// Walks a view in logical C order from a starting linear index, yielding element offsets.
class StridedCursor {
 public:
  StridedCursor(const gkTensor& t, int64_t start_index);
  int64_t offset() const { return offset_; }  // in elements, relative to data
  void Next();

 private:
  const gkTensor& t_;
  std::array<int64_t, GK_MAX_DESCRIPTOR_DIMS> index_{};
  int64_t offset_ = 0;
};

}  // namespace gk
