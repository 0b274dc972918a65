// gradkit's own tile GEMM: a register-blocked micro-kernel over a B packed once into column
// panels, for the CPUs where oneDNN 2.6 has no brgemm kernel (AVX2: its float32 tiles run on
// gemm:jit, which packs both operands on every call, and it has no bfloat16 GEMM at all).
// SIMD target chosen at run time (Highway), ending in a scalar fallback. (Where the CPU has
// AVX512-BF16, the tile GEMM runs streamed bfloat16 tiles on moe_grad_bf16dot.h's kernel instead,
// which shares this one's register block and prefetch stream.)
//
// Packed B: panels of PanelWidth() columns (four vectors of float32 on AVX-512, two elsewhere),
// each [reduce, PanelWidth()] row-major, float32 whatever the GEMM dtype (bfloat16 widened exactly
// once, at packing), zero past `width`: packed[(n / NR) * reduce * NR + k * NR + n % NR] = B(k, n).
// (Or, float32 B^T's rows read in place, MoeMicroGemmKN: a panel is then NR columns of those rows.)
//
// Sums: every C element is one chain of fused multiply-adds over k in ascending order, started
// from 0 (or from C with `accumulate`), whatever the row count, the row blocking and the
// reduction blocking: a call gives the same bits for a row whatever other rows it holds.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace gk {

// The register block is MoeMicroRowBlock() rows x NR columns of accumulators: 6 x 64 on AVX-512
// (24 of its 32 vector registers; the four B vectors and the broadcast A value take five more),
// 6 x 16 on AVX2 and other targets (12 of AVX2's 16).
// Reduction elements per block: the B panel's block (kMoeMicroReduceBlock x NR float32: 16 KiB on
// AVX2) stays in L1 while every row block runs over it; A's block (rows x this) stays in L2. A
// reduction is cut into equal blocks of at most this.
inline constexpr int64_t kMoeMicroReduceBlock = 256;

// The panel width NR of the target chosen at run time (16 on AVX2, 64 on AVX-512).
int64_t MoeMicroPanelWidth();
// The register block's rows on the target chosen at run time (6).
int64_t MoeMicroRowBlock();

// Bytes of B packed for `width` columns and `reduce` reduction elements.
uint64_t MoeMicroPackedBytes(int64_t width, int64_t reduce);

// Bytes of float32 scratch a call of up to `max_rows` rows needs for its A (bfloat16 A is
// widened a block of the reduction at a time; float32 A is read in place: 0).
uint64_t MoeMicroAScratchBytes(DType gemm_dtype, int64_t max_rows);

// Packs B [width, reduce] (b[n * ldb + k]) or, with `kn`, its transpose [reduce, width]
// (b[k * ldb + n]), in gemm_dtype (float32 or bfloat16), into `dst` (MoeMicroPackedBytes).
void MoeMicroPackB(DType gemm_dtype, int64_t width, int64_t reduce, const void* b, int64_t ldb,
                   bool kn, float* dst);

// Memory a call asks into the caches while it computes, spread evenly over its register blocks
// (GroupedMatmul's next weight block, cold in memory: fetched while the GEMMs run instead of
// stalling the pass that packs it): `rows` rows of `row_bytes` bytes, `stride` bytes apart, from
// `base`, `per_block` cache lines per register block, from line `byte` of row `row` on. Calls
// advance it; done once row == rows. A hint: no result changes.
struct MoeMicroPrefetch {
  const char* base = nullptr;
  int64_t rows = 0, row_bytes = 0, stride = 0;
  int64_t per_block = 0;
  int64_t row = 0, byte = 0;
};

// pf's next line asked for (prefetcht0 on x86), the cursor advanced; false (nothing asked) once
// past its rows.
inline bool MoeMicroAskNextLine(MoeMicroPrefetch* pf) {
  constexpr int64_t kLine = 64;
  if (pf->row >= pf->rows) return false;
  __builtin_prefetch(pf->base + pf->row * pf->stride + pf->byte, 0, 3);
  pf->byte += kLine;
  if (pf->byte >= pf->row_bytes) pf->byte = 0, ++pf->row;
  return true;
}

// Rows [r0, r1) of a matrix (rows `stride` bytes apart from `base`), bytes [0, bytes) of each,
// asked for one register block ahead of the kernel: A's block on the first panel's pass (often
// from memory: the tile rows of gradY), and C's rows when the kernel starts from them
// (GroupedMatmulWeightGrad's sums, the forward's k-block sums, often out of L2).
inline void MoeMicroPrefetchRows(const void* base, int64_t stride, int64_t r0, int64_t r1, int64_t bytes) {
  constexpr int64_t kLine = 64;
  for (int64_t r = r0; r < r1; ++r) {
    const char* row = static_cast<const char*>(base) + r * stride;
    for (int64_t at = 0; at < bytes; at += kLine) __builtin_prefetch(row + at, 0, 3);
    __builtin_prefetch(row + bytes - 1, 0, 3);  // the last line, when the row starts mid-line
  }
}

// C[rows, width] (row stride ldc) (+)= A[rows, reduce] (row stride lda, gemm_dtype) * B, B packed
// by MoeMicroPackB for the same width and reduce. a_scratch: MoeMicroAScratchBytes(rows) bytes.
// stream_c: C's final values are stored by non-temporal stores (no read for ownership, nothing
// left in the caches), where the target has them, C is 64-byte aligned and ldc a multiple of 16;
// fenced before the call returns. The same bits either way.
// prefetch: lines to ask for meanwhile, per_block of them before each register block (advanced).
void MoeMicroGemm(DType gemm_dtype, int64_t rows, int64_t width, int64_t reduce, const void* a,
                  int64_t lda, const float* b_packed, float* c, int64_t ldc, bool accumulate,
                  float* a_scratch, bool stream_c = false, MoeMicroPrefetch* prefetch = nullptr);

// MoeMicroGemm's float32 sums (the same bits) with B read in place, nothing packed: b_kn is B's
// transpose, [reduce, width] float32 rows of stride ldb_kn (b_kn[k * ldb_kn + n]; GroupedMatmul's
// [K, N] weights), each panel's NR values of a reduction element one contiguous run of a row.
// Every panel whole: width a multiple of MoeMicroPanelWidth() (else std::logic_error). Rows far
// apart share L1's sets, so this serves where a k-block of B is L2-resident (fetched during the
// calls before, MoeMicroPrefetch) and its rows start on 64-byte lines (a run of NR values then
// spans whole lines, not one more); see MicroTileGemm in moe_grad_gemm.cc for where it runs.
void MoeMicroGemmKN(int64_t rows, int64_t width, int64_t reduce, const float* a, int64_t lda,
                    const float* b_kn, int64_t ldb_kn, float* c, int64_t ldc, bool accumulate,
                    bool stream_c = false, MoeMicroPrefetch* prefetch = nullptr);

}  // namespace gk
