// gradkit's own tile GEMM (see moe_grad_microkernel.h), compiled once per Highway target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_microkernel.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "core/cpu/convert-inl.h"
#include "core/cpu/stream_copy.h"
#include "core/cpu/transpose-inl.h"
#include "core/plan_math.h"

#ifndef GK_MOE_MICROKERNEL_CONSTANTS
#define GK_MOE_MICROKERNEL_CONSTANTS
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_microkernel.h"
namespace gk {
namespace {
constexpr int64_t kKc = kMoeMicroReduceBlock;
// What a call's A block and C rows may take of L2 (half of a 512 KiB L2).
constexpr int64_t kL2Bytes = 256 << 10;
// Columns gathered together when B is packed from its [width, reduce] rows (one 32-bit gather).
constexpr int64_t kGatherRows = 8;
constexpr int64_t kPrefetchBytes = 512;
}  // namespace
}  // namespace gk
#endif

HWY_BEFORE_NAMESPACE();
namespace gk {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The register block: kMicroRows rows x kMicroVecs vectors of accumulators. 6 x 4 (64 float32
// columns) where the target has 32 vector registers (24 accumulators, the 4 B vectors of a
// reduction element, the broadcast), 6 x 2 on AVX2's 16 (12 + 2 + 1). Per 24 multiply-adds AVX-512
// loads 4 B vectors and broadcasts 6 A values, where 12 x 2 (sessions 33-42) took 2 and 12: on a
// hot tile 1.02-1.06x (fused S3's 137 x 64 x 2048 and the weight grad's 256 x 128 x 256), and a
// prototype of it 1.47x while a copy ran on the other core, where the 12-row block slowed to 0.7
// of itself; the weight grad's float32 S1-S4 85-91 -> 91-107% of dense (same bits;
// docs/benchmarks.md, session 43). Six rows also keep a C of rows more than 4 KiB apart out of
// trouble: its rows' lines share few of L1's sets (48 KiB, 12 ways), and 12 rows' 24 lines
// measured 4-5 points of dense slower in the weight grad (session 33).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kMicroVecs = 4;
#else
constexpr int kMicroVecs = 2;
#endif
constexpr int kMicroRows = 6;

HWY_NOINLINE int64_t MicroPanelWidth() {
  return kMicroVecs * static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
}

HWY_NOINLINE int64_t MicroRowBlock() { return kMicroRows; }

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// float32 columns [0, 8 * (cols / 8)) of a panel from B's rows by 8 x 8 register transposes
// (Transpose8x8Words): 8 rows read side by side, 8 values of each per step. Returns the columns
// done.
HWY_INLINE int64_t PackPanelFromRowsF32x8(const uint8_t* b, int64_t row_bytes, int64_t n0,
                                          int64_t cols, int64_t reduce, int64_t nr, float* panel) {
  int64_t n = 0;
  for (; n + 8 <= cols; n += 8) {
    const uint32_t* row[8];
    for (int r = 0; r < 8; ++r) row[r] = reinterpret_cast<const uint32_t*>(b + (n0 + n + r) * row_bytes);
    int64_t k = 0;
    for (; k + 8 <= reduce; k += 8) {
      if (k % 16 == 0) {  // weights often come cold: each row's bytes ahead
        for (int r = 0; r < 8; ++r) hwy::Prefetch(row[r] + k + kPrefetchBytes / 4);
      }
      Transpose8x8Words(row, k, reinterpret_cast<uint32_t*>(panel + k * nr + n), nr);
    }
    for (; k < reduce; ++k) {
      for (int r = 0; r < 8; ++r) std::memcpy(panel + k * nr + n + r, row[r] + k, 4);
    }
  }
  return n;
}
#endif

// One panel (up to NR columns starting at n0) from B's [width, reduce] rows: column n's row is
// read from start to end, kGatherRows rows at a time, one 32-bit gather per reduction element
// (float32) or pair of elements (bfloat16, split into the two float32 values).
template <class Storage>
void PackPanelFromRows(const uint8_t* b, int64_t row_bytes, int64_t n0, int64_t cols,
                       int64_t reduce, int64_t nr, float* panel) {
  constexpr bool kBf16 = std::is_same_v<Storage, Bf16Storage>;
  constexpr int64_t kElem = kBf16 ? 2 : 4;
  const hn::CappedTag<uint32_t, kGatherRows> du;
  const hn::RebindToSigned<decltype(du)> di;
  const hn::Rebind<float, decltype(du)> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(du));
  const auto scalar = [&](int64_t n, int64_t k) {
    const uint8_t* at = b + (n0 + n) * row_bytes + k * kElem;
    if constexpr (kBf16) {
      uint16_t bits;
      std::memcpy(&bits, at, 2);
      return F32FromBf16(bits);
    } else {
      float value;
      std::memcpy(&value, at, 4);
      return value;
    }
  };
  int64_t n = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  if constexpr (!kBf16) n = PackPanelFromRowsF32x8(b, row_bytes, n0, cols, reduce, nr, panel);
#endif
  if (lanes * row_bytes <= INT32_MAX) {
    const auto offsets = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(row_bytes)));
    const int64_t pairs = kBf16 ? reduce / 2 : reduce;  // 32-bit words wholly inside each row
    for (; n + lanes <= cols; n += lanes) {
      const uint8_t* rows = b + (n0 + n) * row_bytes;
      for (int64_t w = 0; w < pairs; ++w) {
        if (w % 16 == 0) {  // weights often come cold: each row's bytes ahead
          for (int64_t r = 0; r < lanes; ++r) hwy::Prefetch(rows + r * row_bytes + w * 4 + kPrefetchBytes);
        }
        const auto word = hn::GatherOffset(du, reinterpret_cast<const uint32_t*>(rows + w * 4), offsets);
        if constexpr (kBf16) {
          hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(word)), df, panel + 2 * w * nr + n);
          hn::StoreU(hn::BitCast(df, hn::And(word, hn::Set(du, 0xffff0000u))), df,
                     panel + (2 * w + 1) * nr + n);
        } else {
          hn::StoreU(hn::BitCast(df, word), df, panel + w * nr + n);
        }
      }
      for (int64_t k = kBf16 ? 2 * pairs : pairs; k < reduce; ++k) {
        for (int64_t q = 0; q < lanes; ++q) panel[k * nr + n + q] = scalar(n + q, k);
      }
    }
  }
  for (; n < cols; ++n) {
    for (int64_t k = 0; k < reduce; ++k) panel[k * nr + n] = scalar(n, k);
  }
}

// One panel from B's transpose, [reduce, width] rows: each reduction element's NR values are
// consecutive there.
template <class Storage>
void PackPanelFromKN(const typename Storage::Lane* b, int64_t ldb, int64_t n0, int64_t cols,
                     int64_t reduce, int64_t nr, float* panel) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t k = 0; k < reduce; ++k) {
    const typename Storage::Lane* row = b + k * ldb + n0;
    float* out = panel + k * nr;
    int64_t n = 0;
    for (; n + lanes <= cols; n += lanes) hn::StoreU(LoadAsF32<Storage>(df, row + n), df, out + n);
    for (; n < cols; ++n) {
      if constexpr (std::is_same_v<Storage, Bf16Storage>) {
        out[n] = F32FromBf16(reinterpret_cast<const uint16_t*>(row)[n]);
      } else {
        out[n] = row[n];
      }
    }
  }
}

// B^T's rows in blocks of kKnRows, each block into every panel in turn: a row is read once,
// from start to end, while the next block's rows are fetched ahead (a panel at a time over the
// whole reduction would read one line per row, each row on its own page: DRAM latency and a
// TLB miss per line for weights of long rows, 40% of GroupedMatmul's time at S3).
constexpr int64_t kKnRows = 16;
template <class Storage>
void PackFromKN(const typename Storage::Lane* b, int64_t ldb, int64_t width, int64_t reduce,
                int64_t nr, float* dst) {
  constexpr int64_t kLine = 64;
  const int64_t row_bytes = width * static_cast<int64_t>(sizeof(typename Storage::Lane));
  for (int64_t k0 = 0; k0 < reduce; k0 += kKnRows) {
    const int64_t k1 = std::min(reduce, k0 + kKnRows);
    for (int64_t k = k1; k < std::min(reduce, k1 + kKnRows); ++k) {
      const auto* row = reinterpret_cast<const uint8_t*>(b + k * ldb);
      for (int64_t at = 0; at < row_bytes; at += kLine) hwy::Prefetch(row + at);
    }
    for (int64_t n0 = 0; n0 < width; n0 += nr) {
      PackPanelFromKN<Storage>(b + k0 * ldb, ldb, n0, std::min(nr, width - n0), k1 - k0, nr,
                               dst + n0 * reduce + k0 * nr);
    }
  }
}

template <class Storage>
void PackB(int64_t width, int64_t reduce, const void* b, int64_t ldb, bool kn, float* dst) {
  const int64_t nr = MicroPanelWidth();
  const int64_t elem = sizeof(typename Storage::Lane);
  for (int64_t n0 = 0; n0 < width; n0 += nr) {
    const int64_t cols = std::min(nr, width - n0);
    float* panel = dst + n0 * reduce;  // = (n0 / nr) * reduce * nr
    if (cols < nr) {
      for (int64_t k = 0; k < reduce; ++k) std::fill(panel + k * nr + cols, panel + (k + 1) * nr, 0.0f);
    }
    if (!kn) {
      PackPanelFromRows<Storage>(static_cast<const uint8_t*>(b), ldb * elem, n0, cols, reduce, nr,
                                 panel);
    }
  }
  if (kn) PackFromKN<Storage>(static_cast<const typename Storage::Lane*>(b), ldb, width, reduce, nr, dst);
}

HWY_NOINLINE void MicroPackB(DType gemm_dtype, int64_t width, int64_t reduce, const void* b,
                             int64_t ldb, bool kn, float* dst) {
  if (gemm_dtype == DType::kBF16) {
    PackB<Bf16Storage>(width, reduce, b, ldb, kn, dst);
  } else {
    PackB<F32Storage>(width, reduce, b, ldb, kn, dst);
  }
}

// The next per_block lines of pf (none without it), asked for before a register block runs,
// where the kernel's loop had no register left for them (12 rows' pointers of any stride, in
// session 34's 12 x 32 block: a prefetch stream inside that loop spilled a B vector to the stack,
// S3 65-73% of dense against 78-83 on oneDNN; not tried again on the 6 x 64 block). Blocks of A
// rows 256 floats apart (kMoeMicroReduceBlock: the forward's dense k-blocks) ask for them inside
// the loop instead (MicroTile's kLda).
HWY_INLINE void PrefetchNext(MoeMicroPrefetch* pf) {
  for (int64_t n = 0; pf != nullptr && n < pf->per_block && MoeMicroAskNextLine(pf); ++n) {
  }
}

// Reduction element k of a register block: the panel's NR values at b_k times each row's A value
// (a_k[r * lda]), added into acc. The loops over rows and vectors here and in MicroTile are
// unrolled by pragma: left to GCC 12, it kept the 6 x 4 accumulators on the stack between tiles
// (stored and reloaded around each tile's loop, 0.93 of a hand-written tile; session 43).
template <int MR, class D, class V>
HWY_INLINE void MicroStep(D df, const float* HWY_RESTRICT b_k, const float* HWY_RESTRICT a_k,
                          int64_t lda, V (&acc)[MR][kMicroVecs]) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  V b[kMicroVecs];
#pragma GCC unroll 4
  for (int v = 0; v < kMicroVecs; ++v) b[v] = hn::LoadU(df, b_k + v * lanes);
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    const V av = hn::Set(df, a_k[r * lda]);
#pragma GCC unroll 4
    for (int v = 0; v < kMicroVecs; ++v) acc[r][v] = hn::MulAdd(av, b[v], acc[r][v]);
  }
}

// C[MR, NR] (+)= A[MR, kc] (row stride lda) * panel[kc, NR] (row stride panel_ld: NR packed,
// B^T's row stride read in place): MR x kMicroVecs accumulator vectors, one fused multiply-add
// chain per element over k ascending.
// With `stream`, C's rows go out by non-temporal stores (each row's NR values whole lines of an
// aligned C, see MicroGemm).
// kLda > 0: A's row stride is kLda (lda ignored): the rows are read at constant offsets from one
// pointer, which leaves registers for pf's lines, asked for inside the loop (its per_block of
// them, one every kc / per_block steps).
template <int MR, int64_t kLda = 0>
HWY_NOINLINE void MicroTile(int64_t kc, const float* HWY_RESTRICT a, int64_t lda,
                            const float* HWY_RESTRICT panel, int64_t panel_ld,
                            float* HWY_RESTRICT c, int64_t ldc, bool load_c, bool stream = false,
                            MoeMicroPrefetch* pf = nullptr) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  V acc[MR][kMicroVecs];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kMicroVecs; ++v) {
      acc[r][v] = load_c ? hn::LoadU(df, c + r * ldc + v * lanes) : hn::Zero(df);
    }
  }
  if constexpr (kLda > 0) {
    int64_t k = 0;
    if (pf != nullptr && pf->per_block > 0) {
      const int64_t every = std::max<int64_t>(1, kc / pf->per_block);
      for (int64_t n = 0; n < pf->per_block && MoeMicroAskNextLine(pf); ++n) {
        for (const int64_t k1 = std::min(kc, k + every); k < k1; ++k) {
          MicroStep<MR>(df, panel + k * panel_ld, a + k, kLda, acc);
        }
      }
    }
    for (; k < kc; ++k) MicroStep<MR>(df, panel + k * panel_ld, a + k, kLda, acc);
  } else {
    for (int64_t k = 0; k < kc; ++k) MicroStep<MR>(df, panel + k * panel_ld, a + k, lda, acc);
  }
  if (stream) {
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
      for (int v = 0; v < kMicroVecs; ++v) hn::Stream(acc[r][v], df, c + r * ldc + v * lanes);
    }
    return;
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kMicroVecs; ++v) hn::StoreU(acc[r][v], df, c + r * ldc + v * lanes);
  }
}

template <int MR>
HWY_NOINLINE void MicroBlockNarrow(int64_t kc, const float* a, int64_t lda, const float* panel,
                                   int64_t panel_ld, float* c, int64_t ldc, int64_t cols,
                                   bool load_c, MoeMicroPrefetch* pf);

// A register block of MR rows and `cols` <= NR columns: a narrower panel runs through a local
// tile (its padding columns are zeros in the panel, their sums dropped; C by plain stores).
template <int MR>
HWY_INLINE void MicroBlock(int64_t kc, const float* a, int64_t lda, const float* panel,
                           int64_t panel_ld, float* c, int64_t ldc, int64_t cols, bool load_c,
                           bool stream, MoeMicroPrefetch* pf) {
  if (cols == MicroPanelWidth()) {
    if constexpr (MR == kMicroRows) {
      if (pf != nullptr && lda == kKc) {  // rows at constant offsets: the stream in the loop
        MicroTile<MR, kKc>(kc, a, lda, panel, panel_ld, c, ldc, load_c, stream, pf);
        return;
      }
    }
    PrefetchNext(pf);
    MicroTile<MR>(kc, a, lda, panel, panel_ld, c, ldc, load_c, stream);
  } else {
    MicroBlockNarrow<MR>(kc, a, lda, panel, panel_ld, c, ldc, cols, load_c, pf);
  }
}

template <int MR>
HWY_NOINLINE void MicroBlockNarrow(int64_t kc, const float* a, int64_t lda, const float* panel,
                                   int64_t panel_ld, float* c, int64_t ldc, int64_t cols,
                                   bool load_c, MoeMicroPrefetch* pf) {
  const int64_t nr = MicroPanelWidth();
  HWY_ALIGN float tile[kMicroRows * kMicroVecs * HWY_LANES(float)] = {};
  for (int r = 0; r < MR && load_c; ++r) std::memcpy(tile + r * nr, c + r * ldc, cols * sizeof(float));
  PrefetchNext(pf);
  MicroTile<MR>(kc, a, lda, panel, panel_ld, tile, nr, load_c);
  for (int r = 0; r < MR; ++r) std::memcpy(c + r * ldc, tile + r * nr, cols * sizeof(float));
}

// Rows [0, rows) of a call (one chunk of MicroGemm's): the reduction in blocks of kc_base, each
// block's panels in turn over every row block. b_ld 0: b packed (panels); else b is B^T's float32
// rows of that stride, read in place (whole panels only).
HWY_NOINLINE void MicroGemmRows(DType gemm_dtype, int64_t rows, int64_t width, int64_t reduce,
                                int64_t kc_base, const void* a, int64_t lda, const float* b,
                                int64_t b_ld, float* c, int64_t ldc, bool accumulate,
                                float* a_scratch, bool stream_c, MoeMicroPrefetch* pf) {
  const hn::ScalableTag<float> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t nr = kMicroVecs * lanes;
  const int64_t k_blocks = CeilDiv(reduce, kc_base);
  for (int64_t kb = 0; kb < k_blocks; ++kb) {
    const int64_t k0 = kb * kc_base;
    const int64_t kc = std::min(kc_base, reduce - k0);
    const float* a_block;
    int64_t a_ld;
    if (gemm_dtype == DType::kBF16) {
      // Widened once per block for every panel: a broadcast from bfloat16 costs three
      // instructions more per element than one from float32.
      const auto* src = static_cast<const hwy::bfloat16_t*>(a);
      for (int64_t r = 0; r < rows; ++r) {
        const hwy::bfloat16_t* in = src + r * lda + k0;
        float* out = a_scratch + r * kc;
        int64_t k = 0;
        for (; k + lanes <= kc; k += lanes) hn::StoreU(LoadAsF32<Bf16Storage>(df, in + k), df, out + k);
        for (; k < kc; ++k) out[k] = F32FromBf16(reinterpret_cast<const uint16_t*>(in)[k]);
      }
      a_block = a_scratch;
      a_ld = kc;
    } else {
      a_block = static_cast<const float*>(a) + k0;
      a_ld = lda;
    }
    const bool load_c = accumulate || kb > 0;
    const bool stream = stream_c && kb == k_blocks - 1;  // C's final values
    for (int64_t n0 = 0; n0 < width; n0 += nr) {
      const float* panel = b_ld > 0 ? b + k0 * b_ld + n0 : b + n0 * reduce + k0 * nr;
      const int64_t panel_ld = b_ld > 0 ? b_ld : nr;
      const int64_t cols = std::min(nr, width - n0);
      // Blocks of kMicroRows rows; a remainder of 1 to 3 rows takes the last full block with it,
      // and what is left runs in blocks of 4 + 3, 4 + 4 or 4 + 5 for 7 to 9 rows: blocks of fewer
      // than 4 rows have too few accumulators to hide the latency of their multiply-adds (on
      // AVX2's 2 vectors a row).
      constexpr int64_t block = kMicroRows;
      int64_t full = rows / block;
      const int64_t rest = rows % block;
      if (full > 0 && rest > 0 && rest < 4) --full;
      for (int64_t b = 0; b < full; ++b) {
        const int64_t r0 = b * block;
        if (n0 == 0) MoeMicroPrefetchRows(a_block, a_ld * 4, r0 + block, std::min(rows, r0 + 2 * block), kc * 4);
        if (load_c) MoeMicroPrefetchRows(c + n0, ldc * 4, r0 + block, std::min(rows, r0 + 2 * block), cols * 4);
        MicroBlock<kMicroRows>(kc, a_block + r0 * a_ld, a_ld, panel, panel_ld, c + r0 * ldc + n0, ldc, cols,
                               load_c, stream, pf);
      }
      int64_t r0 = full * block;
      while (r0 < rows) {
        const int64_t left = rows - r0;
        const int64_t mr = left >= 7 ? 4 : left;
        const float* a_rest = a_block + r0 * a_ld;
        float* c_rest = c + r0 * ldc + n0;
        switch (mr) {
          case 5: MicroBlock<5>(kc, a_rest, a_ld, panel, panel_ld, c_rest, ldc, cols, load_c, stream, pf); break;
          case 4: MicroBlock<4>(kc, a_rest, a_ld, panel, panel_ld, c_rest, ldc, cols, load_c, stream, pf); break;
          case 3: MicroBlock<3>(kc, a_rest, a_ld, panel, panel_ld, c_rest, ldc, cols, load_c, stream, pf); break;
          case 2: MicroBlock<2>(kc, a_rest, a_ld, panel, panel_ld, c_rest, ldc, cols, load_c, stream, pf); break;
          default: MicroBlock<1>(kc, a_rest, a_ld, panel, panel_ld, c_rest, ldc, cols, load_c, stream, pf); break;
        }
        r0 += mr;
      }
    }
  }
}


HWY_NOINLINE void MicroGemm(DType gemm_dtype, int64_t rows, int64_t width, int64_t reduce,
                            const void* a, int64_t lda, const float* b, int64_t b_ld, float* c,
                            int64_t ldc, bool accumulate, float* a_scratch, bool stream_c,
                            MoeMicroPrefetch* pf) {
  if (reduce == 0) {
    for (int64_t r = 0; r < rows && !accumulate; ++r) std::fill(c + r * ldc, c + r * ldc + width, 0.0f);
    return;
  }
  const int64_t k_blocks = CeilDiv(reduce, kKc);
  const int64_t kc_base = CeilDiv(reduce, k_blocks);
  // Rows in chunks whose A block and C rows stay in L2 together (kL2Bytes) while the panels run
  // over them, equal-sized, multiples of the register block.
  // Streamed only where every whole panel's rows are whole aligned lines of C (a panel is a
  // multiple of 16 floats, 64 bytes, on every target but the scalar one).
  const int64_t line_floats = static_cast<int64_t>(kStreamLineBytes / sizeof(float));
  stream_c = stream_c && kHasStreamingStores && MicroPanelWidth() % line_floats == 0 &&
             reinterpret_cast<uintptr_t>(c) % kStreamLineBytes == 0 && ldc % line_floats == 0;
  const int64_t block = kMicroRows;
  const int64_t most = std::max<int64_t>(
      block, kL2Bytes / (static_cast<int64_t>(sizeof(float)) * (kc_base + width)) / block * block);
  const int64_t chunks = CeilDiv(rows, most);
  const int64_t chunk_rows = RoundUp(CeilDiv(rows, chunks), block);
  const int64_t elem = gemm_dtype == DType::kBF16 ? 2 : 4;
  for (int64_t m0 = 0; m0 < rows; m0 += chunk_rows) {
    MicroGemmRows(gemm_dtype, std::min(chunk_rows, rows - m0), width, reduce, kc_base,
                  static_cast<const char*>(a) + m0 * lda * elem, lda, b, b_ld, c + m0 * ldc, ldc,
                  accumulate, a_scratch, stream_c, pf);
  }
  if (stream_c) hwy::FlushStream();  // ordered before whatever the caller does next
}

}  // namespace HWY_NAMESPACE
}  // namespace gk
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gk {

HWY_EXPORT(MicroPanelWidth);
HWY_EXPORT(MicroRowBlock);
HWY_EXPORT(MicroPackB);
HWY_EXPORT(MicroGemm);

int64_t MoeMicroPanelWidth() { return HWY_DYNAMIC_DISPATCH(MicroPanelWidth)(); }
int64_t MoeMicroRowBlock() { return HWY_DYNAMIC_DISPATCH(MicroRowBlock)(); }

uint64_t MoeMicroPackedBytes(int64_t width, int64_t reduce) {
  const int64_t nr = MoeMicroPanelWidth();
  return static_cast<uint64_t>(RoundUp(width, nr) * reduce) * sizeof(float);
}

uint64_t MoeMicroAScratchBytes(DType gemm_dtype, int64_t max_rows) {
  return gemm_dtype == DType::kBF16 ? static_cast<uint64_t>(max_rows * kKc) * sizeof(float) : 0;
}

void MoeMicroPackB(DType gemm_dtype, int64_t width, int64_t reduce, const void* b, int64_t ldb,
                   bool kn, float* dst) {
  HWY_DYNAMIC_DISPATCH(MicroPackB)(gemm_dtype, width, reduce, b, ldb, kn, dst);
}

void MoeMicroGemm(DType gemm_dtype, int64_t rows, int64_t width, int64_t reduce, const void* a,
                  int64_t lda, const float* b_packed, float* c, int64_t ldc, bool accumulate,
                  float* a_scratch, bool stream_c, MoeMicroPrefetch* prefetch) {
  HWY_DYNAMIC_DISPATCH(MicroGemm)(gemm_dtype, rows, width, reduce, a, lda, b_packed, 0, c, ldc,
                                  accumulate, a_scratch, stream_c, prefetch);
}

void MoeMicroGemmKN(int64_t rows, int64_t width, int64_t reduce, const float* a, int64_t lda,
                    const float* b_kn, int64_t ldb_kn, float* c, int64_t ldc, bool accumulate,
                    bool stream_c, MoeMicroPrefetch* prefetch) {
  if (width % MoeMicroPanelWidth() != 0 || ldb_kn < width) {
    throw std::logic_error("MoeMicroGemmKN: whole panels of B^T rows only");
  }
  HWY_DYNAMIC_DISPATCH(MicroGemm)(DType::kF32, rows, width, reduce, a, lda, b_kn, ldb_kn, c, ldc,
                                  accumulate, nullptr, stream_c, prefetch);
}

}  // namespace gk
#endif  // HWY_ONCE
