// MoeFinalizeRouting SIMD kernels, compiled once per Highway target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/moe_finalize_routing/cpu/moe_finalize_routing_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <cstdint>

#include "core/cpu/convert-inl.h"
#include "core/cpu/stream_copy.h"
#include "ops/moe_finalize_routing/cpu/moe_finalize_routing_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace gk {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class Storage>
const typename Storage::Lane* AsLanes(const void* p) {
  return static_cast<const typename Storage::Lane*>(p);
}
template <class Storage>
typename Storage::Lane* AsLanes(void* p) {
  return static_cast<typename Storage::Lane*>(p);
}

// Calls f(Storage{}) for a float dtype: the dtypes' storage types, one instantiation each.
template <class F>
void WithStorage(DType dtype, const F& f) {
  switch (dtype) {
    case DType::kF16: f(F16Storage{}); break;
    case DType::kBF16: f(Bf16Storage{}); break;
    default: f(F32Storage{}); break;
  }
}

// Prefetches the lines of `count` rows that hold elements [j, j + elems).
template <class Storage>
HWY_INLINE void PrefetchRows(const void* const* rows, int64_t count, int64_t j, int64_t elems) {
  for (int64_t s = 0; s < count; ++s) {
    const auto* row = AsLanes<Storage>(rows[s]) + j;
    for (int64_t e = 0; e < elems; e += 64 / static_cast<int64_t>(sizeof(*row))) hwy::Prefetch(row + e);
  }
}

// Whether every row in rows[0, count) starts on a cache line. Non-temporal stores are used only
// there: a line that plain stores also write (a row starting mid-line) costs more than its
// read-for-ownership would have.
bool RowsOnLines(void* const* rows, int64_t count) {
  for (int64_t s = 0; s < count; ++s) {
    if (reinterpret_cast<uintptr_t>(rows[s]) % kStreamLineBytes != 0) return false;
  }
  return true;
}

// Four vectors of columns per step, then two, then one, then the scalar tail (the sums of
// different columns are independent, so the step changes no result). kStream: the two-vector stores
// are non-temporal (out on a cache line).
template <class Y, class Out, bool kStream>
void WeightedSumT(const MoeFinalizeSumArgs& a) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t n = a.n;
  auto* out = a.out != nullptr ? AsLanes<Out>(a.out) : nullptr;
  const auto start = [&](int64_t j) { return a.acc_in ? hn::LoadU(df, a.acc_in + j) : hn::Zero(df); };
  int64_t j = 0;
  // Four independent chains of additions hide the add latency that two leave exposed with
  // many slots (topK 8: 8 dependent adds per vector).
  for (; j + 4 * lanes <= n; j += 4 * lanes) {
    PrefetchRows<Y>(a.next_rows, a.next_count, j, 4 * lanes);
    auto acc0 = start(j), acc1 = start(j + lanes);
    auto acc2 = start(j + 2 * lanes), acc3 = start(j + 3 * lanes);
    for (int64_t s = 0; s < a.count; ++s) {
      const auto* row = AsLanes<Y>(a.rows[s]);
      const auto p = hn::Set(df, a.probs[s]);
      acc0 = hn::Add(acc0, hn::Mul(p, LoadAsF32<Y>(df, row + j)));
      acc1 = hn::Add(acc1, hn::Mul(p, LoadAsF32<Y>(df, row + j + lanes)));
      acc2 = hn::Add(acc2, hn::Mul(p, LoadAsF32<Y>(df, row + j + 2 * lanes)));
      acc3 = hn::Add(acc3, hn::Mul(p, LoadAsF32<Y>(df, row + j + 3 * lanes)));
    }
    if (out != nullptr) {
      StorePairFromF32<Out, kStream>(df, acc0, acc1, out + j);
      StorePairFromF32<Out, kStream>(df, acc2, acc3, out + j + 2 * lanes);
    } else {
      hn::StoreU(acc0, df, a.acc_out + j);
      hn::StoreU(acc1, df, a.acc_out + j + lanes);
      hn::StoreU(acc2, df, a.acc_out + j + 2 * lanes);
      hn::StoreU(acc3, df, a.acc_out + j + 3 * lanes);
    }
  }
  for (; j + 2 * lanes <= n; j += 2 * lanes) {
    PrefetchRows<Y>(a.next_rows, a.next_count, j, 2 * lanes);
    auto acc0 = start(j), acc1 = start(j + lanes);
    for (int64_t s = 0; s < a.count; ++s) {
      const auto* row = AsLanes<Y>(a.rows[s]);
      const auto p = hn::Set(df, a.probs[s]);
      acc0 = hn::Add(acc0, hn::Mul(p, LoadAsF32<Y>(df, row + j)));
      acc1 = hn::Add(acc1, hn::Mul(p, LoadAsF32<Y>(df, row + j + lanes)));
    }
    if (out != nullptr) {
      StorePairFromF32<Out, kStream>(df, acc0, acc1, out + j);
    } else {
      hn::StoreU(acc0, df, a.acc_out + j);
      hn::StoreU(acc1, df, a.acc_out + j + lanes);
    }
  }
  for (; j + lanes <= n; j += lanes) {
    auto acc = start(j);
    for (int64_t s = 0; s < a.count; ++s) {
      acc = hn::Add(acc, hn::Mul(hn::Set(df, a.probs[s]), LoadAsF32<Y>(df, AsLanes<Y>(a.rows[s]) + j)));
    }
    if (out != nullptr) {
      StoreFromF32<Out>(df, acc, out + j);
    } else {
      hn::StoreU(acc, df, a.acc_out + j);
    }
  }
  for (; j < n; ++j) {
    float acc = a.acc_in ? a.acc_in[j] : 0.0f;
    for (int64_t s = 0; s < a.count; ++s) {
      const float product = a.probs[s] * gk::LoadAsF32(a.rows[s], j, a.y_dtype);
      acc = acc + product;
    }
    if (out != nullptr) {
      gk::StoreFromF32(a.out, j, a.out_dtype, acc);
    } else {
      a.acc_out[j] = acc;
    }
  }
}

template <class Y, class Out>
void WeightedSumStreamOrNot(const MoeFinalizeSumArgs& a) {
  void* out = a.out;
  if (kHasStreamingStores && a.stream && out != nullptr && RowsOnLines(&out, 1)) {
    WeightedSumT<Y, Out, true>(a);
  } else {
    WeightedSumT<Y, Out, false>(a);
  }
}

HWY_NOINLINE void WeightedSum(const MoeFinalizeSumArgs& a) {
  WithStorage(a.y_dtype, [&](auto y) {
    using Y = decltype(y);
    if (a.out_dtype == DType::kF32) {
      WeightedSumStreamOrNot<Y, F32Storage>(a);
    } else {
      WeightedSumStreamOrNot<Y, Y>(a);
    }
  });
}

// grad_y[c] = p * g[c] for c in [begin, end) of slot s's row, plain stores (each element one
// product, rounded once to GY, as in every other store of grad_y).
template <class G, class GY>
void ScaleColumns(const MoeFinalizeGradArgs& a, int64_t s, int64_t begin, int64_t end) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto* g_row = AsLanes<G>(a.grad_out);
  auto* gy = AsLanes<GY>(a.grad_y_rows[s]);
  const float p = a.probs[s];
  int64_t c = begin;
  for (; c + lanes <= end; c += lanes) {
    StoreFromF32<GY>(df, hn::Mul(hn::Set(df, p), LoadAsF32<G>(df, g_row + c)), gy + c);
  }
  for (; c < end; ++c) {
    gk::StoreFromF32(a.grad_y_rows[s], c, a.grad_y_dtype, p * gk::LoadAsF32(a.grad_out, c, a.grad_dtype));
  }
}

// Up to four slots, each with its own register of partial dot products: their rows stream in
// together, gradOut's row is loaded once for them. Two vectors of columns per step, then one:
// each slot's partial sums take the vectors in column order either way (the same additions as
// one vector per step, and the same wherever the rows lie). Not kStream: each step stores its
// columns of grad_y with plain stores. kStream: every grad_y row starts on a cache line; after
// the dot products each row is written in turn, non-temporal pairs then plain stores for the
// tail (one row at a time: pairs into four rows at once, interleaved with the loads, left lines
// half-written and ran 2-5x slower than plain stores: S2 bfloat16 16% of a copy against 74-77%).
template <class G, class Y, class GY, bool kStream>
void GradSlotsT(const MoeFinalizeGradArgs& a) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t n = a.n, count = a.count;
  const auto* g_row = AsLanes<G>(a.grad_out);
  const auto slot = [&](int64_t s) { return s < count ? s : 0; };
  const auto* y0 = AsLanes<Y>(a.y_rows[slot(0)]);
  const auto* y1 = AsLanes<Y>(a.y_rows[slot(1)]);
  const auto* y2 = AsLanes<Y>(a.y_rows[slot(2)]);
  const auto* y3 = AsLanes<Y>(a.y_rows[slot(3)]);
  auto* gy0 = AsLanes<GY>(a.grad_y_rows[slot(0)]);
  auto* gy1 = AsLanes<GY>(a.grad_y_rows[slot(1)]);
  auto* gy2 = AsLanes<GY>(a.grad_y_rows[slot(2)]);
  auto* gy3 = AsLanes<GY>(a.grad_y_rows[slot(3)]);
  const auto p0 = hn::Set(df, a.probs[slot(0)]), p1 = hn::Set(df, a.probs[slot(1)]);
  const auto p2 = hn::Set(df, a.probs[slot(2)]), p3 = hn::Set(df, a.probs[slot(3)]);
  auto sum0 = hn::Zero(df), sum1 = hn::Zero(df), sum2 = hn::Zero(df), sum3 = hn::Zero(df);
  // One slot's two vectors at j: its partial sums, in column order, and (not streaming) its
  // grad_y pair.
  const auto pair = [&](auto& sum, const typename Y::Lane* y, typename GY::Lane* gy,
                        hn::Vec<decltype(df)> p, hn::Vec<decltype(df)> g0,
                        hn::Vec<decltype(df)> g1, int64_t j) {
    sum = hn::Add(sum, hn::Mul(g0, LoadAsF32<Y>(df, y + j)));
    sum = hn::Add(sum, hn::Mul(g1, LoadAsF32<Y>(df, y + j + lanes)));
    if constexpr (!kStream) StorePairFromF32<GY, false>(df, hn::Mul(p, g0), hn::Mul(p, g1), gy + j);
  };
  // One slot's vector at j (grad_y too when not streaming).
  const auto one = [&](auto& sum, const typename Y::Lane* y, typename GY::Lane* gy,
                       hn::Vec<decltype(df)> p, hn::Vec<decltype(df)> g, int64_t j) {
    sum = hn::Add(sum, hn::Mul(g, LoadAsF32<Y>(df, y + j)));
    if constexpr (!kStream) StoreFromF32<GY>(df, hn::Mul(p, g), gy + j);
  };
  int64_t j = 0;
  for (; j + 2 * lanes <= n; j += 2 * lanes) {
    PrefetchRows<Y>(a.next_rows, a.next_count, j, 2 * lanes);
    if (a.next_grad_out != nullptr) PrefetchRows<G>(&a.next_grad_out, 1, j, 2 * lanes);
    const auto g0 = LoadAsF32<G>(df, g_row + j), g1 = LoadAsF32<G>(df, g_row + j + lanes);
    pair(sum0, y0, gy0, p0, g0, g1, j);
    if (count > 1) pair(sum1, y1, gy1, p1, g0, g1, j);
    if (count > 2) pair(sum2, y2, gy2, p2, g0, g1, j);
    if (count > 3) pair(sum3, y3, gy3, p3, g0, g1, j);
  }
  for (; j + lanes <= n; j += lanes) {
    const auto g = LoadAsF32<G>(df, g_row + j);
    one(sum0, y0, gy0, p0, g, j);
    if (count > 1) one(sum1, y1, gy1, p1, g, j);
    if (count > 2) one(sum2, y2, gy2, p2, g, j);
    if (count > 3) one(sum3, y3, gy3, p3, g, j);
  }
  const int64_t tail = j;
  const auto finish = [&](int64_t s, hn::Vec<decltype(df)> sum) {
    float total = hn::GetLane(hn::SumOfLanes(df, sum));
    for (int64_t c = tail; c < n; ++c) {
      const float g = gk::LoadAsF32(a.grad_out, c, a.grad_dtype);
      const float product = g * gk::LoadAsF32(a.y_rows[s], c, a.y_dtype);
      total = total + product;
    }
    a.grad_probs[s] = total;
    if constexpr (kStream) {
      const auto pv = hn::Set(df, a.probs[s]);
      auto* gy = AsLanes<GY>(a.grad_y_rows[s]);
      int64_t c = 0;
      for (; c + 2 * lanes <= n; c += 2 * lanes) {
        StorePairFromF32<GY, true>(df, hn::Mul(pv, LoadAsF32<G>(df, g_row + c)),
                                   hn::Mul(pv, LoadAsF32<G>(df, g_row + c + lanes)), gy + c);
      }
      ScaleColumns<G, GY>(a, s, c, n);
    } else {
      ScaleColumns<G, GY>(a, s, tail, n);
    }
  };
  finish(0, sum0);
  if (count > 1) finish(1, sum1);
  if (count > 2) finish(2, sum2);
  if (count > 3) finish(3, sum3);
}

HWY_NOINLINE void GradSlots(const MoeFinalizeGradArgs& a) {
  const bool stream = kHasStreamingStores && a.stream && RowsOnLines(a.grad_y_rows, a.count);
  WithStorage(a.y_dtype, [&](auto y) {
    using Y = decltype(y);
    const auto with_grad_y = [&](auto g) {
      using G = decltype(g);
      if (a.grad_y_dtype == DType::kF32) {
        if (stream) {
          GradSlotsT<G, Y, F32Storage, true>(a);
        } else {
          GradSlotsT<G, Y, F32Storage, false>(a);
        }
      } else if (stream) {
        GradSlotsT<G, Y, Y, true>(a);
      } else {
        GradSlotsT<G, Y, Y, false>(a);
      }
    };
    if (a.grad_dtype == DType::kF32) {
      with_grad_y(F32Storage{});
    } else {
      with_grad_y(Y{});
    }
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace gk
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gk {

HWY_EXPORT(WeightedSum);
HWY_EXPORT(GradSlots);

void MoeFinalizeWeightedSum(const MoeFinalizeSumArgs& args) {
  HWY_DYNAMIC_DISPATCH(WeightedSum)(args);
}
void MoeFinalizeGradSlots(const MoeFinalizeGradArgs& args) {
  HWY_DYNAMIC_DISPATCH(GradSlots)(args);
}

}  // namespace gk
#endif  // HWY_ONCE
