// exp() for float32 vectors, in 13 vector operations with AVX-512 (16 elsewhere) where Highway's
// takes 22: the cost that decides whether an elementwise backward runs at memory speed. A
// shorter variant serves results that are rounded to a 16-bit float next.
// Per-target header: included from foreach_target translation units.
#if defined(GRADKIT_CORE_CPU_MATH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef GRADKIT_CORE_CPU_MATH_INL_H_
#undef GRADKIT_CORE_CPU_MATH_INL_H_
#else
#define GRADKIT_CORE_CPU_MATH_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace gk {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// exp(z) = 2^n * exp(r): n = round(z / ln 2) with the 1.5 * 2^23 rounding constant, r = z - n ln 2,
// exp(r) by a polynomial on [-ln2/2, ln2/2], then times 2^n. NaN gives NaN; results beyond
// float32 give +inf or 0. kDegree selects the accuracy:
//   6  for float32 results: r in two parts (exact n * ln2_hi), relative error 2e-9, tested within
//      the 4-ulp contract over the whole range;
//   4  for float16 results: 2.9e-6, 170x below float16's half-ulp (2^-11 relative);
//   3  for bfloat16 results: 1.0e-4, 19x below bfloat16's half-ulp (2^-9 relative).
// The short variants take r in one step: ln 2 rounded to float32 is 1.9e-9 off, so r is off by
// at most 150 * 1.9e-9 (|n| <= 150), far below what a 16-bit result can show. Their
// polynomials keep exp(0) = 1 exactly (constant term 1) and were fitted for minimax relative
// error in float32 evaluation (Horner with FMA).
template <int kDegree, class DF, class V = hn::Vec<DF>>
HWY_INLINE V ExpF32Reduced(DF df, V z, V* t) {
  static_assert(kDegree == 3 || kDegree == 4 || kDegree == 6, "no polynomial of that degree");
  const V rounding = hn::Set(df, 12582912.0f);  // 1.5 * 2^23
  *t = hn::MulAdd(z, hn::Set(df, 1.44269502f), rounding);
  const V n = hn::Sub(*t, rounding);
  if constexpr (kDegree == 6) {
    V r = hn::NegMulAdd(n, hn::Set(df, 0.693145751953125f), z);  // ln 2, high part: exact n * hi
    r = hn::NegMulAdd(n, hn::Set(df, 1.428606765330187e-06f), r);  // ln 2, low part
    V p = hn::Set(df, 0.0013843540800735354f);
    p = hn::MulAdd(p, r, hn::Set(df, 0.008374175056815147f));
    p = hn::MulAdd(p, r, hn::Set(df, 0.04166800528764725f));
    p = hn::MulAdd(p, r, hn::Set(df, 0.16666431725025177f));
    p = hn::MulAdd(p, r, hn::Set(df, 0.4999999403953552f));
    p = hn::MulAdd(p, r, hn::Set(df, 1.0f));
    return hn::MulAdd(p, r, hn::Set(df, 1.0f));
  } else {
    const V r = hn::NegMulAdd(n, hn::Set(df, 0.693147182f), z);
    V p;
    if constexpr (kDegree == 4) {
      p = hn::MulAdd(hn::Set(df, 0.04151364415884018f), r, hn::Set(df, 0.16787442564964294f));
      p = hn::MulAdd(p, r, hn::Set(df, 0.5000301599502563f));
      p = hn::MulAdd(p, r, hn::Set(df, 0.9999668598175049f));
    } else {
      p = hn::MulAdd(hn::Set(df, 0.1651797592639923f), r, hn::Set(df, 0.5041303634643555f));
      p = hn::MulAdd(p, r, hn::Set(df, 1.000195860862732f));
    }
    return hn::MulAdd(p, r, hn::Set(df, 1.0f));
  }
}

// With AVX-512, vscalefps computes p * 2^n in one instruction over the whole range (subnormal
// results and overflow included): no branch. Elsewhere 2^n is built in the exponent bits, which
// needs it to be a normal float, |z| <= 87; a vector with a lane outside (rare: exp is then below
// 2^-126 or near overflow) takes Highway's Exp, which scales in two steps and keeps subnormal
// results.
template <int kDegree = 6, class DF, class V = hn::Vec<DF>>
HWY_INLINE V ExpF32(DF df, V z) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (hn::MaxLanes(DF()) * sizeof(float) == 64) {
    // min/max return their second operand when one is NaN: a NaN z passes both clamps.
    z = hn::Max(hn::Set(df, -104.0f), hn::Min(hn::Set(df, 89.0f), z));
    V t;
    const V p = ExpF32Reduced<kDegree>(df, z, &t);
    const V n = hn::Sub(t, hn::Set(df, 12582912.0f));
    return V{_mm512_scalef_ps(p.raw, n.raw)};
  }
#endif
  const hn::RebindToSigned<DF> di;
  V t;
  const V p = ExpF32Reduced<kDegree>(df, z, &t);
  // t's low mantissa bits hold n; shifted into the exponent field they give 2^n. A NaN z
  // makes p NaN, and the product keeps it.
  const V two_to_n = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(hn::BitCast(di, t), hn::Set(di, 127))));
  const V fast = hn::Mul(p, two_to_n);
  const auto outside = hn::Gt(hn::Abs(z), hn::Set(df, 87.0f));
  if (HWY_LIKELY(hn::AllFalse(df, outside))) return fast;
  // Highway's Exp: valid up to +104 (clamped: float32 exp is +inf from 88.8 on), and NaN-blind.
  const V clamped = hn::Min(z, hn::Set(df, 89.0f));
  const V slow = hn::IfThenElse(hn::IsNaN(z), z, hn::Exp(df, clamped));
  return hn::IfThenElse(outside, slow, fast);
}

}  // namespace HWY_NAMESPACE
}  // namespace gk
HWY_AFTER_NAMESPACE();

#endif  // GRADKIT_CORE_CPU_MATH_INL_H_
