// Fuzz target: MoeInitRoutingGroupedMatmulGrad's two-phase C API. From a valid routing (group
// list and expanded row index of random small shapes, both rowIdxType and both groupListType)
// the input applies mutations: out-of-range, repeated and -1 indices, group lists that do not
// add up, negative counts, wrong shapes, ranks, dtypes (invalid enum values included), strides,
// offsets, NULL pointers, hostile batch / topK / N / K, gradX overlapping an input; then phase-2
// misuse (short or NULL workspace, another operator's phase 2, a second run, index data changed
// before a repeated run).
// Guarantees checked:
//   - phase 1 succeeds exactly when the arguments meet the header's contract (an independent
//     check here); a failure has a message, no executor, and leaves every buffer unchanged;
//   - phase 2 writes nothing outside gradX (ASan, exact buffers) and gradX equals the float64
//     reference exactly (inputs are small integers, so every order of summation is exact);
//   - index data made invalid after phase 1 fails phase 2 with gradX unchanged.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gradkit/gradkit.h"
#include "tests/fuzz/c_caller.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using gk::DType;
// The shared views, memory and checks (fuzz_support.h).
using namespace gk::fuzz;  // NOLINT(build/namespaces)

enum Role { kGradY, kWeight, kRowIdx, kGroupList, kGradX, kRoles };

struct Call : gk::fuzz::GuardedMemory {
  View views[kRoles];
  int64_t batch = 1, top_k = 1;
  int32_t row_idx_type = 0, group_list_type = 0;  // the C enums: any int
  bool exact_values = true;
};

// The header's contract, checked independently of gradkit. Only called when every view is
// backed (so index data can be read once the descriptors pass).
// allow_repeated_slots: phase 2 of a repeatable executor re-checks index ranges and group totals,
// not whether a slot repeats (rowIdxType 0); such data then adds twice, harmlessly.
GK_FUZZ_NO_COVERAGE bool MeetsContract(const Call& c, bool null_size, bool null_executor,
                                       bool allow_repeated_slots = false) {
  if (null_size || null_executor) return false;
  for (const View& v : c.views) {
    if (!v.present || v.tensor == nullptr) return false;
  }
  const View& dy = c.views[kGradY];
  const View& w = c.views[kWeight];
  const View& idx = c.views[kRowIdx];
  const View& groups = c.views[kGroupList];
  const View& dx = c.views[kGradX];
  if (dy.dtype != GK_FLOAT && dy.dtype != GK_FLOAT16 && dy.dtype != GK_BF16) return false;
  if (w.dtype != dy.dtype || (idx.dtype != GK_INT64 && idx.dtype != GK_INT32)) return false;
  if ((groups.dtype != GK_INT64 && groups.dtype != GK_INT32) || dx.dtype != GK_FLOAT) return false;
  if (c.batch <= 0 || c.top_k <= 0) return false;
  int64_t slots;
  if (__builtin_mul_overflow(c.batch, c.top_k, &slots)) return false;
  if (c.row_idx_type != 0 && c.row_idx_type != 1) return false;
  if (c.group_list_type != 0 && c.group_list_type != 1) return false;
  if (dy.rank != 2 || w.rank != 3 || idx.rank != 1 || groups.rank != 1 || dx.rank != 2) return false;
  const int64_t m = dy.dims[0], n = dy.dims[1], g = w.dims[0], k = w.dims[1], l = idx.dims[0];
  if (g < 1 || k < 1 || w.dims[2] < 1 || n != w.dims[2] || groups.dims[0] != g) return false;
  if (dx.dims[0] != c.batch || dx.dims[1] != k || m > slots) return false;
  if (c.row_idx_type == 0 ? l < m : l != slots) return false;
  for (const View& v : c.views) {
    if (!v.Contiguous() || (v.Count() > 0 && v.data == nullptr) || !v.Addressable()) return false;
  }
  // gradX shares no byte with an input.
  __int128 xl, xh;
  if (dx.Extent(&xl, &xh)) {
    const auto x_first = reinterpret_cast<uintptr_t>(dx.At(0));
    const auto x_last = x_first + static_cast<uintptr_t>(dx.Count()) * 4;
    for (int r = 0; r < kGradX; ++r) {
      const View& v = c.views[r];
      if (v.Count() == 0) continue;
      const auto first = reinterpret_cast<uintptr_t>(v.At(0));
      const auto last = first + static_cast<uintptr_t>(v.Count()) * BytesOf(v.dtype);
      if (first < x_last && x_first < last) return false;
    }
  }
  // groupList.
  int64_t total = 0;
  for (int64_t e = 0; e < g; ++e) {
    const int64_t value = IndexAt(groups, e);
    if (c.group_list_type == 0) {
      if (value < 0 || value > m - total) return false;
      total += value;
    } else {
      if (value < total || value > m) return false;
      total = value;
    }
  }
  if (total != m) return false;
  // expandedRowIdx.
  if (c.row_idx_type == 0) {
    std::vector<int64_t> named;  // batch * topK may be huge: sort the M slots instead of a bitmap
    for (int64_t i = 0; i < m; ++i) {
      const int64_t slot = IndexAt(idx, i);
      if (slot < 0 || slot >= slots) return false;
      named.push_back(slot);
    }
    std::sort(named.begin(), named.end());
    if (!allow_repeated_slots && std::adjacent_find(named.begin(), named.end()) != named.end()) {
      return false;
    }
  } else {
    std::vector<bool> named(static_cast<size_t>(m));
    int64_t count = 0;
    for (int64_t p = 0; p < l; ++p) {
      const int64_t row = IndexAt(idx, p);
      if (row == -1) continue;
      if (row < 0 || row >= m || named[row]) return false;
      named[row] = true;
      ++count;
    }
    if (count != m) return false;
  }
  return true;
}

// gradX in float64 from the (current) inputs, for a call that meets the contract.
GK_FUZZ_NO_COVERAGE std::vector<double> Reference(const Call& c) {
  const View& dy = c.views[kGradY];
  const View& w = c.views[kWeight];
  const View& idx = c.views[kRowIdx];
  const View& groups = c.views[kGroupList];
  const int64_t m = dy.dims[0], n = dy.dims[1], g = w.dims[0], k = w.dims[1];
  std::vector<double> dx(static_cast<size_t>(c.batch * k), 0.0);
  std::vector<int64_t> token(static_cast<size_t>(m), -1), expert(static_cast<size_t>(m));
  int64_t row = 0;
  for (int64_t e = 0; e < g; ++e) {
    const int64_t value = IndexAt(groups, e);
    const int64_t end = c.group_list_type == 0 ? row + value : value;
    for (; row < end; ++row) expert[row] = e;
  }
  if (c.row_idx_type == 0) {
    for (int64_t i = 0; i < m; ++i) token[i] = IndexAt(idx, i) / c.top_k;
  } else {
    for (int64_t p = 0; p < idx.dims[0]; ++p) {
      const int64_t r = IndexAt(idx, p);
      if (r >= 0) token[r] = p / c.top_k;
    }
  }
  const auto dtype = static_cast<DType>(dy.dtype);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t col = 0; col < k; ++col) {
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        sum += static_cast<double>(gk::LoadAsF32(dy.At(i * n + j), 0, dtype)) *
               gk::LoadAsF32(w.At((expert[i] * k + col) * n + j), 0, dtype);
      }
      dx[token[i] * k + col] += sum;
    }
  }
  return dx;
}

GK_FUZZ_NO_COVERAGE void CheckResult(const Call& call) {
  const View& dx = call.views[kGradX];
  if (!call.exact_values) return;
  const std::vector<double> want = Reference(call);
  for (size_t i = 0; i < want.size(); ++i) {
    float got;
    std::memcpy(&got, dx.At(static_cast<int64_t>(i)), 4);
    GK_FUZZ_CHECK(static_cast<double>(got) == want[i], "gradX[%zu] = %.9g, reference %.9g", i,
                  got, want[i]);
  }
}

void Mutate(ByteReader& in, Call& call, Routing& r, int64_t slots, int64_t m) {
  const int mutations = static_cast<int>(in.Range(0, 3));
  for (int i = 0; i < mutations; ++i) {
    const uint8_t kind = in.U8();
    const auto pick = [&](const std::vector<int64_t>& v) {
      return v.empty() ? 0 : static_cast<size_t>(in.Range(0, static_cast<int64_t>(v.size()) - 1));
    };
    switch (kind % 12) {
      case 0: if (!r.group_list.empty()) r.group_list[pick(r.group_list)] = in.Range(-3, m + 3); break;
      case 1: if (!r.group_list.empty()) r.group_list[pick(r.group_list)] = in.Pick(kIndexValues); break;
      case 2: if (!r.row_idx.empty()) r.row_idx[pick(r.row_idx)] = in.Range(-2, slots + 2); break;
      case 3: if (!r.row_idx.empty()) r.row_idx[pick(r.row_idx)] = in.Pick(kIndexValues); break;
      case 4:  // a repeated entry
        if (r.row_idx.size() > 1) r.row_idx[pick(r.row_idx)] = r.row_idx[pick(r.row_idx)];
        break;
      case 5: if (!r.row_idx.empty()) r.row_idx[pick(r.row_idx)] = -1; break;
      case 6: call.batch = in.Bool() ? in.Range(-1, 6) : in.Pick(gk::fuzz::kHostileSizes); break;
      case 7: call.top_k = in.Bool() ? in.Range(-1, 4) : in.Pick(gk::fuzz::kHostileSizes); break;
      default: {  // a tensor's descriptor (MutateView): a dim, the rank, an offset or strides, the dtype
        View& v = call.views[in.Range(0, kRoles - 1)];
        const int what = kind % 12 - 8;
        MutateView(in, v, what < 2 ? what : what == 3 ? 4 : in.Bool() ? 2 : 3);
        break;
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  gkSetNumThreads(static_cast<int32_t>(in.Range(1, 3)));
  Call call;
  const int64_t g = in.Range(1, 4), k = in.Range(1, 6), n = in.Range(1, 6);
  call.batch = in.Range(1, 5);
  call.top_k = in.Range(1, 3);
  const int64_t slots = call.batch * call.top_k;
  const int64_t m = in.Range(0, slots);
  const uint8_t types = in.U8();
  call.row_idx_type = types < 240 ? (types & 1) : static_cast<int32_t>(in.Pick(kIndexValues));
  call.group_list_type = types < 240 ? ((types >> 1) & 1) : static_cast<int32_t>(in.Pick(kIndexValues));
  const int64_t extra = call.row_idx_type == 0 ? in.Range(0, 2) : 0;
  Routing routing = MakeRouting(in, m, g, slots, call.row_idx_type, call.group_list_type, extra);

  View& dy = call.views[kGradY];
  View& w = call.views[kWeight];
  View& idx = call.views[kRowIdx];
  View& groups = call.views[kGroupList];
  View& dx = call.views[kGradX];
  dy.dtype = in.Pick(kFloatDTypes);
  w.dtype = in.U8() < 240 ? dy.dtype : in.Pick(kFloatDTypes);
  idx.dtype = in.Bool() ? GK_INT32 : GK_INT64;
  groups.dtype = GK_INT64;
  dx.dtype = GK_FLOAT;
  dy.rank = 2, dy.dims[0] = m, dy.dims[1] = n;
  w.rank = 3, w.dims[0] = g, w.dims[1] = k, w.dims[2] = n;
  idx.rank = 1, idx.dims[0] = static_cast<int64_t>(routing.row_idx.size());
  groups.rank = 1, groups.dims[0] = g;
  dx.rank = 2, dx.dims[0] = call.batch, dx.dims[1] = k;
  Mutate(in, call, routing, slots, m);

  // Memory. NULL data, gradX overlapping an input, NULL descriptors.
  const uint8_t memory = in.U8();
  for (int r = 0; r < kRoles; ++r) {
    if (r == kGradX && memory >= 224) continue;
    Back(call, call.views[r], memory >= 248 && (memory & 7) == r);
  }
  if (memory >= 224) Share(call, dx, call.views[in.Range(0, kGroupList)], in.Range(-16, 16));
  call.exact_values = in.U8() < 224;
  FillFloatViews(call, call.views, {kGradY, kWeight, kGradX}, kGradX, call.exact_values, in.U64() | 1);
  FillIndex(call, call.views[kRowIdx], routing.row_idx);
  FillIndex(call, call.views[kGroupList], routing.group_list);
  const uint8_t nulls = in.U8();
  for (int r = 0; r < kRoles; ++r) call.views[r].present = !(nulls >= 240 && (nulls & 7) == r);
  const bool null_size = nulls >= 240 && (nulls & 7) == 5;
  const bool null_executor = nulls >= 240 && (nulls & 7) == 6;
  const uint8_t phase2 = in.U8();
  const int64_t workspace_shift = in.Range(0, 7);
  const int64_t corrupt_at = in.Range(0, 63);
  const int64_t corrupt_value = in.Bool() ? in.Range(-2, slots + 2) : in.Pick(kIndexValues);

  // Phase 1 reads the index arrays (the contract says so): a view larger than its memory would
  // be the caller's lie, not gradkit's bug. Hostile index descriptors are fuzzed only where the
  // bytes they claim exist.
  for (int r : {kRowIdx, kGroupList}) {
    const View& v = call.views[r];
    if (v.present && v.data != nullptr && !v.backed) return 0;
  }
  for (View& v : call.views) {
    if (!v.present) continue;
    v.tensor = gkFuzzCreateTensor(v.dims, static_cast<uint64_t>(v.rank), v.dtype,
                                  v.explicit_strides ? v.strides : nullptr, v.offset, v.data);
  }
  const auto before = Snapshot(call);
  uint64_t workspace_size = 12345;
  gkOpExecutor* executor = reinterpret_cast<gkOpExecutor*>(&call);  // must be overwritten
  const gkStatus status = gkFuzzMoeGradGetWorkspaceSize(
      dy.tensor, w.tensor, idx.tensor, groups.tensor, call.batch, call.top_k, call.row_idx_type,
      call.group_list_type, dx.tensor, null_size ? nullptr : &workspace_size,
      null_executor ? nullptr : &executor);

  bool all_backed = true;
  for (const View& v : call.views) all_backed &= v.backed;
  if (status != GK_SUCCESS) {
    CheckFailure(status, "phase 1");
    if (!null_executor) GK_FUZZ_CHECK(executor == nullptr, "phase 1 failed but left an executor");
    CheckUnchanged(call, before, "failed phase 1");
    if (all_backed) {
      GK_FUZZ_CHECK(!MeetsContract(call, null_size, null_executor),
                    "phase 1 refused a call that meets the contract: %s", gkGetRecentErrMsg());
    }
  } else {
    GK_FUZZ_CHECK(executor != nullptr, "phase 1 succeeded without an executor");
    CheckUnchanged(call, before, "phase 1");
    if (all_backed) {
      GK_FUZZ_CHECK(MeetsContract(call, null_size, null_executor),
                    "phase 1 accepted a call that breaks the contract");
    }
  }

  if (std::getenv("GK_FUZZ_DEBUG")) {
    std::fprintf(stderr, "phase 1: %s%s\n", status == GK_SUCCESS ? "ok" : gkGetRecentErrMsg(),
                 all_backed ? "" : " (unbacked)");
  }
  if (status == GK_SUCCESS && all_backed) {
    GK_FUZZ_CHECK(workspace_size <= (uint64_t{1} << 28), "workspace of %llu bytes for a small call",
                  static_cast<unsigned long long>(workspace_size));
    GuardedBuffer workspace(static_cast<size_t>(workspace_size + workspace_shift));
    void* ws = workspace.data() + workspace_shift;
    CheckFailure(gkMoeInitRoutingGroupedMatmulGrad(ws, workspace_size, nullptr, nullptr),
                 "NULL executor");
    switch (phase2 % 6) {
      case 1:
        if (workspace_size > 0) {
          CheckFailure(gkMoeInitRoutingGroupedMatmulGrad(ws, workspace_size - 1, executor, nullptr),
                       "short workspace");
          CheckUnchanged(call, before, "short workspace");
        }
        break;
      case 2:
        if (workspace_size > 0) {
          CheckFailure(gkMoeInitRoutingGroupedMatmulGrad(nullptr, workspace_size, executor, nullptr),
                       "NULL workspace");
          CheckUnchanged(call, before, "NULL workspace");
        }
        break;
      case 3:
        CheckFailure(gkEluGradV2(ws, workspace_size, executor, nullptr),
                     "executor given to another operator");
        CheckUnchanged(call, before, "executor given to another operator");
        break;
      case 5:
        GK_FUZZ_CHECK(gkSetExecutorRepeatable(executor) == GK_SUCCESS, "gkSetExecutorRepeatable");
        break;
      default:
        break;
    }
    const gkStatus run = gkMoeInitRoutingGroupedMatmulGrad(ws, workspace_size, executor, nullptr);
    GK_FUZZ_CHECK(run == GK_SUCCESS, "phase 2 failed after phase 1 succeeded: %s",
                  gkGetRecentErrMsg());
    workspace.CheckGuards("workspace");
    CheckUnchanged(call, before, "phase 2 (inputs)", dx.buffer);
    CheckResult(call);
    const auto after = Snapshot(call);
    if (phase2 % 6 == 4) {
      CheckFailure(gkMoeInitRoutingGroupedMatmulGrad(ws, workspace_size, executor, nullptr),
                   "executor run twice");
      CheckUnchanged(call, after, "executor run twice");
    }
    if (phase2 % 6 == 5) {
      // Repeated: same bytes again; then with index data changed after phase 1.
      GK_FUZZ_CHECK(gkMoeInitRoutingGroupedMatmulGrad(ws, workspace_size, executor, nullptr) ==
                        GK_SUCCESS, "repeated run");
      CheckUnchanged(call, after, "repeated run");
      const bool in_group_list = (phase2 >> 3) & 1;
      std::vector<int64_t>& values = in_group_list ? routing.group_list : routing.row_idx;
      if (!values.empty()) {
        values[static_cast<size_t>(corrupt_at) % values.size()] = corrupt_value;
        FillIndex(call, call.views[in_group_list ? kGroupList : kRowIdx], values);
        const auto changed = Snapshot(call);
        const gkStatus rerun = gkMoeInitRoutingGroupedMatmulGrad(ws, workspace_size, executor, nullptr);
        if (rerun != GK_SUCCESS) {
          CheckFailure(rerun, "run on changed index data");
          CheckUnchanged(call, changed, "failed run on changed index data");
        } else {
          GK_FUZZ_CHECK(MeetsContract(call, false, false, /*allow_repeated_slots=*/true),
                        "phase 2 ran on index data that breaks the contract");
          if (MeetsContract(call, false, false)) CheckResult(call);
        }
      }
    }
  }
  if (status == GK_SUCCESS) gkDestroyExecutor(executor);
  for (View& v : call.views) gkDestroyTensor(v.tensor);
  return 0;
}
