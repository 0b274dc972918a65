// An 8 x 8 transpose of 32-bit words in registers (x86 AVX2 and later): what the packers of B use
// to read eight weight rows side by side, eight words of each per step, instead of one 32-bit
// gather per word (8 loads each): 4.5 shuffles per 8 words. Words are moved, never converted:
// float32 values, pairs of bfloat16 and NaN payloads keep their bits.
// Per-target header: included from inside HWY_NAMESPACE by foreach_target translation units.
#if defined(GRADKIT_CORE_CPU_TRANSPOSE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef GRADKIT_CORE_CPU_TRANSPOSE_INL_H_
#undef GRADKIT_CORE_CPU_TRANSPOSE_INL_H_
#else
#define GRADKIT_CORE_CPU_TRANSPOSE_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace gk {
namespace HWY_NAMESPACE {

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// Words [k, k + 8) of rows row[0..7] go to out[j * out_stride + r] = row[r][k + j], j, r < 8.
HWY_INLINE void Transpose8x8Words(const uint32_t* const row[8], int64_t k, uint32_t* out,
                                  int64_t out_stride) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::FixedTag<uint32_t, 8> d;
  const hn::Repartition<uint64_t, decltype(d)> dd;
  const auto r0 = hn::LoadU(d, row[0] + k), r1 = hn::LoadU(d, row[1] + k);
  const auto r2 = hn::LoadU(d, row[2] + k), r3 = hn::LoadU(d, row[3] + k);
  const auto r4 = hn::LoadU(d, row[4] + k), r5 = hn::LoadU(d, row[5] + k);
  const auto r6 = hn::LoadU(d, row[6] + k), r7 = hn::LoadU(d, row[7] + k);
  // Pairs of rows interleaved (per 128-bit half), then pairs of pairs, then the halves.
  const auto t0 = hn::BitCast(dd, hn::InterleaveLower(d, r0, r1));
  const auto t1 = hn::BitCast(dd, hn::InterleaveUpper(d, r0, r1));
  const auto t2 = hn::BitCast(dd, hn::InterleaveLower(d, r2, r3));
  const auto t3 = hn::BitCast(dd, hn::InterleaveUpper(d, r2, r3));
  const auto t4 = hn::BitCast(dd, hn::InterleaveLower(d, r4, r5));
  const auto t5 = hn::BitCast(dd, hn::InterleaveUpper(d, r4, r5));
  const auto t6 = hn::BitCast(dd, hn::InterleaveLower(d, r6, r7));
  const auto t7 = hn::BitCast(dd, hn::InterleaveUpper(d, r6, r7));
  // u_j: word j (lower half) and j + 4 (upper half) of rows 0-3 / v_j: of rows 4-7.
  const auto u0 = hn::BitCast(d, hn::InterleaveLower(dd, t0, t2));
  const auto u1 = hn::BitCast(d, hn::InterleaveUpper(dd, t0, t2));
  const auto u2 = hn::BitCast(d, hn::InterleaveLower(dd, t1, t3));
  const auto u3 = hn::BitCast(d, hn::InterleaveUpper(dd, t1, t3));
  const auto v0 = hn::BitCast(d, hn::InterleaveLower(dd, t4, t6));
  const auto v1 = hn::BitCast(d, hn::InterleaveUpper(dd, t4, t6));
  const auto v2 = hn::BitCast(d, hn::InterleaveLower(dd, t5, t7));
  const auto v3 = hn::BitCast(d, hn::InterleaveUpper(dd, t5, t7));
  hn::StoreU(hn::ConcatLowerLower(d, v0, u0), d, out + 0 * out_stride);
  hn::StoreU(hn::ConcatLowerLower(d, v1, u1), d, out + 1 * out_stride);
  hn::StoreU(hn::ConcatLowerLower(d, v2, u2), d, out + 2 * out_stride);
  hn::StoreU(hn::ConcatLowerLower(d, v3, u3), d, out + 3 * out_stride);
  hn::StoreU(hn::ConcatUpperUpper(d, v0, u0), d, out + 4 * out_stride);
  hn::StoreU(hn::ConcatUpperUpper(d, v1, u1), d, out + 5 * out_stride);
  hn::StoreU(hn::ConcatUpperUpper(d, v2, u2), d, out + 6 * out_stride);
  hn::StoreU(hn::ConcatUpperUpper(d, v3, u3), d, out + 7 * out_stride);
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace gk
HWY_AFTER_NAMESPACE();

#endif  // GRADKIT_CORE_CPU_TRANSPOSE_INL_H_
