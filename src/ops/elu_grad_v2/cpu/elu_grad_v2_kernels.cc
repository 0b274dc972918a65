// EluGradV2 SIMD kernels, compiled once per Highway target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/elu_grad_v2/cpu/elu_grad_v2_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <cstring>
#include <type_traits>

#include "core/cpu/convert-inl.h"
#include "core/cpu/math-inl.h"
#include "core/cpu/stream_copy.h"
#include "ops/elu_grad_v2/cpu/elu_grad_v2_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace gk {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// How far ahead of the computed elements the body fetches its inputs (see EluGradV2Body).
constexpr int64_t kPrefetchBytes = 1024;

// The exp polynomial for results rounded to Out: each 16-bit output takes the shortest one whose
// error stays far below its half-ulp (math-inl.h); float32 outputs the full one.
template <class Out>
inline constexpr int kExpDegree = std::is_same_v<Out, F16Storage>    ? 4
                                  : std::is_same_v<Out, Bf16Storage> ? 3
                                                                     : 6;

// EluGradV2Formula (elu_grad_v2_ref.h), one vector at a time.
template <bool kIsResult, int kDegree, class DF, class V = hn::Vec<DF>>
HWY_INLINE V EluGradV2Vector(DF df, V dy, V x, V negcoef, V poscoef, V negiptcoef) {
  const V positive = hn::Mul(dy, poscoef);
  V negative;
  if constexpr (kIsResult) {
    negative = hn::Mul(hn::Mul(dy, negiptcoef), hn::Add(x, negcoef));
  } else {
    // ExpF32 keeps a NaN argument (x or the product NaN), so NaN needs no select here.
    negative = hn::Mul(hn::Mul(hn::Mul(dy, negiptcoef), negcoef),
                       ExpF32<kDegree>(df, hn::Mul(x, negiptcoef)));
  }
  // A select: the branch not taken (e.g. exp of a large argument) never reaches the result.
  return hn::IfThenElse(hn::Gt(x, hn::Zero(df)), positive, negative);
}

template <class In, class Out, bool kIsResult, bool kBf16Asm>
HWY_NOINLINE void EluGradV2Body(const void* dy_bytes, const void* x_bytes, void* y_bytes,
                                int64_t n, const EluGradV2Coefficients& c, bool stream_output) {
  using InLane = typename In::Lane;
  using OutLane = typename Out::Lane;
  const auto* dy = static_cast<const InLane*>(dy_bytes);
  const auto* x = static_cast<const InLane*>(x_bytes);
  auto* y = static_cast<OutLane*>(y_bytes);
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto negcoef = hn::Set(df, c.negcoef);
  const auto poscoef = hn::Set(df, c.poscoef);
  const auto negiptcoef = hn::Set(df, c.negiptcoef);
  // Inputs fetched kPrefetchBytes ahead of the pair of vectors computed: the exp between the
  // loads keeps too few of them in flight for memory (64 M float32 elements: 21 GB/s without,
  // 35 with, against a 44 GB/s copy; 16 M: 27 and 33); a line of each input per step.
  // The addresses as integers: near the end they lie past the tensor (a prefetch never faults).
  const auto ahead = [](const InLane* p) {
    return reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(p) + kPrefetchBytes);
  };
  const auto prefetch = [&](int64_t i) {
    hwy::Prefetch(ahead(dy + i));
    hwy::Prefetch(ahead(x + i));
  };
  const auto compute = [&](int64_t i) {
    return EluGradV2Vector<kIsResult, kExpDegree<Out>>(df, LoadAsF32<In>(df, dy + i),
                                                       LoadAsF32<In>(df, x + i), negcoef, poscoef,
                                                       negiptcoef);
  };
  // Elements [begin, end) through a padded copy: the same vector code and the same conversion
  // as the body, so every element follows one formula, whatever its position.
  const auto run_padded = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i += lanes) {
      const int64_t count = std::min(lanes, end - i);
      HWY_ALIGN InLane dy_tail[hn::MaxLanes(df)] = {};
      HWY_ALIGN InLane x_tail[hn::MaxLanes(df)] = {};
      HWY_ALIGN OutLane y_tail[2 * hn::MaxLanes(df)] = {};
      std::memcpy(dy_tail, dy + i, count * sizeof(InLane));
      std::memcpy(x_tail, x + i, count * sizeof(InLane));
      const auto v = EluGradV2Vector<kIsResult, kExpDegree<Out>>(
          df, LoadAsF32<In>(df, dy_tail), LoadAsF32<In>(df, x_tail), negcoef, poscoef, negiptcoef);
      StorePairFromF32<Out, false, kBf16Asm>(df, v, hn::Zero(df), y_tail);
      std::memcpy(y + i, y_tail, count * sizeof(OutLane));
    }
  };

  int64_t i = 0;
  const auto y_address = reinterpret_cast<uintptr_t>(y);
  if (kHasStreamingStores && stream_output && y_address % sizeof(OutLane) == 0) {
    // Peel up to the output's first cache line, then stream pairs of vectors.
    constexpr uintptr_t kAlign = kStreamLineBytes;
    static_assert(!kHasStreamingStores || kAlign % (hn::MaxLanes(df) * sizeof(float)) == 0,
                  "lines hold whole vectors");
    const int64_t head = std::min<int64_t>(
        n, static_cast<int64_t>((kAlign - y_address % kAlign) % kAlign / sizeof(OutLane)));
    run_padded(0, head);
    // A burst at a time: computed into a buffer in L1 with plain stores, then streamed out
    // (non-temporal stores interleaved with the input loads measured 30% slower than plain
    // stores on Zen 3; in bursts of their own they are not).
    constexpr int64_t kBurstBytes = 4096;
    HWY_ALIGN OutLane burst[kBurstBytes / sizeof(OutLane)];
    const int64_t burst_elems = kBurstBytes / static_cast<int64_t>(sizeof(OutLane));
    for (i = head; i + 2 * lanes <= n;) {
      const int64_t count = std::min(burst_elems, (n - i) / (2 * lanes) * (2 * lanes));
      for (int64_t j = 0; j < count; j += 2 * lanes) {
        prefetch(i + j);
        StorePairFromF32<Out, false, kBf16Asm>(df, compute(i + j), compute(i + j + lanes), burst + j);
      }
      const auto* from = reinterpret_cast<const float*>(burst);
      auto* to = reinterpret_cast<float*>(y + i);  // aligned: i - head is whole vectors
      const int64_t floats = count * static_cast<int64_t>(sizeof(OutLane)) / 4;
      for (int64_t f = 0; f < floats; f += lanes) hn::Stream(hn::Load(df, from + f), df, to + f);
      i += count;
    }
  } else {
    for (; i + 2 * lanes <= n; i += 2 * lanes) {
      prefetch(i);
      StorePairFromF32<Out, false, kBf16Asm>(df, compute(i), compute(i + lanes), y + i);
    }
  }
  run_padded(i, n);
}

template <class In, class Out, bool kIsResult>
void EluGradV2Run(const void* dy, const void* x, void* y, int64_t n, const EluGradV2Coefficients& c,
                  bool stream_output) {
  if constexpr (kHasBf16Asm && std::is_same_v<Out, Bf16Storage>) {
    if (CpuHasAvx512Bf16() && NativeBf16Allowed().load(std::memory_order_relaxed)) {
      return EluGradV2Body<In, Out, kIsResult, true>(dy, x, y, n, c, stream_output);
    }
  }
  EluGradV2Body<In, Out, kIsResult, false>(dy, x, y, n, c, stream_output);
}

#define GK_ELU_GRAD_V2_KERNEL(name, In, Out, is_result)                                     \
  void EluGradV2_##name(const void* dy, const void* x, void* y, int64_t n,                   \
                        const EluGradV2Coefficients& c, bool stream_output) {                \
    EluGradV2Run<In, Out, is_result>(dy, x, y, n, c, stream_output);                         \
  }
#include "ops/elu_grad_v2/cpu/elu_grad_v2_kernels.inc"
#undef GK_ELU_GRAD_V2_KERNEL

}  // namespace HWY_NAMESPACE
}  // namespace gk
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gk {

#define GK_ELU_GRAD_V2_KERNEL(name, In, Out, is_result) HWY_EXPORT(EluGradV2_##name);
#include "ops/elu_grad_v2/cpu/elu_grad_v2_kernels.inc"
#undef GK_ELU_GRAD_V2_KERNEL

namespace {
constexpr DType DTypeOf(std::string_view storage) {
  return storage == "F16Storage" ? DType::kF16 : storage == "Bf16Storage" ? DType::kBF16 : DType::kF32;
}
}  // namespace

const std::vector<EluGradV2KernelEntry>& EluGradV2Kernels() {
  static const std::vector<EluGradV2KernelEntry> kernels = {
#define GK_ELU_GRAD_V2_KERNEL(name, In, Out, is_result)                                      \
  {#name, DTypeOf(#In), DTypeOf(#Out), is_result,                                            \
   [](const void* dy, const void* x, void* y, int64_t n, const EluGradV2Coefficients& c,     \
      bool stream_output) {                                                                  \
     HWY_DYNAMIC_DISPATCH(EluGradV2_##name)(dy, x, y, n, c, stream_output);                  \
   }},
#include "ops/elu_grad_v2/cpu/elu_grad_v2_kernels.inc"
#undef GK_ELU_GRAD_V2_KERNEL
  };
  return kernels;
}

void AllowNativeBf16Conversion(bool allow) { NativeBf16Allowed().store(allow); }

EluGradV2Kernel FindEluGradV2Kernel(DType input, DType output, bool is_result) {
  for (const auto& entry : EluGradV2Kernels()) {
    if (entry.input == input && entry.output == output && entry.is_result == is_result) {
      return entry.kernel;
    }
  }
  return nullptr;
}

}  // namespace gk
#endif  // HWY_ONCE
