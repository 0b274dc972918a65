// Fuzz target: EluGradV2's two-phase C API with random descriptors (dtypes, invalid enum values
// included; ranks 0..9; shapes; zero, negative, overlapping and hostile strides; offsets; NULL
// pointers; aliasing), attributes (NaN, inf, negative alpha, values past float32) and phase-2
// misuse (short or NULL workspace, an executor run twice or given to another operator).
// Guarantees checked:
//   - a failed call returns an error status with a message, no executor, and leaves every
//     buffer unchanged;
//   - a successful phase 1 on views backed by exact-size buffers runs in phase 2 without a
//     byte outside the buffers (ASan) and without a byte outside gradInput's elements changing;
//   - each gradInput element equals the float32 formula of elu_grad_v2_ref.h on its inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gradkit/gradkit.h"
#include "ops/elu_grad_v2/elu_grad_v2_ref.h"
#include "tests/fuzz/c_caller.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using gk::DType;
using gk::fuzz::ByteReader;
using gk::fuzz::GuardedBuffer;

constexpr int kMaxDims = 9;                       // one past the operator's limit of 8
constexpr int64_t kMaxBackedBytes = int64_t{1} << 14;  // larger views get no buffer: phase 1 only

constexpr int32_t kDTypes[] = {GK_FLOAT, GK_FLOAT16, GK_BF16, GK_FLOAT, GK_INT32,
                               GK_INT64, GK_DOUBLE,  2,       -1,       1000};
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kAttributes[] = {1.0,   0.0,  -1.0,   1.6732632423543772, 1.0507009873554805,
                                  0.5,   2.0,  -0.0,   std::numeric_limits<double>::quiet_NaN(),
                                  kInf,  -kInf, 1e39,  -1e39, 1e-45, 3.4028235677973366e38,
                                  std::numeric_limits<double>::max()};
// Float values that exercise every branch: signs, zeros, exp underflow and overflow, subnormals.
constexpr float kValues[] = {0.0f,  -0.0f,  1.0f,   -1.0f,  0.5f,   -0.5f,  2.0f,   -3.0f,
                             88.0f, -88.0f, -100.f, 1e-40f, -1e-40f, 65504.f, 1e30f, -1e30f,
                             std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN(), 3.0e38f};

// p + bytes, wrapping like the address arithmetic of a hostile caller (never dereferenced unless
// the view is backed).
uint8_t* Offset(uint8_t* p, __int128 bytes) {
  return reinterpret_cast<uint8_t*>(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes));
}

int64_t WrapMul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

int64_t BytesOf(int32_t dtype) {
  return gk::IsKnownDType(dtype) ? gk::ElementBytes(static_cast<DType>(dtype)) : 4;
}

// A tensor argument: its descriptor fields, where its data lives, and whether every element it
// addresses lies inside a buffer this target owns.
struct View {
  bool present = true;  // false: the argument is NULL
  int32_t dtype = GK_FLOAT;
  int rank = 0;
  int64_t dims[kMaxDims] = {};
  bool explicit_strides = false;
  int64_t strides[kMaxDims] = {};
  int64_t offset = 0;
  int buffer = -1;  // index into Call::buffers, -1: no buffer (data NULL or a dangling pointer)
  uint8_t* data = nullptr;
  bool backed = false;
  gkTensor* tensor = nullptr;

  // Element offsets (relative to data) of every logical index, in C order; empty if too many.
  GK_FUZZ_NO_COVERAGE std::vector<int64_t> ElementOffsets() const {
    std::vector<int64_t> out;
    __int128 count = 1;
    for (int d = 0; d < rank; ++d) {
      if (dims[d] <= 0) return out;
      count = count > kMaxBackedBytes ? count : count * dims[d];
    }
    if (count <= 0 || count > kMaxBackedBytes) return out;
    int64_t effective[kMaxDims];
    ContiguousStrides(effective);
    out.reserve(static_cast<size_t>(count));
    int64_t index[kMaxDims] = {};
    for (__int128 i = 0; i < count; ++i) {
      int64_t at = offset;
      for (int d = 0; d < rank; ++d) at += index[d] * effective[d];
      out.push_back(at);
      for (int d = rank - 1; d >= 0; --d) {
        if (++index[d] < dims[d]) break;
        index[d] = 0;
      }
    }
    return out;
  }

  // The strides the descriptor holds: explicit, or C-contiguous as gkCreateTensor computes them.
  GK_FUZZ_NO_COVERAGE void ContiguousStrides(int64_t* out) const {
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      out[d] = explicit_strides ? strides[d] : stride;
      stride = WrapMul(stride, std::max<int64_t>(dims[d], 1));
    }
  }

  // [low, high] element offsets addressed, computed exactly (a span past 2^70 elements is
  // clamped there: no buffer is that large); false when the view is empty or a dim negative.
  bool Extent(__int128* low, __int128* high) const {
    int64_t effective[kMaxDims];
    ContiguousStrides(effective);
    constexpr __int128 kHuge = static_cast<__int128>(1) << 70;
    __int128 lo = offset, hi = offset;
    for (int d = 0; d < rank; ++d) {
      if (dims[d] <= 0) return false;
    }
    for (int d = 0; d < rank; ++d) {
      __int128 span = static_cast<__int128>(dims[d] - 1) * effective[d];
      span = std::clamp(span, -kHuge, kHuge);
      (span < 0 ? lo : hi) += span;
    }
    *low = lo;
    *high = hi;
    return true;
  }
};

struct Call {
  std::vector<std::unique_ptr<GuardedBuffer>> buffers;
  GuardedBuffer dangling{0};  // a non-NULL pointer to nothing: any access is out of bounds
  View views[3];              // gradOutput, x, gradInput
  double alpha = 1.0, scale = 1.0, input_scale = 1.0;
  bool is_result = false;
};

void ReadShape(ByteReader& in, View& v) {
  const uint8_t r = in.U8();
  v.rank = r < 200 ? r % 5 : r % (kMaxDims + 1);  // mostly 0..4, sometimes up to 9
  for (int d = 0; d < v.rank; ++d) {
    const uint8_t b = in.U8();
    v.dims[d] = b < 240 ? b % 6 : in.Pick(gk::fuzz::kHostileSizes);
  }
}

void ReadLayout(ByteReader& in, View& v) {
  switch (in.Range(0, 5)) {
    case 0:
      v.explicit_strides = false;
      break;
    case 1: {  // contiguous, written out
      v.explicit_strides = true;
      int64_t stride = 1;
      for (int d = v.rank - 1; d >= 0; --d) {
        v.strides[d] = stride;
        stride = WrapMul(stride, std::clamp<int64_t>(v.dims[d], 1, 1 << 10));
      }
      break;
    }
    case 2:  // small strides of any sign, zero included: overlapping and reversed views
      v.explicit_strides = true;
      for (int d = 0; d < v.rank; ++d) v.strides[d] = in.Range(-4, 8);
      break;
    case 3: {  // a permuted dense layout with an optional gap (transposes)
      v.explicit_strides = true;
      int64_t stride = in.Range(1, 2);
      for (int i = 0; i < v.rank; ++i) {
        const int d = static_cast<int>((i + in.Range(0, 8)) % std::max(v.rank, 1));
        if (v.strides[d] != 0) continue;
        v.strides[d] = stride;
        stride = WrapMul(stride, std::clamp<int64_t>(v.dims[d], 1, 1 << 10));
      }
      for (int d = 0; d < v.rank; ++d) {
        if (v.strides[d] == 0) v.strides[d] = stride;
      }
      break;
    }
    default:  // hostile values in some dims
      v.explicit_strides = true;
      for (int d = 0; d < v.rank; ++d) {
        v.strides[d] = in.Bool() ? in.Pick(gk::fuzz::kHostileSizes) : in.Range(-2, 2);
      }
      break;
  }
  switch (in.Range(0, 3)) {
    case 0: v.offset = 0; break;
    case 1: v.offset = in.Range(0, 8); break;
    case 2: v.offset = in.Range(0, 64); break;
    default: v.offset = in.Pick(gk::fuzz::kHostileSizes); break;
  }
}

// Gives the view its own exact-size buffer when it addresses few enough bytes.
void Back(Call& call, View& v, ByteReader& in) {
  const uint8_t mode = in.U8();
  if (mode >= 248) {  // NULL data
    v.data = nullptr;
    return;
  }
  __int128 low, high;
  if (!v.Extent(&low, &high)) {  // empty: any pointer will do, none may be dereferenced
    v.data = mode >= 224 ? nullptr : call.dangling.data();
    v.backed = true;
    return;
  }
  const int64_t elem = BytesOf(v.dtype);
  const __int128 bytes = (high - low + 1) * elem;
  if (bytes > kMaxBackedBytes) {
    v.data = call.dangling.data();
    return;
  }
  call.buffers.push_back(std::make_unique<GuardedBuffer>(static_cast<size_t>(bytes)));
  v.buffer = static_cast<int>(call.buffers.size()) - 1;
  v.data = Offset(call.buffers.back()->data(), -low * elem);
  v.backed = true;
}

// Places `v` on the buffer of `owner` (shifted by a few elements): in-place and overlapping use.
void Share(Call& call, View& v, const View& owner, int64_t shift_elems) {
  v.buffer = owner.buffer;
  v.backed = false;
  if (owner.buffer < 0) {
    v.data = owner.data;
    return;
  }
  v.data = Offset(owner.data, static_cast<__int128>(shift_elems) * BytesOf(owner.dtype));
  __int128 low, high;
  if (!v.Extent(&low, &high)) {
    v.backed = true;
    return;
  }
  const GuardedBuffer& b = *call.buffers[v.buffer];
  const int64_t elem = BytesOf(v.dtype);
  const auto start = static_cast<__int128>(static_cast<intptr_t>(
      reinterpret_cast<uintptr_t>(v.data) - reinterpret_cast<uintptr_t>(b.data())));
  const __int128 first = start + low * elem;
  const __int128 last = start + (high + 1) * elem;
  v.backed = first >= 0 && last <= static_cast<__int128>(b.size());
}

GK_FUZZ_NO_COVERAGE void Fill(ByteReader& in, Call& call) {
  uint64_t state = in.U64() | 1;
  const bool nice = in.U8() < 192;
  for (View& v : call.views) {
    if (v.buffer < 0 || !gk::IsKnownDType(v.dtype)) continue;
    GuardedBuffer& b = *call.buffers[v.buffer];
    const int64_t elem = BytesOf(v.dtype);
    for (size_t i = 0; i < b.size(); ++i) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      b.data()[i] = static_cast<uint8_t>(state);
    }
    if (!nice || v.dtype == GK_INT32 || v.dtype == GK_INT64) continue;
    for (size_t i = 0; i + elem <= b.size(); i += elem) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      const float value = kValues[state % std::size(kValues)];
      gk::StoreFromF32(b.data() + i, 0, static_cast<DType>(v.dtype), value);
    }
  }
}

void CreateTensors(Call& call) {
  for (View& v : call.views) {
    if (!v.present) continue;
    v.tensor = gkFuzzCreateTensor(v.dims, static_cast<uint64_t>(v.rank), v.dtype,
                              v.explicit_strides ? v.strides : nullptr, v.offset, v.data);
    if (v.tensor == nullptr) {
      GK_FUZZ_CHECK(gkGetRecentErrMsg()[0] != '\0', "gkCreateTensor failed without a message");
    }
  }
}

GK_FUZZ_NO_COVERAGE std::vector<std::vector<uint8_t>> Snapshot(const Call& call) {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& b : call.buffers) out.push_back(b->Snapshot());
  return out;
}

GK_FUZZ_NO_COVERAGE void CheckUnchanged(const Call& call, const std::vector<std::vector<uint8_t>>& before,
                    const char* when) {
  for (size_t i = 0; i < call.buffers.size(); ++i) {
    call.buffers[i]->CheckGuards(when);
    GK_FUZZ_CHECK(call.buffers[i]->Snapshot() == before[i], "%s: buffer %zu changed", when, i);
  }
}

void CheckFailure(gkStatus status, const char* when) {
  GK_FUZZ_CHECK(status != GK_SUCCESS, "%s: expected an error", when);
  const std::string message = gkGetRecentErrMsg();
  GK_FUZZ_CHECK(!message.empty(), "%s: status %d without a message", when, static_cast<int>(status));
  GK_FUZZ_CHECK(message.find('\n') == std::string::npos, "%s: message spans lines: %s", when,
                message.c_str());
}

// got (in the output dtype) against the float32 formula on the same inputs.
GK_FUZZ_NO_COVERAGE bool Close(float got, float dy, float x, const gk::EluGradV2Coefficients& c, bool is_result,
           DType out) {
  const float want = gk::RoundToDType(gk::EluGradV2Formula(dy, x, c, is_result), out);
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (got == want) return true;
  // Intermediate products past float32 make the result depend on the order of the products:
  // only NaN-ness (checked above) is specified there.
  const float p1 = dy * c.negiptcoef, p2 = p1 * c.negcoef, p3 = dy * c.poscoef;
  if (!std::isfinite(p1) || !std::isfinite(p2) || !std::isfinite(p3) ||
      !std::isfinite(x + c.negcoef)) {
    return true;
  }
  const double magnitude = std::fabs(static_cast<double>(want));
  double tolerance = 8.0 * magnitude * 0x1p-23 + 0x1p-126;  // exp is within 1 ulp of std::exp
  // A subnormal exp(arg) carries fewer bits: an absolute error of up to an ulp of 2^-149 each in
  // std::exp and in the kernel's exp, scaled by the factor in front.
  if (!is_result && x <= 0.0f) tolerance += 2.0 * std::fabs(static_cast<double>(p2)) * 0x1p-149;
  if (out == DType::kF16) tolerance += std::fmax(magnitude * 0x1p-10, 0x1p-24);
  if (out == DType::kBF16) tolerance += std::fmax(magnitude * 0x1p-7, 0x1p-126);
  if (std::isinf(got) || std::isinf(want)) {  // rounding at the top of the output's range
    const double finite = std::isinf(got) ? magnitude : std::fabs(static_cast<double>(got));
    const double top = out == DType::kF16 ? 65504.0 : out == DType::kBF16 ? 3.3895e38 : 3.40282e38;
    return (got > 0) == (want > 0) && finite + tolerance >= top * (1 - 0x1p-7);
  }
  return std::fabs(static_cast<double>(got) - static_cast<double>(want)) <= tolerance;
}

// After a successful run: gradInput's elements hold the formula of the inputs as they were, and
// no other byte of any buffer changed.
GK_FUZZ_NO_COVERAGE void Verify(const Call& call, const std::vector<std::vector<uint8_t>>& before) {
  const View& dy = call.views[0];
  const View& x = call.views[1];
  const View& y = call.views[2];
  const auto dy_at = dy.ElementOffsets(), x_at = x.ElementOffsets(), y_at = y.ElementOffsets();
  GK_FUZZ_CHECK(dy_at.size() == y_at.size() && x_at.size() == y_at.size(), "element counts");
  const auto coef = gk::FoldEluGradV2Coefficients(call.alpha, call.scale, call.input_scale);
  const auto out_dtype = static_cast<DType>(y.dtype);
  const int64_t y_elem = BytesOf(y.dtype);
  std::vector<std::vector<bool>> written(call.buffers.size());
  for (size_t i = 0; i < call.buffers.size(); ++i) written[i].resize(call.buffers[i]->size());
  const auto byte_index = [&](const View& v, int64_t element) {
    return static_cast<int64_t>(reinterpret_cast<uintptr_t>(v.data) -
                                reinterpret_cast<uintptr_t>(call.buffers[v.buffer]->data())) +
           element * BytesOf(v.dtype);
  };
  for (size_t i = 0; i < y_at.size(); ++i) {
    const float dy_value = gk::LoadAsF32(before[dy.buffer].data() + byte_index(dy, dy_at[i]), 0,
                                         static_cast<DType>(dy.dtype));
    const float x_value = gk::LoadAsF32(before[x.buffer].data() + byte_index(x, x_at[i]), 0,
                                        static_cast<DType>(x.dtype));
    const int64_t at = byte_index(y, y_at[i]);
    const float got = gk::LoadAsF32(call.buffers[y.buffer]->data() + at, 0, out_dtype);
    GK_FUZZ_CHECK(Close(got, dy_value, x_value, coef, call.is_result, out_dtype),
                  "gradInput[%zu] = %.9g for dy %.9g, x %.9g (alpha %g scale %g inputScale %g "
                  "isResult %d), formula %.9g",
                  i, got, dy_value, x_value, call.alpha, call.scale, call.input_scale,
                  call.is_result, gk::EluGradV2Formula(dy_value, x_value, coef, call.is_result));
    for (int64_t b = 0; b < y_elem; ++b) written[y.buffer][at + b] = true;
  }
  for (size_t i = 0; i < call.buffers.size(); ++i) {
    call.buffers[i]->CheckGuards("phase 2");
    const uint8_t* now = call.buffers[i]->data();
    for (size_t b = 0; b < call.buffers[i]->size(); ++b) {
      GK_FUZZ_CHECK(written[i][b] || now[b] == before[i][b],
                    "byte %zu of buffer %zu changed outside gradInput", b, i);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  gkSetNumThreads(static_cast<int32_t>(in.Range(1, 3)));
  Call call;
  View& dy = call.views[0];
  View& x = call.views[1];
  View& y = call.views[2];

  // Shapes and dtypes: mostly consistent, so that the checks after the shape ones are reached.
  ReadShape(in, dy);
  dy.dtype = in.Pick(kDTypes);
  x = dy;
  y = dy;
  const uint8_t variation = in.U8();
  if (variation >= 224) ReadShape(in, x);
  if (variation >= 208 && variation < 224) ReadShape(in, y);
  if (in.U8() >= 224) x.dtype = in.Pick(kDTypes);
  const uint8_t out_choice = in.U8();
  if (out_choice >= 128 && out_choice < 224) y.dtype = GK_FLOAT;
  if (out_choice >= 224) y.dtype = in.Pick(kDTypes);
  for (View& v : call.views) ReadLayout(in, v);

  // Memory: own buffers, or in place / overlapping on gradOutput's buffer.
  Back(call, dy, in);
  const uint8_t x_memory = in.U8();
  if (x_memory >= 232) {
    Share(call, x, dy, in.Range(-8, 8));
  } else {
    Back(call, x, in);
  }
  const uint8_t y_memory = in.U8();
  if (y_memory >= 192 && y_memory < 224) {  // exactly in place: the same view as gradOutput
    for (int d = 0; d < kMaxDims; ++d) y.dims[d] = dy.dims[d], y.strides[d] = dy.strides[d];
    y.rank = dy.rank;
    y.explicit_strides = dy.explicit_strides;
    y.offset = dy.offset;
    Share(call, y, dy, 0);
  } else if (y_memory >= 224) {
    Share(call, y, in.Bool() ? dy : x, in.Range(-8, 8));
  } else {
    Back(call, y, in);
  }
  Fill(in, call);

  // NULL arguments, attributes.
  const uint8_t nulls = in.U8();
  for (int i = 0; i < 3; ++i) call.views[i].present = !(nulls >= 240 && (nulls & (1 << i)));
  const bool null_size = nulls >= 240 && (nulls & 8);
  const bool null_executor = nulls >= 240 && (nulls & 16);
  double* attributes[] = {&call.alpha, &call.scale, &call.input_scale};
  for (double* a : attributes) {
    const uint8_t b = in.U8();
    *a = b < 160 ? 1.0 : b < 248 ? in.Pick(kAttributes) : in.F64();
  }
  call.is_result = in.Bool();
  const uint8_t phase2 = in.U8();
  const int64_t workspace_shift = in.Range(0, 7);

  CreateTensors(call);
  const auto before = Snapshot(call);
  uint64_t workspace_size = 12345;
  gkOpExecutor* executor = reinterpret_cast<gkOpExecutor*>(&call);  // must be overwritten
  const gkStatus status = gkEluGradV2GetWorkspaceSize(
      dy.tensor, x.tensor, call.alpha, call.scale, call.input_scale, call.is_result, y.tensor,
      null_size ? nullptr : &workspace_size, null_executor ? nullptr : &executor);

  bool must_fail = null_size || null_executor;
  for (const View& v : call.views) must_fail |= v.tensor == nullptr;
  if (!must_fail) {
    must_fail |= dy.rank > 8 || (dy.dtype != GK_FLOAT && dy.dtype != GK_FLOAT16 && dy.dtype != GK_BF16);
    must_fail |= x.dtype != dy.dtype || (y.dtype != dy.dtype && y.dtype != GK_FLOAT);
    for (double a : {call.alpha, call.scale, call.input_scale}) {
      must_fail |= !std::isfinite(static_cast<float>(a));
    }
    must_fail |= call.is_result && call.alpha < 0;
  }
  if (status != GK_SUCCESS) {
    CheckFailure(status, "phase 1");
    if (!null_executor) GK_FUZZ_CHECK(executor == nullptr, "phase 1 failed but left an executor");
    CheckUnchanged(call, before, "failed phase 1");
  } else {
    GK_FUZZ_CHECK(!must_fail, "phase 1 accepted arguments its contract rejects");
    GK_FUZZ_CHECK(executor != nullptr, "phase 1 succeeded without an executor");
    GK_FUZZ_CHECK(workspace_size <= (uint64_t{1} << 26), "workspace of %llu bytes for a small view",
                  static_cast<unsigned long long>(workspace_size));
    CheckUnchanged(call, before, "phase 1");
    CheckFailure(gkEluGradV2(nullptr, 0, nullptr, nullptr), "NULL executor");
  }

  if (status == GK_SUCCESS && dy.backed && x.backed && y.backed) {
    GuardedBuffer workspace(static_cast<size_t>(workspace_size + workspace_shift));
    void* ws = workspace.data() + workspace_shift;
    switch (phase2 % 6) {
      case 1:  // short workspace
        if (workspace_size > 0) {
          CheckFailure(gkEluGradV2(ws, workspace_size - 1, executor, nullptr), "short workspace");
          CheckUnchanged(call, before, "short workspace");
        }
        break;
      case 2:  // NULL workspace
        if (workspace_size > 0) {
          CheckFailure(gkEluGradV2(nullptr, workspace_size, executor, nullptr), "NULL workspace");
          CheckUnchanged(call, before, "NULL workspace");
        }
        break;
      case 3:  // another operator's phase 2
        CheckFailure(gkMoeInitRoutingGroupedMatmulGrad(ws, workspace_size, executor, nullptr),
                     "executor given to another operator");
        CheckUnchanged(call, before, "executor given to another operator");
        break;
      case 5:
        GK_FUZZ_CHECK(gkSetExecutorRepeatable(executor) == GK_SUCCESS, "gkSetExecutorRepeatable");
        break;
      default:
        break;
    }
    const gkStatus run = gkEluGradV2(ws, workspace_size, executor, nullptr);
    GK_FUZZ_CHECK(run == GK_SUCCESS, "phase 2 failed after phase 1 succeeded: %s", gkGetRecentErrMsg());
    workspace.CheckGuards("workspace");
    Verify(call, before);
    const auto after = Snapshot(call);
    if (phase2 % 6 == 4) {  // a second run without gkSetExecutorRepeatable
      CheckFailure(gkEluGradV2(ws, workspace_size, executor, nullptr), "executor run twice");
      CheckUnchanged(call, after, "executor run twice");
    }
    const bool in_place = y.buffer == dy.buffer || y.buffer == x.buffer;
    if (phase2 % 6 == 5 && !in_place) {  // a repeatable executor gives the same bytes again
      GK_FUZZ_CHECK(gkEluGradV2(ws, workspace_size, executor, nullptr) == GK_SUCCESS, "rerun");
      CheckUnchanged(call, after, "repeated run");
    }
  }
  if (status == GK_SUCCESS) gkDestroyExecutor(executor);
  for (View& v : call.views) gkDestroyTensor(v.tensor);
  return 0;
}
