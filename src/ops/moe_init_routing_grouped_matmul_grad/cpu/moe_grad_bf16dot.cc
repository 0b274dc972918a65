// gradkit's bfloat16 tile GEMM on vdpbf16ps (see moe_grad_bf16dot.h). Highway 1.0 has no
// target with AVX512-BF16, so the kernel is written with the instruction's intrinsics, in
// functions compiled for that extension alone, and called only where the CPU has it.
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_bf16dot.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "core/cpu_info.h"
#include "core/plan_math.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if !defined(__clang__)
// GCC 12's AVX-512 intrinsics start their results from _mm512_undefined_*(), a self-initialised
// variable that -Wmaybe-uninitialized reports once the shuffles below are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_broadcast_avx512.h"
#define GK_BF16DOT 1
#define GK_BF16DOT_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))
#endif

namespace gk {
namespace {

constexpr int64_t kNr = kMoeBf16DotPanel;
constexpr int64_t kHalf = kNr / 2;         // the columns of one permute (two rows of 32 values)
constexpr int64_t kPairElems = kNr * 2;    // a panel's pair of reduction elements: 256 bytes
constexpr int64_t kKc = kMoeBf16DotReduceBlock;
constexpr int kMicroRows = static_cast<int>(kMoeBf16DotRows);
// B^T's rows packed a band at a time into every panel, the next band's rows fetched meanwhile.
constexpr int64_t kKnRows = 16;
// The register block asks for the panel's pairs this far ahead of the one it multiplies (into L1;
// the panel's block is read from L2 by every register block after the first).
constexpr int64_t kBAheadBytes = 1024;
// The weights-broadcast form's register block: kWeightRows weight rows x up to three vectors of
// kTokenVector tokens (A rows).
constexpr int64_t kTokenVector = 16;
constexpr int64_t kTokenGroup = kMoeBf16DotTokenGroup;
constexpr int kWeightRows = static_cast<int>(kMoeBf16DotWeightRows);

#if defined(GK_BF16DOT)
// The panels' layout is the shared packer's (moe_grad_broadcast_avx512.h).
static_assert(kTokenVector == kMoeBroadcastTokenVector && kTokenGroup == kMoeBroadcastTokenGroup);

// The lanes of 32 columns' pairs, first (second) 16 columns: elements j of row 2p and row 2p + 1
// side by side, picked from the 64 lanes of the two rows (row 2p's first).
GK_BF16DOT_TARGET inline __m512i PairIndex(int half) {
  alignas(64) uint16_t index[32];
  for (int j = 0; j < 16; ++j) {
    index[2 * j] = static_cast<uint16_t>(16 * half + j);
    index[2 * j + 1] = static_cast<uint16_t>(32 + 16 * half + j);
  }
  return _mm512_load_si512(index);
}

// 32 columns of a pair from B^T's rows 2p (even) and 2p + 1 (odd), their two values side by side,
// stored at `dst` (two vectors); returned as the instruction reads them.
GK_BF16DOT_TARGET __attribute__((always_inline)) inline void StorePair(__m512i even, __m512i odd,
                                                                      __m512i lo_index, __m512i hi_index,
                                                                      uint16_t* dst, __m512bh& b0,
                                                                      __m512bh& b1) {
  const __m512i w0 = _mm512_permutex2var_epi16(even, lo_index, odd);
  const __m512i w1 = _mm512_permutex2var_epi16(even, hi_index, odd);
  _mm512_store_si512(dst, w0);
  _mm512_store_si512(dst + kHalf, w1);
  b0 = (__m512bh)w0, b1 = (__m512bh)w1;
}

// The mask of the first `cols` (clamped to [0, lanes]) of `lanes` lanes.
inline uint32_t FirstLanes(int64_t cols, int64_t lanes) {
  const int64_t n = std::clamp<int64_t>(cols, 0, lanes);
  return n >= 32 ? ~uint32_t{0} : (uint32_t{1} << n) - 1;
}

// Panel columns [n0, n0 + cols) of pairs [p0, p1) from B^T's rows (b[k * ldb + n], k < reduce).
GK_BF16DOT_TARGET void PackPanelFromKN(const uint16_t* b, int64_t ldb, int64_t reduce, int64_t n0,
                                       int64_t cols, int64_t p0, int64_t p1, uint16_t* panel) {
  const __m512i lo = PairIndex(0), hi = PairIndex(1);
  for (int64_t half = 0; half < 2; ++half) {
    const __mmask32 mask = FirstLanes(cols - kHalf * half, kHalf);
    const uint16_t* col = b + n0 + kHalf * half;
    for (int64_t p = p0; p < p1; ++p) {
      const __m512i even = _mm512_maskz_loadu_epi16(mask, col + 2 * p * ldb);
      const __m512i odd = 2 * p + 1 < reduce ? _mm512_maskz_loadu_epi16(mask, col + (2 * p + 1) * ldb)
                                             : _mm512_setzero_si512();
      __m512bh b0, b1;
      StorePair(even, odd, lo, hi, panel + p * kPairElems + 2 * kHalf * half, b0, b1);
    }
  }
}

// A band of kKnRows rows into every panel in turn, the next band's rows fetched meanwhile. (Each
// pair of rows into every panel, read from start to end, ran 1.5x faster alone on 128 KiB blocks
// but 5% slower in GroupedMatmul S3, whose blocks were fetched during the GEMMs: session 35.)
GK_BF16DOT_TARGET void PackFromKN(const uint16_t* b, int64_t ldb, int64_t width, int64_t reduce,
                                  uint16_t* dst) {
  const int64_t pairs = CeilDiv(reduce, int64_t{2});
  for (int64_t k0 = 0; k0 < reduce; k0 += kKnRows) {
    const int64_t k1 = std::min(reduce, k0 + kKnRows);
    for (int64_t k = k1; k < std::min(reduce, k1 + kKnRows); ++k) {  // the next band, ahead
      const auto* row = reinterpret_cast<const char*>(b + k * ldb);
      for (int64_t at = 0; at < width * 2; at += 64) _mm_prefetch(row + at, _MM_HINT_T0);
    }
    for (int64_t n0 = 0; n0 < width; n0 += kNr) {
      PackPanelFromKN(b, ldb, reduce, n0, std::min(kNr, width - n0), k0 / 2, CeilDiv(k1, int64_t{2}),
                      dst + n0 * pairs * 2);
    }
  }
}

// The 16 x 16 32-bit words of r transposed in registers: r[i] word j -> r[j] word i.
GK_BF16DOT_TARGET inline void Transpose16x16Words(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4 i + j], 128-bit lane L: rows 4i .. 4i + 3, word 4 L + j.
  __m512i u[16];
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // Word 4 L + j of every row: lane L of u[j], u[4 + j], u[8 + j], u[12 + j].
  for (int j = 0; j < 4; ++j) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xEE);
    r[j] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + j] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[8 + j] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

// B's rows (b[n * ldb + k]): a pair is one 32-bit word of a column's row, so 16 pairs of 16
// columns are a 16 x 16 transpose of words (each row read 64 bytes at a time); an odd
// reduction's last element alone.
GK_BF16DOT_TARGET void PackFromRows(const uint16_t* b, int64_t ldb, int64_t width, int64_t reduce,
                                    uint16_t* dst) {
  const int64_t pairs = CeilDiv(reduce, int64_t{2});
  const int64_t whole = reduce / 2;
  for (int64_t n0 = 0; n0 < width; n0 += kNr) {
    const int64_t cols = std::min(kNr, width - n0);
    uint16_t* panel = dst + n0 * pairs * 2;
    for (int64_t quarter = 0; quarter < kNr / 16; ++quarter) {
      const int64_t in_quarter = std::clamp<int64_t>(cols - 16 * quarter, 0, 16);
      for (int64_t p0 = 0; p0 < whole; p0 += 16) {
        const int64_t count = std::min<int64_t>(16, whole - p0);
        const __mmask16 words = static_cast<__mmask16>((uint32_t{1} << count) - 1);
        __m512i r[16];
        for (int64_t i = 0; i < 16; ++i) {
          r[i] = i < in_quarter ? _mm512_maskz_loadu_epi32(words, b + (n0 + 16 * quarter + i) * ldb + 2 * p0)
                                : _mm512_setzero_si512();
        }
        Transpose16x16Words(r);
        for (int64_t c = 0; c < count; ++c) {
          _mm512_store_si512(panel + (p0 + c) * kPairElems + 16 * quarter * 2, r[c]);
        }
      }
    }
    if (whole < pairs) {  // the last element, paired with a zero
      uint16_t* last = panel + whole * kPairElems;
      std::memset(last, 0, kPairElems * 2);
      for (int64_t n = 0; n < cols; ++n) last[2 * n] = b[(n0 + n) * ldb + reduce - 1];
    }
  }
}

// B^T's rows that a register block packs on the way (MoeBf16DotGemmPackingKN): row k of the
// panel's `cols` columns at rows + k * ldb, `reduce` rows from the reduction block's first;
// mask0 (mask1) the first (second) 32 columns' lanes, the indices StorePair's.
struct DotKnSource {
  const uint16_t* rows;
  int64_t ldb, cols, reduce;
  __mmask32 mask0, mask1;
  __m512i lo_index, hi_index;
};

// The packing register block asks for B^T's rows this many rows ahead of the pair it packs
// (into L1). Each of a panel's rows is its own page, 4 KiB from the last, so neither the
// hardware's prefetchers nor a stream of the whole block spread over the previous block's
// GEMMs had them there in time (docs/benchmarks.md, session 37).
constexpr int64_t kDotPackAheadRows = 16;

// A pair of the panel's 64 columns packed from `src`: B^T's row 2p at even_row and, with has_odd,
// the row below it (else zeros), stored at `pair` and returned as the instruction reads them.
GK_BF16DOT_TARGET __attribute__((always_inline)) inline void PackPair(const DotKnSource& src,
                                                                     const uint16_t* even_row, bool has_odd,
                                                                     uint16_t* pair, __m512bh (&b)[4]) {
#pragma GCC unroll 2
  for (int half = 0; half < 2; ++half) {
    const __mmask32 mask = half == 0 ? src.mask0 : src.mask1;
    const __m512i even = _mm512_maskz_loadu_epi16(mask, even_row + kHalf * half);
    const __m512i odd = has_odd ? _mm512_maskz_loadu_epi16(mask, even_row + src.ldb + kHalf * half)
                                : _mm512_setzero_si512();
    StorePair(even, odd, src.lo_index, src.hi_index, pair + 2 * kHalf * half, b[2 * half], b[2 * half + 1]);
  }
}

// A register block's accumulators: MR rows x 4 vectors of 16 columns.
template <int MR>
using DotAcc = __m512[MR][4];

// Pair p of the panel times MR rows of A (each row's pair one 32-bit word of A, at a_pair + r ld
// bytes): the pair read from the packed panel, or with kPack first packed from B^T's rows 2p and
// 2p + 1 (as PackPanelFromKN) and stored there. The lines asked for ahead may lie past the block
// (a prefetch never faults).
template <int MR, bool kPack>
GK_BF16DOT_TARGET __attribute__((always_inline)) inline void DotStep(const char* a_pair, int64_t ld,
                                                                    const uint16_t* panel, int64_t p,
                                                                    const DotKnSource* src,
                                                                    DotAcc<MR>& acc) {
  __m512bh b[4];
  const uint16_t* pair = panel + p * kPairElems;
  if constexpr (kPack) {
    const uint16_t* even_row = src->rows + 2 * p * src->ldb;
    const char* ahead = reinterpret_cast<const char*>(even_row + kDotPackAheadRows * src->ldb);
    const int64_t row_bytes = src->ldb * 2;
    // The 128 bytes of a row's 64 columns span three lines where the rows are not 64-byte aligned.
    _mm_prefetch(ahead, _MM_HINT_T0);
    _mm_prefetch(ahead + 64, _MM_HINT_T0);
    _mm_prefetch(ahead + 127, _MM_HINT_T0);
    _mm_prefetch(ahead + row_bytes, _MM_HINT_T0);
    _mm_prefetch(ahead + row_bytes + 64, _MM_HINT_T0);
    _mm_prefetch(ahead + row_bytes + 127, _MM_HINT_T0);
    PackPair(*src, even_row, 2 * p + 1 < src->reduce, const_cast<uint16_t*>(pair), b);
  } else {
    const char* ahead = reinterpret_cast<const char*>(pair) + kBAheadBytes;
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      _mm_prefetch(ahead + 64 * v, _MM_HINT_T0);
      b[v] = (__m512bh)_mm512_load_si512(pair + 32 * v);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    int32_t word;
    std::memcpy(&word, a_pair + r * ld, 4);
    const __m512bh av = (__m512bh)_mm512_set1_epi32(word);
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, b[v]);
  }
}

// C[MR, 64] (+)= A[MR, 2 pairs + odd] * panel, the whole reduction block in one pass with the
// accumulators in registers (the panel's block read from L2 by all but the first register block,
// as oneDNN's brgemm reads its B); columns past `cols` neither read nor written. Meanwhile, every
// 16 pairs (a line of each A row), it asks for the next register block's `next_rows` rows of A
// (at a_next, the same stride) and, where given, pf's lines, spread over the loop. With kPack, the
// panel is first packed from `src` pair by pair (and written), as it is used.
template <int MR, bool kPack = false>
GK_BF16DOT_TARGET __attribute__((noinline)) void DotTile(int64_t pairs, bool odd, const uint16_t* a,
                                                         int64_t lda, const uint16_t* panel, float* c,
                                                         int64_t ldc, int64_t cols, bool load_c,
                                                         const uint16_t* a_next, int64_t next_rows,
                                                         MoeMicroPrefetch* pf, const DotKnSource* src) {
  __mmask16 mask[4];
  for (int v = 0; v < 4; ++v) mask[v] = static_cast<__mmask16>(FirstLanes(cols - 16 * v, 16));
  DotAcc<MR> acc;
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      acc[r][v] = load_c ? _mm512_maskz_loadu_ps(mask[v], c + r * ldc + 16 * v) : _mm512_setzero_ps();
    }
  }
  const char* a_bytes = reinterpret_cast<const char*>(a);
  const char* next_bytes = reinterpret_cast<const char*>(a_next);
  const int64_t ld = lda * 2;
  // A local copy: the panel's stores could alias *src, whose fields would be read again per step.
  DotKnSource local{};
  if constexpr (kPack) local = *src;
  const int64_t stream = pf != nullptr ? pf->per_block : 0;
  int64_t asked = 0;
  for (int64_t p = 0; p < pairs;) {
    const int64_t p1 = std::min(pairs, p + 16);
    for (int64_t r = 0; r < next_rows; ++r) _mm_prefetch(next_bytes + r * ld + 4 * p, _MM_HINT_T0);
    for (const int64_t due = stream * p1 / pairs; asked < due && MoeMicroAskNextLine(pf); ++asked) {
    }
#pragma GCC unroll 2
    for (; p < p1; ++p) DotStep<MR, kPack>(a_bytes + 4 * p, ld, panel, p, &local, acc);
  }
  // The last line of each next row's block (its last byte), where the rows start mid-line.
  const int64_t last_byte = 4 * pairs + (odd ? 1 : -1);
  for (int64_t r = 0; r < next_rows; ++r) _mm_prefetch(next_bytes + r * ld + last_byte, _MM_HINT_T0);
  if (odd) {  // the last element alone: its pair's second element (and the panel's) zero
    const uint16_t* pair = panel + pairs * kPairElems;
    __m512bh b[4];
    if constexpr (kPack) {  // the row below it is past the reduction (zeros)
      PackPair(local, local.rows + 2 * pairs * local.ldb, false, const_cast<uint16_t*>(pair), b);
    } else {
      for (int v = 0; v < 4; ++v) b[v] = (__m512bh)_mm512_load_si512(pair + 32 * v);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      uint16_t value;
      std::memcpy(&value, a_bytes + r * ld + 4 * pairs, 2);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(value);
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, b[v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) _mm512_mask_storeu_ps(c + r * ldc + 16 * v, mask[v], acc[r][v]);
  }
}

template <int MR>
GK_BF16DOT_TARGET void DotBlockUpTo(int64_t mr, int64_t pairs, bool odd, const uint16_t* a,
                                   int64_t lda, const uint16_t* panel, float* c, int64_t ldc,
                                   int64_t cols, bool load_c, const uint16_t* a_next, int64_t next_rows,
                                   MoeMicroPrefetch* pf, const DotKnSource* src) {
  if constexpr (MR > 1) {
    if (mr < MR) {
      DotBlockUpTo<MR - 1>(mr, pairs, odd, a, lda, panel, c, ldc, cols, load_c, a_next, next_rows, pf, src);
      return;
    }
  }
  if (src != nullptr) {
    DotTile<MR, true>(pairs, odd, a, lda, panel, c, ldc, cols, load_c, a_next, next_rows, pf, src);
  } else {
    DotTile<MR>(pairs, odd, a, lda, panel, c, ldc, cols, load_c, a_next, next_rows, pf, nullptr);
  }
}

// Register blocks of a call's rows: kMicroRows, then the rest in one block of 3 to 5 rows, or, a
// rest of 1 or 2 joined by the last full block, two of 3 or 4: the instruction's latency wants
// 12 accumulators in flight (3 rows).
int64_t FullDotBlocks(int64_t rows) {
  const int64_t full = rows / kMicroRows, rest = rows % kMicroRows;
  return full > 0 && rest > 0 && rest < 3 ? full - 1 : full;
}
int64_t DotBlockRows(int64_t rows, int64_t full, int64_t r0) {
  const int64_t left = rows - r0;
  return r0 < full * kMicroRows ? kMicroRows : left <= kMicroRows ? left : left / 2;
}

// With B^T's rows (b_kn, row stride ldb) packed on the way: the rows of the panel after
// (reduction block k0, panel n0) (the next panel of the block, or the next block's first), to ask
// for over the register blocks of (k0, n0) after its packing one, so that the next packing block
// finds them in cache instead of waiting on memory (it asks only kDotPackAheadRows ahead, too
// late for rows each on its own page). Empty where there is no next panel or no block after the
// packing one. GroupedMatmul S3 bfloat16 (137 rows an expert, 12 register blocks a panel), Zen 5,
// one-process harness, 2 threads, median of per-round ratios: 1.074, 1.075, 1.101; S1 1.005, S2
// 1.026, S4 1.009; the weight grad S1 1.020, S4 1.001; the same bits (docs/benchmarks.md,
// session 41).
// `blocks`: the register blocks of each panel (the call's row blocks).
GK_BF16DOT_TARGET MoeMicroPrefetch NextPanelRows(const uint16_t* b_kn, int64_t ldb, int64_t width,
                                                 int64_t reduce, int64_t kc_base, int64_t k0, int64_t n0,
                                                 int64_t blocks) {
  int64_t next_k0 = k0, next_n0 = n0 + kNr;
  if (next_n0 >= width) next_n0 = 0, next_k0 = k0 + kc_base;
  if (next_k0 >= reduce || blocks < 2) return {};
  const auto* first = reinterpret_cast<const char*>(b_kn + next_k0 * ldb + next_n0);
  const int64_t stride = ldb * 2;
  const int64_t bytes = std::min(kNr, width - next_n0) * 2;
  // Both lines of a row's columns where they may straddle two.
  const bool aligned = reinterpret_cast<uintptr_t>(first) % 64 == 0 && stride % 64 == 0;
  const int64_t row_bytes = aligned ? RoundUp(bytes, int64_t{64}) : bytes + 64;
  const int64_t krows = std::min(kc_base, reduce - next_k0);
  MoeMicroPrefetch p{};
  p.base = first, p.rows = krows, p.row_bytes = row_bytes, p.stride = stride;
  p.per_block = CeilDiv(krows * row_bytes / 64, blocks - 1);
  return p;
}

// Rows [0, rows) of a call: the reduction in blocks of kc_base (even), each block's panels in
// turn over every row block. With b_kn (B^T's rows, row stride ldb), the first register block of
// each reduction block and panel packs that part of `packed` as it multiplies, and the blocks
// after it fetch the next panel's rows (NextPanelRows).
GK_BF16DOT_TARGET void DotGemmRows(int64_t rows, int64_t width, int64_t reduce, int64_t kc_base,
                                   const uint16_t* a, int64_t lda, const uint16_t* packed, float* c,
                                   int64_t ldc, bool accumulate, MoeMicroPrefetch* pf,
                                   const uint16_t* b_kn = nullptr, int64_t ldb = 0) {
  const int64_t pairs = CeilDiv(reduce, int64_t{2});
  const int64_t full = FullDotBlocks(rows);
  int64_t blocks = 0;  // register blocks a panel
  for (int64_t r0 = 0; r0 < rows; r0 += DotBlockRows(rows, full, r0)) ++blocks;
  for (int64_t k0 = 0; k0 < reduce; k0 += kc_base) {
    const int64_t kc = std::min(kc_base, reduce - k0);
    const bool load_c = accumulate || k0 > 0;
    for (int64_t n0 = 0; n0 < width; n0 += kNr) {
      const uint16_t* panel = packed + n0 * pairs * 2 + k0 * kNr;
      const int64_t cols = std::min(kNr, width - n0);
      // Packing on the way, the register blocks after the packing one ask for the next panel's
      // rows in place of the caller's stream (which the tile GEMM's worker leaves empty then).
      MoeMicroPrefetch next_panel{};
      if (b_kn != nullptr) next_panel = NextPanelRows(b_kn, ldb, width, reduce, kc_base, k0, n0, blocks);
      for (int64_t r0 = 0; r0 < rows;) {
        const int64_t mr = DotBlockRows(rows, full, r0);
        const int64_t next = std::min(rows, r0 + mr + kMicroRows);
        // A's next rows on the first panel's pass (often from memory: the tile rows of gradY).
        const int64_t next_rows = n0 == 0 ? next - (r0 + mr) : 0;
        if (load_c) MoeMicroPrefetchRows(c + n0, ldc * 4, r0 + mr, next, cols * 4);
        DotKnSource src{};
        if (b_kn != nullptr && r0 == 0) {
          src = {b_kn + k0 * ldb + n0, ldb, cols, kc, FirstLanes(cols, kHalf),
                 FirstLanes(cols - kHalf, kHalf), PairIndex(0), PairIndex(1)};
        }
        DotBlockUpTo<kMicroRows>(mr, kc / 2, kc % 2 != 0, a + r0 * lda + k0, lda, panel,
                                 c + r0 * ldc + n0, ldc, cols, load_c,
                                 next_rows > 0 ? a + (r0 + mr) * lda + k0 : nullptr, next_rows,
                                 b_kn == nullptr ? pf : r0 == 0 ? nullptr : &next_panel,
                                 src.rows != nullptr ? &src : nullptr);
        r0 += mr;
      }
    }
  }
}

// ---- The weights-broadcast form (MoeBf16DotGemmBroadcastB) ----

// One register block: kWeightRows weight rows x NV token vectors of float32 accumulators over
// every pair, each step NV panel vectors times each row's pair broadcast (the weights' own 32-bit
// words). Stored to ct (rows ldct apart, a row's tokens contiguous). A line of `next` asked for
// every `every` pairs.
template <int NV>
GK_BF16DOT_TARGET __attribute__((noinline)) void BroadcastTile(int64_t pairs,
                                                               const uint16_t* const* w_rows,
                                                               const uint32_t* panel, float* ct,
                                                               int64_t ldct, MoeMicroPrefetch* next,
                                                               int64_t every) {
  __m512 acc[kWeightRows][NV];
#pragma GCC unroll 8
  for (int r = 0; r < kWeightRows; ++r) {
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  const uint16_t* w[kWeightRows];
  for (int r = 0; r < kWeightRows; ++r) w[r] = w_rows[r];
  int64_t countdown = every;
  for (int64_t p = 0; p < pairs; ++p) {
    if (--countdown == 0) {
      MoeMicroAskNextLine(next);
      countdown = every;
    }
    __m512i b[NV];
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_si512(panel + p * (kTokenVector * NV) + kTokenVector * v);
#pragma GCC unroll 8
    for (int r = 0; r < kWeightRows; ++r) {
      int32_t word;
      std::memcpy(&word, w[r] + 2 * p, 4);
      const __m512i pair = _mm512_set1_epi32(word);
#pragma GCC unroll 3
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)pair, (__m512bh)b[v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kWeightRows; ++r) {
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(ct + r * ldct + kTokenVector * v, acc[r][v]);
  }
}

GK_BF16DOT_TARGET void GemmBroadcastB(int64_t rows, int64_t width, int64_t pairs, const uint32_t* a_tokens,
                                      const uint16_t* b, int64_t ldb, float* c, int64_t ldc, float* ct,
                                      const uint16_t* next_b, int64_t next_rows) {
  const int64_t tokens = RoundUp(rows, kTokenVector);
  const int64_t groups = CeilDiv(tokens, kTokenGroup);
  const int64_t row_bytes = 4 * pairs;
  for (int64_t n0 = 0; n0 < width; n0 += kWeightRows) {
    // Past the width, the last row again (its sums land in rows of ct never read).
    const uint16_t* w_rows[kWeightRows];
    for (int r = 0; r < kWeightRows; ++r) w_rows[r] = b + std::min<int64_t>(n0 + r, width - 1) * ldb;
    // The next register blocks' weight rows (the next block's first ones after the last), asked
    // for meanwhile.
    MoeMicroPrefetch next{};
    if (n0 + kWeightRows < width) {
      next = {reinterpret_cast<const char*>(b + (n0 + kWeightRows) * ldb),
              std::min<int64_t>(kWeightRows, width - n0 - kWeightRows), row_bytes, 2 * ldb};
    } else if (next_b != nullptr) {
      next = {reinterpret_cast<const char*>(next_b), std::min<int64_t>(kWeightRows, next_rows), row_bytes,
              2 * ldb};
    }
    const int64_t lines = next.rows * CeilDiv(row_bytes, int64_t{64});
    const int64_t every = lines > 0 ? std::max<int64_t>(1, groups * pairs / lines) : pairs + 1;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t vectors = std::min<int64_t>(3, (tokens - g * kTokenGroup) / kTokenVector);
      const uint32_t* panel = a_tokens + g * kTokenGroup * pairs;
      float* out = ct + n0 * tokens + g * kTokenGroup;
      if (vectors == 3) {
        BroadcastTile<3>(pairs, w_rows, panel, out, tokens, &next, every);
      } else if (vectors == 2) {
        BroadcastTile<2>(pairs, w_rows, panel, out, tokens, &next, every);
      } else {
        BroadcastTile<1>(pairs, w_rows, panel, out, tokens, &next, every);
      }
    }
  }
  MoeStoreTransposedTile(rows, width, ct, RoundUp(width, int64_t{kWeightRows}), tokens, c, ldc);
}
#endif  // GK_BF16DOT

int64_t DotReduceBlock(int64_t reduce) {
  const int64_t k_blocks = std::max<int64_t>(1, CeilDiv(reduce, kKc));
  return RoundUp(CeilDiv(reduce, k_blocks), int64_t{2});
}

}  // namespace

bool MoeBf16DotAvailable() {
#if defined(GK_BF16DOT)
  return CpuHasAvx512Bf16() && ChosenIsa().rfind("AVX3", 0) == 0;
#else
  return false;
#endif
}

int64_t MoeBf16DotBlockMacs(int64_t reduce) { return kMoeBf16DotRows * kNr * DotReduceBlock(reduce); }

uint64_t MoeBf16DotPackedBytes(int64_t width, int64_t reduce) {
  return static_cast<uint64_t>(RoundUp(width, kNr) * RoundUp(reduce, int64_t{2})) * 2;
}

void MoeBf16DotPackB(int64_t width, int64_t reduce, const void* b, int64_t ldb, bool kn, void* dst) {
#if defined(GK_BF16DOT)
  const auto* src = static_cast<const uint16_t*>(b);
  auto* out = static_cast<uint16_t*>(dst);
  if (kn) {  // either packer writes zeros past the width
    PackFromKN(src, ldb, width, reduce, out);
  } else {
    PackFromRows(src, ldb, width, reduce, out);
  }
#else
  (void)width, (void)reduce, (void)b, (void)ldb, (void)kn, (void)dst;
  throw std::logic_error("bfloat16 dot-product kernel: not built for this CPU");
#endif
}

void MoeBf16DotGemm(int64_t rows, int64_t width, int64_t reduce, const void* a, int64_t lda,
                    const void* b_packed, float* c, int64_t ldc, bool accumulate,
                    MoeMicroPrefetch* prefetch) {
  // Only read: nothing is packed without B^T's rows.
  MoeBf16DotGemmPackingKN(rows, width, reduce, a, lda, nullptr, 0, const_cast<void*>(b_packed), c, ldc,
                          accumulate, prefetch);
}

void MoeBf16DotGemmPackingKN(int64_t rows, int64_t width, int64_t reduce, const void* a, int64_t lda,
                             const void* b_kn, int64_t ldb, void* b_packed, float* c, int64_t ldc,
                             bool accumulate, MoeMicroPrefetch* prefetch) {
#if defined(GK_BF16DOT)
  if (rows == 0) {  // nothing to multiply; B still packed when named
    if (b_kn != nullptr) MoeBf16DotPackB(width, reduce, b_kn, ldb, /*kn=*/true, b_packed);
    return;
  }
  if (reduce == 0) {
    for (int64_t r = 0; r < rows && !accumulate; ++r) std::fill(c + r * ldc, c + r * ldc + width, 0.0f);
    return;
  }
  const int64_t kc_base = DotReduceBlock(reduce);
  // Rows in chunks whose A block and C rows stay in L2 together, equal-sized, multiples of the
  // register block.
  const int64_t most = std::max<int64_t>(
      kMicroRows, kMoeBf16DotAChunkBytes / (2 * kc_base + 4 * width) / kMicroRows * kMicroRows);
  const int64_t chunk_rows = RoundUp(CeilDiv(rows, CeilDiv(rows, most)), int64_t{kMicroRows});
  for (int64_t m0 = 0; m0 < rows; m0 += chunk_rows) {
    DotGemmRows(std::min(chunk_rows, rows - m0), width, reduce, kc_base,
                static_cast<const uint16_t*>(a) + m0 * lda, lda, static_cast<const uint16_t*>(b_packed),
                c + m0 * ldc, ldc, accumulate, prefetch,
                m0 == 0 ? static_cast<const uint16_t*>(b_kn) : nullptr, ldb);
  }
#else
  (void)rows, (void)width, (void)reduce, (void)a, (void)lda, (void)b_kn, (void)ldb, (void)b_packed,
      (void)c, (void)ldc, (void)accumulate, (void)prefetch;
  throw std::logic_error("bfloat16 dot-product kernel: not built for this CPU");
#endif
}

uint64_t MoeBf16DotTokensBytes(int64_t rows, int64_t reduce) {
  return static_cast<uint64_t>(RoundUp(rows, kTokenVector) * (reduce / 2)) * 4;
}

uint64_t MoeBf16DotBroadcastScratchBytes(int64_t rows, int64_t width) {
  return static_cast<uint64_t>(RoundUp(rows, kTokenVector) * RoundUp(width, int64_t{16})) * 4;
}

void MoeBf16DotPackTokens(int64_t rows, int64_t reduce, const void* a, int64_t lda, void* dst) {
  if (reduce % 2 != 0) throw std::logic_error("MoeBf16DotPackTokens: the reduction must be even");
#if defined(GK_BF16DOT)
  MoePackTokenWords(rows, reduce / 2, static_cast<const char*>(a), 2 * lda, static_cast<uint32_t*>(dst));
#else
  (void)rows, (void)a, (void)lda, (void)dst;
  throw std::logic_error("bfloat16 dot-product kernel: not built for this CPU");
#endif
}

void MoeBf16DotGemmBroadcastB(int64_t rows, int64_t width, int64_t reduce, const void* a_tokens,
                              const void* b, int64_t ldb, float* c, int64_t ldc, float* scratch,
                              const void* next_b, int64_t next_rows) {
  if (reduce % 2 != 0) throw std::logic_error("MoeBf16DotGemmBroadcastB: the reduction must be even");
#if defined(GK_BF16DOT)
  if (rows == 0 || width == 0) return;
  GemmBroadcastB(rows, width, reduce / 2, static_cast<const uint32_t*>(a_tokens),
                 static_cast<const uint16_t*>(b), ldb, c, ldc, scratch,
                 static_cast<const uint16_t*>(next_b), next_rows);
#else
  (void)rows, (void)width, (void)a_tokens, (void)b, (void)ldb, (void)c, (void)ldc, (void)scratch,
      (void)next_b, (void)next_rows;
  throw std::logic_error("bfloat16 dot-product kernel: not built for this CPU");
#endif
}

}  // namespace gk
