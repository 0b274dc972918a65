#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_routing.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace gk {

gkStatus BuildGroupOffsets(std::string_view api, const gkTensor& group_list,
                           const MoeGradShape& shape, int64_t* group_offsets,
                           std::string_view rows_of) {
  const bool cumsum = shape.group_list_type == GroupListType::kCumsum;
  group_offsets[0] = 0;
  for (int64_t g = 0; g < shape.g; ++g) {
    const int64_t value = IndexAt(group_list, g);
    const int64_t previous = group_offsets[g];
    int64_t end;
    if (cumsum) {
      if (g == 0 && value < 0) {
        return Fail(GK_ERROR_PARAM_INVALID, api,
                    "groupList[0] is {}, a cumsum group list must start at >= 0", value);
      }
      if (value < previous) {
        return Fail(GK_ERROR_PARAM_INVALID, api,
                    "groupList[{}] is {}, below groupList[{}] = {}; a cumsum group list must be "
                    "non-decreasing",
                    g, value, g - 1, previous);
      }
      end = value;
    } else {
      if (value < 0) {
        return Fail(GK_ERROR_PARAM_INVALID, api,
                    "groupList[{}] is {}, a row count must be >= 0", g, value);
      }
      if (value > shape.m - previous) {  // also keeps the running total from overflowing
        // Print the prefix and the value, not their sum: it may pass 2^63.
        return Fail(GK_ERROR_PARAM_INVALID, api,
                    "groupList[{}] is {} after {} rows in groups before it: the counts total more "
                    "than M = {} rows of {}",
                    g, value, previous, shape.m, rows_of);
      }
      end = previous + value;
    }
    if (end > shape.m) {
      return Fail(GK_ERROR_PARAM_INVALID, api,
                  "groupList[{}] is {}, past M = {} rows of {} (cumsum group list)", g, value,
                  shape.m, rows_of);
    }
    group_offsets[g + 1] = end;
  }
  if (group_offsets[shape.g] != shape.m) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "groupList ({}) totals {} rows, but {} has M = {} rows; they must be equal",
                GroupListTypeName(shape.group_list_type), group_offsets[shape.g], rows_of,
                shape.m);
  }
  return GK_SUCCESS;
}

gkStatus BuildRowTokens(std::string_view api, const gkTensor& idx, const MoeGradShape& shape,
                        int64_t* row_token) {
  const int64_t slots = shape.slots();
  if (shape.row_idx_type == RowIdxType::kGather) {
    for (int64_t i = 0; i < shape.m; ++i) {
      const int64_t slot = IndexAt(idx, i);
      if (slot < 0 || slot >= slots) {
        return Fail(GK_ERROR_PARAM_INVALID, api,
                    "expandedRowIdx[{}] is {}, it must be an original slot in [0, {}) (batch {} * "
                    "topK {}) for rowIdxType 0",
                    i, slot, slots, shape.batch, shape.top_k);
      }
      row_token[i] = slot / shape.top_k;
    }
    return GK_SUCCESS;
  }
  std::fill(row_token, row_token + shape.m, int64_t{-1});
  int64_t rows_named = 0;
  for (int64_t p = 0; p < shape.l; ++p) {
    const int64_t row = IndexAt(idx, p);
    if (row == -1) continue;  // a dropped slot
    if (row < 0 || row >= shape.m) {
      return Fail(GK_ERROR_PARAM_INVALID, api,
                  "expandedRowIdx[{}] is {}, it must be an expanded row in [0, {}) (M) or -1 for a "
                  "dropped slot, for rowIdxType 1",
                  p, row, shape.m);
    }
    if (row_token[row] != -1) {
      return Fail(GK_ERROR_PARAM_INVALID, api,
                  "expandedRowIdx[{}] is {}, a row already named by an earlier slot (of token {}); "
                  "each expanded row must appear exactly once for rowIdxType 1",
                  p, row, row_token[row]);
    }
    row_token[row] = p / shape.top_k;
    ++rows_named;
  }
  if (rows_named != shape.m) {
    const int64_t missing = std::find(row_token, row_token + shape.m, -1) - row_token;
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "expandedRowIdx names {} of the M = {} expanded rows (row {} is missing); each "
                "must appear exactly once for rowIdxType 1",
                rows_named, shape.m, missing);
  }
  return GK_SUCCESS;
}

gkStatus CheckDistinctSlots(std::string_view api, const gkTensor& idx, const MoeGradShape& shape) {
  const auto duplicate = [&](int64_t i, int64_t slot) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "expandedRowIdx[{}] is {}, a slot already named by an earlier row; each original "
                "slot holds at most one expanded row (rowIdxType 0)",
                i, slot);
  };
  const int64_t slots = shape.slots();
  if (slots / 64 <= std::max<int64_t>(shape.m, 1)) {  // a bitmap of the slots is small enough
    std::vector<uint64_t> seen(static_cast<size_t>(slots / 64 + 1));
    for (int64_t i = 0; i < shape.m; ++i) {
      const int64_t slot = IndexAt(idx, i);
      uint64_t& word = seen[static_cast<size_t>(slot / 64)];
      const uint64_t bit = uint64_t{1} << (slot % 64);
      if (word & bit) return duplicate(i, slot);
      word |= bit;
    }
    return GK_SUCCESS;
  }
  std::vector<std::pair<int64_t, int64_t>> order(static_cast<size_t>(shape.m));  // (slot, row)
  for (int64_t i = 0; i < shape.m; ++i) order[i] = {IndexAt(idx, i), i};
  std::sort(order.begin(), order.end());
  for (size_t j = 1; j < order.size(); ++j) {
    if (order[j].first == order[j - 1].first) return duplicate(order[j].second, order[j].first);
  }
  return GK_SUCCESS;
}

namespace {

// rowIdxType 0's rules: L >= M, the first M entries distinct slots in [0, batch * topK).
bool ValidAsGather(const gkTensor& idx, const MoeGradShape& shape) {
  if (shape.l < shape.m) return false;
  std::vector<int64_t> slots(static_cast<size_t>(shape.m));
  for (int64_t i = 0; i < shape.m; ++i) {
    slots[i] = IndexAt(idx, i);
    if (slots[i] < 0 || slots[i] >= shape.slots()) return false;
  }
  std::sort(slots.begin(), slots.end());
  return std::adjacent_find(slots.begin(), slots.end()) == slots.end();
}

// rowIdxType 1's rules: one entry per slot, each row of [0, M) exactly once, -1 elsewhere.
bool ValidAsScatter(const gkTensor& idx, const MoeGradShape& shape) {
  if (shape.l != shape.slots()) return false;
  std::vector<bool> named(static_cast<size_t>(shape.m));
  int64_t count = 0;
  for (int64_t p = 0; p < shape.l; ++p) {
    const int64_t row = IndexAt(idx, p);
    if (row == -1) continue;
    if (row < 0 || row >= shape.m || named[row]) return false;
    named[row] = true;
    ++count;
  }
  return count == shape.m;
}

}  // namespace

std::string RowIdxTypeHint(const gkTensor& idx, const MoeGradShape& shape) {
  if (shape.row_idx_type == RowIdxType::kScatter && ValidAsGather(idx, shape)) {
    return " (the values form a valid gather index: is it rowIdxType 0?)";
  }
  if (shape.row_idx_type == RowIdxType::kGather && ValidAsScatter(idx, shape)) {
    return " (the values form a valid scatter index: is it rowIdxType 1?)";
  }
  return "";
}

void BuildChunkRows(const int64_t* group_offsets, const int64_t* row_token, int64_t g,
                    int64_t chunks, int64_t tokens_per_chunk, int64_t* chunk_starts,
                    int64_t* chunk_rows) {
  const int64_t buckets = chunks * g;
  std::fill(chunk_starts, chunk_starts + buckets + 1, int64_t{0});
  for (int64_t expert = 0; expert < g; ++expert) {
    for (int64_t i = group_offsets[expert]; i < group_offsets[expert + 1]; ++i) {
      ++chunk_starts[(row_token[i] / tokens_per_chunk) * g + expert + 1];
    }
  }
  for (int64_t b = 0; b < buckets; ++b) chunk_starts[b + 1] += chunk_starts[b];
  // Fill with a cursor per bucket: chunk_starts[b] moves to the end of bucket b, i.e. the start
  // of bucket b + 1, and is then shifted back.
  for (int64_t expert = 0; expert < g; ++expert) {
    for (int64_t i = group_offsets[expert]; i < group_offsets[expert + 1]; ++i) {
      chunk_rows[chunk_starts[(row_token[i] / tokens_per_chunk) * g + expert]++] = i;
    }
  }
  for (int64_t b = buckets; b > 0; --b) chunk_starts[b] = chunk_starts[b - 1];
  chunk_starts[0] = 0;
}

}  // namespace gk
