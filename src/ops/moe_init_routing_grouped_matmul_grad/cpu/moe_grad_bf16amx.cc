// The bfloat16 weights-broadcast tile on AMX (see moe_grad_bf16amx.h), in GCC/Clang intrinsics.
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_bf16amx.h"

#include <algorithm>
#include <stdexcept>

#include "core/cpu_info.h"
#include "core/plan_math.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_bf16dot.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#if !defined(__clang__)
// As in moe_grad_f32bcast.cc: GCC 12's AVX-512 shuffles start from a self-initialised value.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_broadcast_avx512.h"
#define GK_BF16AMX 1
#define GK_BF16AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f")))
#endif

namespace gk {
namespace {

constexpr int64_t kTile = 16;       // rows of a tile; tokens of a B tile; 32-bit words of a row
constexpr int64_t kStep = 32;       // bfloat16 reduction elements of one TDPBF16PS
constexpr int64_t kWeightRows = 32; // weight rows of a register block (two A tiles)
// Steps of a reduction chunk: a block's two A tiles' rows of one chunk (16 KiB) stay in L1 while
// every token tile pair runs over them, each pair's sums carried in ct from chunk to chunk.
constexpr int64_t kChunkSteps = 8;

#if defined(GK_BF16AMX)
static_assert(kTile == kMoeBroadcastTokenVector);

// The tile configuration (palette 1): C tiles 0-3 (A tile i x B tile j at 2 i + j), A tiles 4-5,
// B tiles 6-7; `a_rows` rows in the A and C tiles (fewer than 16 for a block's last weight rows).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

GK_BF16AMX_TARGET void Configure(int a_rows) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = static_cast<uint8_t>(t < 6 ? a_rows : kTile);
  }
  // Not _tile_loadconfig: GCC 12's names only the first 8 bytes as read, so the stores of the
  // rest may be dropped (an undefined configuration, then #UD at the first tile instruction).
  __asm__ volatile("ldtilecfg %0" : : "m"(cfg) : "memory");
}

// Where B tile rows of tokens [t0, t0 + 16) start in the token panels (MoeBf16DotPackTokens's
// layout: groups of 48 tokens, the last 16, 32 or 48 wide), and their stride in bytes.
struct TokenTile {
  const char* base;
  int64_t stride;
};
inline TokenTile TokenTileAt(const uint32_t* panels, int64_t tokens, int64_t words, int64_t t0) {
  const int64_t g0 = t0 / kMoeBroadcastTokenGroup * kMoeBroadcastTokenGroup;
  const int64_t width = std::min(kMoeBroadcastTokenGroup, tokens - g0);
  return {reinterpret_cast<const char*>(panels + g0 * words + (t0 - g0)), width * 4};
}

// One register block: NA A tiles (16 weight rows each, rows w[i] of stride ldb_bytes) x NB B
// tiles of tokens, over the whole reduction, stored transposed into ct (rows ct_stride bytes
// apart). `ahead` lines of the next rows asked for into L2 per step, from `fetch` on.
template <int NA, int NB>
GK_BF16AMX_TARGET __attribute__((noinline)) void Block(int64_t s0, int64_t s1, bool carry, const char* const* w,
                                                       int64_t ldb_bytes, const TokenTile* tt,
                                                       float* const* ct, int64_t ct_stride,
                                                       const char* const*& fetch, const char* const* fetch_end,
                                                       int64_t& fetch_at, int64_t fetch_row_bytes, int64_t ahead) {
  if (carry) {  // the sums of the steps before s0, exact in float32
    _tile_loadd(0, ct[0], ct_stride);
    if (NB > 1) _tile_loadd(1, ct[0] + kTile, ct_stride);
    if (NA > 1) _tile_loadd(2, ct[1], ct_stride);
    if (NA > 1 && NB > 1) _tile_loadd(3, ct[1] + kTile, ct_stride);
  } else {
    _tile_zero(0);
    if (NB > 1) _tile_zero(1);
    if (NA > 1) _tile_zero(2);
    if (NA > 1 && NB > 1) _tile_zero(3);
  }
  for (int64_t s = s0; s < s1; ++s) {
    _tile_loadd(4, w[0] + s * 64, ldb_bytes);
    _tile_loadd(6, tt[0].base + s * kTile * tt[0].stride, tt[0].stride);
    if (NB > 1) _tile_loadd(7, tt[1].base + s * kTile * tt[1].stride, tt[1].stride);
    _tile_dpbf16ps(0, 4, 6);
    if (NB > 1) _tile_dpbf16ps(1, 4, 7);
    if (NA > 1) {
      _tile_loadd(5, w[1] + s * 64, ldb_bytes);
      _tile_dpbf16ps(2, 5, 6);
      if (NB > 1) _tile_dpbf16ps(3, 5, 7);
    }
    for (int64_t i = 0; i < ahead && fetch != fetch_end; ++i) {
      _mm_prefetch(*fetch + fetch_at, _MM_HINT_T1);
      fetch_at += 64;
      if (fetch_at >= fetch_row_bytes) fetch_at = 0, ++fetch;
    }
  }
  _tile_stored(0, ct[0], ct_stride);
  if (NB > 1) _tile_stored(1, ct[0] + kTile, ct_stride);
  if (NA > 1) _tile_stored(2, ct[1], ct_stride);
  if (NA > 1 && NB > 1) _tile_stored(3, ct[1] + kTile, ct_stride);
}

template <int NA>
GK_BF16AMX_TARGET void Blocks(int nb, int64_t s0, int64_t s1, bool carry, const char* const* w, int64_t ldb_bytes,
                              const TokenTile* tt, float* const* ct, int64_t ct_stride,
                              const char* const*& fetch, const char* const* fetch_end, int64_t& fetch_at,
                              int64_t fetch_row_bytes, int64_t ahead) {
  if (nb == 2) {
    Block<NA, 2>(s0, s1, carry, w, ldb_bytes, tt, ct, ct_stride, fetch, fetch_end, fetch_at, fetch_row_bytes, ahead);
  } else {
    Block<NA, 1>(s0, s1, carry, w, ldb_bytes, tt, ct, ct_stride, fetch, fetch_end, fetch_at, fetch_row_bytes, ahead);
  }
}

GK_BF16AMX_TARGET void GemmBroadcastB(int64_t rows, int64_t width, int64_t reduce, const uint32_t* panels,
                                      const char* b, int64_t ldb, float* c, int64_t ldc, float* ct,
                                      const char* next_b, int64_t next_rows) {
  const int64_t tokens = RoundUp(rows, kTile);
  const int64_t words = reduce / 2, steps = reduce / kStep;
  const int64_t ldb_bytes = ldb * 2, row_bytes = reduce * 2;
  const int64_t ct_stride = tokens * 4;
  const int64_t full = width / kTile, tail = width % kTile;
  // The rows to fetch: each block's next 32 weight rows, and after the last block the first 32
  // of next_b's.
  const int64_t groups = CeilDiv(width, kWeightRows);
  const int64_t token_blocks = CeilDiv(tokens, 2 * kTile);
  const int64_t lines = kWeightRows * CeilDiv(row_bytes, int64_t{64});
  const int64_t ahead = CeilDiv(lines, std::max<int64_t>(token_blocks * steps, 1));
  const char* fetch_rows[kWeightRows];
  Configure(static_cast<int>(kTile));
  bool tail_config = false;
  for (int64_t gi = 0; gi < groups; ++gi) {
    const int64_t w0 = gi * kWeightRows;
    // This group's A tiles: two of 16 rows, one, or a last one of `tail` rows.
    const int64_t in_group = std::min(kWeightRows, width - w0);
    const bool has_tail = tail != 0 && w0 + in_group == width;
    // The next rows: the next group's, or the next block's.
    int64_t count = 0;
    const char* next_base = nullptr;
    if (gi + 1 < groups) {
      next_base = b + (w0 + kWeightRows) * ldb_bytes;
      count = std::min(kWeightRows, width - w0 - kWeightRows);
    } else if (next_b != nullptr) {
      next_base = next_b;
      count = std::min(kWeightRows, next_rows);
    }
    for (int64_t r = 0; r < count; ++r) fetch_rows[r] = next_base + r * ldb_bytes;
    const char* const* fetch = fetch_rows;
    const char* const* fetch_end = fetch_rows + count;
    int64_t fetch_at = 0;
    const auto run = [&](int64_t first, int n_a, int a_rows) {
      if ((a_rows != kTile) != tail_config) {
        Configure(a_rows);
        tail_config = a_rows != kTile;
      }
      const char* w[2] = {b + first * ldb_bytes, b + (first + kTile) * ldb_bytes};
      for (int64_t s0 = 0; s0 < steps; s0 += kChunkSteps) {
        const int64_t s1 = std::min(steps, s0 + kChunkSteps);
        for (int64_t t0 = 0; t0 < tokens; t0 += 2 * kTile) {
          const int nb = tokens - t0 > kTile ? 2 : 1;
          const TokenTile tt[2] = {TokenTileAt(panels, tokens, words, t0),
                                   nb > 1 ? TokenTileAt(panels, tokens, words, t0 + kTile) : TokenTile{}};
          float* out[2] = {ct + first * tokens + t0, ct + (first + kTile) * tokens + t0};
          if (n_a == 2) {
            Blocks<2>(nb, s0, s1, s0 > 0, w, ldb_bytes, tt, out, ct_stride, fetch, fetch_end, fetch_at, row_bytes,
                      ahead);
          } else {
            Blocks<1>(nb, s0, s1, s0 > 0, w, ldb_bytes, tt, out, ct_stride, fetch, fetch_end, fetch_at, row_bytes,
                      ahead);
          }
        }
      }
    };
    if (has_tail) {  // a full tile alone first, then the tail's rows
      if (in_group > kTile) run(w0, 1, static_cast<int>(kTile));
      run(full * kTile, 1, static_cast<int>(tail));
    } else {
      run(w0, in_group > kTile ? 2 : 1, static_cast<int>(kTile));
    }
  }
  _tile_release();
  MoeStoreTransposedTile(rows, width, ct, width, tokens, c, ldc);
}

// Linux hands a process the AMX tile data state only on request (since 5.16).
bool RequestTileData() {
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

}  // namespace

bool MoeBf16AmxAvailable() {
#if defined(GK_BF16AMX)
  static const bool granted = DetectCpuIdentity().amx_bf16 && RequestTileData();
  return granted && ChosenIsa().rfind("AVX3", 0) == 0;
#else
  return false;
#endif
}

bool MoeBf16AmxTakesReduce(int64_t reduce) { return reduce > 0 && reduce % kStep == 0; }

void MoeBf16AmxGemmBroadcastB(int64_t rows, int64_t width, int64_t reduce, const void* a_tokens,
                              const void* b, int64_t ldb, float* c, int64_t ldc, float* scratch,
                              const void* next_b, int64_t next_rows) {
  if (!MoeBf16AmxTakesReduce(reduce)) {
    throw std::logic_error("MoeBf16AmxGemmBroadcastB: the reduction must be a multiple of 32");
  }
#if defined(GK_BF16AMX)
  if (rows == 0 || width == 0) return;
  GemmBroadcastB(rows, width, reduce, static_cast<const uint32_t*>(a_tokens), static_cast<const char*>(b), ldb,
                 c, ldc, scratch, static_cast<const char*>(next_b), next_rows);
#else
  (void)rows, (void)width, (void)a_tokens, (void)b, (void)ldb, (void)c, (void)ldc, (void)scratch,
      (void)next_b, (void)next_rows;
  throw std::logic_error("bfloat16 AMX kernel: not built for this CPU");
#endif
}

}  // namespace gk
