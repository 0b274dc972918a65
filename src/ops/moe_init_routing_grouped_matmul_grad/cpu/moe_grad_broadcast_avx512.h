// What the two weights-broadcast kernels share (moe_grad_bf16dot.cc's bfloat16 form and
// moe_grad_f32bcast.cc's float32 one): token panels of 32-bit words (a bfloat16 pair or a
// float32) packed from gradY's rows, and C's rows written from the transposed sums their register
// blocks hold; both through 16 x 16 register transposes. x86-64 with GCC or Clang only; included
// inside each file's AVX-512 section.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/plan_math.h"

namespace gk {

// Tokens (rows of A) of a panel vector, and of a register block's group.
inline constexpr int64_t kMoeBroadcastTokenVector = 16;
inline constexpr int64_t kMoeBroadcastTokenGroup = 48;

// Row i of `r` in, column i out.
__attribute__((target("avx512f"), always_inline)) inline void MoeTransposeWords16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD);
  }
}

// `rows` rows of `words` 32-bit words (row_bytes apart from `a`, any alignment) into token panels:
// tokens (zero past `rows` up to a multiple of 16) in groups of 48, the last one 16, 32 or 48
// wide; group g (tokens 48 g ..) of width w at word g * 48 * words, token t's word p at p * w +
// t % 48. 16 rows x 16 words at a time through a register transpose, the words past the last
// multiple of 16 one by one.
__attribute__((target("avx512f"))) inline void MoePackTokenWords(int64_t rows, int64_t words, const char* a,
                                                               int64_t row_bytes, uint32_t* dst) {
  const int64_t tokens = RoundUp(rows, kMoeBroadcastTokenVector);
  for (int64_t t0 = 0; t0 < tokens; t0 += kMoeBroadcastTokenVector) {
    const int64_t g0 = t0 / kMoeBroadcastTokenGroup * kMoeBroadcastTokenGroup;
    const int64_t group_width = std::min(kMoeBroadcastTokenGroup, tokens - g0);
    uint32_t* out = dst + g0 * words + (t0 - g0);
    const int64_t valid = std::min(kMoeBroadcastTokenVector, rows - t0);
    int64_t p0 = 0;
    for (; p0 + 16 <= words; p0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        r[i] = i < valid ? _mm512_loadu_si512(a + (t0 + i) * row_bytes + 4 * p0) : _mm512_setzero_si512();
      }
      MoeTransposeWords16(r);
      for (int j = 0; j < 16; ++j) _mm512_storeu_si512(out + (p0 + j) * group_width, r[j]);
    }
    for (; p0 < words; ++p0) {
      for (int64_t i = 0; i < kMoeBroadcastTokenVector; ++i) {
        uint32_t word = 0;
        if (i < valid) std::memcpy(&word, a + (t0 + i) * row_bytes + 4 * p0, 4);
        out[p0 * group_width + i] = word;
      }
    }
  }
}

// C [rows, width] (row stride ldc) from its transpose ct [ct_rows >= width, tokens] (rows `tokens`
// apart; rows past ct_rows, up to a multiple of 16, not read), 16 x 16 at a time, C's last columns
// masked: nothing of C past the width is written.
__attribute__((target("avx512f"))) inline void MoeStoreTransposedTile(int64_t rows, int64_t width, const float* ct,
                                                                    int64_t ct_rows, int64_t tokens, float* c,
                                                                    int64_t ldc) {
  for (int64_t t0 = 0; t0 < rows; t0 += kMoeBroadcastTokenVector) {
    const int64_t out_rows = std::min(kMoeBroadcastTokenVector, rows - t0);
    for (int64_t c0 = 0; c0 < width; c0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        r[i] = c0 + i < ct_rows ? _mm512_loadu_si512(ct + (c0 + i) * tokens + t0) : _mm512_setzero_si512();
      }
      MoeTransposeWords16(r);
      const __mmask16 cols = static_cast<__mmask16>(width - c0 >= 16 ? 0xFFFF : (1u << (width - c0)) - 1);
      for (int64_t j = 0; j < out_rows; ++j) {
        _mm512_mask_storeu_ps(c + (t0 + j) * ldc + c0, cols, _mm512_castsi512_ps(r[j]));
      }
    }
  }
}

}  // namespace gk
