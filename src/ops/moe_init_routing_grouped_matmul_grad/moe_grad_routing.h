// MoeInitRoutingGroupedMatmulGrad routing tables: the expert ranges of groupList, the token of
// every expanded row (the seed's inverse-permutation table for rowIdxType 1), and the rows of
// each token chunk in expert order. Each builder validates the values it reads, so phase 1 uses
// them as checks and phase 2 (which rebuilds them in the workspace) never trusts stale data.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/tensor.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_def.h"

namespace gk {

// Element i of a contiguous int32 or int64 index tensor, as int64.
inline int64_t IndexAt(const gkTensor& t, int64_t i) {
  const char* base = TensorBase(t);
  if (t.dtype == DType::kI32) return reinterpret_cast<const int32_t*>(base)[i];
  return reinterpret_cast<const int64_t*>(base)[i];
}

// group_offsets[0..G]: expert g owns expanded rows [group_offsets[g], group_offsets[g + 1]).
// Fails unless the list is valid for its type and totals shape.m; messages call the tensor whose
// rows M counts `rows_of` (other operators than this one reuse the check).
gkStatus BuildGroupOffsets(std::string_view api, const gkTensor& group_list,
                           const MoeGradShape& shape, int64_t* group_offsets,
                           std::string_view rows_of = "gradY");

// row_token[i] = token of expanded row i, for i < M. Fails when an index is out of range; for
// rowIdxType 1 also when a row is named twice or never.
gkStatus BuildRowTokens(std::string_view api, const gkTensor& expanded_row_idx,
                        const MoeGradShape& shape, int64_t* row_token);

// rowIdxType 0 only: no original slot is named by two rows (the rows are in range already).
// Uses O(min(batch * topK, 64 M) / 8) bytes of scratch memory.
gkStatus CheckDistinctSlots(std::string_view api, const gkTensor& expanded_row_idx,
                            const MoeGradShape& shape);

// A mix-up of the two index forms often fits the sizes but not the values. When the values
// would pass the other rowIdxType's checks, returns a hint to append to the error, e.g.
// " (the values form a valid scatter index: is it rowIdxType 1?)"; "" otherwise.
std::string RowIdxTypeHint(const gkTensor& expanded_row_idx, const MoeGradShape& shape);

// Rows grouped by token chunk (chunk = token / tokens_per_chunk), then by expert, ascending
// within each: chunk c's rows of expert g are chunk_rows[starts[c * G + g] .. starts[c * G + g + 1]).
// starts has chunks * G + 1 entries. A stable counting sort: O(M + chunks * G).
void BuildChunkRows(const int64_t* group_offsets, const int64_t* row_token, int64_t g,
                    int64_t chunks, int64_t tokens_per_chunk, int64_t* chunk_starts,
                    int64_t* chunk_rows);

}  // namespace gk
