// GroupedMatmul(WeightGrad) SIMD kernels, compiled once per Highway target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/grouped_matmul/cpu/grouped_matmul_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cstring>

#include "core/cpu/convert-inl.h"
#include "ops/grouped_matmul/cpu/grouped_matmul_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace gk {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class Storage>
void StoreRow(const float* src, void* dst_bytes, int64_t n, DType dtype) {
  using Lane = typename Storage::Lane;
  auto* dst = static_cast<Lane*>(dst_bytes);
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) StoreFromF32<Storage>(df, hn::LoadU(df, src + j), dst + j);
  for (; j < n; ++j) ::gk::StoreFromF32(dst_bytes, j, dtype, src[j]);
}

HWY_NOINLINE void StoreRowAs(const float* src, void* dst, DType dtype, int64_t n) {
  switch (dtype) {
    case DType::kF16: StoreRow<F16Storage>(src, dst, n, dtype); break;
    case DType::kBF16: StoreRow<Bf16Storage>(src, dst, n, dtype); break;
    default: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); break;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace gk
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gk {

HWY_EXPORT(StoreRowAs);

void GroupedMatmulStoreRow(const float* src, void* dst, DType dtype, int64_t n) {
  HWY_DYNAMIC_DISPATCH(StoreRowAs)(src, dst, dtype, n);
}

namespace {
// Blocks of 16 rows x 16 columns, so that the rows read and the columns written stay in L1.
template <class Out, class In, class Convert>
void TransposeRows(const void* const* rows_src, int64_t rows, int64_t cols, Out* dst,
                   int64_t ld_dst, Convert convert) {
  constexpr int64_t kBlock = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t r1 = std::min(rows, r0 + kBlock);
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t c1 = std::min(cols, c0 + kBlock);
      for (int64_t r = r0; r < r1; ++r) {
        const In* src = static_cast<const In*>(rows_src[r]);
        for (int64_t c = c0; c < c1; ++c) dst[c * ld_dst + r] = convert(src[c]);
      }
    }
  }
  if (rows < ld_dst) {
    for (int64_t c = 0; c < cols; ++c) std::fill(dst + c * ld_dst + rows, dst + (c + 1) * ld_dst, Out{});
  }
}
}  // namespace

void GroupedMatmulTransposeRows(DType src_dtype, const void* const* rows_src, int64_t rows,
                                int64_t cols, void* dst, int64_t ld_dst) {
  if (src_dtype == DType::kF16) {
    TransposeRows<float, uint16_t>(rows_src, rows, cols, static_cast<float*>(dst), ld_dst,
                                   [](uint16_t h) { return F32FromF16(h); });
  } else if (src_dtype == DType::kBF16) {
    TransposeRows<uint16_t, uint16_t>(rows_src, rows, cols, static_cast<uint16_t*>(dst), ld_dst,
                                      [](uint16_t b) { return b; });
  } else {
    TransposeRows<float, float>(rows_src, rows, cols, static_cast<float*>(dst), ld_dst,
                                [](float f) { return f; });
  }
}

}  // namespace gk
#endif  // HWY_ONCE
