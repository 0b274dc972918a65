// Fuzz target: GroupedMatmul and GroupedMatmulWeightGrad(Add)'s two-phase C APIs. From a valid
// call (any of the three operators; plain or gather-fused x with either rowIdxType; either groupListType; the
// forward's weight in either layout, as transposeWeight says, or as the transposed view of the
// other; float32 or dtype outputs) the input applies mutations: out-of-range, repeated and -1
// indices, group lists that do not add up, wrong shapes, ranks, dtypes (invalid enum values
// included), strides, offsets, NULL pointers, a hostile topK, the output overlapping an input;
// then phase-2 misuse (short or NULL workspace, the other operator's phase 2, a second run, index
// data changed before a repeated run).
// Guarantees checked:
//   - phase 1 succeeds exactly when the arguments meet the header's contract (an independent
//     check here); a failure has a message, no executor, and leaves every buffer unchanged;
//   - phase 2 writes nothing outside the output (ASan, exact buffers) and the output equals the
//     float64 reference exactly (inputs are small integers: every sum is exact, also in 16 bits;
//     WeightGradAdd: the output's prior value plus that sum, rounded once);
//   - index data made invalid after phase 1 fails phase 2 with the output unchanged.
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

enum Role { kX, kOperand, kRowIdx, kGroupList, kOut, kRoles };

struct Call : gk::fuzz::GuardedMemory {
  View views[kRoles];
  bool weight_grad = false;
  bool accumulate = false;    // weight grad: GroupedMatmulWeightGradAdd
  bool gather_fused = false;  // expandedRowIdx passed (views[kRowIdx].present)
  bool transpose_weight = false;
  int64_t top_k = 1;
  int32_t row_idx_type = 0, group_list_type = 0;  // the C enums: any int
  bool exact_values = true;
};


// The weight's dims as W[g] = [K, N] and whether its storage is [G, N, K]; false unless the view
// is C-contiguous or the transposed view of a C-contiguous buffer of the other layout.
bool WeightLayout(const Call& c, int64_t* g, int64_t* k, int64_t* n) {
  View w = c.views[kOperand];
  *g = w.dims[0];
  *k = c.transpose_weight ? w.dims[2] : w.dims[1];
  *n = c.transpose_weight ? w.dims[1] : w.dims[2];
  if (w.Contiguous()) return true;
  View storage = w;
  storage.explicit_strides = true;
  for (int d = 0; d < 3; ++d) storage.strides[d] = w.Stride(d);
  std::swap(storage.dims[1], storage.dims[2]);
  std::swap(storage.strides[1], storage.strides[2]);
  return storage.Contiguous();
}

// Element (g, k, n) of W[g] = [K, N], in elements from the weight view's data.
int64_t WeightAt(const Call& c, int64_t g, int64_t k, int64_t n) {
  const View& w = c.views[kOperand];
  const int64_t i1 = c.transpose_weight ? n : k, i2 = c.transpose_weight ? k : n;
  return g * w.Stride(0) + i1 * w.Stride(1) + i2 * w.Stride(2);
}

// The sizes of a call: M expanded rows, G, K, N, and the tokens (batch) of a gather-fused x.
struct Sizes {
  int64_t m, g, k, n, batch;
};

// The header's contract, checked independently of gradkit. Only called when every view is
// backed. allow_repeated_slots: phase 2 re-checks ranges and totals, not repeated slots.
GK_FUZZ_NO_COVERAGE bool MeetsContract(const Call& c, bool null_size, bool null_executor,
                                       Sizes* sizes, bool allow_repeated_slots = false) {
  if (null_size || null_executor) return Refuse(__LINE__);
  for (int r = 0; r < kRoles; ++r) {
    const View& v = c.views[r];
    if (r == kRowIdx && !c.gather_fused) continue;
    if (!v.present || v.tensor == nullptr) return Refuse(__LINE__);
  }
  const View& x = c.views[kX];
  const View& op = c.views[kOperand];
  const View& idx = c.views[kRowIdx];
  const View& groups = c.views[kGroupList];
  const View& out = c.views[kOut];
  if (!IsFloat(x.dtype) || op.dtype != x.dtype || !IsIndex(groups.dtype)) return Refuse(__LINE__);
  if (c.gather_fused && !IsIndex(idx.dtype)) return Refuse(__LINE__);
  if (out.dtype != GK_FLOAT && out.dtype != x.dtype) return Refuse(__LINE__);
  if (c.group_list_type != 0 && c.group_list_type != 1) return Refuse(__LINE__);
  if (c.gather_fused && ((c.row_idx_type != 0 && c.row_idx_type != 1) || c.top_k < 1)) return Refuse(__LINE__);
  if (x.rank != 2 || groups.rank != 1 || (c.gather_fused && idx.rank != 1)) return Refuse(__LINE__);
  Sizes s{};
  if (!c.weight_grad) {
    if (op.rank != 3 || out.rank != 2) return Refuse(__LINE__);
    if (!WeightLayout(c, &s.g, &s.k, &s.n)) return Refuse(__LINE__);
    s.m = c.gather_fused ? out.dims[0] : x.dims[0];
    if (out.dims[0] != s.m || out.dims[1] != s.n) return Refuse(__LINE__);
  } else {
    if (op.rank != 2 || out.rank != 3) return Refuse(__LINE__);
    s.m = op.dims[0], s.n = op.dims[1], s.k = x.dims[1], s.g = out.dims[0];
    if (!c.gather_fused && x.dims[0] != s.m) return Refuse(__LINE__);
    if (out.dims[1] != s.k || out.dims[2] != s.n) return Refuse(__LINE__);
  }
  constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;
  if (s.g < 1 || s.k < 1 || s.n < 1 || s.g > kMaxDim || s.k > kMaxDim || s.n > kMaxDim) return Refuse(__LINE__);
  if (x.dims[1] != s.k || groups.dims[0] != s.g || s.m < 0) return Refuse(__LINE__);
  s.batch = x.dims[0];
  int64_t slots = 0;
  if (c.gather_fused) {
    if (s.batch < 1 || __builtin_mul_overflow(s.batch, c.top_k, &slots) || s.m > slots) return Refuse(__LINE__);
    if (c.row_idx_type == 0 ? idx.dims[0] < s.m : idx.dims[0] != slots) return Refuse(__LINE__);
  }
  for (int r = 0; r < kRoles; ++r) {
    const View& v = c.views[r];
    if (r == kRowIdx && !c.gather_fused) continue;
    if ((v.Count() > 0 && v.data == nullptr) || !v.Addressable()) return Refuse(__LINE__);
    if (!(r == kOperand && !c.weight_grad) && !v.Contiguous()) return Refuse(__LINE__);
  }
  // The output shares no byte with an input.
  __int128 lo, hi;
  if (out.Extent(&lo, &hi)) {
    const auto out_first = reinterpret_cast<uintptr_t>(out.data) + static_cast<uintptr_t>(lo * BytesOf(out.dtype));
    const auto out_last = reinterpret_cast<uintptr_t>(out.data) + static_cast<uintptr_t>((hi + 1) * BytesOf(out.dtype));
    for (int r = 0; r < kOut; ++r) {
      const View& v = c.views[r];
      if ((r == kRowIdx && !c.gather_fused) || !v.Extent(&lo, &hi)) continue;
      const auto first = reinterpret_cast<uintptr_t>(v.data) + static_cast<uintptr_t>(lo * BytesOf(v.dtype));
      const auto last = reinterpret_cast<uintptr_t>(v.data) + static_cast<uintptr_t>((hi + 1) * BytesOf(v.dtype));
      if (first < out_last && out_first < last) return Refuse(__LINE__);
    }
  }
  int64_t total = 0;
  for (int64_t e = 0; e < s.g; ++e) {
    const int64_t value = IndexAt(groups, e);
    if (c.group_list_type == 0) {
      if (value < 0 || value > s.m - total) return Refuse(__LINE__);
      total += value;
    } else {
      if (value < total || value > s.m) return Refuse(__LINE__);
      total = value;
    }
  }
  if (total != s.m) return Refuse(__LINE__);
  if (c.gather_fused && c.row_idx_type == 0) {
    std::vector<int64_t> named;
    for (int64_t i = 0; i < s.m; ++i) {
      const int64_t slot = IndexAt(idx, i);
      if (slot < 0 || slot >= slots) return Refuse(__LINE__);
      named.push_back(slot);
    }
    std::sort(named.begin(), named.end());
    if (!allow_repeated_slots && std::adjacent_find(named.begin(), named.end()) != named.end()) {
      return Refuse(__LINE__);
    }
  } else if (c.gather_fused) {
    std::vector<bool> named(static_cast<size_t>(s.m));
    int64_t count = 0;
    for (int64_t p = 0; p < idx.dims[0]; ++p) {
      const int64_t row = IndexAt(idx, p);
      if (row == -1) continue;
      if (row < 0 || row >= s.m || named[row]) return Refuse(__LINE__);
      named[row] = true;
      ++count;
    }
    if (count != s.m) return Refuse(__LINE__);
  }
  if (sizes != nullptr) *sizes = s;
  return true;
}

// The output in float64 from the (current) inputs, for a call that meets the contract.
GK_FUZZ_NO_COVERAGE std::vector<double> Reference(const Call& c, const Sizes& s) {
  const View& x = c.views[kX];
  const View& op = c.views[kOperand];
  const View& idx = c.views[kRowIdx];
  const View& groups = c.views[kGroupList];
  std::vector<int64_t> x_row(static_cast<size_t>(s.m)), expert(static_cast<size_t>(s.m));
  int64_t row = 0;
  for (int64_t e = 0; e < s.g; ++e) {
    const int64_t value = IndexAt(groups, e);
    const int64_t end = c.group_list_type == 0 ? row + value : value;
    for (; row < end; ++row) expert[row] = e;
  }
  for (int64_t i = 0; i < s.m; ++i) x_row[i] = i;
  if (c.gather_fused && c.row_idx_type == 0) {
    for (int64_t i = 0; i < s.m; ++i) x_row[i] = IndexAt(idx, i) / c.top_k;
  } else if (c.gather_fused) {
    for (int64_t p = 0; p < idx.dims[0]; ++p) {
      const int64_t r = IndexAt(idx, p);
      if (r >= 0) x_row[r] = p / c.top_k;
    }
  }
  const auto dtype = static_cast<DType>(x.dtype);
  const auto xv = [&](int64_t i, int64_t k) {
    return static_cast<double>(gk::LoadAsF32(x.At(x_row[i] * s.k + k), 0, dtype));
  };
  std::vector<double> out;
  if (!c.weight_grad) {
    out.assign(static_cast<size_t>(s.m * s.n), 0.0);
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t n = 0; n < s.n; ++n) {
        for (int64_t k = 0; k < s.k; ++k) {
          out[i * s.n + n] += xv(i, k) * gk::LoadAsF32(op.At(WeightAt(c, expert[i], k, n)), 0, dtype);
        }
      }
    }
  } else {
    out.assign(static_cast<size_t>(s.g * s.k * s.n), 0.0);
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t k = 0; k < s.k; ++k) {
        for (int64_t n = 0; n < s.n; ++n) {
          out[(expert[i] * s.k + k) * s.n + n] += xv(i, k) * gk::LoadAsF32(op.At(i * s.n + n), 0, dtype);
        }
      }
    }
  }
  return out;
}

// The output's values before a run that adds into it (empty unless the result will be checked).
GK_FUZZ_NO_COVERAGE std::vector<double> PriorOutput(const Call& call) {
  std::vector<double> prior;
  Sizes s{};
  if (!call.accumulate || !call.exact_values || !MeetsContract(call, false, false, &s)) return prior;
  const View& out = call.views[kOut];
  for (int64_t i = 0; i < s.g * s.k * s.n; ++i) {
    prior.push_back(gk::LoadAsF32(out.At(i), 0, static_cast<DType>(out.dtype)));
  }
  return prior;
}

GK_FUZZ_NO_COVERAGE void CheckResult(const Call& call, const std::vector<double>& prior) {
  Sizes s{};
  if (!call.exact_values || !MeetsContract(call, false, false, &s)) return;
  const View& out = call.views[kOut];
  const auto out_dtype = static_cast<DType>(out.dtype);
  const std::vector<double> want = Reference(call, s);
  for (size_t i = 0; i < want.size(); ++i) {
    // Integer sums below 2^24 are exact in float32: the output is that value rounded once;
    // when adding, the prior value (any bits, NaN included: the output may sit on an unused
    // index buffer) plus that exact sum, one float32 addition as the kernel makes, rounded once.
    const double base = call.accumulate ? prior[i] : 0.0;
    const double expected =
        gk::RoundToDType(static_cast<float>(base) + static_cast<float>(want[i]), out_dtype);
    const double got = gk::LoadAsF32(out.At(static_cast<int64_t>(i)), 0, out_dtype);
    GK_FUZZ_CHECK(got == expected || (std::isnan(got) && std::isnan(expected)),
                  "output[%zu] = %.9g, reference %.9g", i, got, expected);
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
      case 5: call.transpose_weight = !call.transpose_weight; break;
      case 6: call.top_k = in.Bool() ? in.Range(-1, 4) : in.Pick(gk::fuzz::kHostileSizes); break;
      case 7: call.gather_fused = !call.gather_fused; break;
      default: {  // a tensor's descriptor (MutateView): a dim, the rank, an offset or strides, the dtype
        View& v = call.views[in.Range(0, kRoles - 1)];
        const int what = kind % 12 - 8;
        MutateView(in, v, what < 2 ? what : what == 3 ? 4 : in.Bool() ? 2 : 3);
        break;
      }
    }
  }
}

gkStatus RunPhase2(const Call& call, void* workspace, uint64_t size, gkOpExecutor* executor) {
  if (call.accumulate) return gkGroupedMatmulWeightGradAdd(workspace, size, executor, nullptr);
  return call.weight_grad ? gkGroupedMatmulWeightGrad(workspace, size, executor, nullptr)
                          : gkGroupedMatmul(workspace, size, executor, nullptr);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  gkSetNumThreads(static_cast<int32_t>(in.Range(1, 3)));
  Call call;
  const uint8_t shape_bits = in.U8();
  call.weight_grad = shape_bits & 1;
  call.gather_fused = (shape_bits >> 1) & 1;
  call.transpose_weight = (shape_bits >> 2) & 1;
  const bool weight_view = ((shape_bits >> 3) & 3) == 3;  // the forward's transposed-view form
  const bool out_in_dtype = (shape_bits >> 5) & 1;
  call.accumulate = call.weight_grad && ((shape_bits >> 6) & 1);
  const int64_t g = in.Range(1, 4), n = in.Range(1, 6);
  // Sometimes K past one forward k-block (kGroupedMatmulStreamBaseK = 256): the streamed path.
  const int64_t k = in.U8() < 24 ? in.Range(257, 520) : in.Range(1, 6);
  const int64_t batch = in.Range(1, 5);
  call.top_k = in.Range(1, 3);
  const int64_t slots = batch * call.top_k;
  const int64_t m = call.gather_fused ? in.Range(0, slots) : in.Range(0, 8);
  const uint8_t types = in.U8();
  call.row_idx_type = types < 240 ? (types & 1) : static_cast<int32_t>(in.Pick(kIndexValues));
  call.group_list_type = types < 240 ? ((types >> 1) & 1) : static_cast<int32_t>(in.Pick(kIndexValues));
  const int64_t extra = call.row_idx_type == 0 ? in.Range(0, 2) : 0;
  Routing routing = MakeRouting(in, m, g, std::max(slots, m), call.row_idx_type,
                                call.group_list_type, extra);

  View& x = call.views[kX];
  View& op = call.views[kOperand];
  View& idx = call.views[kRowIdx];
  View& groups = call.views[kGroupList];
  View& out = call.views[kOut];
  x.dtype = in.Pick(kFloatDTypes);
  op.dtype = in.U8() < 240 ? x.dtype : in.Pick(kFloatDTypes);
  idx.dtype = in.Bool() ? GK_INT32 : GK_INT64;
  groups.dtype = in.Bool() ? GK_INT32 : GK_INT64;
  out.dtype = out_in_dtype ? x.dtype : GK_FLOAT;
  x.rank = 2, x.dims[0] = call.gather_fused ? batch : m, x.dims[1] = k;
  if (call.weight_grad) {
    op.rank = 2, op.dims[0] = m, op.dims[1] = n;
    out.rank = 3, out.dims[0] = g, out.dims[1] = k, out.dims[2] = n;
  } else {
    op.rank = 3, op.dims[0] = g;
    op.dims[1] = call.transpose_weight ? n : k;
    op.dims[2] = call.transpose_weight ? k : n;
    if (weight_view) {  // the same dims, read from the other layout's buffer
      op.explicit_strides = true;
      op.strides[0] = k * n, op.strides[1] = 1, op.strides[2] = op.dims[1];
    }
    out.rank = 2, out.dims[0] = m, out.dims[1] = n;
  }
  idx.rank = 1, idx.dims[0] = static_cast<int64_t>(routing.row_idx.size());
  groups.rank = 1, groups.dims[0] = g;
  Mutate(in, call, routing, slots, m);
  idx.present = call.gather_fused;

  // Memory. NULL data, the output overlapping an input, NULL descriptors.
  const uint8_t memory = in.U8();
  for (int r = 0; r < kRoles; ++r) {
    if (r == kOut && memory >= 224) continue;
    Back(call, call.views[r], memory >= 248 && (memory & 7) == r);
  }
  if (memory >= 224) Share(call, out, call.views[in.Range(0, kGroupList)], in.Range(-16, 16));
  call.exact_values = in.U8() < 224;
  FillFloatViews(call, call.views, {kX, kOperand, kOut}, kOut, call.exact_values, in.U64() | 1);
  FillIndex(call, call.views[kRowIdx], routing.row_idx);
  FillIndex(call, call.views[kGroupList], routing.group_list);
  const uint8_t nulls = in.U8();
  for (int r = 0; r < kRoles; ++r) {
    if (r != kRowIdx) call.views[r].present = !(nulls >= 240 && (nulls & 7) == r);
  }
  const bool null_size = nulls >= 240 && (nulls & 7) == 5;
  const bool null_executor = nulls >= 240 && (nulls & 7) == 6;
  const uint8_t phase2 = in.U8();
  const int64_t workspace_shift = in.Range(0, 7);
  const int64_t corrupt_at = in.Range(0, 63);
  const int64_t corrupt_value = in.Bool() ? in.Range(-2, slots + 2) : in.Pick(kIndexValues);

  // Phase 1 reads the index arrays (the contract says so): hostile index descriptors are fuzzed
  // only where the bytes they claim exist.
  for (int r : {kRowIdx, kGroupList}) {
    const View& v = call.views[r];
    if (v.present && v.data != nullptr && !v.backed) return 0;
  }
  for (View& v : call.views) {
    if (!v.present) continue;
    v.tensor = gkFuzzCreateTensor(v.dims, static_cast<uint64_t>(v.rank), v.dtype,
                                  v.explicit_strides ? v.strides : nullptr, v.offset, v.data);
  }
  // A NULL expandedRowIdx (a descriptor gkCreateTensor refused) is a plain x: the call is that.
  call.gather_fused = idx.tensor != nullptr;
  const auto before = Snapshot(call);
  uint64_t workspace_size = 12345;
  gkOpExecutor* executor = reinterpret_cast<gkOpExecutor*>(&call);  // must be overwritten
  const gkTensor* idx_tensor = call.gather_fused ? idx.tensor : nullptr;
  const gkStatus status =
      call.weight_grad
          ? gkFuzzGroupedMatmulWeightGradGetWorkspaceSize(
                x.tensor, op.tensor, groups.tensor, call.group_list_type, idx_tensor,
                call.row_idx_type, call.top_k, out.tensor, call.accumulate,
                null_size ? nullptr : &workspace_size, null_executor ? nullptr : &executor)
          : gkFuzzGroupedMatmulGetWorkspaceSize(
                x.tensor, op.tensor, groups.tensor, call.group_list_type, call.transpose_weight,
                idx_tensor, call.row_idx_type, call.top_k, out.tensor,
                null_size ? nullptr : &workspace_size, null_executor ? nullptr : &executor);

  bool all_backed = true;
  for (int r = 0; r < kRoles; ++r) all_backed &= (r == kRowIdx && !call.gather_fused) || call.views[r].backed;
  if (status != GK_SUCCESS) {
    CheckFailure(status, "phase 1");
    if (!null_executor) GK_FUZZ_CHECK(executor == nullptr, "phase 1 failed but left an executor");
    CheckUnchanged(call, before, "failed phase 1");
    if (all_backed) {
      GK_FUZZ_CHECK(!MeetsContract(call, null_size, null_executor, nullptr),
                    "phase 1 refused a call that meets the contract: %s", gkGetRecentErrMsg());
    }
  } else {
    GK_FUZZ_CHECK(executor != nullptr, "phase 1 succeeded without an executor");
    CheckUnchanged(call, before, "phase 1");
    if (all_backed) {
      GK_FUZZ_CHECK(MeetsContract(call, null_size, null_executor, nullptr),
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
    CheckFailure(RunPhase2(call, ws, workspace_size, nullptr), "NULL executor");
    switch (phase2 % 6) {
      case 1:
        if (workspace_size > 0) {
          CheckFailure(RunPhase2(call, ws, workspace_size - 1, executor), "short workspace");
          CheckUnchanged(call, before, "short workspace");
        }
        break;
      case 2:
        if (workspace_size > 0) {
          CheckFailure(RunPhase2(call, nullptr, workspace_size, executor), "NULL workspace");
          CheckUnchanged(call, before, "NULL workspace");
        }
        break;
      case 3: {
        Call other;  // the forward's executor to the weight grad, the others' to the forward
        other.weight_grad = !call.weight_grad;
        other.accumulate = !call.weight_grad && ((phase2 >> 3) & 1);
        CheckFailure(RunPhase2(other, ws, workspace_size, executor),
                     "executor given to the other operator");
        CheckUnchanged(call, before, "executor given to the other operator");
        break;
      }
      case 5:
        GK_FUZZ_CHECK(gkSetExecutorRepeatable(executor) == GK_SUCCESS, "gkSetExecutorRepeatable");
        break;
      default:
        break;
    }
    const std::vector<double> prior = PriorOutput(call);
    const gkStatus run = RunPhase2(call, ws, workspace_size, executor);
    GK_FUZZ_CHECK(run == GK_SUCCESS, "phase 2 failed after phase 1 succeeded: %s",
                  gkGetRecentErrMsg());
    workspace.CheckGuards("workspace");
    CheckUnchanged(call, before, "phase 2 (inputs)", out.buffer);
    CheckResult(call, prior);
    const auto after = Snapshot(call);
    if (phase2 % 6 == 4) {
      CheckFailure(RunPhase2(call, ws, workspace_size, executor), "executor run twice");
      CheckUnchanged(call, after, "executor run twice");
    }
    if (phase2 % 6 == 5) {
      const std::vector<double> prior_again = PriorOutput(call);
      GK_FUZZ_CHECK(RunPhase2(call, ws, workspace_size, executor) == GK_SUCCESS, "repeated run");
      if (call.accumulate) {  // added a second time
        CheckUnchanged(call, after, "repeated run (inputs)", out.buffer);
        CheckResult(call, prior_again);
      } else {
        CheckUnchanged(call, after, "repeated run");
      }
      const bool in_group_list = ((phase2 >> 3) & 1) || !call.gather_fused;
      std::vector<int64_t>& values = in_group_list ? routing.group_list : routing.row_idx;
      if (!values.empty()) {
        values[static_cast<size_t>(corrupt_at) % values.size()] = corrupt_value;
        FillIndex(call, call.views[in_group_list ? kGroupList : kRowIdx], values);
        const auto changed = Snapshot(call);
        const std::vector<double> prior_rerun = PriorOutput(call);
        const gkStatus rerun = RunPhase2(call, ws, workspace_size, executor);
        if (rerun != GK_SUCCESS) {
          CheckFailure(rerun, "run on changed index data");
          CheckUnchanged(call, changed, "failed run on changed index data");
        } else {
          GK_FUZZ_CHECK(MeetsContract(call, false, false, nullptr, /*allow_repeated_slots=*/true),
                        "phase 2 ran on index data that breaks the contract");
          CheckResult(call, prior_rerun);
        }
      }
    }
  }
  if (status == GK_SUCCESS) gkDestroyExecutor(executor);
  for (View& v : call.views) gkDestroyTensor(v.tensor);
  return 0;
}
