// gradkit's bfloat16 tile GEMM on the dot-product instruction of AVX512-BF16 (vdpbf16ps):
// register blocks of 6 rows x 64 columns of float32 accumulators, each over a whole reduction
// block of up to 2048 elements in one pass (the blocking of oneDNN's brgemm on these tiles), with
// bfloat16 operands read as they are, two reduction elements per instruction. For the CPUs that
// have the instruction but no AMX, where oneDNN 2.6's bfloat16 brgemm packs each B block in a
// pass of its own: this kernel fetches the next block while it multiplies (MoeMicroPrefetch), as
// the float32 micro-kernel does, or packs B from its [K, N] rows as it multiplies
// (MoeBf16DotGemmPackingKN), each row asked for a few ahead.
// x86-64 only; elsewhere MoeBf16DotAvailable() is false and nothing here may be called.
//
// Packed B: panels of kMoeBf16DotPanel columns; panel j holds, for each pair of reduction
// elements (2p, 2p + 1), the 64 columns' two values side by side (the instruction's pairs; a
// pair's 256 bytes contiguous, as in oneDNN's BA16a64b2a):
//   packed[j * pairs * 128 + p * 128 + (n % 64) * 2 + (k % 2)] = B(k, n), n = 64 j + n % 64,
// pairs = ceil(reduce / 2), zero past `width` and (an odd reduction) at k = reduce.
//
// Sums: every C element starts from 0 (or from C with `accumulate`) and takes the pairs in
// ascending order, each as the instruction does: c = (c + a[2p+1] b[2p+1]) + a[2p] b[2p], the
// products exact in float32, each sum rounded to nearest even, bfloat16 subnormal inputs read as
// zero and float32 subnormal results flushed to zero. An odd reduction's last pair has a zero
// second element. So a call gives the same bits for a row whatever other rows, columns or
// reduction blocks (cut at even k) it holds, and a reduction split by the caller at an even k
// continues the same chains.
#pragma once

#include <cstdint>

#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_microkernel.h"

namespace gk {

// The register block: 6 rows x 64 columns (a panel) of float32 accumulators, 24 of AVX-512's 32
// vector registers; the panel's four vectors of a pair and the broadcast A word take five more.
// Reduction elements per block: a register block runs over a whole block of the panel (up to
// 256 KiB, read from L2 by every register block after the first) before it stores C. A
// reduction is cut into equal blocks (even) of at most this.
inline constexpr int64_t kMoeBf16DotRows = 6;
inline constexpr int64_t kMoeBf16DotPanel = 64;
inline constexpr int64_t kMoeBf16DotReduceBlock = 2048;
// A call's rows are taken in chunks whose A block and C rows fit in this (held in L2 while the
// chunk's panels run over them).
inline constexpr int64_t kMoeBf16DotAChunkBytes = 256 << 10;

// Whether this CPU runs the kernel: x86-64 with AVX512-BF16, and Highway dispatching to an
// AVX-512 target (so that `--isa AVX2` and the tests that select a target keep AVX-512 out).
bool MoeBf16DotAvailable();

// Multiply-adds of one register block for a call of this reduction (the unit of
// MoeMicroPrefetch::per_block here).
int64_t MoeBf16DotBlockMacs(int64_t reduce);

// Bytes of B packed for `width` columns and `reduce` reduction elements.
uint64_t MoeBf16DotPackedBytes(int64_t width, int64_t reduce);

// Packs bfloat16 B [width, reduce] (b[n * ldb + k]) or, with `kn`, its transpose [reduce, width]
// (b[k * ldb + n]) into `dst` (MoeBf16DotPackedBytes, 64-byte aligned).
void MoeBf16DotPackB(int64_t width, int64_t reduce, const void* b, int64_t ldb, bool kn, void* dst);

// C[rows, width] (row stride ldc) (+)= A[rows, reduce] (bfloat16, row stride lda) * B, B packed by
// MoeBf16DotPackB for the same width and reduce. prefetch: lines to ask for meanwhile, per_block
// of them spread over each register block's loop (advanced).
void MoeBf16DotGemm(int64_t rows, int64_t width, int64_t reduce, const void* a, int64_t lda,
                    const void* b_packed, float* c, int64_t ldc, bool accumulate,
                    MoeMicroPrefetch* prefetch = nullptr);

// As MoeBf16DotGemm, with B packed on the way: b_kn holds B^T's rows (b_kn[k * ldb + n]), and
// the first register block of each reduction block and panel packs that part of `b_packed` (as
// MoeBf16DotPackB with kn) while it multiplies; later row blocks, and later calls on the same B,
// read what it stored. Where it packs, the register blocks after each packing one fetch the next
// panel's B^T rows meanwhile, in place of `prefetch`. The same bits as MoeBf16DotPackB then
// MoeBf16DotGemm.
void MoeBf16DotGemmPackingKN(int64_t rows, int64_t width, int64_t reduce, const void* a, int64_t lda,
                             const void* b_kn, int64_t ldb, void* b_packed, float* c, int64_t ldc,
                             bool accumulate, MoeMicroPrefetch* prefetch = nullptr);

// ---- The weights-broadcast form ----
// The same product with the operands' roles swapped, for the fused op's experts of few rows,
// whose weight blocks serve too few rows to repay packing them: A (an expert's gradY rows) is
// packed once into token panels and serves every block of weights, and B's rows (the weights,
// [K, N] rows, reduction contiguous) are read where they are, each 32-bit word (a pair) broadcast
// into the instruction against 16 tokens of a panel. The register block is
// kMoeBf16DotWeightRows weight rows x up to three vectors of 16 tokens (a token group of
// kMoeBf16DotTokenGroup); it holds C transposed, which a 16 x 16 register transpose turns back
// into C's rows at the end. Each C element is the same chain over the pairs as MoeBf16DotGemm's
// (see the top of this file: the products are exact, so which operand is broadcast changes no
// bit): the two forms give the same bits, and a caller may take either per call.
inline constexpr int64_t kMoeBf16DotWeightRows = 8;
inline constexpr int64_t kMoeBf16DotTokenGroup = 48;

// Bytes of A's rows [rows, reduce] as token panels: rows rounded up to 16, reduce even.
uint64_t MoeBf16DotTokensBytes(int64_t rows, int64_t reduce);
// Bytes of MoeBf16DotGemmBroadcastB's scratch for a call of `rows` rows and `width` columns.
uint64_t MoeBf16DotBroadcastScratchBytes(int64_t rows, int64_t width);

// Packs bfloat16 A [rows, reduce] (row stride lda; reduce even, else std::logic_error) into
// token panels at `dst` (MoeBf16DotTokensBytes): tokens (rows, zero past `rows` up to a multiple
// of 16) in groups of 48, the last one 16, 32 or 48 wide; group g (tokens 48 g ..) of width w at
// word g * 48 * pairs, its word for pair p and token t at p * w + t % 48 (the token's elements
// 2p and 2p + 1 side by side).
void MoeBf16DotPackTokens(int64_t rows, int64_t reduce, const void* a, int64_t lda, void* dst);

// C[rows, width] (row stride ldc) = A * B^T: A packed by MoeBf16DotPackTokens (the same rows and
// reduce), B [width, reduce] bfloat16 rows of stride ldb read in place (reduce even, else
// std::logic_error). scratch: MoeBf16DotBroadcastScratchBytes(rows, width), 64-byte aligned
// or not. Meanwhile the next register block's weight rows are asked for, and during the last
// one the first kMoeBf16DotWeightRows of `next_b`'s `next_rows` rows (the caller's next block of
// the same stride and reduce; null: none). The same bits as MoeBf16DotGemm without accumulate.
void MoeBf16DotGemmBroadcastB(int64_t rows, int64_t width, int64_t reduce, const void* a_tokens,
                              const void* b, int64_t ldb, float* c, int64_t ldc, float* scratch,
                              const void* next_b = nullptr, int64_t next_rows = 0);

}  // namespace gk
