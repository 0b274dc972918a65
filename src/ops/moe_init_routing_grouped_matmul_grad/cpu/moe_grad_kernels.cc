// MoeInitRoutingGroupedMatmulGrad SIMD kernels, compiled once per Highway target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>

#include "core/cpu/convert-inl.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace gk {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

HWY_NOINLINE void ConvertF16ToF32(const uint16_t* src, float* dst, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto* half = reinterpret_cast<const hwy::float16_t*>(src);
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) hn::StoreU(LoadAsF32<F16Storage>(df, half + j), df, dst + j);
  for (; j < n; ++j) dst[j] = F32FromF16(src[j]);
}

HWY_NOINLINE void AddRowF32(float* dst, const float* src, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    hn::StoreU(hn::Add(hn::LoadU(df, dst + j), hn::LoadU(df, src + j)), df, dst + j);
  }
  for (; j < n; ++j) dst[j] += src[j];
}

// One output element at a time, four columns per pass over an A row; lanes accumulate in a
// fixed order and are reduced the same way for every call.
template <class Storage>
void GemmTile(int64_t rows, int64_t width, int64_t reduce, const void* a_bytes, int64_t lda,
              const void* b_bytes, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  using Lane = typename Storage::Lane;
  const auto* a = static_cast<const Lane*>(a_bytes);
  const auto* b = static_cast<const Lane*>(b_bytes);
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t vector_end = reduce / lanes * lanes;
  const auto scalar = [](const Lane* p, int64_t i) {
    if constexpr (std::is_same_v<Storage, F32Storage>) return p[i];
    else return F32FromBf16(reinterpret_cast<const uint16_t*>(p)[i]);
  };
  for (int64_t r = 0; r < rows; ++r) {
    const Lane* a_row = a + r * lda;
    int64_t j = 0;
    for (; j < width; j += 4) {
      const int64_t cols = std::min<int64_t>(4, width - j);
      const Lane* b_rows[4];
      for (int64_t q = 0; q < 4; ++q) b_rows[q] = b + (j + std::min(q, cols - 1)) * ldb;
      auto s0 = hn::Zero(df), s1 = hn::Zero(df), s2 = hn::Zero(df), s3 = hn::Zero(df);
      for (int64_t i = 0; i < vector_end; i += lanes) {
        const auto av = LoadAsF32<Storage>(df, a_row + i);
        s0 = hn::MulAdd(av, LoadAsF32<Storage>(df, b_rows[0] + i), s0);
        s1 = hn::MulAdd(av, LoadAsF32<Storage>(df, b_rows[1] + i), s1);
        s2 = hn::MulAdd(av, LoadAsF32<Storage>(df, b_rows[2] + i), s2);
        s3 = hn::MulAdd(av, LoadAsF32<Storage>(df, b_rows[3] + i), s3);
      }
      float sums[4] = {hn::GetLane(hn::SumOfLanes(df, s0)), hn::GetLane(hn::SumOfLanes(df, s1)), hn::GetLane(hn::SumOfLanes(df, s2)),
                       hn::GetLane(hn::SumOfLanes(df, s3))};
      for (int64_t q = 0; q < cols; ++q) {
        for (int64_t i = vector_end; i < reduce; ++i) {
          sums[q] += scalar(a_row, i) * scalar(b_rows[q], i);
        }
        c[r * ldc + j + q] = accumulate ? c[r * ldc + j + q] + sums[q] : sums[q];
      }
    }
  }
}

HWY_NOINLINE void GemmTileF32(int64_t rows, int64_t width, int64_t reduce, const void* a,
                              int64_t lda, const void* b, int64_t ldb, float* c, int64_t ldc,
                              bool accumulate) {
  GemmTile<F32Storage>(rows, width, reduce, a, lda, b, ldb, c, ldc, accumulate);
}
HWY_NOINLINE void GemmTileBf16(int64_t rows, int64_t width, int64_t reduce, const void* a,
                               int64_t lda, const void* b, int64_t ldb, float* c, int64_t ldc,
                               bool accumulate) {
  GemmTile<Bf16Storage>(rows, width, reduce, a, lda, b, ldb, c, ldc, accumulate);
}

}  // namespace HWY_NAMESPACE
}  // namespace gk
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gk {

HWY_EXPORT(ConvertF16ToF32);
HWY_EXPORT(AddRowF32);
HWY_EXPORT(GemmTileF32);
HWY_EXPORT(GemmTileBf16);

void MoeConvertF16ToF32(const uint16_t* src, float* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(ConvertF16ToF32)(src, dst, n);
}

void MoeAddRowF32(float* dst, const float* src, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AddRowF32)(dst, src, n);
}

namespace {
// The transpose in square blocks, so that both the rows read and the rows written stay in L1.
template <class Out, class In, class Convert>
void TransposeBlock(const In* src, int64_t ld_src, int64_t reduce, int64_t cols, Out* dst,
                    int64_t ld_dst, Convert convert) {
  constexpr int64_t kBlock = 16;
  for (int64_t i0 = 0; i0 < reduce; i0 += kBlock) {
    const int64_t i1 = std::min(reduce, i0 + kBlock);
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t c1 = std::min(cols, c0 + kBlock);
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t c = c0; c < c1; ++c) dst[c * ld_dst + i] = convert(src[i * ld_src + c]);
      }
    }
  }
}
}  // namespace

void MoeTransposeWeightBlock(DType src_dtype, const void* src, int64_t ld_src, int64_t reduce,
                             int64_t cols, void* dst, int64_t ld_dst) {
  if (src_dtype == DType::kF16) {
    TransposeBlock(static_cast<const uint16_t*>(src), ld_src, reduce, cols,
                   static_cast<float*>(dst), ld_dst, [](uint16_t h) { return F32FromF16(h); });
  } else if (src_dtype == DType::kBF16) {
    TransposeBlock(static_cast<const uint16_t*>(src), ld_src, reduce, cols,
                   static_cast<uint16_t*>(dst), ld_dst, [](uint16_t b) { return b; });
  } else {
    TransposeBlock(static_cast<const float*>(src), ld_src, reduce, cols, static_cast<float*>(dst),
                   ld_dst, [](float f) { return f; });
  }
}

void MoeGemmTileOwn(DType gemm_dtype, int64_t rows, int64_t width, int64_t reduce, const void* a,
                    int64_t lda, const void* b, int64_t ldb, float* c, int64_t ldc,
                    bool accumulate) {
  if (gemm_dtype == DType::kBF16) {
    HWY_DYNAMIC_DISPATCH(GemmTileBf16)(rows, width, reduce, a, lda, b, ldb, c, ldc, accumulate);
  } else {
    HWY_DYNAMIC_DISPATCH(GemmTileF32)(rows, width, reduce, a, lda, b, ldb, c, ldc, accumulate);
  }
}

}  // namespace gk
#endif  // HWY_ONCE
