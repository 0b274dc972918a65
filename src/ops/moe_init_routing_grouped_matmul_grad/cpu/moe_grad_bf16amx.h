// The bfloat16 weights-broadcast form of the fused op's tile on AMX (Intel's tile unit, TDPBF16PS):
// the product of moe_grad_bf16dot.h's weights-broadcast form (same token panels, same scratch,
// same C), computed with the roles of that form. The weights' rows, reduction contiguous, are the
// A tiles, read where they are (16 rows x 32 reduction elements a load); an expert's gradY rows,
// packed once by MoeBf16DotPackTokens, are the B tiles (16 pairs x 16 tokens); each C tile is 16
// weight rows x 16 tokens of C transposed, turned back into C's rows by the shared 16 x 16
// register transpose. So where oneDNN's AMX brgemm needs each (expert, column block) of the weights
// packed into its VNNI layout first (at S2 a third of the op's time on an AMX Xeon), this form
// reads the weights once, in place, and packs only gradY (once per expert and thread).
//
// Sums: each C element starts from 0 and takes the reduction in steps of 32 elements in
// ascending order, one TDPBF16PS per step, as oneDNN's AMX brgemm does on a call over the same
// reduction; whether the two give the same bits on this machine and library is checked at run time
// by the caller before it takes this form (OneDnnTileGemm::has_broadcast_form), never assumed.
// x86-64 with GCC or Clang only; elsewhere MoeBf16AmxAvailable() is false.
#pragma once

#include <cstdint>

namespace gk {

// Whether this CPU and OS run the kernel: AMX-BF16 and AMX-TILE enabled by the OS (XCR0), the
// process granted the tile data state (Linux's ARCH_REQ_XCOMP_PERM, asked for once here), and
// Highway dispatching to an AVX-512 target (so that `--isa AVX2` keeps it out).
bool MoeBf16AmxAvailable();

// Whether a call of this reduction may run here: a multiple of 32 (whole tile steps).
bool MoeBf16AmxTakesReduce(int64_t reduce);

// C[rows, width] (row stride ldc) = A * B^T: A packed by MoeBf16DotPackTokens (the same rows and
// reduce), B [width, reduce] bfloat16 rows of stride ldb read in place (MoeBf16AmxTakesReduce,
// else std::logic_error). scratch: MoeBf16DotBroadcastScratchBytes(rows, width). During each
// group of 32 weight rows the next group's rows are asked for, and during the last one the first
// 32 of `next_b`'s `next_rows` rows (the caller's next block of the same stride and reduce; null:
// none). Leaves the tile unit released.
void MoeBf16AmxGemmBroadcastB(int64_t rows, int64_t width, int64_t reduce, const void* a_tokens,
                              const void* b, int64_t ldb, float* c, int64_t ldc, float* scratch,
                              const void* next_b = nullptr, int64_t next_rows = 0);

}  // namespace gk
