// EluGradV2 plan (the seed's host tiling, for CPU): plain data, computed once in phase 1.
//
// Work is split over threads the way the seed splits it over AI cores: whole 256-byte blocks of
// the input, the first `big_share_count` threads taking one block more (big shares), the rest
// small shares, and the last thread the remainder that no block divides. Each share is walked
// in tiles sized to a per-core cache budget (the analog of the seed's UB).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "ops/elu_grad_v2/elu_grad_v2_ref.h"

namespace gk {

// The seed's eight schedule modes. Each names a kernel path (see elu_grad_v2_kernels.h):
//   SAFE_*           float32; and strided views of any dtype: the kernel per contiguous row, or
//                    (rows too short) on tiles gathered into scratch
//   SINGLE_TILE_*    the whole tensor fits one tile: one pass on the calling thread
//   MIXED_*_FAST     contiguous bfloat16: convert in registers, no scratch
//   FLOAT16_*_FAST   contiguous float16: convert in registers, no scratch
#define GK_ELU_GRAD_V2_MODES(X) \
  X(kSafeExp, "SAFE_EXP")                     \
  X(kSafeResult, "SAFE_RESULT")               \
  X(kSingleTileExp, "SINGLE_TILE_EXP")        \
  X(kSingleTileResult, "SINGLE_TILE_RESULT")  \
  X(kMixedExpFast, "MIXED_EXP_FAST")          \
  X(kMixedResultFast, "MIXED_RESULT_FAST")    \
  X(kFloat16ExpFast, "FLOAT16_EXP_FAST")      \
  X(kFloat16ResultFast, "FLOAT16_RESULT_FAST")

enum class EluGradV2Mode : int32_t {
#define GK_X(id, name) id,
  GK_ELU_GRAD_V2_MODES(GK_X)
#undef GK_X
};
std::string_view EluGradV2ModeName(EluGradV2Mode mode);

// What the plan depends on, beyond the machine.
struct EluGradV2Problem {
  int64_t elems;
  DType input_dtype;
  DType output_dtype;
  bool is_result;
  bool contiguous;  // gradOutput, x and gradInput all dense in C order
  EluGradV2Coefficients coef;
  // Strided views: elements per contiguous row once dims are merged (elu_grad_v2_layout.h);
  // 1 when some view has no unit-stride inner dim.
  int64_t row_elems = 1;
};

// The machine's share of the decision: threads allowed and the per-core cache budget.
struct EluGradV2Machine {
  int32_t threads;
  int64_t l1d_bytes_per_core;
  int64_t llc_bytes;  // last-level cache, all cores
};
EluGradV2Machine DetectEluGradV2Machine();

inline constexpr int64_t kEluGradV2BlockBytes = 256;          // share boundaries align to this
// Less input per thread is not worth waking one. Measured (docs/benchmarks.md, EluGradV2): with
// 64 KiB, two threads ran 1.5-4x slower than one at 32 K - 256 K elements, in every dtype and
// mode; one thread stayed ahead up to 512 K float32 elements (2 MiB).
inline constexpr int64_t kEluGradV2MinShareBytes = 1024 * 1024;
// Strided rows at least this long run the vector kernel in place; shorter ones are gathered.
inline constexpr int64_t kEluGradV2MinRowElems = 64;
inline constexpr int64_t kEluGradV2WorkspaceAlignment = 64;

struct EluGradV2Plan {
  EluGradV2Mode mode;
  DType input_dtype;
  DType output_dtype;
  bool is_result;
  bool contiguous;
  EluGradV2Coefficients coef;
  int64_t total_elems;
  int64_t block_elems;        // elements in one 256-byte block of the input
  int32_t threads;            // shares, one per thread
  int32_t big_share_count;    // the first shares take one block more
  int64_t big_share_elems;
  int64_t small_share_elems;
  int64_t last_share_elems;   // the last share ends at total_elems
  int64_t tile_elems;         // elements per tile, a multiple of block_elems
  int64_t row_elems;          // strided views: contiguous row length (see EluGradV2Problem)
  bool gather;                // strided views with rows shorter than kEluGradV2MinRowElems
  int64_t scratch_bytes_per_thread;  // gather: one tile of dy, x (input dtype) and y
  bool streaming_stores;      // bytes moved exceed the last-level cache: write y past the caches
  uint64_t workspace_bytes;

  int64_t ShareBegin(int32_t share) const;
  int64_t ShareElems(int32_t share) const;
  bool operator==(const EluGradV2Plan&) const = default;
};

EluGradV2Plan MakeEluGradV2Plan(const EluGradV2Problem& problem, const EluGradV2Machine& machine);
std::string EluGradV2PlanToJson(const EluGradV2Plan& plan);

}  // namespace gk
