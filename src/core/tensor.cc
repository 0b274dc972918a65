#include "core/tensor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/c_api_guard.h"
#include "core/error.h"
#include "core/live_handles.h"

namespace gk {

std::string ShapeString(const gkTensor& t) {
  return fmt::format("[{}]", fmt::join(t.dims.begin(), t.dims.begin() + t.ndims, ", "));
}
std::string StridesString(const gkTensor& t) {
  return fmt::format("[{}]", fmt::join(t.strides.begin(), t.strides.begin() + t.ndims, ", "));
}

std::optional<int64_t> NumElements(const gkTensor& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndims; ++d) {
    if (__builtin_mul_overflow(n, t.dims[d], &n)) return std::nullopt;
  }
  return n;
}

bool IsContiguous(const gkTensor& t) {
  int64_t expected = 1;
  for (int d = t.ndims - 1; d >= 0; --d) {
    if (t.dims[d] != 1 && t.strides[d] != expected) return false;
    // Past int64 only in an empty view with huge dims ([0, 5, 2^62]): call it strided.
    if (__builtin_mul_overflow(expected, t.dims[d], &expected)) return false;
  }
  return true;
}

bool SameShape(const gkTensor& a, const gkTensor& b) {
  return a.ndims == b.ndims && std::equal(a.dims.begin(), a.dims.begin() + a.ndims, b.dims.begin());
}

std::optional<ByteRange> TouchedBytes(const gkTensor& t) {
  const auto n = NumElements(t);
  if (!n || *n == 0) return std::nullopt;
  int64_t low = t.offset, high = t.offset;
  for (int d = 0; d < t.ndims; ++d) {
    int64_t span;
    if (__builtin_mul_overflow(t.dims[d] - 1, t.strides[d], &span)) return std::nullopt;
    if (span < 0) {
      if (__builtin_add_overflow(low, span, &low)) return std::nullopt;
    } else if (__builtin_add_overflow(high, span, &high)) {
      return std::nullopt;
    }
  }
  const int64_t bytes = ElementBytes(t.dtype);
  int64_t low_bytes, high_bytes, end;
  if (__builtin_add_overflow(high, 1, &end) || __builtin_mul_overflow(low, bytes, &low_bytes) ||
      __builtin_mul_overflow(end, bytes, &high_bytes)) {
    return std::nullopt;
  }
  const auto base = reinterpret_cast<uintptr_t>(t.data);
  // |low_bytes| as unsigned: negating INT64_MIN in int64 would overflow.
  const uintptr_t below = uintptr_t{0} - static_cast<uintptr_t>(low_bytes);
  uintptr_t first, last;
  if (low_bytes < 0 ? base < below
                    : __builtin_add_overflow(base, static_cast<uintptr_t>(low_bytes), &first)) {
    return std::nullopt;  // the view starts below address 0
  }
  first = base + static_cast<uintptr_t>(low_bytes);
  if (__builtin_add_overflow(base, static_cast<uintptr_t>(high_bytes), &last)) return std::nullopt;
  return ByteRange{first, last};
}

bool MayOverlapItself(const gkTensor& t) {
  // Sort the non-trivial dims by |stride|; the view is free of self-overlap when each stride is
  // at least the extent spanned by all smaller ones (a sufficient test, exact for permutations).
  std::array<int, GK_MAX_DESCRIPTOR_DIMS> order{};
  int count = 0;
  for (int d = 0; d < t.ndims; ++d) {
    if (t.dims[d] == 0) return false;
    if (t.dims[d] > 1) order[count++] = d;
  }
  std::sort(order.begin(), order.begin() + count, [&](int a, int b) {
    return std::llabs(t.strides[a]) < std::llabs(t.strides[b]);
  });
  int64_t extent = 1;  // elements spanned by the dims seen so far
  for (int i = 0; i < count; ++i) {
    const int64_t stride = std::llabs(t.strides[order[i]]);
    if (stride < extent) return true;
    int64_t span;
    if (__builtin_mul_overflow(stride, t.dims[order[i]] - 1, &span) ||
        __builtin_add_overflow(span, extent, &extent)) {
      return false;  // spans beyond int64 never wrap onto each other within a real allocation
    }
  }
  return false;
}

const void* ElementAt(const gkTensor& t, int64_t index) {
  int64_t offset = t.offset;
  for (int d = t.ndims - 1; d >= 0; --d) {
    offset += (index % t.dims[d]) * t.strides[d];
    index /= t.dims[d];
  }
  return static_cast<const char*>(t.data) + offset * ElementBytes(t.dtype);
}

StridedCursor::StridedCursor(const gkTensor& t, int64_t start_index) : t_(t), offset_(t.offset) {
  for (int d = t.ndims - 1; d >= 0; --d) {
    index_[d] = start_index % t.dims[d];
    start_index /= t.dims[d];
    offset_ += index_[d] * t.strides[d];
  }
}

void StridedCursor::Next() {
  // Only offsets of elements of the view are formed (phase 1 checked that those fit in int64);
  // stepping past the end of a dim first could overflow, e.g. a size-1 dim with stride 2^63.
  for (int d = t_.ndims - 1; d >= 0; --d) {
    if (++index_[d] < t_.dims[d]) {
      offset_ += t_.strides[d];
      return;
    }
    offset_ -= (index_[d] - 1) * t_.strides[d];
    index_[d] = 0;
  }
}

}  // namespace gk

namespace {

constexpr std::string_view kCreateTensor = "gkCreateTensor";

// dtype_value: the bits of the caller's gkDataType (see gkCreateTensor).
gkTensor* CreateTensor(const int64_t* dims, uint64_t ndims, int32_t dtype_value,
                       const int64_t* strides, int64_t offset, void* data) {
  constexpr std::string_view kApi = kCreateTensor;
  if (ndims > GK_MAX_DESCRIPTOR_DIMS) {
    gk::Fail(GK_ERROR_PARAM_INVALID, kApi, "ndims is {}, a descriptor holds at most {} dims",
             ndims, GK_MAX_DESCRIPTOR_DIMS);
    return nullptr;
  }
  if (ndims > 0 && dims == nullptr) {
    gk::Fail(GK_ERROR_NULLPTR, kApi, "dims is NULL while ndims is {}", ndims);
    return nullptr;
  }
  if (!gk::IsKnownDType(dtype_value)) {
    gk::Fail(GK_ERROR_PARAM_INVALID, kApi, "dtype {} is not a gkDataType", dtype_value);
    return nullptr;
  }
  if (offset < 0) {
    gk::Fail(GK_ERROR_PARAM_INVALID, kApi, "offset is {}, it must be >= 0", offset);
    return nullptr;
  }
  // Kernels read elements through typed pointers; vectors need no more than this (unaligned loads).
  const int64_t element_bytes = gk::ElementBytes(static_cast<gk::DType>(dtype_value));
  if (reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(element_bytes) != 0) {
    gk::Fail(GK_ERROR_PARAM_INVALID, kApi,
             "data {} is not aligned to {} bytes; a {} tensor's data must be a multiple of its "
             "element size",
             data, element_bytes, gk::DTypeName(static_cast<gk::DType>(dtype_value)));
    return nullptr;
  }
  auto* t = new gkTensor;
  t->dtype = static_cast<gk::DType>(dtype_value);
  t->ndims = static_cast<int32_t>(ndims);
  t->offset = offset;
  t->data = data;
  for (uint64_t d = 0; d < ndims; ++d) {
    if (dims[d] < 0) {
      gk::Fail(GK_ERROR_PARAM_INVALID, kApi, "dims[{}] is {}, sizes must be >= 0", d, dims[d]);
      delete t;
      return nullptr;
    }
    t->dims[d] = dims[d];
  }
  if (strides != nullptr) {
    std::copy(strides, strides + ndims, t->strides.begin());
  } else {
    int64_t stride = 1;
    for (int d = static_cast<int>(ndims) - 1; d >= 0; --d) {
      t->strides[d] = stride;
      if (__builtin_mul_overflow(stride, std::max<int64_t>(t->dims[d], 1), &stride)) {
        gk::Fail(GK_ERROR_PARAM_INVALID, kApi, "shape {} has more than 2^63 elements",
                 gk::ShapeString(*t));
        delete t;
        return nullptr;
      }
    }
  }
  return t;
}

}  // namespace

extern "C" gkTensor* gkCreateTensor(const int64_t* dims, uint64_t ndims, gkDataType dtype,
                                    const int64_t* strides, int64_t offset, void* data) {
  // A C caller may pass any int: read the enum's bits, not its value (in C++ loading an enum
  // outside its range is undefined, and the compiler may assume it never happens).
  int32_t dtype_value;
  static_assert(sizeof dtype_value == sizeof dtype);
  std::memcpy(&dtype_value, &dtype, sizeof dtype_value);
  return gk::GuardCApi(kCreateTensor, static_cast<gkTensor*>(nullptr), [&] {
    gkTensor* t = CreateTensor(dims, ndims, dtype_value, strides, offset, data);
    if (t != nullptr) gk::LiveHandles<gkTensor>::Get().Add(t);
    return t;
  });
}

extern "C" gkStatus gkDestroyTensor(const gkTensor* tensor) {
  return gk::GuardCApi("gkDestroyTensor", [&] {
    if (tensor == nullptr) return GK_SUCCESS;
    if (!gk::LiveHandles<gkTensor>::Get().Remove(tensor)) {
      return gk::Fail(GK_ERROR_PARAM_INVALID, "gkDestroyTensor",
                      "tensor is not a live descriptor from gkCreateTensor (destroyed already, "
                      "or never created)");
    }
    delete tensor;
    return GK_SUCCESS;
  });
}
