// Fuzz target: MoeInitRouting's two-phase C API. From a valid call (random small shapes, expert
// choices of any skew, capacity 0 or a few rows, expandedX from M to Rmax rows or NULL (index-only
// routing), either rowIdxType,
// either groupListType, x with strided rows) the input applies mutations: experts out of range,
// hostile expertNum / expertCapacity / enum values, too few or too many rows, wrong shapes, ranks,
// dtypes, strides, offsets, NULL pointers, an output overlapping an input; then phase-2 misuse
// (short or NULL workspace, another operator's phase 2, a second run, expertIdx changed before a
// repeated run).
// Guarantees checked:
//   - phase 1 succeeds exactly when the arguments meet the header's contract (an independent
//     check here); a failure has a message, no executor, and leaves every buffer unchanged;
//   - phase 2 writes nothing outside its outputs (ASan, exact buffers), and the outputs equal
//     moe_init_routing_ref.h's routing bit for bit: expandedX rows are copies of x's bytes (any
//     bits, NaN included), rows past M zeros, gather entries past M -1;
//   - expertIdx made invalid after phase 1 fails phase 2 with the outputs unchanged.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gradkit/gradkit.h"
#include "ops/moe_init_routing/moe_init_routing_ref.h"
#include "tests/fuzz/c_caller.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

// The shared views, memory and checks (fuzz_support.h).
using namespace gk::fuzz;  // NOLINT(build/namespaces)

enum Role { kX, kExpertIdx, kExpandedX, kRowIdx, kGroupList, kRoles };
constexpr int kFirstOutput = kExpandedX;

struct Call : gk::fuzz::GuardedMemory {
  View views[kRoles];
  int64_t capacity = 0, expert_num = 1;
  int32_t row_idx_type = 0, group_list_type = 0;  // the C enums: any int
};

// The header's contract, checked independently of gradkit; on success `experts` holds expertIdx
// in slot order. Only called when every view is backed.
// Whether a view reaches the API as a descriptor: one whose gkCreateTensor failed is passed as
// NULL, which for expandedX is index-only routing, the same as not passing it.
bool Passed(const View& v) { return v.present && v.tensor != nullptr; }

GK_FUZZ_NO_COVERAGE bool MeetsContract(const Call& c, bool null_size, bool null_executor,
                                       std::vector<int64_t>* experts) {
  if (null_size || null_executor) return Refuse(__LINE__);
  // expandedX may be NULL (index-only routing); then R is the gather index's length.
  const bool index_only = !Passed(c.views[kExpandedX]);
  for (int r = 0; r < kRoles; ++r) {
    if (r == kExpandedX && index_only) continue;
    if (!c.views[r].present || c.views[r].tensor == nullptr) return Refuse(__LINE__);
  }
  const View& x = c.views[kX];
  const View& e = c.views[kExpertIdx];
  const View& ex = c.views[kExpandedX];
  const View& idx = c.views[kRowIdx];
  const View& groups = c.views[kGroupList];
  if (!IsFloat(x.dtype) || !IsIndex(e.dtype) || !IsIndex(idx.dtype)) return Refuse(__LINE__);
  if (!index_only && ex.dtype != x.dtype) return Refuse(__LINE__);
  if (groups.dtype != GK_INT64) return Refuse(__LINE__);
  const int64_t g = c.expert_num, cap = c.capacity;
  if (g < 1 || g >= (int64_t{1} << 31) || cap < 0) return Refuse(__LINE__);
  if ((c.row_idx_type != 0 && c.row_idx_type != 1) || (c.group_list_type != 0 && c.group_list_type != 1)) {
    return Refuse(__LINE__);
  }
  if (x.rank != 2 || e.rank != 2 || (!index_only && ex.rank != 2) || idx.rank != 1 || groups.rank != 1) {
    return Refuse(__LINE__);
  }
  const int64_t batch = x.dims[0], h = x.dims[1], top_k = e.dims[1];
  int64_t slots;
  if (batch < 1 || h < 1 || e.dims[0] != batch || top_k < 1) return Refuse(__LINE__);
  if (__builtin_mul_overflow(batch, top_k, &slots) || slots > (int64_t{1} << 59)) return Refuse(__LINE__);
  int64_t max_rows = slots, capped;
  if (cap > 0 && !__builtin_mul_overflow(g, cap, &capped)) max_rows = std::min(slots, capped);
  const int64_t rows = !index_only ? ex.dims[0] : c.row_idx_type == 0 ? idx.dims[0] : max_rows;
  if ((!index_only && ex.dims[1] != h) || groups.dims[0] != g || rows < 0 || rows > max_rows) {
    return Refuse(__LINE__);
  }
  if (idx.dims[0] != (c.row_idx_type == 0 ? rows : slots)) return Refuse(__LINE__);
  if (idx.dtype == GK_INT32 && slots > INT32_MAX) return Refuse(__LINE__);
  if (h > 1 && x.Stride(1) != 1) return Refuse(__LINE__);
  const auto used = [&](int r) { return r != kExpandedX || !index_only; };
  for (int r = 0; r < kRoles; ++r) {
    const View& v = c.views[r];
    if (!used(r)) continue;
    if ((v.Count() > 0 && v.data == nullptr) || !v.Addressable()) return Refuse(__LINE__);
    if (r != kX && !v.Contiguous()) return Refuse(__LINE__);
  }
  for (int o = kFirstOutput; o < kRoles; ++o) {
    for (int r = 0; r < kRoles; ++r) {
      if (r != o && used(o) && used(r) && Overlap(c.views[o], c.views[r])) return Refuse(__LINE__);
    }
  }
  std::vector<int64_t> values(static_cast<size_t>(slots));
  std::vector<int64_t> count(static_cast<size_t>(g), 0);
  for (int64_t p = 0; p < slots; ++p) {
    values[p] = IndexAt(e, p);
    if (values[p] < 0 || values[p] >= g) return Refuse(__LINE__);
    ++count[values[p]];
  }
  int64_t m = 0;
  for (int64_t n : count) m += cap > 0 ? std::min(n, cap) : n;
  if (m > rows) return Refuse(__LINE__);
  if (experts != nullptr) *experts = values;
  return true;
}

GK_FUZZ_NO_COVERAGE void CheckResult(const Call& c) {
  std::vector<int64_t> experts;
  if (!MeetsContract(c, false, false, &experts)) return;
  const View& x = c.views[kX];
  const View& ex = c.views[kExpandedX];
  const View& idx = c.views[kRowIdx];
  const View& groups = c.views[kGroupList];
  const auto ref = gk::MoeInitRoutingReference(experts, c.expert_num, c.capacity);
  const int64_t h = x.dims[1], top_k = c.views[kExpertIdx].dims[1];
  const int64_t rows = Passed(ex) ? ex.dims[0] : 0;  // index-only: no expandedX to check
  const auto row_bytes = static_cast<size_t>(h * BytesOf(x.dtype));
  const std::vector<uint8_t> zeros(row_bytes, 0);
  for (int64_t i = 0; i < rows; ++i) {
    const uint8_t* want = zeros.data();
    if (i < ref.m) {
      const int64_t token = ref.row_slot[i] / top_k;
      want = gk::fuzz::Offset(x.data, (static_cast<__int128>(x.offset) + token * x.Stride(0)) *
                                          BytesOf(x.dtype));
    }
    GK_FUZZ_CHECK(std::memcmp(ex.At(i * h), want, row_bytes) == 0,
                  "expandedX row %lld of %lld (M %lld) differs from the reference",
                  static_cast<long long>(i), static_cast<long long>(rows), static_cast<long long>(ref.m));
  }
  for (int64_t i = 0; i < idx.dims[0]; ++i) {
    const int64_t want = c.row_idx_type == 1 ? ref.slot_row[i] : i < ref.m ? ref.row_slot[i] : -1;
    GK_FUZZ_CHECK(IndexAt(idx, i) == want, "expandedRowIdx[%lld] = %lld, reference %lld",
                  static_cast<long long>(i), static_cast<long long>(IndexAt(idx, i)),
                  static_cast<long long>(want));
  }
  for (int64_t e = 0; e < c.expert_num; ++e) {
    const int64_t want = c.group_list_type == 1 ? ref.group_cumsum[e] : ref.group_counts[e];
    GK_FUZZ_CHECK(IndexAt(groups, e) == want, "groupList[%lld] = %lld, reference %lld",
                  static_cast<long long>(e), static_cast<long long>(IndexAt(groups, e)),
                  static_cast<long long>(want));
  }
}

void Mutate(ByteReader& in, Call& call, std::vector<int64_t>& experts) {
  const int mutations = static_cast<int>(in.Range(0, 3));
  for (int i = 0; i < mutations; ++i) {
    View& v = call.views[in.Range(0, kRoles - 1)];
    const int kind = in.U8() % 9;
    switch (kind) {
      case 0:  // an expert out of range (or at the edge)
        experts[static_cast<size_t>(in.Range(0, static_cast<int64_t>(experts.size()) - 1))] =
            in.Bool() ? in.Range(-1, call.expert_num) : in.Pick(gk::fuzz::kIndexValues);
        break;
      case 1: call.expert_num = in.Bool() ? in.Range(-1, 6) : in.Pick(gk::fuzz::kHostileSizes); break;
      case 2: call.capacity = in.Bool() ? in.Range(-1, 3) : in.Pick(gk::fuzz::kHostileSizes); break;
      case 3:
        if (in.Bool()) {
          call.row_idx_type = static_cast<int32_t>(in.Pick(gk::fuzz::kIndexValues));
        } else {
          call.group_list_type = static_cast<int32_t>(in.Range(-1, 2));
        }
        break;
      default: gk::fuzz::MutateView(in, v, kind - 4); break;  // the view's descriptor
    }
  }
}

// Arbitrary bits in every float buffer (expandedX is a byte copy) and in the outputs (a canary).
GK_FUZZ_NO_COVERAGE void FillBytes(Call& call, uint64_t state) {
  for (int r : {kX, kExpandedX, kRowIdx, kGroupList}) {
    if (call.views[r].buffer < 0) continue;
    GuardedBuffer& b = *call.buffers[call.views[r].buffer];
    for (size_t i = 0; i < b.size(); ++i) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      b.data()[i] = static_cast<uint8_t>(state >> 32);
    }
  }
}

gkStatus RunPhase2(void* workspace, uint64_t size, gkOpExecutor* executor, void* stream) {
  return gkMoeInitRouting(workspace, size, executor, stream);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  gkSetNumThreads(static_cast<int32_t>(in.Range(1, 3)));
  Call call;
  const uint8_t bits = in.U8();
  call.row_idx_type = bits & 1;
  call.group_list_type = (bits >> 1) & 1;
  const int64_t batch = in.Range(1, 5), top_k = in.Range(1, 4), h = in.Range(1, 6);
  call.expert_num = in.Range(1, 5);
  call.capacity = in.U8() < 160 ? 0 : in.Range(1, 4);
  const int64_t slots = batch * top_k;
  // Expert choices: uniform, or (skewed) mostly expert `hot`.
  std::vector<int64_t> experts(static_cast<size_t>(slots));
  const uint8_t skew = in.U8();
  const int64_t hot = in.Range(0, call.expert_num - 1);
  uint64_t state = in.U64() | 1;
  for (auto& e : experts) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    e = (state & 0xFF) < skew ? hot : static_cast<int64_t>((state >> 8) % call.expert_num);
  }
  const auto routing = gk::MoeInitRoutingReference(experts, call.expert_num, call.capacity);
  const int64_t max_rows =
      call.capacity > 0 ? std::min(slots, call.expert_num * call.capacity) : slots;
  const uint8_t rows_choice = in.U8();
  const int64_t rows = rows_choice < 128   ? max_rows
                       : rows_choice < 192 ? routing.m
                       : rows_choice < 240 ? in.Range(routing.m, max_rows)
                                           : routing.m - 1;  // too few: refused

  View& x = call.views[kX];
  View& e = call.views[kExpertIdx];
  View& ex = call.views[kExpandedX];
  View& idx = call.views[kRowIdx];
  View& groups = call.views[kGroupList];
  x.dtype = in.Pick(gk::fuzz::kFloatDTypes);
  ex.dtype = in.U8() < 240 ? x.dtype : in.Pick(gk::fuzz::kFloatDTypes);
  e.dtype = in.Bool() ? GK_INT32 : GK_INT64;
  idx.dtype = in.Bool() ? GK_INT32 : GK_INT64;
  groups.dtype = in.U8() < 240 ? GK_INT64 : GK_INT32;
  x.rank = 2, x.dims[0] = batch, x.dims[1] = h;
  if (in.Bool()) {  // strided rows, as the header allows
    x.explicit_strides = true;
    x.strides[0] = h + in.Range(0, 3), x.strides[1] = 1;
  }
  e.rank = 2, e.dims[0] = batch, e.dims[1] = top_k;
  ex.rank = 2, ex.dims[0] = std::max<int64_t>(rows, 0), ex.dims[1] = h;
  idx.rank = 1, idx.dims[0] = call.row_idx_type == 0 ? ex.dims[0] : slots;
  groups.rank = 1, groups.dims[0] = call.expert_num;
  Mutate(in, call, experts);

  // Memory: NULL data, an output on an input's buffer (or another output's), NULL descriptors.
  const uint8_t memory = in.U8();
  const int shared_output = memory >= 224 ? kFirstOutput + memory % 3 : -1;
  for (int r = 0; r < kRoles; ++r) {
    if (r != shared_output) Back(call, call.views[r], memory >= 248 && (memory % kRoles) == r);
  }
  if (shared_output >= 0) {
    int owner = static_cast<int>(in.Range(0, kRoles - 1));
    if (owner == shared_output) owner = kX;
    gk::fuzz::Share(call, call.views[shared_output], call.views[owner], in.Range(-16, 16));
  }
  FillBytes(call, in.U64() | 1);
  FillIndex(call, e, experts);
  const uint8_t nulls = in.U8();
  for (int r = 0; r < kRoles; ++r) call.views[r].present = !(nulls >= 240 && (nulls % 8) == r);
  if (((bits >> 2) & 7) == 7) ex.present = false;  // index-only routing
  const bool null_size = nulls >= 240 && (nulls % 8) == 5;
  const bool null_executor = nulls >= 240 && (nulls % 8) == 6;
  const uint8_t phase2 = in.U8();
  const int64_t workspace_shift = in.Range(0, 7);
  const int64_t corrupt_at = in.Range(0, 63);
  const int64_t corrupt_value = in.Bool() ? in.Range(-1, call.expert_num) : in.Pick(gk::fuzz::kIndexValues);

  // Phase 1 reads expertIdx: a hostile descriptor for it is fuzzed only where its bytes exist.
  if (e.present && e.data != nullptr && !e.backed) return 0;
  for (View& v : call.views) {
    if (!v.present) continue;
    v.tensor = gkFuzzCreateTensor(v.dims, static_cast<uint64_t>(v.rank), v.dtype,
                                  v.explicit_strides ? v.strides : nullptr, v.offset, v.data);
  }
  const auto before = gk::fuzz::Snapshot(call);
  uint64_t workspace_size = 12345;
  gkOpExecutor* executor = reinterpret_cast<gkOpExecutor*>(&call);  // must be overwritten
  const gkStatus status = gkFuzzMoeInitRoutingGetWorkspaceSize(
      x.tensor, e.tensor, call.capacity, call.expert_num, call.group_list_type, call.row_idx_type,
      ex.tensor, idx.tensor, groups.tensor, null_size ? nullptr : &workspace_size,
      null_executor ? nullptr : &executor);

  bool all_backed = true;
  for (const View& v : call.views) all_backed &= v.backed;
  gk::fuzz::CheckPhase1(status, executor, null_executor, call, before, all_backed, [&] {
    return MeetsContract(call, null_size, null_executor, nullptr);
  });
  if (status == GK_SUCCESS && all_backed) {
    GK_FUZZ_CHECK(workspace_size <= (uint64_t{1} << 28), "workspace of %llu bytes for a small call",
                  static_cast<unsigned long long>(workspace_size));
    GuardedBuffer workspace(static_cast<size_t>(workspace_size + workspace_shift));
    void* ws = workspace.data() + workspace_shift;
    gk::fuzz::CheckPhase2Misuse(phase2 % 6 < 4 ? phase2 % 6 : 0, call, before, ws, workspace_size,
                                executor, RunPhase2, gkMoeFinalizeRouting);
    if (phase2 % 6 == 5) {
      GK_FUZZ_CHECK(gkSetExecutorRepeatable(executor) == GK_SUCCESS, "gkSetExecutorRepeatable");
    }
    GK_FUZZ_CHECK(RunPhase2(ws, workspace_size, executor, nullptr) == GK_SUCCESS,
                  "phase 2 failed after phase 1 succeeded: %s", gkGetRecentErrMsg());
    workspace.CheckGuards("workspace");
    const auto after = gk::fuzz::Snapshot(call);
    for (int r = 0; r < kRoles; ++r) {  // the inputs, and expandedX's memory when not passed
      // (An output not passed may share its buffer with one that was: that one's bytes change.)
      const auto shares_a_passed_output = [&](int r) {
        for (int o = kFirstOutput; o < kRoles; ++o) {
          if (o != r && Passed(call.views[o]) && call.views[o].buffer == call.views[r].buffer) return true;
        }
        return false;
      };
      if ((r < kFirstOutput || (!Passed(call.views[r]) && !shares_a_passed_output(r))) &&
          call.views[r].buffer >= 0) {
        GK_FUZZ_CHECK(after[call.views[r].buffer] == before[call.views[r].buffer],
                      "phase 2 changed input %d", r);
      }
    }
    CheckUnchanged(call, after, "guards after phase 2");
    CheckResult(call);
    if (phase2 % 6 == 4) {
      CheckFailure(RunPhase2(ws, workspace_size, executor, nullptr), "executor run twice");
      CheckUnchanged(call, after, "executor run twice");
    }
    if (phase2 % 6 == 5) {
      GK_FUZZ_CHECK(RunPhase2(ws, workspace_size, executor, nullptr) == GK_SUCCESS, "repeated run");
      CheckUnchanged(call, after, "repeated run");
      experts[static_cast<size_t>(corrupt_at) % experts.size()] = corrupt_value;
      FillIndex(call, e, experts);
      const auto changed = gk::fuzz::Snapshot(call);
      const gkStatus rerun = RunPhase2(ws, workspace_size, executor, nullptr);
      if (rerun != GK_SUCCESS) {
        CheckFailure(rerun, "run on changed expertIdx");
        CheckUnchanged(call, changed, "failed run on changed expertIdx");
      } else {
        GK_FUZZ_CHECK(MeetsContract(call, false, false, nullptr),
                      "phase 2 ran on an expertIdx that breaks the contract");
        CheckResult(call);
      }
    }
  }
  if (status == GK_SUCCESS) gkDestroyExecutor(executor);
  for (View& v : call.views) gkDestroyTensor(v.tensor);
  return 0;
}
