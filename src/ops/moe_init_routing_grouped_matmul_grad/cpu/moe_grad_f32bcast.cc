// The float32 weights-broadcast tile (see moe_grad_f32bcast.h), in AVX-512 intrinsics: its layout
// (16-token vectors, 8 x 48 register blocks) is that of a 512-bit target, where the micro-kernel
// whose chains it repeats runs.
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_f32bcast.h"

#include <algorithm>
#include <stdexcept>

#include "core/cpu_info.h"
#include "core/plan_math.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_microkernel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if !defined(__clang__)
// GCC 12's AVX-512 intrinsics start their results from _mm512_undefined_*(), a self-initialised
// variable that -Wmaybe-uninitialized reports once the shuffles are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_broadcast_avx512.h"
#define GK_F32BCAST 1
#define GK_F32BCAST_TARGET __attribute__((target("avx512f")))
#endif

namespace gk {
namespace {

constexpr int64_t kTokenVector = 16;
constexpr int64_t kTokenGroup = kMoeF32BroadcastTokenGroup;
constexpr int kWeightRows = static_cast<int>(kMoeF32BroadcastWeightRows);

#if defined(GK_F32BCAST)
// The panels' layout is the shared packer's (moe_grad_broadcast_avx512.h).
static_assert(kTokenVector == kMoeBroadcastTokenVector && kTokenGroup == kMoeBroadcastTokenGroup);

// Reduction element k of a register block: a vector of each token panel times each weight row's
// element k, added into the block's chains.
template <int NV>
GK_F32BCAST_TARGET __attribute__((always_inline)) inline void BroadcastStep(
    int64_t k, const float* const* w, const float* panel, __m512 (&acc)[kWeightRows][NV]) {
  __m512 b[NV];
#pragma GCC unroll 3
  for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_ps(panel + k * (kTokenVector * NV) + kTokenVector * v);
#pragma GCC unroll 8
  for (int r = 0; r < kWeightRows; ++r) {
    const __m512 x = _mm512_set1_ps(w[r][k]);
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(x, b[v], acc[r][v]);
  }
}

// One register block over reduction elements [k0, k1): kWeightRows weight rows x NV token
// vectors, started from 0 or (`carry`) from ct, stored back to ct (rows ldct apart). A line of
// `next` asked for about every `every` elements.
template <int NV>
GK_F32BCAST_TARGET __attribute__((noinline)) void BroadcastTile(int64_t k0, int64_t k1,
                                                                const float* const* w_rows,
                                                                const float* panel, float* ct,
                                                                int64_t ldct, bool carry,
                                                                MoeMicroPrefetch* next, int64_t every) {
  __m512 acc[kWeightRows][NV];
#pragma GCC unroll 8
  for (int r = 0; r < kWeightRows; ++r) {
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = carry ? _mm512_loadu_ps(ct + r * ldct + kTokenVector * v) : _mm512_setzero_ps();
    }
  }
  const float* w[kWeightRows];
  for (int r = 0; r < kWeightRows; ++r) w[r] = w_rows[r];
  // Two reduction elements a turn, each chain still in ascending k (the same bits), in segments
  // of at least kSegment elements with the segment's lines of `next` asked for between them, so
  // that the loop holds its pointers only (with the countdown inside it, GCC kept three of them
  // on the stack). One-process A/B of the tile on an Ice Lake Xeon core, S3's 144 x 64 x 2048
  // and S2's 256 x 128 x 768, weights hot or streamed, ten runs: medians 1.02-1.11x (most
  // 1.05-1.10) the loop of one element with the countdown inside; two elements a turn without the
  // segments 0.99-1.05x, segments without two elements 0.95-1.01x (docs/benchmarks.md, session
  // 47). Zen 5, where auto takes this form, not measured since.
  constexpr int64_t kSegment = 32;
  const int64_t segment = RoundUp(std::max(every, kSegment), int64_t{2});
  const int64_t lines = segment / every;
  for (int64_t k = k0; k < k1;) {
    const int64_t end = std::min(k1, k + segment);
    for (; k + 2 <= end; k += 2) {
      BroadcastStep<NV>(k, w, panel, acc);
      BroadcastStep<NV>(k + 1, w, panel, acc);
    }
    if (k < end) BroadcastStep<NV>(k++, w, panel, acc);
    for (int64_t i = 0; i < lines; ++i) MoeMicroAskNextLine(next);
  }
#pragma GCC unroll 8
  for (int r = 0; r < kWeightRows; ++r) {
#pragma GCC unroll 3
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(ct + r * ldct + kTokenVector * v, acc[r][v]);
  }
}

GK_F32BCAST_TARGET void GemmBroadcastB(int64_t rows, int64_t width, int64_t reduce, const float* a_tokens,
                                       const float* b, int64_t ldb, float* c, int64_t ldc, float* ct,
                                       const float* next_b, int64_t next_rows) {
  const int64_t tokens = RoundUp(rows, kTokenVector);
  const int64_t groups = CeilDiv(tokens, kTokenGroup);
  // Reduction chunks whose panels fit kMoeF32BroadcastChunkBytes, equal, multiples of 16.
  const int64_t most = std::max<int64_t>(16, static_cast<int64_t>(kMoeF32BroadcastChunkBytes) / (4 * tokens) / 16 * 16);
  const int64_t chunk = RoundUp(CeilDiv(reduce, CeilDiv(reduce, most)), int64_t{16});
  for (int64_t k0 = 0; k0 < reduce; k0 += chunk) {
    const int64_t k1 = std::min(reduce, k0 + chunk);
    for (int64_t n0 = 0; n0 < width; n0 += kWeightRows) {
      // Past the width, the last row again (its sums land in rows of ct never read).
      const float* w_rows[kWeightRows];
      for (int r = 0; r < kWeightRows; ++r) w_rows[r] = b + std::min<int64_t>(n0 + r, width - 1) * ldb;
      // Asked for meanwhile: the next register block's rows of this chunk, then the next chunk's
      // first rows, then the caller's next block's.
      MoeMicroPrefetch next{};
      if (n0 + kWeightRows < width) {
        next = {reinterpret_cast<const char*>(b + (n0 + kWeightRows) * ldb + k0),
                std::min<int64_t>(kWeightRows, width - n0 - kWeightRows), 4 * (k1 - k0), 4 * ldb};
      } else if (k1 < reduce) {
        next = {reinterpret_cast<const char*>(b + k1), std::min<int64_t>(kWeightRows, width),
                4 * (std::min(reduce, k1 + chunk) - k1), 4 * ldb};
      } else if (next_b != nullptr) {
        next = {reinterpret_cast<const char*>(next_b), std::min<int64_t>(kWeightRows, next_rows),
                4 * std::min(reduce, chunk), 4 * ldb};
      }
      const int64_t lines = next.rows * CeilDiv(next.row_bytes, int64_t{64});
      const int64_t every = lines > 0 ? std::max<int64_t>(1, groups * (k1 - k0) / lines) : k1 - k0 + 1;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t vectors = std::min<int64_t>(3, (tokens - g * kTokenGroup) / kTokenVector);
        const float* panel = a_tokens + g * kTokenGroup * reduce;
        float* out = ct + n0 * tokens + g * kTokenGroup;
        const bool carry = k0 > 0;
        if (vectors == 3) {
          BroadcastTile<3>(k0, k1, w_rows, panel, out, tokens, carry, &next, every);
        } else if (vectors == 2) {
          BroadcastTile<2>(k0, k1, w_rows, panel, out, tokens, carry, &next, every);
        } else {
          BroadcastTile<1>(k0, k1, w_rows, panel, out, tokens, carry, &next, every);
        }
      }
    }
  }
  MoeStoreTransposedTile(rows, width, ct, RoundUp(width, int64_t{kWeightRows}), tokens, c, ldc);
}
#endif  // GK_F32BCAST

}  // namespace

bool MoeF32BroadcastAvailable() {
#if defined(GK_F32BCAST)
  return ChosenIsa().rfind("AVX3", 0) == 0;
#else
  return false;
#endif
}

uint64_t MoeF32TokensBytes(int64_t rows, int64_t reduce) {
  return static_cast<uint64_t>(RoundUp(rows, kTokenVector) * reduce) * 4;
}

uint64_t MoeF32BroadcastScratchBytes(int64_t rows, int64_t width) {
  return static_cast<uint64_t>(RoundUp(rows, kTokenVector) * RoundUp(width, int64_t{16})) * 4;
}

void MoeF32PackTokens(int64_t rows, int64_t reduce, const float* a, int64_t lda, float* dst) {
#if defined(GK_F32BCAST)
  MoePackTokenWords(rows, reduce, reinterpret_cast<const char*>(a), 4 * lda, reinterpret_cast<uint32_t*>(dst));
#else
  (void)rows, (void)reduce, (void)a, (void)lda, (void)dst;
  throw std::logic_error("float32 weights-broadcast kernel: not built for this CPU");
#endif
}

void MoeF32GemmBroadcastB(int64_t rows, int64_t width, int64_t reduce, const float* a_tokens,
                          const float* b, int64_t ldb, float* c, int64_t ldc, float* scratch,
                          const float* next_b, int64_t next_rows) {
#if defined(GK_F32BCAST)
  if (rows == 0 || width == 0) return;
  if (reduce == 0) {
    for (int64_t r = 0; r < rows; ++r) std::fill(c + r * ldc, c + r * ldc + width, 0.0f);
    return;
  }
  GemmBroadcastB(rows, width, reduce, a_tokens, b, ldb, c, ldc, scratch, next_b, next_rows);
#else
  (void)rows, (void)width, (void)reduce, (void)a_tokens, (void)b, (void)ldb, (void)c, (void)ldc,
      (void)scratch, (void)next_b, (void)next_rows;
  throw std::logic_error("float32 weights-broadcast kernel: not built for this CPU");
#endif
}

}  // namespace gk
