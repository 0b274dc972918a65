// GroupedMatmul(WeightGrad) SIMD kernels, compiled once per Highway target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/grouped_matmul/cpu/grouped_matmul_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/cpu/convert-inl.h"
#include "core/cpu/stream_copy.h"
#include "ops/grouped_matmul/cpu/grouped_matmul_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace gk {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// dst[j] = src[j] (kAdd: dst[j] as float32 + src[j], one float32 addition), rounded once.
template <class Storage, bool kAdd>
void StoreRow(const float* src, void* dst_bytes, int64_t n, DType dtype) {
  using Lane = typename Storage::Lane;
  auto* dst = static_cast<Lane*>(dst_bytes);
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    auto v = hn::LoadU(df, src + j);
    if constexpr (kAdd) v = hn::Add(LoadAsF32<Storage>(df, dst + j), v);
    StoreFromF32<Storage>(df, v, dst + j);
  }
  for (; j < n; ++j) {
    float v = src[j];
    if constexpr (kAdd) v = ::gk::LoadAsF32(dst_bytes, j, dtype) + v;
    ::gk::StoreFromF32(dst_bytes, j, dtype, v);
  }
}

HWY_NOINLINE void StoreRowAs(const float* src, void* dst, DType dtype, int64_t n) {
  switch (dtype) {
    case DType::kF16: StoreRow<F16Storage, false>(src, dst, n, dtype); break;
    case DType::kBF16: StoreRow<Bf16Storage, false>(src, dst, n, dtype); break;
    default: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); break;
  }
}

// StoreRowAs with non-temporal stores from dst's first cache line on, in whole vectors (the
// head before it and the tail after the last whole line by plain stores), where the target has
// them; elsewhere StoreRowAs. The run.rows * run.row_cols values go to dst one after another,
// from where GroupedMatmulTileRun says (a row; or a weight-grad unit's rows across its C
// tiles, see grouped_matmul_kernels.h).
template <class Storage>
void StreamRun(const float* src, const GroupedMatmulTileRun& run, void* dst_bytes, DType dtype) {
  using Lane = typename Storage::Lane;
  auto* dst = static_cast<Lane*>(dst_bytes);
  const int64_t n = run.rows * run.row_cols;
  const auto at = [&](int64_t c) {
    const int64_t r = c / run.row_cols, col = c % run.row_cols;
    return src + r / run.rows_per_block * run.block_stride + r % run.rows_per_block * run.row_stride +
           col / run.piece_cols * run.piece_stride + col % run.piece_cols;
  };
  // Values from c on that are consecutive in src.
  const auto contiguous = [&](int64_t c) {
    const int64_t col = c % run.row_cols;
    return std::min(run.piece_cols - col % run.piece_cols, run.row_cols - col);
  };
  const auto plain = [&](int64_t c0, int64_t c1) {  // [c0, c1) by plain stores
    while (c0 < c1) {
      const int64_t c = std::min(c1, c0 + contiguous(c0));
      StoreRow<Storage, false>(at(c0), dst + c0, c - c0, dtype);
      c0 = c;
    }
  };
  int64_t j = 0;
  if constexpr (kHasStreamingStores) {
    const hn::ScalableTag<float> df;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
    const auto misaligned = reinterpret_cast<uintptr_t>(dst) % kStreamLineBytes;
    if (misaligned % sizeof(Lane) == 0) {
      const int64_t head = static_cast<int64_t>((kStreamLineBytes - misaligned) % kStreamLineBytes / sizeof(Lane));
      if (head + 2 * lanes <= n) {
        plain(0, head);
        HWY_ALIGN float staged[2 * hn::MaxLanes(df)];
        for (j = head; j + 2 * lanes <= n; j += 2 * lanes) {
          const float* from = at(j);
          if (contiguous(j) < 2 * lanes) {  // the vectors cross into the next piece or row
            for (int64_t i = 0; i < 2 * lanes;) {
              const int64_t count = std::min(2 * lanes - i, contiguous(j + i));
              std::memcpy(staged + i, at(j + i), static_cast<size_t>(count) * sizeof(float));
              i += count;
            }
            from = staged;
          }
          StorePairFromF32<Storage, true>(df, hn::LoadU(df, from), hn::LoadU(df, from + lanes),
                                          dst + j);
        }
        // float32: a last whole line streamed too, where a vector is one.
        if constexpr (std::is_same_v<Lane, float>) {
          if (lanes * sizeof(float) == kStreamLineBytes && j + lanes <= n && contiguous(j) >= lanes) {
            hn::Stream(hn::LoadU(df, at(j)), df, dst + j);
            j += lanes;
          }
        }
      }
    }
  }
  plain(j, n);
}

HWY_NOINLINE void StreamRunAs(const float* src, const GroupedMatmulTileRun& run, void* dst,
                              DType dtype) {
  if (run.rows <= 0 || run.row_cols <= 0) return;
  switch (dtype) {
    case DType::kF16: StreamRun<F16Storage>(src, run, dst, dtype); break;
    case DType::kBF16: StreamRun<Bf16Storage>(src, run, dst, dtype); break;
    default: StreamRun<F32Storage>(src, run, dst, dtype); break;
  }
}

HWY_NOINLINE void AddRowAs(const float* src, void* dst, DType dtype, int64_t n) {
  switch (dtype) {
    case DType::kF16: StoreRow<F16Storage, true>(src, dst, n, dtype); break;
    case DType::kBF16: StoreRow<Bf16Storage, true>(src, dst, n, dtype); break;
    default: StoreRow<F32Storage, true>(src, dst, n, dtype); break;
  }
}

// dst[c * ld_dst + i] = row_at(i)[c] for i < rows, c < cols: float32 (and float16, converted)
// in 4 x 4 blocks transposed in registers, 16-bit values in 8 x 8 blocks; the edges element by
// element. A band of 4 (8) source rows is read end to end before the next, so the hardware
// prefetchers follow 4 (8) streams. With a band of columns outer, the blocks had walked down all
// the rows of a chunk (up to 256, each in a page of its own) 16 bytes at a time: weight grad S3,
// AMX Xeon, perf samples of the transposes against the GEMMs': bfloat16 0.40 -> 0.21-0.23,
// float32 0.23-0.25 -> 0.15-0.16 (session 19). The block stores land in the destination (a
// workspace tile, L2-sized) wherever the band is.
// Src: float, or uint16_t holding float16 bits (converted to float32 on the way, exactly).
template <class Src, class RowAt>
void TransposeF32(RowAt row_at, int64_t rows, int64_t cols, float* dst, int64_t ld_dst) {
  const auto scalar = [](Src v) {
    if constexpr (std::is_same_v<Src, float>) return v;
    else return F32FromF16(v);
  };
  int64_t cols8 = 0, rows4 = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::Full128<float> d;
  const auto load = [&](const Src* p) {
    if constexpr (std::is_same_v<Src, float>) return hn::LoadU(d, p);
    else return F32FromF16Bits(d, hn::LoadU(hn::Rebind<uint16_t, decltype(d)>(), p));
  };
  cols8 = cols / 8 * 8;
  rows4 = rows / 4 * 4;
  for (int64_t i = 0; i < rows4; i += 4) {
    const Src* const r0_row = row_at(i);
    const Src* const r1_row = row_at(i + 1);
    const Src* const r2_row = row_at(i + 2);
    const Src* const r3_row = row_at(i + 3);
    for (int64_t c0 = 0; c0 < cols8; c0 += 8) {
      const Src* s0 = r0_row + c0;
      const Src* s1 = r1_row + c0;
      const Src* s2 = r2_row + c0;
      const Src* s3 = r3_row + c0;
      for (int64_t half = 0; half < 8; half += 4) {
        const auto r0 = load(s0 + half), r1 = load(s1 + half);
        const auto r2 = load(s2 + half), r3 = load(s3 + half);
        const auto t0 = hn::InterleaveLower(d, r0, r1), t1 = hn::InterleaveUpper(d, r0, r1);
        const auto t2 = hn::InterleaveLower(d, r2, r3), t3 = hn::InterleaveUpper(d, r2, r3);
        float* o = dst + (c0 + half) * ld_dst + i;
        hn::StoreU(hn::ConcatLowerLower(d, t2, t0), d, o);
        hn::StoreU(hn::ConcatUpperUpper(d, t2, t0), d, o + ld_dst);
        hn::StoreU(hn::ConcatLowerLower(d, t3, t1), d, o + 2 * ld_dst);
        hn::StoreU(hn::ConcatUpperUpper(d, t3, t1), d, o + 3 * ld_dst);
      }
    }
  }
#endif
  for (int64_t c = 0; c < cols; ++c) {
    const int64_t first_row = c < cols8 ? rows4 : 0;  // the blocks above did the rest
    for (int64_t i = first_row; i < rows; ++i) dst[c * ld_dst + i] = scalar(row_at(i)[c]);
  }
}

template <class RowAt>
void Transpose16(RowAt row_at, int64_t rows, int64_t cols, uint16_t* dst, int64_t ld_dst) {
  int64_t cols8 = 0, rows8 = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::Full128<uint16_t> d16;
  const hn::Full128<uint32_t> d32;
  const hn::Full128<uint64_t> d64;
  cols8 = cols / 8 * 8;
  rows8 = rows / 8 * 8;
  const auto il32 = [&](auto a, auto b) {
    return hn::BitCast(d16, hn::InterleaveLower(d32, hn::BitCast(d32, a), hn::BitCast(d32, b)));
  };
  const auto iu32 = [&](auto a, auto b) {
    return hn::BitCast(d16, hn::InterleaveUpper(d32, hn::BitCast(d32, a), hn::BitCast(d32, b)));
  };
  const auto il64 = [&](auto a, auto b) {
    return hn::BitCast(d16, hn::InterleaveLower(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
  };
  const auto iu64 = [&](auto a, auto b) {
    return hn::BitCast(d16, hn::InterleaveUpper(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
  };
  for (int64_t i = 0; i < rows8; i += 8) {
    const uint16_t* src[8];
    for (int q = 0; q < 8; ++q) src[q] = row_at(i + q);
    for (int64_t c0 = 0; c0 < cols8; c0 += 8) {
      hn::Vec<decltype(d16)> r[8];
      for (int q = 0; q < 8; ++q) r[q] = hn::LoadU(d16, src[q] + c0);
      // rows pairwise (16-bit), then pairs of pairs (32-bit), then quads (64-bit): columns.
      const auto a0 = hn::InterleaveLower(d16, r[0], r[1]), a1 = hn::InterleaveUpper(d16, r[0], r[1]);
      const auto a2 = hn::InterleaveLower(d16, r[2], r[3]), a3 = hn::InterleaveUpper(d16, r[2], r[3]);
      const auto a4 = hn::InterleaveLower(d16, r[4], r[5]), a5 = hn::InterleaveUpper(d16, r[4], r[5]);
      const auto a6 = hn::InterleaveLower(d16, r[6], r[7]), a7 = hn::InterleaveUpper(d16, r[6], r[7]);
      const auto b0 = il32(a0, a2), b1 = iu32(a0, a2), b2 = il32(a1, a3), b3 = iu32(a1, a3);
      const auto b4 = il32(a4, a6), b5 = iu32(a4, a6), b6 = il32(a5, a7), b7 = iu32(a5, a7);
      uint16_t* o = dst + c0 * ld_dst + i;
      hn::StoreU(il64(b0, b4), d16, o);
      hn::StoreU(iu64(b0, b4), d16, o + ld_dst);
      hn::StoreU(il64(b1, b5), d16, o + 2 * ld_dst);
      hn::StoreU(iu64(b1, b5), d16, o + 3 * ld_dst);
      hn::StoreU(il64(b2, b6), d16, o + 4 * ld_dst);
      hn::StoreU(iu64(b2, b6), d16, o + 5 * ld_dst);
      hn::StoreU(il64(b3, b7), d16, o + 6 * ld_dst);
      hn::StoreU(iu64(b3, b7), d16, o + 7 * ld_dst);
    }
  }
#endif
  for (int64_t c = 0; c < cols; ++c) {
    const int64_t first_row = c < cols8 ? rows8 : 0;
    for (int64_t i = first_row; i < rows; ++i) dst[c * ld_dst + i] = row_at(i)[c];
  }
}

HWY_NOINLINE void TransposeBlockF32(const float* src, int64_t ld_src, int64_t reduce, int64_t cols,
                                    float* dst, int64_t ld_dst) {
  TransposeF32<float>([&](int64_t i) { return src + i * ld_src; }, reduce, cols, dst, ld_dst);
}
HWY_NOINLINE void TransposeBlockF16(const uint16_t* src, int64_t ld_src, int64_t reduce,
                                    int64_t cols, float* dst, int64_t ld_dst) {
  TransposeF32<uint16_t>([&](int64_t i) { return src + i * ld_src; }, reduce, cols, dst, ld_dst);
}
HWY_NOINLINE void TransposeBlock16(const uint16_t* src, int64_t ld_src, int64_t reduce,
                                   int64_t cols, uint16_t* dst, int64_t ld_dst) {
  Transpose16([&](int64_t i) { return src + i * ld_src; }, reduce, cols, dst, ld_dst);
}
HWY_NOINLINE void TransposeRowsF32(const void* const* rows_src, int64_t rows, int64_t cols,
                                   float* dst, int64_t ld_dst) {
  TransposeF32<float>([&](int64_t i) { return static_cast<const float*>(rows_src[i]); }, rows, cols,
                      dst, ld_dst);
}
HWY_NOINLINE void TransposeRowsF16(const void* const* rows_src, int64_t rows, int64_t cols,
                                   float* dst, int64_t ld_dst) {
  TransposeF32<uint16_t>([&](int64_t i) { return static_cast<const uint16_t*>(rows_src[i]); }, rows,
                         cols, dst, ld_dst);
}
HWY_NOINLINE void TransposeRows16(const void* const* rows_src, int64_t rows, int64_t cols,
                                  uint16_t* dst, int64_t ld_dst) {
  Transpose16([&](int64_t i) { return static_cast<const uint16_t*>(rows_src[i]); }, rows, cols,
              dst, ld_dst);
}

}  // namespace HWY_NAMESPACE
}  // namespace gk
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gk {

HWY_EXPORT(StoreRowAs);
HWY_EXPORT(StreamRunAs);
HWY_EXPORT(AddRowAs);
HWY_EXPORT(TransposeBlockF32);
HWY_EXPORT(TransposeBlockF16);
HWY_EXPORT(TransposeRowsF16);
HWY_EXPORT(TransposeBlock16);
HWY_EXPORT(TransposeRowsF32);
HWY_EXPORT(TransposeRows16);

void GroupedMatmulStoreRow(const float* src, void* dst, DType dtype, int64_t n) {
  HWY_DYNAMIC_DISPATCH(StoreRowAs)(src, dst, dtype, n);
}

void GroupedMatmulStreamTiles(const float* src, const GroupedMatmulTileRun& run, void* dst,
                              DType dtype) {
  HWY_DYNAMIC_DISPATCH(StreamRunAs)(src, run, dst, dtype);
}

void GroupedMatmulAddRow(const float* src, void* dst, DType dtype, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AddRowAs)(src, dst, dtype, n);
}

void GroupedMatmulTransposeBlock(DType src_dtype, const void* src, int64_t ld_src, int64_t reduce,
                                 int64_t cols, void* dst, int64_t ld_dst) {
  const auto* half = static_cast<const uint16_t*>(src);
  if (src_dtype == DType::kF16) {
    HWY_DYNAMIC_DISPATCH(TransposeBlockF16)(half, ld_src, reduce, cols, static_cast<float*>(dst),
                                            ld_dst);
  } else if (src_dtype == DType::kBF16) {
    HWY_DYNAMIC_DISPATCH(TransposeBlock16)(half, ld_src, reduce, cols, static_cast<uint16_t*>(dst),
                                           ld_dst);
  } else {
    HWY_DYNAMIC_DISPATCH(TransposeBlockF32)(static_cast<const float*>(src), ld_src, reduce, cols,
                                            static_cast<float*>(dst), ld_dst);
  }
}

void GroupedMatmulTransposeRows(DType src_dtype, const void* const* rows_src, int64_t rows,
                                int64_t cols, void* dst, int64_t ld_dst) {
  const int64_t elem = src_dtype == DType::kBF16 ? 2 : 4;  // of dst: float16 becomes float32
  if (src_dtype == DType::kF16) {
    HWY_DYNAMIC_DISPATCH(TransposeRowsF16)(rows_src, rows, cols, static_cast<float*>(dst), ld_dst);
  } else if (src_dtype == DType::kBF16) {
    HWY_DYNAMIC_DISPATCH(TransposeRows16)(rows_src, rows, cols, static_cast<uint16_t*>(dst), ld_dst);
  } else {
    HWY_DYNAMIC_DISPATCH(TransposeRowsF32)(rows_src, rows, cols, static_cast<float*>(dst), ld_dst);
  }
  if (rows < ld_dst) {  // the zero padding of a short chunk: +0.0 in every dtype
    for (int64_t c = 0; c < cols; ++c) {
      std::memset(static_cast<char*>(dst) + (c * ld_dst + rows) * elem, 0,
                  static_cast<size_t>((ld_dst - rows) * elem));
    }
  }
}

}  // namespace gk
#endif  // HWY_ONCE
