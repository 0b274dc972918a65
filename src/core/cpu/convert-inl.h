// Loads of float32 / float16 / bfloat16 as float32 vectors, and stores of float32 vectors that
// round once to nearest even. Highway 1.0's own DemoteTo truncates bfloat16 (and float16 on
// targets without F16C), so the rounding is done here in integer arithmetic, on every target.
// Per-target header: included from inside HWY_NAMESPACE by foreach_target translation units.
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

// float16 bits -> float32, exact for every input (Highway 1.0 turns inf and NaN into finite
// values on targets without F16C).
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

template <class Storage, class DF>
HWY_INLINE hn::Vec<DF> LoadAsF32(DF df, const typename Storage::Lane* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<Storage, F32Storage>) {
    return hn::LoadU(df, p);
  } else if constexpr (std::is_same_v<Storage, F16Storage> &&
                       !((HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2) || HWY_ARCH_ARM)) {
    const hn::Rebind<uint16_t, DF> du16;
    return F32FromF16Bits(df, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p)));
  } else {
    const hn::Rebind<typename Storage::Lane, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, p));
  }
}

// float32 -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
template <class DF>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, DF>> Bf16BitsRne(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du32;
  const hn::Rebind<uint16_t, DF> du16;
  const hn::RebindToSigned<DF> di32;
  const auto bits = hn::BitCast(du32, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du32, 1));
  const auto rounded = hn::ShiftRight<16>(hn::Add(hn::Add(bits, hn::Set(du32, 0x7fff)), lsb));
  const auto quiet_nan = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du32, 0x40));
  const auto is_nan = hn::RebindMask(du32, hn::Ne(v, v));
  const auto out = hn::IfThenElse(is_nan, quiet_nan, rounded);
  return hn::DemoteTo(du16, hn::BitCast(di32, out));
}

// float32 -> float16 bits, round to nearest even, overflow to inf, subnormals kept.
template <class DF>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, DF>> F16BitsRne(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du32;
  const hn::Rebind<uint16_t, DF> du16;
  const hn::RebindToSigned<DF> di32;
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2) || HWY_ARCH_ARM
  // The hardware conversion rounds to nearest even.
  const hn::Rebind<hwy::float16_t, DF> dh;
  (void)du32;
  (void)di32;
  return hn::BitCast(du16, hn::DemoteTo(dh, v));
#else
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
#endif
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

// Whether StreamPairFromF32 writes with non-temporal stores on this target (the same condition
// as its #if).
inline constexpr bool kHasStreamingStores = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2;

// Stores two vectors (2 * Lanes(df) elements) as StoreFromF32 does, but bypassing the caches
// where the target allows, for outputs too large to stay cached: it saves the read-for-ownership
// of every output line. 16-bit results of the pair are joined into one full vector first, so
// every non-temporal store writes whole vectors (half-vector ones measured slower than plain
// stores). `p` must be aligned to MaxLanes(df) * 4 bytes. Callers end with hwy::FlushStream()
// before other threads read.
template <class Storage, class DF>
HWY_INLINE void StreamPairFromF32(DF df, hn::Vec<DF> v0, hn::Vec<DF> v1,
                                  typename Storage::Lane* HWY_RESTRICT p) {
  const size_t lanes = hn::Lanes(df);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  if constexpr (std::is_same_v<Storage, F32Storage>) {
    hn::Stream(v0, df, p);
    hn::Stream(v1, df, p + lanes);
  } else {
    constexpr bool kF16 = std::is_same_v<Storage, F16Storage>;
    const hn::Repartition<uint16_t, DF> du16;
    const auto low = kF16 ? F16BitsRne(df, v0) : Bf16BitsRne(df, v0);
    const auto high = kF16 ? F16BitsRne(df, v1) : Bf16BitsRne(df, v1);
    hn::Stream(hn::Combine(du16, high, low), du16, reinterpret_cast<uint16_t*>(p));
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
