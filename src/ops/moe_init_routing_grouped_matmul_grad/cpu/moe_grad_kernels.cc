// MoeInitRoutingGroupedMatmulGrad SIMD kernels, compiled once per Highway target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "core/cpu/convert-inl.h"
#include "core/cpu/transpose-inl.h"
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

// Rows of a tile added into rows of gradX: dst[r][j] += src[r * ld_src + j], r < rows, j < n,
// AddRowF32's sums. gradX's rows are tokens K floats apart (S3: 28 KiB, the same offset in every
// 4 KiB page, so a unit's rows crowd a few L1 and L2 sets and come from L3): the rows
// kScatterAheadRows on are asked for while the current one is added.
constexpr int64_t kScatterAheadRows = 4;
HWY_NOINLINE void AddRowsF32(float* const* dst, const float* src, int64_t ld_src, int64_t rows,
                             int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r = 0; r < rows; ++r) {
    if (r + kScatterAheadRows < rows) {
      const auto* ahead = reinterpret_cast<const char*>(dst[r + kScatterAheadRows]);
      for (int64_t at = 0; at < n * static_cast<int64_t>(sizeof(float)); at += 64) {
        __builtin_prefetch(ahead + at, 1, 3);
      }
    }
    float* d = dst[r];
    const float* from = src + r * ld_src;
    int64_t j = 0;
    for (; j + lanes <= n; j += lanes) {
      hn::StoreU(hn::Add(hn::LoadU(df, d + j), hn::LoadU(df, from + j)), df, d + j);
    }
    for (; j < n; ++j) d[j] += from[j];
  }
}

// One column panel (n_block columns) of a blocked B (see MoeBlockedB), the part inside B: for
// word w < words and n < cols, the word of `pair` elements from reduction index w * pair of
// column n goes to dst[(w / block_words) * k_stride + (w % block_words) * n_block + n] (in
// words). B is [width, reduce] rows (b[n * ldb + k]): 8 columns' rows at a time, each read from
// start to end before the next 8, so the hardware streams 8 rows and the lines stay in L1 even
// when the row stride is a multiple of 4 KiB; 8 words of each through a register transpose on
// x86 (bfloat16 S3 of the fused op 69% -> 82-83% of dense on Zen 4), else and for the rest one
// gather per word.
constexpr int64_t kPrefetchBytes = 512;
HWY_NOINLINE void PackBPanel(const uint8_t* b, int64_t row_bytes, int64_t cols, int64_t words,
                             uint32_t* dst, int64_t n_block, int64_t block_words,
                             int64_t k_stride) {
  const auto out = [&](int64_t w) { return dst + (w / block_words) * k_stride + (w % block_words) * n_block; };
  const hn::CappedTag<uint32_t, 8> d32;
  const hn::RebindToSigned<decltype(d32)> di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d32));
  const auto offsets = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(row_bytes)));
  int64_t n = 0;
  for (; n + lanes <= cols; n += lanes) {
    const uint8_t* rows = b + n * row_bytes;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    // Eight words of each of the 8 rows at a time through a register transpose (the words of
    // one step stay inside one k-block: w0 starts a block, w + 8 <= w1 ends in it), measured
    // faster than the gathers, which serve the rest.
    static_assert(hn::MaxLanes(d32) == 8);
    const uint32_t* row[8];
    for (int r = 0; r < 8; ++r) row[r] = reinterpret_cast<const uint32_t*>(rows + r * row_bytes);
#endif
    for (int64_t w0 = 0; w0 < words; w0 += block_words) {
      // Weights are often cold: ask for each row's bytes kPrefetchBytes ahead.
      for (int64_t r = 0; r < lanes; ++r) hwy::Prefetch(rows + r * row_bytes + w0 * 4 + kPrefetchBytes);
      const int64_t w1 = std::min(words, w0 + block_words);
      int64_t w = w0;
      uint32_t* target = out(w0) + n;  // word w's, one k-block's words n_block apart
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
      for (; w + 8 <= w1; w += 8, target += 8 * n_block) Transpose8x8Words(row, w, target, n_block);
#endif
      for (; w < w1; ++w, target += n_block) {
        const auto* base = reinterpret_cast<const uint32_t*>(rows + w * 4);
        hn::StoreU(hn::GatherOffset(d32, base, offsets), d32, target);
      }
    }
  }
  for (; n < cols; ++n) {
    for (int64_t w = 0; w < words; ++w) std::memcpy(out(w) + n, b + n * row_bytes + w * 4, 4);
  }
}

// B given as its transpose, [reduce, width] rows (kn), all panels: word row w (rows w * pair and
// w * pair + 1, a bfloat16 pair interleaved into 32-bit words) goes into every panel in turn, row
// by row, while the rows kKnAheadWords word rows on are asked into L2 (hint 2: hwy::Prefetch asks
// for L1, which a wide row would overflow). Each row is read once from start to end; a panel at
// a time over the whole reduction read one short piece of every row, each row on its own page
// when rows are long (GroupedMatmul's [G, K, N] weights, S3: 8 KiB apart). Measured on Zen 4, 2
// threads, packing every (expert, 256 columns) of S3's float32 weights: 7-9 -> 10-13 GB/s.
constexpr int64_t kKnAheadWords = 2;
HWY_NOINLINE void PackBRowsKN(const uint8_t* b, int64_t row_bytes, int64_t pair, int64_t width,
                              int64_t words, uint32_t* dst, int64_t n_block, int64_t n_stride,
                              int64_t block_words, int64_t k_stride) {
  const hn::ScalableTag<uint32_t> d32;
  const hn::Rebind<uint16_t, decltype(d32)> d16;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d32));
  const int64_t span = width * 4 / pair;  // bytes of one row's columns
  for (int64_t w = 0; w < words; ++w) {
    if (w + kKnAheadWords < words) {
      for (int64_t r = 0; r < pair; ++r) {
        const uint8_t* ahead = b + ((w + kKnAheadWords) * pair + r) * row_bytes;
        for (int64_t at = 0; at < span; at += 64) __builtin_prefetch(ahead + at, 0, 2);
      }
    }
    const uint8_t* row = b + w * pair * row_bytes;
    uint32_t* const first = dst + (w / block_words) * k_stride + (w % block_words) * n_block;
    for (int64_t n0 = 0; n0 < width; n0 += n_block) {
      const int64_t cols = std::min(n_block, width - n0);
      uint32_t* target = first + (n0 / n_block) * n_stride;
      int64_t n = 0;
      if (pair == 1) {
        const auto* in = reinterpret_cast<const uint32_t*>(row) + n0;
        for (; n + lanes <= cols; n += lanes) hn::StoreU(hn::LoadU(d32, in + n), d32, target + n);
        for (; n < cols; ++n) target[n] = in[n];
        continue;
      }
      const auto* lo = reinterpret_cast<const uint16_t*>(row) + n0;
      const auto* hi = reinterpret_cast<const uint16_t*>(row + row_bytes) + n0;
      for (; n + lanes <= cols; n += lanes) {
        const auto word = hn::Or(hn::PromoteTo(d32, hn::LoadU(d16, lo + n)),
                                 hn::ShiftLeft<16>(hn::PromoteTo(d32, hn::LoadU(d16, hi + n))));
        hn::StoreU(word, d32, target + n);
      }
      for (; n < cols; ++n) target[n] = uint32_t{lo[n]} | uint32_t{hi[n]} << 16;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace gk
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gk {

HWY_EXPORT(ConvertF16ToF32);
HWY_EXPORT(AddRowF32);
HWY_EXPORT(AddRowsF32);
HWY_EXPORT(PackBPanel);
HWY_EXPORT(PackBRowsKN);

void MoeConvertF16ToF32(const uint16_t* src, float* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(ConvertF16ToF32)(src, dst, n);
}

void MoeAddRowF32(float* dst, const float* src, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AddRowF32)(dst, src, n);
}

void MoeAddRowsF32(float* const* dst, const float* src, int64_t ld_src, int64_t rows, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AddRowsF32)(dst, src, ld_src, rows, n);
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

int64_t MoeBlockedB::Elements() const {
  return std::max((padded_reduce / k_block - 1) * k_stride + (padded_width / n_block - 1) * n_stride +
                      k_block * n_block,
                  int64_t{0});
}

void MoePackB(DType gemm_dtype, const MoeBlockedB& layout, int64_t width, int64_t reduce,
              const void* b, int64_t ldb, bool kn, void* dst) {
  const int64_t elem = ElementBytes(gemm_dtype);
  const int64_t pair = layout.pair;
  if (elem * pair != 4) throw std::logic_error("MoePackB: 32-bit words only");
  const auto* src = static_cast<const uint8_t*>(b);
  const int64_t row_bytes = ldb * elem;
  // PackBPanel's gather offsets (up to 8 rows) are 32-bit: beyond that, words are read one by one.
  const bool gather = kn || 8 * row_bytes <= INT32_MAX;
  const auto word_at = [&](int64_t k, int64_t n) {  // zero outside B
    uint32_t word = 0;
    for (int64_t p = 0; p < pair; ++p) {
      if (k + p >= reduce || n >= width) continue;
      const uint8_t* at = src + (kn ? (k + p) * row_bytes + n * elem : n * row_bytes + (k + p) * elem);
      uint32_t part = 0;
      std::memcpy(&part, at, static_cast<size_t>(elem));
      word |= part << (16 * p);
    }
    return word;
  };
  auto* out = static_cast<uint32_t*>(dst);
  const int64_t block_words = layout.k_block / pair;
  // Words wholly inside B, packed fast; the rest (tails, padding) one by one.
  const int64_t words = gather ? reduce / pair : 0;
  const int64_t panels = layout.padded_width / layout.n_block;
  const auto panel_cols = [&](int64_t nb) {
    return std::clamp<int64_t>(width - nb * layout.n_block, 0, layout.n_block);
  };
  const auto panel_at = [&](int64_t nb) { return out + nb * layout.n_stride / pair; };
  if (kn && words > 0 && width > 0) {
    HWY_DYNAMIC_DISPATCH(PackBRowsKN)(src, row_bytes, pair, width, words, out, layout.n_block, layout.n_stride / pair,
                                      block_words, layout.k_stride / pair);
  }
  for (int64_t nb = 0; nb < panels; ++nb) {
    const int64_t n0 = nb * layout.n_block;
    const int64_t cols = panel_cols(nb);
    uint32_t* panel = panel_at(nb);
    if (!kn && words > 0 && cols > 0) {
      HWY_DYNAMIC_DISPATCH(PackBPanel)(src + n0 * row_bytes, row_bytes, cols, words, panel,
                                       layout.n_block, block_words, layout.k_stride / pair);
    }
    for (int64_t w = 0; w < layout.padded_reduce / pair; ++w) {
      uint32_t* row = panel + (w / block_words) * (layout.k_stride / pair) + (w % block_words) * layout.n_block;
      for (int64_t n = w < words ? cols : 0; n < layout.n_block; ++n) row[n] = word_at(w * pair, n0 + n);
    }
  }
}

}  // namespace gk
#endif  // HWY_ONCE
