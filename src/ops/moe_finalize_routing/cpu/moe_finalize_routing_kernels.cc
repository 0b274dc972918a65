// MoeFinalizeRouting SIMD kernels, compiled once per Highway target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/moe_finalize_routing/cpu/moe_finalize_routing_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstring>

#include "core/cpu/convert-inl.h"
#include "ops/moe_finalize_routing/cpu/moe_finalize_routing_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace gk {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class Storage>
void ToF32(const void* src_bytes, float* dst, int64_t n) {
  const auto* src = static_cast<const typename Storage::Lane*>(src_bytes);
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) hn::StoreU(LoadAsF32<Storage>(df, src + j), df, dst + j);
  const DType dtype = std::is_same_v<Storage, F16Storage> ? DType::kF16 : DType::kBF16;
  for (; j < n; ++j) dst[j] = gk::LoadAsF32(src_bytes, j, dtype);
}

template <class Storage>
void FromF32(const float* src, void* dst_bytes, int64_t n) {
  auto* dst = static_cast<typename Storage::Lane*>(dst_bytes);
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) StoreFromF32<Storage>(df, hn::LoadU(df, src + j), dst + j);
  const DType dtype = std::is_same_v<Storage, F16Storage> ? DType::kF16 : DType::kBF16;
  for (; j < n; ++j) gk::StoreFromF32(dst_bytes, j, dtype, src[j]);
}

HWY_NOINLINE void RowToF16(const void* src, float* dst, int64_t n) { ToF32<F16Storage>(src, dst, n); }
HWY_NOINLINE void RowToBf16(const void* src, float* dst, int64_t n) { ToF32<Bf16Storage>(src, dst, n); }
HWY_NOINLINE void RowFromF16(const float* src, void* dst, int64_t n) { FromF32<F16Storage>(src, dst, n); }
HWY_NOINLINE void RowFromBf16(const float* src, void* dst, int64_t n) { FromF32<Bf16Storage>(src, dst, n); }

HWY_NOINLINE void AddScaled(float a, const float* x, float* acc, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto av = hn::Set(df, a);
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    hn::StoreU(hn::Add(hn::LoadU(df, acc + j), hn::Mul(av, hn::LoadU(df, x + j))), df, acc + j);
  }
  for (; j < n; ++j) {
    const float product = a * x[j];
    acc[j] = acc[j] + product;
  }
}

HWY_NOINLINE void Scale(float a, const float* x, float* dst, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto av = hn::Set(df, a);
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) hn::StoreU(hn::Mul(av, hn::LoadU(df, x + j)), df, dst + j);
  for (; j < n; ++j) dst[j] = a * x[j];
}

HWY_NOINLINE float Dot(const float* a, const float* b, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  auto sum = hn::Zero(df);
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    sum = hn::Add(sum, hn::Mul(hn::LoadU(df, a + j), hn::LoadU(df, b + j)));
  }
  float total = hn::GetLane(hn::SumOfLanes(df, sum));
  for (; j < n; ++j) {
    const float product = a[j] * b[j];
    total = total + product;
  }
  return total;
}

}  // namespace HWY_NAMESPACE
}  // namespace gk
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gk {

HWY_EXPORT(RowToF16);
HWY_EXPORT(RowToBf16);
HWY_EXPORT(RowFromF16);
HWY_EXPORT(RowFromBf16);
HWY_EXPORT(AddScaled);
HWY_EXPORT(Scale);
HWY_EXPORT(Dot);

void MoeFinalizeRowToF32(DType dtype, const void* src, float* dst, int64_t n) {
  switch (dtype) {
    case DType::kF16: HWY_DYNAMIC_DISPATCH(RowToF16)(src, dst, n); break;
    case DType::kBF16: HWY_DYNAMIC_DISPATCH(RowToBf16)(src, dst, n); break;
    default: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); break;
  }
}

void MoeFinalizeRowFromF32(DType dtype, const float* src, void* dst, int64_t n) {
  switch (dtype) {
    case DType::kF16: HWY_DYNAMIC_DISPATCH(RowFromF16)(src, dst, n); break;
    case DType::kBF16: HWY_DYNAMIC_DISPATCH(RowFromBf16)(src, dst, n); break;
    default: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); break;
  }
}

void MoeFinalizeAddScaled(float a, const float* x, float* acc, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AddScaled)(a, x, acc, n);
}
void MoeFinalizeScale(float a, const float* x, float* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(Scale)(a, x, dst, n);
}
float MoeFinalizeDot(const float* a, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(Dot)(a, b, n);
}

}  // namespace gk
#endif  // HWY_ONCE
