// The float32 weights-broadcast form of the fused op's tile (C[rows, width] = A * B^T, A the
// expert's gradY rows, B's rows its weights in [K, N] storage, the reduction contiguous in both),
// for experts of few rows, whose weight blocks serve too few rows to repay packing them: A is
// packed once into token panels and serves every block of the expert's weights, and B's rows are
// read where they are, each float32 broadcast into a fused multiply-add against 16 tokens of a
// panel. The register block is kMoeF32BroadcastWeightRows weight rows x up to three vectors of 16
// tokens (a token group of kMoeF32BroadcastTokenGroup) and holds C transposed; a 16 x 16 register
// transpose turns it back into C's rows at the end. The reduction runs in chunks whose token
// panels stay in L2 (kMoeF32BroadcastChunkBytes), each chunk's sums carried to the next in C^T.
//
// Sums: every C element is one chain of fused multiply-adds over k in ascending order from 0:
// the chains of gradkit's micro-kernel on its AVX-512 target (moe_grad_microkernel.h), so the two
// give the same bits and a caller may take either per call. Not those of oneDNN's brgemm.
//
// x86-64 with the AVX-512 target chosen (MoeF32BroadcastAvailable); elsewhere nothing here may
// be called.
#pragma once

#include <cstdint>

namespace gk {

inline constexpr int64_t kMoeF32BroadcastWeightRows = 8;
inline constexpr int64_t kMoeF32BroadcastTokenGroup = 48;
// The token panels of one reduction chunk: kept in a 1 MiB L2 beside the weight rows streaming
// past them (S3: 137 rows, 1.1 MB of float32 panels, in two chunks of 1024).
inline constexpr uint64_t kMoeF32BroadcastChunkBytes = 640u << 10;

// Whether this CPU runs the kernel: x86-64 with Highway dispatching to an AVX-512 target (where
// the micro-kernel's float32 chains are the same fused multiply-adds).
bool MoeF32BroadcastAvailable();

// Bytes of A [rows, reduce] as token panels: rows rounded up to 16.
uint64_t MoeF32TokensBytes(int64_t rows, int64_t reduce);
// Bytes of MoeF32GemmBroadcastB's scratch for a call of `rows` rows and `width` columns.
uint64_t MoeF32BroadcastScratchBytes(int64_t rows, int64_t width);

// Packs float32 A [rows, reduce] (row stride lda) into token panels at `dst` (MoeF32TokensBytes):
// tokens (rows, zero past `rows` up to a multiple of 16) in groups of 48, the last one 16, 32 or
// 48 wide; group g (tokens 48 g ..) of width w at element g * 48 * reduce, its value for k and
// token t at k * w + t % 48.
void MoeF32PackTokens(int64_t rows, int64_t reduce, const float* a, int64_t lda, float* dst);

// C[rows, width] (row stride ldc) = A * B^T: A packed by MoeF32PackTokens (the same rows and
// reduce), B [width, reduce] float32 rows of stride ldb read in place. scratch:
// MoeF32BroadcastScratchBytes(rows, width). Meanwhile the next register block's weight rows are
// asked for, and during the last one the first kMoeF32BroadcastWeightRows of `next_b`'s
// `next_rows` rows (the caller's next block of the same stride and reduce; null: none).
void MoeF32GemmBroadcastB(int64_t rows, int64_t width, int64_t reduce, const float* a_tokens,
                          const float* b, int64_t ldb, float* c, int64_t ldc, float* scratch,
                          const float* next_b = nullptr, int64_t next_rows = 0);

}  // namespace gk
