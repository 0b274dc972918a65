// Loads of float32 / float16 / bfloat16 as float32 vectors, and stores of float32 vectors that
// round once to nearest even, with inf and NaN kept. The one place that knows how each Highway
// version converts 16-bit floats:
// - bfloat16: Highway >= 1.2 rounds correctly on every target, natively where the CPU can
//   (vcvtne2ps2bf16 on AVX3_ZEN4 and later): we use its own. Highway 1.0 (Debian 12) truncates
//   in DemoteTo: there the rounding is done here in integer arithmetic.
// - float16: Highway's conversions where they are hardware (F16C on AVX2 and later, ARM), in
//   every version. On targets without F16C (SSE2-SSE4) Highway 1.0 and 1.2 alike turn a NaN
//   input into a finite value (1.2 found by the tests in a Debian 13 root): our integer
//   conversions serve there.
// Per-target header: included from inside HWY_NAMESPACE by foreach_target translation units.
#include <hwy/highway.h>

// Highway's own bfloat16 conversions round to nearest even from 1.2 on. -DGK_HWY_CONVERTS_BF16=0
// forces ours on a newer Highway (how the fallback is tested there).
#ifndef GK_HWY_CONVERTS_BF16
#if HWY_MAJOR > 1 || (HWY_MAJOR == 1 && HWY_MINOR >= 2)
#define GK_HWY_CONVERTS_BF16 1
#else
#define GK_HWY_CONVERTS_BF16 0
#endif
#endif

#ifndef GRADKIT_CORE_CPU_CONVERT_INL_H_ONCE
#define GRADKIT_CORE_CPU_CONVERT_INL_H_ONCE
#include <atomic>

#include "core/cpu_info.h"

namespace gk {
// Highway 1.0's AVX3 targets are not compiled for AVX512-BF16, so there vcvtne2ps2bf16 is
// reached by inline assembly, and only where the CPU has it (checked once per kernel call).
// Tests turn it off to run the integer rounding on the same target.
inline std::atomic<bool>& NativeBf16Allowed() {
  static std::atomic<bool> allowed{true};
  return allowed;
}
}  // namespace gk
#endif  // GRADKIT_CORE_CPU_CONVERT_INL_H_ONCE

#if defined(GRADKIT_CORE_CPU_CONVERT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef GRADKIT_CORE_CPU_CONVERT_INL_H_
#undef GRADKIT_CORE_CPU_CONVERT_INL_H_
#else
#define GRADKIT_CORE_CPU_CONVERT_INL_H_
#endif

#include <hwy/highway.h>

#include <type_traits>

HWY_BEFORE_NAMESPACE();
namespace gk {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Storage types as the kernels see them.
struct F32Storage { using Lane = float; };
struct F16Storage { using Lane = hwy::float16_t; };
struct Bf16Storage { using Lane = hwy::bfloat16_t; };

// float16 bits -> float32, exact for every input (Highway turns NaN, and 1.0 also inf, into
// finite values on targets without F16C).
template <class DF>
HWY_INLINE hn::Vec<DF> F32FromF16Bits(DF df, hn::Vec<hn::Rebind<uint16_t, DF>> h) {
  const hn::RebindToUnsigned<DF> du32;
  const hn::RebindToSigned<DF> di32;
  const auto bits = hn::PromoteTo(du32, h);
  const auto sign = hn::ShiftLeft<16>(hn::And(bits, hn::Set(du32, 0x8000u)));
  const auto magnitude = hn::And(bits, hn::Set(du32, 0x7fffu));
  const auto normal = hn::Add(hn::ShiftLeft<13>(magnitude), hn::Set(du32, 0x38000000u));
  const auto inf_or_nan = hn::Or(hn::ShiftLeft<13>(magnitude), hn::Set(du32, 0x7f800000u));
  const auto subnormal = hn::BitCast(
      du32, hn::Mul(hn::ConvertTo(df, hn::BitCast(di32, magnitude)), hn::Set(df, 5.9604644775390625e-8f)));
  const auto signed_magnitude = hn::BitCast(di32, magnitude);
  auto out = hn::IfThenElse(hn::RebindMask(du32, hn::Lt(signed_magnitude, hn::Set(di32, 0x400))),
                            subnormal, normal);
  out = hn::IfThenElse(hn::RebindMask(du32, hn::Gt(signed_magnitude, hn::Set(di32, 0x7bff))),
                       inf_or_nan, out);
  return hn::BitCast(df, hn::Or(out, sign));
}

// Whether Highway 1.0's own float16 conversions are right on this target (F16C, or ARM's).
inline constexpr bool kHwyF16IsHardware = (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2) || HWY_ARCH_ARM;

template <class Storage, class DF>
HWY_INLINE hn::Vec<DF> LoadAsF32(DF df, const typename Storage::Lane* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<Storage, F32Storage>) {
    return hn::LoadU(df, p);
  } else {
    if constexpr (std::is_same_v<Storage, F16Storage> && !kHwyF16IsHardware) {
      const hn::Rebind<uint16_t, DF> du16;
      return F32FromF16Bits(df, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p)));
    }
    const hn::Rebind<typename Storage::Lane, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, p));
  }
}

#if !GK_HWY_CONVERTS_BF16
// float32 -> bfloat16, round to nearest even, as 32-bit lanes whose upper half holds the result;
// NaN stays a quiet NaN.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> Bf16RneInUpperHalf(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du32;
  const auto bits = hn::BitCast(du32, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du32, 1));
  const auto rounded = hn::Add(hn::Add(bits, hn::Set(du32, 0x7fff)), lsb);
  const auto quiet_nan = hn::Or(bits, hn::Set(du32, 0x400000));
  return hn::IfThenElse(hn::RebindMask(du32, hn::IsNaN(v)), quiet_nan, rounded);
}
#endif

// Whether this target reaches vcvtne2ps2bf16 by inline assembly (see NativeBf16Allowed).
#undef GK_HAS_BF16_ASM_TARGET
#if !GK_HWY_CONVERTS_BF16 && HWY_ARCH_X86 && \
    (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL) && (HWY_COMPILER_GCC || HWY_COMPILER_CLANG)
#define GK_HAS_BF16_ASM_TARGET 1
inline constexpr bool kHasBf16Asm = true;
// Two float32 vectors -> one vector of their bfloat16 values (v0's first), round to nearest
// even, NaN kept quiet; float32 subnormals become zero (the instruction's rule).
HWY_INLINE hn::Vec512<uint16_t> Bf16PairByInstruction(hn::Vec512<float> v0, hn::Vec512<float> v1) {
  __m512i joined;
  __asm__("vcvtne2ps2bf16 %2, %1, %0" : "=v"(joined) : "v"(v1.raw), "v"(v0.raw));
  return hn::Vec512<uint16_t>{joined};
}
#else
#define GK_HAS_BF16_ASM_TARGET 0
inline constexpr bool kHasBf16Asm = false;
#endif

// float32 -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
template <class DF>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, DF>> Bf16BitsRne(DF df, hn::Vec<DF> v) {
  const hn::Rebind<uint16_t, DF> du16;
#if GK_HWY_CONVERTS_BF16
  return hn::BitCast(du16, hn::DemoteTo(hn::Rebind<hwy::bfloat16_t, DF>(), v));
#else
  const hn::RebindToSigned<DF> di32;
  return hn::DemoteTo(du16, hn::BitCast(di32, hn::ShiftRight<16>(Bf16RneInUpperHalf(df, v))));
#endif
}

// float32 -> float16 bits, round to nearest even, overflow to inf, subnormals kept.
template <class DF>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, DF>> F16BitsRne(DF df, hn::Vec<DF> v) {
  const hn::Rebind<uint16_t, DF> du16;
  if constexpr (!kHwyF16IsHardware) {
    const hn::RebindToUnsigned<DF> du32;
    const hn::RebindToSigned<DF> di32;
    const auto all_bits = hn::BitCast(du32, v);
    const auto sign = hn::And(all_bits, hn::Set(du32, 0x80000000u));
    const auto bits = hn::Xor(all_bits, sign);
    // Normal range: rebias the exponent and round the 13 dropped bits to nearest even.
    const auto odd = hn::And(hn::ShiftRight<13>(bits), hn::Set(du32, 1));
    const auto normal = hn::ShiftRight<13>(
        hn::Add(hn::Add(bits, hn::Set(du32, 0xc8000fffu)), odd));  // (15 - 127) << 23 + 0xfff
    // Subnormal range: adding 0.5 lets the FPU round the mantissa into place.
    const auto magic = hn::Set(du32, 0x3f000000u);
    const auto subnormal =
        hn::Sub(hn::BitCast(du32, hn::Add(hn::BitCast(df, bits), hn::BitCast(df, magic))), magic);
    // With the sign removed the bits are below 2^31: compare them as signed integers.
    const auto magnitude = hn::BitCast(di32, bits);
    const auto inf_or_nan = hn::IfThenElse(
        hn::RebindMask(du32, hn::Gt(magnitude, hn::Set(di32, 0x7f800000))), hn::Set(du32, 0x7e00u),
        hn::Set(du32, 0x7c00u));
    auto out = hn::IfThenElse(hn::RebindMask(du32, hn::Lt(magnitude, hn::Set(di32, 0x38800000))),
                              subnormal, normal);
    out = hn::IfThenElse(hn::RebindMask(du32, hn::Gt(magnitude, hn::Set(di32, 0x477fffff))),
                         inf_or_nan, out);
    out = hn::Or(out, hn::ShiftRight<16>(sign));
    return hn::DemoteTo(du16, hn::BitCast(di32, out));
  }
  // The hardware conversion rounds to nearest even.
  return hn::BitCast(du16, hn::DemoteTo(hn::Rebind<hwy::float16_t, DF>(), v));
}

template <class Storage, class DF>
HWY_INLINE void StoreFromF32(DF df, hn::Vec<DF> v, typename Storage::Lane* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<Storage, F32Storage>) {
    hn::StoreU(v, df, p);
  } else {
    const hn::Rebind<uint16_t, DF> du16;
    const auto bits = std::is_same_v<Storage, F16Storage> ? F16BitsRne(df, v) : Bf16BitsRne(df, v);
    hn::StoreU(bits, du16, reinterpret_cast<uint16_t*>(p));
  }
}

// Whether StorePairFromF32 joins 16-bit results into one full vector, and can write with
// non-temporal stores, on this target.
inline constexpr bool kHasStreamingStores = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2;

// Stores two vectors (2 * Lanes(df) elements) as StoreFromF32 does. 16-bit results of the pair
// are joined into one full vector first where the target allows: with AVX512-BF16 one
// vcvtne2ps2bf16 converts both (Highway >= 1.2), elsewhere one permute joins the rounded upper
// halves. kStream: bypass the caches, for outputs too large to stay cached (it saves the
// read-for-ownership of every output line); every non-temporal store writes a whole vector
// (half-vector ones measured slower than plain stores), so `p` must then be aligned to
// MaxLanes(df) * 4 bytes, and callers end with hwy::FlushStream() before other threads read.
template <class Storage, bool kStream, bool kBf16Asm = false, class DF>
HWY_INLINE void StorePairFromF32(DF df, hn::Vec<DF> v0, hn::Vec<DF> v1,
                                 typename Storage::Lane* HWY_RESTRICT p) {
  const size_t lanes = hn::Lanes(df);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  if constexpr (std::is_same_v<Storage, F32Storage>) {
    if constexpr (kStream) {
      hn::Stream(v0, df, p);
      hn::Stream(v1, df, p + lanes);
    } else {
      hn::StoreU(v0, df, p);
      hn::StoreU(v1, df, p + lanes);
    }
  } else {
    const hn::Repartition<uint16_t, DF> du16;
    hn::Vec<decltype(du16)> joined;
    if constexpr (std::is_same_v<Storage, F16Storage>) {
      joined = hn::Combine(du16, F16BitsRne(df, v1), F16BitsRne(df, v0));
    } else {
#if GK_HWY_CONVERTS_BF16
      joined = hn::BitCast(du16, hn::OrderedDemote2To(hn::Repartition<hwy::bfloat16_t, DF>(), v0, v1));
#else
      if constexpr (kBf16Asm) {
#if GK_HAS_BF16_ASM_TARGET
        joined = Bf16PairByInstruction(v0, v1);
#endif
      } else {
        // Little-endian: the odd 16-bit lanes are the upper halves of the 32-bit ones.
        joined = hn::ConcatOdd(du16, hn::BitCast(du16, Bf16RneInUpperHalf(df, v1)),
                               hn::BitCast(du16, Bf16RneInUpperHalf(df, v0)));
      }
#endif
    }
    if constexpr (kStream) {
      hn::Stream(joined, du16, reinterpret_cast<uint16_t*>(p));
    } else {
      hn::StoreU(joined, du16, reinterpret_cast<uint16_t*>(p));
    }
  }
#else
  StoreFromF32<Storage>(df, v0, p);
  StoreFromF32<Storage>(df, v1, p + lanes);
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace gk
HWY_AFTER_NAMESPACE();

#endif  // GRADKIT_CORE_CPU_CONVERT_INL_H_
