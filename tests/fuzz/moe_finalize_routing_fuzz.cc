// Fuzz target: MoeFinalizeRouting and MoeFinalizeRoutingGrad's two-phase C APIs. From a valid
// call (either operator, either rowIdxType, M from 0 to batch * topK, probs and outputs in float32
// or the dtype) the input applies mutations: out-of-range, repeated and -1 indices, a hostile
// rowIdxType, wrong shapes, ranks, dtypes (invalid enum values included), strides, offsets, NULL
// pointers, an output overlapping an input; then phase-2 misuse (short or NULL workspace, the
// other operator's phase 2, a second run, index data changed before a repeated run).
// Guarantees checked:
//   - phase 1 succeeds exactly when the arguments meet the header's contract (an independent
//     check here); a failure has a message, no executor, and leaves every buffer unchanged;
//   - phase 2 writes nothing outside its outputs (ASan, exact buffers) and each output equals
//     moe_finalize_routing_ref.h's float64 reference rounded once to its dtype (inputs are small
//     integers and probabilities multiples of 1/4: every float32 operation is exact);
//   - index data made invalid after phase 1 fails phase 2 with the outputs unchanged.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "gradkit/gradkit.h"
#include "ops/moe_finalize_routing/moe_finalize_routing_ref.h"
#include "tests/fuzz/c_caller.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using gk::DType;
// The shared views, memory and checks (fuzz_support.h).
using namespace gk::fuzz;  // NOLINT(build/namespaces)

// out is the forward's out [batch, N] or the backward's gradExpandedY [M, N]; gradOut and
// gradProbs exist in the backward only.
enum Role { kY, kProbs, kRowIdx, kGradOut, kOut, kGradProbs, kRoles };

struct Call : gk::fuzz::GuardedMemory {
  View views[kRoles];
  bool backward = false;
  int32_t row_idx_type = 0;  // the C enum: any int
  bool exact_values = true;
  bool Uses(int role) const { return backward || (role != kGradOut && role != kGradProbs); }
  bool IsOutput(int role) const { return role == kOut || role == kGradProbs; }
};

bool FloatOr32(int32_t dtype, int32_t like) { return dtype == GK_FLOAT || dtype == like; }

// The header's contract, checked independently of gradkit; on success slot_row (batch * topK)
// holds the row of every slot or -1. Only called when every used view is backed.
// allow_repeated_slots: phase 2 of a repeatable executor re-checks index ranges only.
GK_FUZZ_NO_COVERAGE bool MeetsContract(const Call& c, bool null_size, bool null_executor,
                                       std::vector<int64_t>* slot_row,
                                       bool allow_repeated_slots = false) {
  if (null_size || null_executor) return Refuse(__LINE__);
  for (int r = 0; r < kRoles; ++r) {
    if (c.Uses(r) && (!c.views[r].present || c.views[r].tensor == nullptr)) return Refuse(__LINE__);
  }
  const View& y = c.views[kY];
  const View& probs = c.views[kProbs];
  const View& idx = c.views[kRowIdx];
  const View& out = c.views[kOut];
  if (!IsFloat(y.dtype) || !FloatOr32(probs.dtype, y.dtype) || !IsIndex(idx.dtype)) return Refuse(__LINE__);
  if (!FloatOr32(out.dtype, y.dtype)) return Refuse(__LINE__);
  if (c.backward && (!FloatOr32(c.views[kGradOut].dtype, y.dtype) ||
                     !FloatOr32(c.views[kGradProbs].dtype, probs.dtype))) {
    return Refuse(__LINE__);
  }
  if (c.row_idx_type != 0 && c.row_idx_type != 1) return Refuse(__LINE__);
  for (int r = 0; r < kRoles; ++r) {
    if (c.Uses(r) && c.views[r].rank != (r == kRowIdx ? 1 : 2)) return Refuse(__LINE__);
  }
  const int64_t m = y.dims[0], n = y.dims[1], batch = probs.dims[0], top_k = probs.dims[1];
  int64_t slots;
  if (m < 0 || n < 1 || n >= (int64_t{1} << 31) || batch < 1 || top_k < 1) return Refuse(__LINE__);
  if (__builtin_mul_overflow(batch, top_k, &slots) || m > slots) return Refuse(__LINE__);
  const auto has_dims = [](const View& v, int64_t d0, int64_t d1) {
    return v.dims[0] == d0 && v.dims[1] == d1;
  };
  if (!c.backward && !has_dims(out, batch, n)) return Refuse(__LINE__);
  if (c.backward && (!has_dims(c.views[kGradOut], batch, n) || !has_dims(out, m, n) ||
                     !has_dims(c.views[kGradProbs], batch, top_k))) {
    return Refuse(__LINE__);
  }
  const int64_t l = idx.dims[0];
  if (c.row_idx_type == 0 ? l < m : l != slots) return Refuse(__LINE__);
  for (int r = 0; r < kRoles; ++r) {
    const View& v = c.views[r];
    if (!c.Uses(r)) continue;
    if ((v.Count() > 0 && v.data == nullptr) || !v.Addressable() || !v.Contiguous()) return Refuse(__LINE__);
  }
  for (int o = 0; o < kRoles; ++o) {
    if (!c.Uses(o) || !c.IsOutput(o)) continue;
    for (int r = 0; r < kRoles; ++r) {
      if (r != o && c.Uses(r) && Overlap(c.views[o], c.views[r])) return Refuse(__LINE__);
    }
  }
  std::vector<int64_t> rows(static_cast<size_t>(slots), -1);
  if (c.row_idx_type == 0) {
    for (int64_t i = 0; i < m; ++i) {
      const int64_t slot = IndexAt(idx, i);
      if (slot < 0 || slot >= slots) return Refuse(__LINE__);
      if (rows[slot] >= 0 && !allow_repeated_slots) return Refuse(__LINE__);
      rows[slot] = i;
    }
  } else {
    std::vector<bool> named(static_cast<size_t>(m), false);
    for (int64_t p = 0; p < slots; ++p) {
      const int64_t row = IndexAt(idx, p);
      if (row == -1) continue;
      if (row < 0 || row >= m || named[row]) return Refuse(__LINE__);
      named[row] = true;
      rows[p] = row;
    }
    if (std::count(named.begin(), named.end(), true) != m) return Refuse(__LINE__);
  }
  if (slot_row != nullptr) *slot_row = rows;
  return true;
}

GK_FUZZ_NO_COVERAGE std::vector<float> Values(const View& v) {
  std::vector<float> out(static_cast<size_t>(v.Count()));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = gk::LoadAsF32(v.At(static_cast<int64_t>(i)), 0, static_cast<DType>(v.dtype));
  }
  return out;
}

GK_FUZZ_NO_COVERAGE void CheckOutput(const View& out, const std::vector<gk::MoeFinalizeRefValue>& want,
                                     const char* name) {
  const auto dtype = static_cast<DType>(out.dtype);
  GK_FUZZ_CHECK(static_cast<size_t>(out.Count()) == want.size(), "%s: size", name);
  for (size_t i = 0; i < want.size(); ++i) {
    const double expected = gk::RoundToDType(static_cast<float>(want[i].value), dtype);
    const double got = gk::LoadAsF32(out.At(static_cast<int64_t>(i)), 0, dtype);
    GK_FUZZ_CHECK(got == expected, "%s[%zu] = %.9g, reference %.9g", name, i, got, expected);
  }
}

GK_FUZZ_NO_COVERAGE void CheckResult(const Call& c) {
  std::vector<int64_t> slot_row;
  if (!c.exact_values || !MeetsContract(c, false, false, &slot_row)) return;
  const View& y = c.views[kY];
  const View& probs = c.views[kProbs];
  const int64_t m = y.dims[0], n = y.dims[1], batch = probs.dims[0], top_k = probs.dims[1];
  if (!c.backward) {
    CheckOutput(c.views[kOut], gk::MoeFinalizeReference(Values(y), Values(probs), slot_row, batch, top_k, n),
                "out");
    return;
  }
  const auto ref = gk::MoeFinalizeGradReference(Values(c.views[kGradOut]), Values(y), Values(probs),
                                                slot_row, m, batch, top_k, n);
  CheckOutput(c.views[kOut], ref.grad_y, "gradExpandedY");
  CheckOutput(c.views[kGradProbs], ref.grad_probs, "gradProbs");
}

void Mutate(ByteReader& in, Call& call, std::vector<int64_t>& row_idx, int64_t slots) {
  const int mutations = static_cast<int>(in.Range(0, 3));
  for (int i = 0; i < mutations; ++i) {
    const auto pick = [&] { return static_cast<size_t>(in.Range(0, static_cast<int64_t>(row_idx.size()) - 1)); };
    View& v = call.views[in.Range(0, kRoles - 1)];
    const int kind = in.U8() % 9;
    switch (kind) {
      case 0: if (!row_idx.empty()) row_idx[pick()] = in.Range(-2, slots + 2); break;
      case 1: if (!row_idx.empty()) row_idx[pick()] = in.Pick(gk::fuzz::kIndexValues); break;
      case 2: if (row_idx.size() > 1) row_idx[pick()] = row_idx[pick()]; break;  // a repeat
      case 3:
        call.row_idx_type = in.Bool() ? static_cast<int32_t>(in.Range(-1, 2))
                                      : static_cast<int32_t>(in.Pick(gk::fuzz::kIndexValues));
        break;
      default: gk::fuzz::MutateView(in, v, kind - 4); break;  // the view's descriptor
    }
  }
}

// Small integers (y, gradOut), multiples of 1/4 (probs), a canary in the outputs; or, for
// !exact_values, arbitrary bits everywhere (NaN and infinity included).
GK_FUZZ_NO_COVERAGE void FillFloats(Call& call, uint64_t state) {
  for (int r : {kY, kProbs, kGradOut, kOut, kGradProbs}) {
    View& v = call.views[r];
    if (!call.Uses(r) || v.buffer < 0) continue;
    GuardedBuffer& b = *call.buffers[v.buffer];
    const int64_t elem = BytesOf(v.dtype);
    for (size_t i = 0; i + elem <= b.size(); i += elem) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      if (!call.exact_values) {
        std::memcpy(b.data() + i, &state, static_cast<size_t>(elem));
      } else if (IsFloat(v.dtype)) {
        const float value = call.IsOutput(r) ? 12345.0f
                            : r == kProbs    ? static_cast<float>(state % 9) * 0.25f - 1.0f
                                             : static_cast<float>(state % 7) - 3.0f;
        gk::StoreFromF32(b.data() + i, 0, static_cast<DType>(v.dtype), value);
      }
    }
  }
}

gkStatus RunPhase2(bool backward, void* workspace, uint64_t size, gkOpExecutor* executor, void* stream) {
  return backward ? gkMoeFinalizeRoutingGrad(workspace, size, executor, stream)
                  : gkMoeFinalizeRouting(workspace, size, executor, stream);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  gkSetNumThreads(static_cast<int32_t>(in.Range(1, 3)));
  Call call;
  const uint8_t shape_bits = in.U8();
  call.backward = shape_bits & 1;
  call.row_idx_type = (shape_bits >> 1) & 1;
  const int64_t batch = in.Range(1, 5), top_k = in.Range(1, 4), n = in.Range(1, 6);
  const int64_t slots = batch * top_k;
  const int64_t m = in.Range(0, slots);
  const int64_t extra = call.row_idx_type == 0 ? in.Range(0, 2) : 0;
  std::vector<int64_t> row_idx =
      gk::fuzz::MakeRouting(in, m, 1, slots, call.row_idx_type, 0, extra).row_idx;

  View& y = call.views[kY];
  View& probs = call.views[kProbs];
  View& idx = call.views[kRowIdx];
  View& out = call.views[kOut];
  y.dtype = in.Pick(gk::fuzz::kFloatDTypes);
  const auto float_or = [&](int32_t like) {
    const uint8_t choice = in.U8();
    return choice < 120 ? like : choice < 240 ? GK_FLOAT : in.Pick(gk::fuzz::kFloatDTypes);
  };
  probs.dtype = float_or(y.dtype);
  idx.dtype = in.Bool() ? GK_INT32 : GK_INT64;
  out.dtype = float_or(y.dtype);
  call.views[kGradOut].dtype = float_or(y.dtype);
  call.views[kGradProbs].dtype = float_or(probs.dtype);
  const auto shape = [](View& v, int64_t d0, int64_t d1) { v.rank = 2, v.dims[0] = d0, v.dims[1] = d1; };
  shape(y, m, n);
  shape(probs, batch, top_k);
  idx.rank = 1, idx.dims[0] = static_cast<int64_t>(row_idx.size());
  shape(call.views[kGradOut], batch, n);
  shape(out, call.backward ? m : batch, n);
  shape(call.views[kGradProbs], batch, top_k);
  Mutate(in, call, row_idx, slots);

  // Memory: NULL data, an output on an input's buffer, NULL descriptors.
  const uint8_t memory = in.U8();
  const int shared_output = memory >= 224 ? (call.backward && (memory & 1) ? kGradProbs : kOut) : -1;
  for (int r = 0; r < kRoles; ++r) {
    if (call.Uses(r) && r != shared_output) Back(call, call.views[r], memory >= 248 && (memory % kRoles) == r);
  }
  if (shared_output >= 0) {
    const int owner = static_cast<int>(in.Range(0, kGradOut));
    gk::fuzz::Share(call, call.views[shared_output], call.views[owner], in.Range(-16, 16));
  }
  call.exact_values = in.U8() < 224;
  FillFloats(call, in.U64() | 1);
  FillIndex(call, idx, row_idx);
  const uint8_t nulls = in.U8();
  for (int r = 0; r < kRoles; ++r) {
    call.views[r].present = call.Uses(r) && !(nulls >= 240 && (nulls % 8) == r);
  }
  const bool null_size = nulls >= 240 && (nulls % 8) == 6;
  const bool null_executor = nulls >= 240 && (nulls % 8) == 7;
  const uint8_t phase2 = in.U8();
  const int64_t workspace_shift = in.Range(0, 7);
  const int64_t corrupt_at = in.Range(0, 63);
  const int64_t corrupt_value = in.Bool() ? in.Range(-2, slots + 2) : in.Pick(gk::fuzz::kIndexValues);

  // Phase 1 reads expandedRowIdx: a hostile index descriptor is fuzzed only where its bytes exist.
  if (idx.present && idx.data != nullptr && !idx.backed) return 0;
  for (View& v : call.views) {
    if (!v.present) continue;
    v.tensor = gkFuzzCreateTensor(v.dims, static_cast<uint64_t>(v.rank), v.dtype,
                                  v.explicit_strides ? v.strides : nullptr, v.offset, v.data);
  }
  const auto before = gk::fuzz::Snapshot(call);
  uint64_t workspace_size = 12345;
  gkOpExecutor* executor = reinterpret_cast<gkOpExecutor*>(&call);  // must be overwritten
  uint64_t* size_arg = null_size ? nullptr : &workspace_size;
  gkOpExecutor** executor_arg = null_executor ? nullptr : &executor;
  const gkStatus status =
      call.backward
          ? gkFuzzMoeFinalizeRoutingGradGetWorkspaceSize(
                call.views[kGradOut].tensor, y.tensor, probs.tensor, idx.tensor, call.row_idx_type,
                out.tensor, call.views[kGradProbs].tensor, size_arg, executor_arg)
          : gkFuzzMoeFinalizeRoutingGetWorkspaceSize(y.tensor, probs.tensor, idx.tensor,
                                                     call.row_idx_type, out.tensor, size_arg,
                                                     executor_arg);

  bool all_backed = true;
  for (int r = 0; r < kRoles; ++r) all_backed &= !call.Uses(r) || call.views[r].backed;
  gk::fuzz::CheckPhase1(status, executor, null_executor, call, before, all_backed, [&] {
    return MeetsContract(call, null_size, null_executor, nullptr);
  });
  if (status == GK_SUCCESS && all_backed) {
    GK_FUZZ_CHECK(workspace_size <= (uint64_t{1} << 28), "workspace of %llu bytes for a small call",
                  static_cast<unsigned long long>(workspace_size));
    GuardedBuffer workspace(static_cast<size_t>(workspace_size + workspace_shift));
    void* ws = workspace.data() + workspace_shift;
    const auto run = [&](void* w, uint64_t s, gkOpExecutor* e, void* stream) {
      return RunPhase2(call.backward, w, s, e, stream);
    };
    const auto other = [&](void* w, uint64_t s, gkOpExecutor* e, void* stream) {
      return RunPhase2(!call.backward, w, s, e, stream);
    };
    gk::fuzz::CheckPhase2Misuse(phase2 % 6 < 4 ? phase2 % 6 : 0, call, before, ws, workspace_size,
                                executor, run, other);
    if (phase2 % 6 == 5) {
      GK_FUZZ_CHECK(gkSetExecutorRepeatable(executor) == GK_SUCCESS, "gkSetExecutorRepeatable");
    }
    const gkStatus ran = run(ws, workspace_size, executor, nullptr);
    GK_FUZZ_CHECK(ran == GK_SUCCESS, "phase 2 failed after phase 1 succeeded: %s", gkGetRecentErrMsg());
    workspace.CheckGuards("workspace");
    // Inputs unchanged: every buffer but the outputs' (never shared here: the call was accepted).
    const auto after = gk::fuzz::Snapshot(call);
    for (int r = 0; r < kRoles; ++r) {
      if (call.Uses(r) && !call.IsOutput(r) && call.views[r].buffer >= 0) {
        GK_FUZZ_CHECK(after[call.views[r].buffer] == before[call.views[r].buffer],
                      "phase 2 changed input %d", r);
      }
    }
    CheckUnchanged(call, after, "guards after phase 2");
    CheckResult(call);
    if (phase2 % 6 == 4) {
      CheckFailure(run(ws, workspace_size, executor, nullptr), "executor run twice");
      CheckUnchanged(call, after, "executor run twice");
    }
    if (phase2 % 6 == 5 && !row_idx.empty()) {
      GK_FUZZ_CHECK(run(ws, workspace_size, executor, nullptr) == GK_SUCCESS, "repeated run");
      CheckUnchanged(call, after, "repeated run");
      row_idx[static_cast<size_t>(corrupt_at) % row_idx.size()] = corrupt_value;
      FillIndex(call, idx, row_idx);
      const auto changed = gk::fuzz::Snapshot(call);
      const gkStatus rerun = run(ws, workspace_size, executor, nullptr);
      if (rerun != GK_SUCCESS) {
        CheckFailure(rerun, "run on changed index data");
        CheckUnchanged(call, changed, "failed run on changed index data");
      } else {
        GK_FUZZ_CHECK(MeetsContract(call, false, false, nullptr, /*allow_repeated_slots=*/true),
                      "phase 2 ran on index data that breaks the contract");
        CheckResult(call);
      }
    }
  }
  if (status == GK_SUCCESS) gkDestroyExecutor(executor);
  for (View& v : call.views) gkDestroyTensor(v.tensor);
  return 0;
}
