#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/plan_math.h"
#include "core/thread_pool.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_bf16amx.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_bf16dot.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_f32bcast.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_kernels.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_microkernel.h"

#if defined(GRADKIT_HAVE_DNNL)
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_dnnl.h"
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
#include <omp.h>
#define GK_DNNL_OMP 1
#endif
#endif

namespace gk {

const void* MoeTileGemm::Worker::PrepareBStrided(int64_t, int64_t, const void*, int64_t, bool) {
  throw std::logic_error("MoE tile GEMM: B is taken at the shape's stride only");
}

void MoeTileGemm::Worker::RunStrided(int64_t, int64_t, int64_t, bool, const void*, int64_t,
                                     const void*, float*) {
  throw std::logic_error("MoE tile GEMM: A is taken at the shape's stride only");
}

namespace {

// ---- gradkit's own kernel ----------------------------------------------------------------------
// The register-blocked micro-kernel (moe_grad_microkernel.h) over B packed into its panels: once
// per caller's B with shape.prepared_b, else on every call. Streamed bfloat16 B (shape.streamed_b)
// on the dot-product kernel instead (moe_grad_bf16dot.h) where the CPU has it.
class MicroTileGemm final : public MoeTileGemm {
 public:
  explicit MicroTileGemm(const MoeTileGemmShape& shape)
      : shape_(shape),
        dot_(shape.AsksBf16Dot() && MoeBf16DotAvailable()) {
    uint64_t packed = 0;
    for (const int64_t width : shape.widths) {
      for (const auto& step : shape.steps) {
        packed = std::max(packed, dot_ ? MoeBf16DotPackedBytes(width, step.reduce)
                                       : MoeMicroPackedBytes(width, step.reduce));
      }
    }
    packed_bytes_ = static_cast<uint64_t>(RoundUp(static_cast<int64_t>(packed), 64));
    a_bytes_ = dot_ ? 0
                    : static_cast<uint64_t>(RoundUp(
                          static_cast<int64_t>(MoeMicroAScratchBytes(shape.gemm_dtype, shape.max_rows)), 64));
  }
  std::string name() const override { return "gradkit"; }
  std::string impl(int64_t width) const override {
    if (dot_ && prepares_b_from_kn()) {
      return fmt::format("bfloat16 dot-product microkernel {}x{} (AVX512-BF16), B packed from its "
                         "[K, N] rows by each panel's first register block as it multiplies",
                         kMoeBf16DotRows, kMoeBf16DotPanel);
    }
    if (dot_) {
      return fmt::format("bfloat16 dot-product microkernel {}x{} (AVX512-BF16), B packed once per "
                         "block, the next block fetched meanwhile", kMoeBf16DotRows, kMoeBf16DotPanel);
    }
    if (shape_.streamed_b && ReadsKNInPlace(width)) {
      return fmt::format("microkernel {}x{}, B read in place from its [K, N] rows where they start "
                         "on 64-byte lines (else packed once per block), the next block fetched "
                         "meanwhile", MoeMicroRowBlock(), MoeMicroPanelWidth());
    }
    if (shape_.streamed_b) {
      return fmt::format("microkernel {}x{}, B packed once per block, the next block fetched "
                         "meanwhile", MoeMicroRowBlock(), MoeMicroPanelWidth());
    }
    return fmt::format("microkernel {}x{}, B packed {}", MoeMicroRowBlock(), MoeMicroPanelWidth(),
                       shape_.prepared_b ? "once per block" : "per call");
  }
  // The packed B, then A widened to float32 (bfloat16).
  uint64_t scratchpad_bytes() const override { return packed_bytes_ + a_bytes_; }
  int64_t row_granule() const override { return 1; }
  bool packs_b() const override { return shape_.prepared_b; }
  bool prepares_b_from_kn() const override { return shape_.prepared_b && shape_.ldb_kn > 0; }
  bool takes_any_stride() const override { return true; }
  bool rows_independent(int64_t) const override { return true; }  // one chain per element
  bool has_broadcast_form() const override {
    return dot_ || (shape_.gemm_dtype == DType::kF32 && MoeF32BroadcastAvailable());
  }

  // Whether float32 B^T rows of this width may be read in place (MoeMicroGemmKN) rather than
  // packed: streamed blocks (fetched into L2 while the calls before them run, so a block's rows
  // are read from there however far apart; packing them took 12% of GroupedMatmul's S3 float32
  // samples, docs/benchmarks.md, session 38) in whole panels, on the CPUs where the streamed
  // float32 kernel was measured (MoeOwnStreamedOutrunsBrgemm: Zen 5; elsewhere, AVX2 hosts
  // included, the packing stays). The worker also asks each block's rows to start on 64-byte
  // lines: 16 bytes off, a panel's run of a row spans one line more and every load splits
  // across two (measured no faster than packing).
  bool ReadsKNInPlace(int64_t width) const {
    return kn_in_place_cpu_ && !dot_ && shape_.gemm_dtype == DType::kF32 && shape_.streamed_b &&
           shape_.ldb_kn > 0 && width % MoeMicroPanelWidth() == 0;
  }

  class MicroWorker final : public Worker {
   public:
    MicroWorker(const MicroTileGemm& gemm, void* scratchpad)
        : gemm_(gemm),
          packed_(static_cast<float*>(scratchpad)),
          a_scratch_(reinterpret_cast<float*>(static_cast<char*>(scratchpad) + gemm.packed_bytes_)) {}
    const void* PrepareB(int64_t width, int64_t reduce, const void* b) override {
      if (!gemm_.shape_.prepared_b) return b;
      return PrepareBStrided(width, reduce, b, gemm_.shape_.LdbOf(reduce), /*kn=*/false);
    }
    const void* PrepareBFromKN(int64_t width, int64_t reduce, const void* b_kn) override {
      if (!gemm_.prepares_b_from_kn()) {
        throw std::logic_error("MoE tile GEMM: B^T rows were not prepared for");
      }
      return PrepareBStrided(width, reduce, b_kn, gemm_.shape_.ldb_kn, /*kn=*/true);
    }
    const void* PrepareBStrided(int64_t width, int64_t reduce, const void* b, int64_t ldb,
                                bool kn) override {
      prefetch_ = MoeMicroPrefetch{};
      pending_ = Pending{};
      prepared_reduce_ = reduce;
      in_place_ = InPlace{};
      constexpr int64_t kLine = 64;
      if (kn && gemm_.ReadsKNInPlace(width) && reinterpret_cast<uintptr_t>(b) % kLine == 0 &&
          ldb * static_cast<int64_t>(sizeof(float)) % kLine == 0) {
        in_place_ = InPlace{b, ldb};
        return b;
      }
      if (gemm_.dot_ && kn) {  // packed by the next Run as it multiplies
        pending_ = Pending{b, ldb, width, reduce};
      } else if (gemm_.dot_) {
        MoeBf16DotPackB(width, reduce, b, ldb, kn, packed_);
      } else {
        MoeMicroPackB(gemm_.shape_.gemm_dtype, width, reduce, b, ldb, kn, packed_);
      }
      return packed_;
    }
    void PrefetchDuringRuns(const void* base, int64_t rows, int64_t row_bytes, int64_t stride,
                            int64_t macs) override {
      // A block packed on the way fetches its own rows a few ahead (MoeBf16DotGemmPackingKN);
      // the next block streamed over these runs on top of that measured no faster, slower in a
      // busy hour (docs/benchmarks.md, session 37).
      if (!gemm_.shape_.streamed_b || pending_.b_kn != nullptr) return;
      const int64_t lines = rows * CeilDiv(row_bytes, int64_t{64});
      const int64_t block_macs =
          gemm_.dot_ ? std::max<int64_t>(1, MoeBf16DotBlockMacs(prepared_reduce_))
                     : MoeMicroRowBlock() * MoeMicroPanelWidth() * kMoeMicroReduceBlock;
      const int64_t blocks = std::max<int64_t>(1, macs / block_macs);
      prefetch_ = MoeMicroPrefetch{static_cast<const char*>(base), rows, row_bytes, stride,
                                   CeilDiv(lines, blocks)};
    }
    void Run(int64_t rows, int64_t width, int64_t reduce, bool accumulate, const void* a,
             const void* b, float* c) override {
      const MoeTileGemmShape& shape = gemm_.shape_;
      if (!shape.prepared_b) b = PrepareBStrided(width, reduce, b, shape.LdbOf(reduce), /*kn=*/false);
      RunStrided(rows, width, reduce, accumulate, a, shape.LdaOf(reduce), b, c);
    }
    // b: packed (by PrepareB, PrepareBStrided or Run).
    void RunStrided(int64_t rows, int64_t width, int64_t reduce, bool accumulate, const void* a,
                    int64_t lda, const void* b, float* c) override {
      if (gemm_.dot_) {
        if (pending_.b_kn == nullptr || b != packed_) {
          MoeBf16DotGemm(rows, width, reduce, a, lda, b, c, gemm_.shape_.ldc, accumulate, &prefetch_);
          return;
        }
        const Pending pending = std::exchange(pending_, Pending{});
        if (width == pending.width && reduce == pending.reduce) {
          MoeBf16DotGemmPackingKN(rows, width, reduce, a, lda, pending.b_kn, pending.ldb, packed_, c,
                                  gemm_.shape_.ldc, accumulate, &prefetch_);
          return;
        }
        MoeBf16DotPackB(pending.width, pending.reduce, pending.b_kn, pending.ldb, /*kn=*/true, packed_);
        MoeBf16DotGemm(rows, width, reduce, a, lda, packed_, c, gemm_.shape_.ldc, accumulate, &prefetch_);
        return;
      }
      if (b != nullptr && b == in_place_.b_kn) {
        MoeMicroGemmKN(rows, width, reduce, static_cast<const float*>(a), lda,
                       static_cast<const float*>(b), in_place_.ldb, c, gemm_.shape_.ldc, accumulate,
                       final_c_, &prefetch_);
        return;
      }
      MoeMicroGemm(gemm_.shape_.gemm_dtype, rows, width, reduce, a, lda,
                   static_cast<const float*>(b), c, gemm_.shape_.ldc, accumulate, a_scratch_,
                   final_c_, &prefetch_);
    }
    void SetFinalC(bool final_c) override { final_c_ = final_c; }

   private:
    const MicroTileGemm& gemm_;
    float* packed_;
    float* a_scratch_;
    bool final_c_ = false;
    MoeMicroPrefetch prefetch_;  // PrefetchDuringRuns', until the next PrepareB
    int64_t prepared_reduce_ = 0;  // the last PrepareB's
    // B^T's rows that PrepareBStrided named on the dot-product kernel, packed by the next Run on
    // packed_ as it multiplies (the first register block of each panel stores what it uses).
    struct Pending {
      const void* b_kn = nullptr;
      int64_t ldb = 0, width = 0, reduce = 0;
    } pending_;
    // float32 B^T's rows that PrepareBStrided handed back to be read in place
    // (MicroTileGemm::ReadsKNInPlace), until the next PrepareB.
    struct InPlace {
      const void* b_kn = nullptr;
      int64_t ldb = 0;
    } in_place_;
  };
  std::unique_ptr<Worker> MakeWorker(void* scratchpad) const override {
    return std::make_unique<MicroWorker>(*this, scratchpad);
  }

 private:
  MoeTileGemmShape shape_;
  // bfloat16 on the dot-product kernel (moe_grad_bf16dot.h): streamed B where the CPU has it.
  bool dot_;
  bool kn_in_place_cpu_ = MoeOwnStreamedOutrunsBrgemm(DetectCpuIdentity());  // ReadsKNInPlace
  uint64_t packed_bytes_ = 0, a_bytes_ = 0;
};

// The whole GEMM on the micro-kernel: B packed once (in parallel, by panels), then blocks of
// rows x columns spread over the threads.
class MicroDenseGemm final : public MoeDenseGemm {
 public:
  MicroDenseGemm(DType dtype, int64_t m, int64_t reduce, int64_t width, int32_t threads)
      : dtype_(dtype), m_(m), reduce_(reduce), width_(width), threads_(threads) {}
  std::string name() const override {
    return fmt::format("gradkit microkernel {}x{}", MoeMicroRowBlock(), MoeMicroPanelWidth());
  }
  void Run(const void* a, const void* b, float* c, int64_t ldc) const override {
    constexpr int64_t kRows = 256;
    const int64_t nr = MoeMicroPanelWidth();
    const int64_t cols = 8 * nr;  // a column block: whole panels
    const int64_t elem = ElementBytes(dtype_);
    std::vector<float> packed(MoeMicroPackedBytes(width_, reduce_) / sizeof(float));
    const int64_t panels = CeilDiv(width_, nr);
    ParallelFor(threads_, panels, [&](int64_t p) {
      MoeMicroPackB(dtype_, std::min(nr, width_ - p * nr), reduce_,
                    static_cast<const char*>(b) + p * nr * reduce_ * elem, reduce_, false,
                    packed.data() + p * nr * reduce_);
    });
    const int64_t row_blocks = CeilDiv(m_, kRows), col_blocks = CeilDiv(width_, cols);
    const uint64_t a_floats = MoeMicroAScratchBytes(dtype_, kRows) / sizeof(float);
    std::vector<float> scratch(a_floats * static_cast<uint64_t>(threads_));
    ParallelFor(threads_, threads_, [&](int64_t t) {
      for (int64_t unit = t; unit < row_blocks * col_blocks; unit += threads_) {
        const int64_t r0 = unit / col_blocks * kRows, c0 = unit % col_blocks * cols;
        MoeMicroGemm(dtype_, std::min(kRows, m_ - r0), std::min(cols, width_ - c0), reduce_,
                     static_cast<const char*>(a) + r0 * reduce_ * elem, reduce_,
                     packed.data() + c0 * reduce_, c + r0 * ldc + c0, ldc, /*accumulate=*/false,
                     scratch.data() + t * a_floats);
      }
    });
  }

 private:
  DType dtype_;
  int64_t m_, reduce_, width_;
  int32_t threads_;
};

#if defined(GRADKIT_HAVE_DNNL)
// ---- oneDNN --------------------------------------------------------------------------------------
dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}
dnnl::stream& ThreadStream() {
  thread_local dnnl::stream stream(Engine());
  return stream;
}
dnnl::memory::data_type DnnlType(DType dtype) {
  return dtype == DType::kBF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

// Sets oneDNN's thread count on the calling thread while alive. oneDNN plans each primitive
// (blocking, scratchpad size) for the threads it sees when the primitive descriptor is made, so
// descriptors are made under the same count they run with.
class OmpThreadsScope {
 public:
  explicit OmpThreadsScope(int threads) {
#if defined(GK_DNNL_OMP)
    saved_ = omp_get_max_threads();
    if (saved_ != threads) omp_set_num_threads(threads);
    threads_ = threads;
#else
    (void)threads;
#endif
  }
  ~OmpThreadsScope() {
#if defined(GK_DNNL_OMP)
    if (saved_ != threads_) omp_set_num_threads(saved_);
#endif
  }
  OmpThreadsScope(const OmpThreadsScope&) = delete;
  OmpThreadsScope& operator=(const OmpThreadsScope&) = delete;

 private:
  int saved_ = 0, threads_ = 0;
};

// B as the caller holds it: the matmul's [reduce, width] weights with strides {1, ldb}; or,
// kn, their transpose's rows: strides {ldb, 1}.
dnnl::memory::desc PlainB(DType dtype, int64_t reduce, int64_t width, int64_t ldb, bool kn = false) {
  return dnnl::memory::desc({reduce, width}, DnnlType(dtype),
                            kn ? dnnl::memory::dims{ldb, 1} : dnnl::memory::dims{1, ldb});
}

// C[rows, width] (+)= A[rows, reduce] * B[width, reduce]^T. With packed_b, the weights are in
// the layout the implementation chooses (format_tag::any: B is reordered into it once per B,
// see OneDnnTileGemm); else B is read where it is (oneDNN then packs it on every call), as
// [width, reduce] rows of stride ldb or, with ldb_kn > 0, as B^T's rows of that stride.
dnnl::matmul::primitive_desc MatmulDesc(DType dtype, int64_t rows, int64_t reduce, int64_t width,
                                        int64_t lda, int64_t ldb, int64_t ldc, bool accumulate,
                                        bool user_scratchpad, bool packed_b = false,
                                        int64_t ldb_kn = 0) {
  using dnnl::memory;
  const memory::desc a({rows, reduce}, DnnlType(dtype), memory::dims{lda, 1});
  const memory::desc b = packed_b     ? memory::desc({reduce, width}, DnnlType(dtype), memory::format_tag::any)
                         : ldb_kn > 0 ? PlainB(dtype, reduce, width, ldb_kn, /*kn=*/true)
                                      : PlainB(dtype, reduce, width, ldb);
  const memory::desc c({rows, width}, memory::data_type::f32, memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (user_scratchpad) attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  return dnnl_compat::MakeMatmulPd(a, b, c, attr, Engine());
}

// B packed once per caller's B (MoeTileGemmShape::prepared_b) on oneDNN 2.x only. With oneDNN
// 3.7 (Debian 13) the same code gave wrong sums (a quarter of them, on N = 4): the weights layout
// its brgemm asks for through format_tag::any (AB16a64b, padded) is not what the reorder into
// that very descriptor writes, or not all of it is read back. Until that is understood, 3.x
// keeps oneDNN's packing on every call (tested on both by the fresh-machine runs).
constexpr bool kPackBOnce = DNNL_VERSION_MAJOR == 2;

// The blocked layout a packed B descriptor asks for, when it is one MoePackB writes: two
// dimensions [reduce, width], blocks (16 x pair) x n_block with `pair` reduction elements per
// 32-bit word (oneDNN 2.x's BA16a64b2a for bfloat16, BA16a64b for float32, and their narrower
// n blocks). Anything else: none, and oneDNN's reorder packs.
std::optional<MoeBlockedB> OwnPackLayout(const dnnl::memory::desc& packed, DType dtype) {
#if DNNL_VERSION_MAJOR == 2
  const dnnl_memory_desc_t& d = packed.data;
  if (d.ndims != 2 || d.format_kind != dnnl_blocked || d.offset0 != 0 || d.padded_offsets[0] != 0 ||
      d.padded_offsets[1] != 0) {
    return std::nullopt;
  }
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  const bool paired = b.inner_nblks == 3 && b.inner_idxs[0] == 0 && b.inner_idxs[1] == 1 &&
                      b.inner_idxs[2] == 0;
  const bool single = b.inner_nblks == 2 && b.inner_idxs[0] == 0 && b.inner_idxs[1] == 1;
  if (!paired && !single) return std::nullopt;
  MoeBlockedB layout{};
  layout.pair = paired ? b.inner_blks[2] : 1;
  layout.k_block = b.inner_blks[0] * layout.pair;
  layout.n_block = b.inner_blks[1];
  layout.k_stride = b.strides[0];
  layout.n_stride = b.strides[1];
  layout.padded_reduce = d.padded_dims[0];
  layout.padded_width = d.padded_dims[1];
  if (ElementBytes(dtype) * layout.pair != 4 || layout.padded_reduce % layout.k_block != 0 ||
      layout.padded_width % layout.n_block != 0 || layout.k_stride % layout.pair != 0 ||
      layout.n_stride % layout.pair != 0 ||
      static_cast<uint64_t>(layout.Elements() * ElementBytes(dtype)) > packed.get_size()) {
    return std::nullopt;
  }
  return layout;
#else
  (void)packed, (void)dtype;
  return std::nullopt;
#endif
}

class OneDnnTileGemm final : public MoeTileGemm {
 public:
  explicit OneDnnTileGemm(const MoeTileGemmShape& shape) : shape_(shape) {
    // Single-threaded descriptors: each call runs on one thread of gradkit's pool.
    const OmpThreadsScope one(1);
    rows_ = shape.row_counts;
    if (rows_.empty()) {
      for (int64_t r = shape.row_granule; r <= shape.max_rows; r += shape.row_granule) rows_.push_back(r);
    }
    // Packed B needs one layout per (width, reduce) whatever the row count; where the library
    // picks different ones, B is read in place instead. bfloat16 also needs gradkit's packer for
    // the main width's packs: oneDNN 2.6's reorder into the VNNI layout costs more than it
    // saves, where brgemm's own per-call copy is specialised (docs/benchmarks.md); a narrower
    // last column block (often gemm:jit, with a plain B) may use the reorder. A property of the
    // shape and the library, never of the thread count.
    // float32 B read in place (shape.b_in_place): every call of the shape on gemm:jit, or none
    // (brgemm sums a row of C over the whole K in one chain, gemm:jit in blocks of K added into
    // C, so the weight forms would differ in bits), else packed.
    in_place_ = shape.b_in_place && shape.ldb_kn > 0 && shape.gemm_dtype == DType::kF32 &&
                MoeF32InPlaceKNOutrunsPackedBrgemm(DetectCpuIdentity());
    if (in_place_ && !MakeEntries(/*packed_b=*/false)) in_place_ = false;
    if (!in_place_ && !(shape.prepared_b && kPackBOnce && MakeEntries(/*packed_b=*/true) &&
                        (shape.gemm_dtype != DType::kBF16 || PacksOwn(shape.widths.front())))) {
      MakeEntries(/*packed_b=*/false);
    }
    if (shape.tail_calls && shape.row_counts.empty() && shape.row_granule > 1) AddTailEntries();
    for (const Entry& e : entries_) {
      const std::string name = e.pd.impl_info_str();
      std::string& impl = impls_[e.width];
      if (impl.find(name) == std::string::npos) impl += impl.empty() ? name : "+" + name;
      const bool brgemm = name.rfind("brg", 0) == 0;  // see rows_independent
      const auto [it, first] = brgemm_only_.emplace(e.width, brgemm && !in_place_);
      if (!first) it->second = it->second && brgemm;
    }
    if (in_place_) {
      for (auto& [width, impl] : impls_) impl += ", B read in place from [K, N] rows";
    }
    if (packed_b_) {
      for (auto& [width, impl] : impls_) {
        impl += PacksOwn(width) ? ", B packed once per block by gradkit" : ", B packed once per block";
      }
    }
    WarmUp();
  }
  std::string name() const override { return "onednn"; }
  std::string impl(int64_t width) const override {
    const auto it = impls_.find(width);
    return it == impls_.end() ? std::string() : it->second;
  }
  // The packed B (when used) first, then the library's scratchpad.
  uint64_t scratchpad_bytes() const override { return packed_b_bytes_ + scratchpad_bytes_; }
  int64_t row_granule() const override { return tails_ ? 1 : shape_.row_granule; }
  bool packs_b() const override { return packed_b_; }
  bool prepares_b_from_kn() const override { return in_place_ || (packed_b_ && packs_from_kn_); }
  bool reads_b_in_place() const override { return in_place_; }
  // Only widths whose calls all run brgemm (each row of C one chain over the call's reduction,
  // as its design goes), and only once a check on this machine and library found it so: every
  // prepared row count's call, over every step, giving each row the bits of the full-height call
  // on random operands. (oneDNN 3.7's brgemm gave a call of one row other bits, Debian 13: not
  // taken there.) Checked once per process and configuration, cached: the first phase 1 of a
  // shape pays one call of each row count, spread over the threads (Zen 5, one core: S1 float32
  // 140 ms, S3 53, S2 42; the first phase 1 of S1 float32 184 ms on one thread, 120 on two).
  bool rows_independent(int64_t width) const override {
    const auto it = brgemm_only_.find(width);
    if (it == brgemm_only_.end() || !it->second) return false;
    std::string key = fmt::format("{} {} width {} rows {} lda {} ldb {} ldc {} packed {} tails {} steps",
                                  MoeGemmLibraryName(), DTypeName(shape_.gemm_dtype), width, rows_.back(),
                                  shape_.lda, shape_.ldb, shape_.ldc, packed_b_, tails_);
    for (const auto& step : shape_.steps) key += fmt::format(" {}{}", step.reduce, step.accumulate ? "+" : "");
    static std::mutex mutex;
    static std::map<std::string, bool> checked;
    const std::lock_guard<std::mutex> lock(mutex);
    const auto [at, fresh] = checked.emplace(key, false);
    if (fresh) at->second = EachRowGetsItsBits(width);
    return at->second;
  }
  // bfloat16 on AMX brgemm, B packed, one step whose reduction AMX takes whole: the
  // weights-broadcast form on AMX tiles, once a check on this machine and library found its bits
  // equal to the packed calls' for every width (each width's rows independent first, so that one
  // call of each width decides). Checked once per process and configuration, cached.
  bool has_broadcast_form() const override { return broadcast_on_amx(); }
  bool broadcast_on_amx() const override {
    if (shape_.gemm_dtype != DType::kBF16 || !packed_b_ || in_place_ || shape_.steps.size() != 1 ||
        shape_.steps[0].accumulate || !MoeBf16AmxTakesReduce(shape_.steps[0].reduce) ||
        !MoeBf16AmxAvailable()) {
      return false;
    }
    for (const int64_t width : shape_.widths) {
      if (impl(width).find("amx") == std::string::npos || !rows_independent(width)) return false;
    }
    const std::string key = fmt::format("{} amx broadcast widths {} rows {} lda {} ldb {} ldc {} reduce {}",
                                        MoeGemmLibraryName(), fmt::join(shape_.widths, ","), rows_.back(),
                                        shape_.lda, shape_.ldb, shape_.ldc, shape_.steps[0].reduce);
    static std::mutex mutex;
    static std::map<std::string, bool> checked;
    const std::lock_guard<std::mutex> lock(mutex);
    const auto [at, fresh] = checked.emplace(key, false);
    if (fresh) {
      at->second = std::all_of(shape_.widths.begin(), shape_.widths.end(),
                               [&](int64_t width) { return AmxBroadcastGivesItsBits(width); });
    }
    return at->second;
  }

  class DnnlWorker final : public Worker {
   public:
    DnnlWorker(const OneDnnTileGemm& gemm, void* scratchpad)
        : gemm_(gemm),
          packed_b_(scratchpad),
          scratchpad_(static_cast<char*>(scratchpad) + gemm.packed_b_bytes_),
          bound_(gemm.entries_.size()),
          pack_bound_(gemm.packs_.size()),
          pack_kn_bound_(gemm.packs_.size()) {}
    const void* PrepareB(int64_t width, int64_t reduce, const void* b) override {
      if (!gemm_.packed_b_) return b;
      return PackB(width, reduce, b, /*kn=*/false);
    }
    const void* PrepareBFromKN(int64_t width, int64_t reduce, const void* b_kn) override {
      if (!gemm_.prepares_b_from_kn()) {
        throw std::logic_error("MoE tile GEMM: B^T rows were not prepared for");
      }
      if (gemm_.in_place_) return b_kn;
      return PackB(width, reduce, b_kn, /*kn=*/true);
    }
    void Run(int64_t rows, int64_t width, int64_t reduce, bool accumulate, const void* a,
             const void* b, float* c) override {
      const int64_t granule = gemm_.shape_.row_granule;
      if (gemm_.tails_ && rows > granule && rows % granule != 0) {  // the multiple, then the rest
        const int64_t head = rows / granule * granule;
        RunPrepared(head, width, reduce, accumulate, a, b, c);
        RunPrepared(rows - head, width, reduce, accumulate,
                    static_cast<const char*>(a) +
                        head * gemm_.shape_.LdaOf(reduce) * ElementBytes(gemm_.shape_.gemm_dtype),
                    b, c + head * gemm_.shape_.ldc);
        return;
      }
      RunPrepared(rows, width, reduce, accumulate, a, b, c);
    }

   private:
    void RunPrepared(int64_t rows, int64_t width, int64_t reduce, bool accumulate, const void* a,
                     const void* b, float* c) {
      const size_t index = gemm_.Index(rows, width, reduce, accumulate);
      const Entry& e = gemm_.entries_[index];
      std::optional<Bound>& bound = bound_[index];
      if (!bound) {
        // Made once per primitive and thread; later calls only repoint the handles.
        const dnnl::engine& engine = Engine();
        bound.emplace();
        bound->a = dnnl::memory(e.pd.src_desc(), engine, const_cast<void*>(a));
        bound->b = dnnl::memory(e.pd.weights_desc(), engine, const_cast<void*>(b));
        bound->c = dnnl::memory(e.pd.dst_desc(), engine, c);
        bound->args = {{DNNL_ARG_SRC, bound->a},
                       {DNNL_ARG_WEIGHTS, bound->b},
                       {DNNL_ARG_DST, bound->c},
                       {DNNL_ARG_SCRATCHPAD,
                        dnnl::memory(e.pd.scratchpad_desc(), engine, scratchpad_)}};
      } else {
        bound->a.set_data_handle(const_cast<void*>(a));
        bound->b.set_data_handle(const_cast<void*>(b));
        bound->c.set_data_handle(c);
      }
      e.primitive.execute(ThreadStream(), bound->args);
    }

    const void* PackB(int64_t width, int64_t reduce, const void* b, bool kn) {
      const size_t index = gemm_.PackIndex(width, reduce);
      const OneDnnTileGemm::Pack& pack = gemm_.packs_[index];
      if (const std::optional<MoeBlockedB>& own = kn ? pack.own_kn : pack.own) {
        MoePackB(gemm_.shape_.gemm_dtype, *own, width, reduce, b,
                 kn ? gemm_.shape_.ldb_kn : gemm_.shape_.LdbOf(reduce), kn, packed_b_);
        return packed_b_;
      }
      std::optional<PackBound>& bound = (kn ? pack_kn_bound_ : pack_bound_)[index];
      if (!bound) {
        bound.emplace();
        bound->src = dnnl::memory(kn ? pack.src_kn : pack.src, Engine(), const_cast<void*>(b));
        bound->dst = dnnl::memory(pack.dst, Engine(), packed_b_);
      } else {
        bound->src.set_data_handle(const_cast<void*>(b));
      }
      (kn ? pack.reorder_kn : pack.reorder).execute(ThreadStream(), bound->src, bound->dst);
      return packed_b_;
    }

    struct Bound {
      dnnl::memory a, b, c;
      std::unordered_map<int, dnnl::memory> args;
    };
    struct PackBound {
      dnnl::memory src, dst;
    };
    const OneDnnTileGemm& gemm_;
    void* packed_b_;
    void* scratchpad_;
    std::vector<std::optional<Bound>> bound_;
    std::vector<std::optional<PackBound>> pack_bound_, pack_kn_bound_;
  };
  std::unique_ptr<Worker> MakeWorker(void* scratchpad) const override {
    return std::make_unique<DnnlWorker>(*this, scratchpad);
  }

 private:
  struct Entry {
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul primitive;
    int64_t width;
  };
  // The reorder of one (width, reduce)'s B from the caller's layout into the packed one, and
  // (shape.ldb_kn > 0) from B^T's rows.
  struct Pack {
    int64_t width, reduce;
    dnnl::memory::desc src, dst;
    dnnl::reorder reorder;
    dnnl::memory::desc src_kn;
    dnnl::reorder reorder_kn;
    std::string impl, impl_kn;  // the reorders' implementations (WarmUp runs one of each)
    // gradkit's packer writes the same bytes as the reorder (checked in phase 1, OwnPackAgrees);
    // oneDNN 2.6's reorders into these layouts are generic (jit:uni) and slow: a 2048 x 64
    // bfloat16 block took 0.17 ms, 3.7 times the tile GEMM that reads it.
    std::optional<MoeBlockedB> own, own_kn;
  };

  // Every matmul the shape needs, in Index order. With packed_b, false (and nothing kept) when
  // two row counts of one (width, reduce) want B in different layouts, or a reorder needs a
  // scratchpad of its own; with in_place_, false when a call's implementation is not gemm:jit.
  bool MakeEntries(bool packed_b) {
    entries_.clear();
    packs_.clear();
    scratchpad_bytes_ = packed_b_bytes_ = 0;
    packed_b_ = packed_b;
    packs_from_kn_ = packed_b && shape_.ldb_kn > 0;
    for (int64_t width : shape_.widths) {
      for (const auto& step : shape_.steps) {
        for (const int64_t rows : rows_) {
          Entry e = MakeEntry(rows, width, step, packed_b);
          if (in_place_ && std::string_view(e.pd.impl_info_str()).rfind("gemm:jit", 0) != 0) {
            entries_.clear();
            return false;
          }
          scratchpad_bytes_ = std::max<uint64_t>(scratchpad_bytes_, e.pd.scratchpad_desc().get_size());
          if (packed_b && !AddPack(width, step.reduce, e.pd.weights_desc())) {
            entries_.clear();
            packs_.clear();
            return false;
          }
          entries_.push_back(std::move(e));
        }
      }
    }
    return true;
  }

  Entry MakeEntry(int64_t rows, int64_t width, const MoeTileGemmShape::Step& step,
                  bool packed_b) const {
    Entry e{MatmulDesc(shape_.gemm_dtype, rows, step.reduce, width, shape_.LdaOf(step.reduce),
                       shape_.LdbOf(step.reduce), shape_.ldc, step.accumulate,
                       /*user_scratchpad=*/true, packed_b, in_place_ ? shape_.ldb_kn : 0),
            {}, width};
    e.primitive = dnnl::matmul(e.pd);
    return e;
  }

  // shape.tail_calls: the matmuls of 1 .. row_granule - 1 rows, in Index order among the
  // others. Kept only where each one runs on the implementation of its (width, k-block)'s
  // calls of a whole granule and, B packed, reads B in their layout; else none is, and Run's
  // rows stay multiples of the granule.
  void AddTailEntries() {
    const int64_t granule = shape_.row_granule;
    if (rows_.empty()) return;  // max_rows below one granule: nothing to add a tail to
    std::vector<Entry> tails;
    uint64_t scratchpad = scratchpad_bytes_;
    try {
      for (int64_t width : shape_.widths) {
        for (const auto& step : shape_.steps) {
          const Entry& whole = entries_[Index(rows_.front(), width, step.reduce, step.accumulate)];
          for (int64_t rows = 1; rows < granule; ++rows) {
            Entry e = MakeEntry(rows, width, step, packed_b_);
            if (std::string_view(e.pd.impl_info_str()) != whole.pd.impl_info_str() ||
                (packed_b_ && e.pd.weights_desc() != whole.pd.weights_desc())) {
              return;
            }
            scratchpad = std::max<uint64_t>(scratchpad, e.pd.scratchpad_desc().get_size());
            tails.push_back(std::move(e));
          }
        }
      }
    } catch (const dnnl::error&) {
      return;
    }
    std::vector<Entry> entries;
    entries.reserve(entries_.size() + tails.size());
    auto whole = entries_.begin();
    auto tail = tails.begin();
    for (size_t group = 0; group < shape_.widths.size() * shape_.steps.size(); ++group) {
      for (int64_t rows = 1; rows < granule; ++rows) entries.push_back(std::move(*tail++));
      for (size_t r = 0; r < rows_.size(); ++r) entries.push_back(std::move(*whole++));
    }
    std::vector<int64_t> rows;
    for (int64_t r = 1; r < granule; ++r) rows.push_back(r);
    rows.insert(rows.end(), rows_.begin(), rows_.end());
    rows_ = std::move(rows);
    entries_ = std::move(entries);
    scratchpad_bytes_ = scratchpad;
    tails_ = true;
  }

  bool AddPack(int64_t width, int64_t reduce, const dnnl::memory::desc& packed) {
    for (const Pack& p : packs_) {
      if (p.width == width && p.reduce == reduce) return p.dst == packed;
    }
    Pack p;
    p.width = width;
    p.reduce = reduce;
    p.src = PlainB(shape_.gemm_dtype, reduce, width, shape_.LdbOf(reduce));
    p.dst = packed;
    const dnnl::reorder::primitive_desc pd(Engine(), p.src, Engine(), p.dst);
    if (pd.scratchpad_desc().get_size() != 0) return false;
    p.reorder = dnnl::reorder(pd);
    p.impl = pd.impl_info_str();
    p.own = OwnPackAgrees(p, /*kn=*/false);
    if (packs_from_kn_) {
      // A reorder from B^T's rows that wants a scratchpad of its own: the caller transposes
      // B instead (prepares_b_from_kn() false), B is still packed once.
      p.src_kn = PlainB(shape_.gemm_dtype, reduce, width, shape_.ldb_kn, /*kn=*/true);
      const dnnl::reorder::primitive_desc kn_pd(Engine(), p.src_kn, Engine(), p.dst);
      if (kn_pd.scratchpad_desc().get_size() == 0) {
        p.reorder_kn = dnnl::reorder(kn_pd);
        p.impl_kn = kn_pd.impl_info_str();
        p.own_kn = OwnPackAgrees(p, /*kn=*/true);
      } else {
        packs_from_kn_ = false;
      }
    }
    packed_b_bytes_ = std::max<uint64_t>(packed_b_bytes_, (packed.get_size() + 63) / 64 * 64);
    packs_.push_back(std::move(p));
    return true;
  }

  // Whether gradkit's packer packs every B of `width` columns.
  bool PacksOwn(int64_t width) const {
    return std::all_of(packs_.begin(), packs_.end(), [&](const Pack& p) {
      return p.width != width || (p.own.has_value() && (!packs_from_kn_ || p.own_kn.has_value()));
    });
  }

  // The own packer's layout for p's B (or its transpose's rows), if it writes exactly the
  // bytes oneDNN's reorder writes: both pack the same B of distinct values into buffers of the
  // same prior contents, and every byte of the packed descriptor is compared.
  // The answer is kept for the process (phase 1 runs once per call of a framework's op).
  std::optional<MoeBlockedB> OwnPackAgrees(const Pack& p, bool kn) const {
    const std::optional<MoeBlockedB> layout = OwnPackLayout(p.dst, shape_.gemm_dtype);
    if (!layout) return std::nullopt;
    const dnnl::memory::desc& src_desc = kn ? p.src_kn : p.src;
    const int64_t ldb = kn ? shape_.ldb_kn : shape_.LdbOf(p.reduce);
    using Key = std::array<int64_t, 12>;
    // Never destroyed: a thread may still plan while the process exits.
    static std::mutex& mutex = *new std::mutex;
    static std::map<Key, bool>& agreed = *new std::map<Key, bool>;
    const Key key{static_cast<int64_t>(shape_.gemm_dtype), p.width, p.reduce, ldb, kn,
                  layout->k_block, layout->n_block, layout->pair, layout->k_stride,
                  layout->n_stride, layout->padded_reduce, layout->padded_width};
    {
      const std::lock_guard<std::mutex> lock(mutex);
      if (const auto it = agreed.find(key); it != agreed.end()) {
        return it->second ? layout : std::nullopt;
      }
    }
    const size_t src_bytes = src_desc.get_size(), dst_bytes = p.dst.get_size();
    std::vector<uint16_t> src((src_bytes + 1) / 2);
    for (size_t i = 0; i < src.size(); ++i) {
      // Finite in both dtypes (exponent field never all ones), and with no period: a block put
      // in another block's place cannot match by accident, whatever the strides.
      const uint64_t h = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull;
      src[i] = static_cast<uint16_t>((h >> 40) & 0x3fffu);
    }
    std::vector<uint8_t> by_library(dst_bytes, 0xA5), by_own(dst_bytes, 0xA5);
    dnnl::memory src_mem(src_desc, Engine(), src.data()), dst_mem(p.dst, Engine(), by_library.data());
    (kn ? p.reorder_kn : p.reorder).execute(ThreadStream(), src_mem, dst_mem);
    ThreadStream().wait();
    MoePackB(shape_.gemm_dtype, *layout, p.width, p.reduce, src.data(), ldb, kn, by_own.data());
    const bool same = by_own == by_library;
    const std::lock_guard<std::mutex> lock(mutex);
    agreed.emplace(key, same);
    return same ? layout : std::nullopt;
  }

  size_t PackIndex(int64_t width, int64_t reduce) const {
    for (size_t i = 0; i < packs_.size(); ++i) {
      if (packs_[i].width == width && packs_[i].reduce == reduce) return i;
    }
    throw std::logic_error(fmt::format("MoE tile GEMM: B of {}x{} was not prepared", width, reduce));
  }

  static size_t Position(const std::vector<int64_t>& values, int64_t value) {
    return static_cast<size_t>(std::find(values.begin(), values.end(), value) - values.begin());
  }
  size_t Index(int64_t rows, int64_t width, int64_t reduce, bool accumulate) const {
    const size_t w = Position(shape_.widths, width);
    const size_t st = static_cast<size_t>(
        std::find(shape_.steps.begin(), shape_.steps.end(), MoeTileGemmShape::Step{reduce, accumulate}) -
        shape_.steps.begin());
    const size_t r = Position(rows_, rows);
    if (w == shape_.widths.size() || st == shape_.steps.size() || r == rows_.size()) {
      throw std::logic_error(fmt::format("MoE tile GEMM: call {}x{}x{} (accumulate {}) was not "
                                         "prepared",
                                         rows, width, reduce, accumulate));
    }
    return (w * shape_.steps.size() + st) * rows_.size() + r;
  }

  // rows_independent's check: random operands of the shape's strides, every step in turn (B
  // prepared per step, later steps accumulating), the full-height call against a call of each
  // other prepared row count.
  // One packed call of max_rows rows against MoeBf16AmxGemmBroadcastB on the same random
  // operands: the same bits in every row (and in a call of a partial token tile's rows).
  bool AmxBroadcastGivesItsBits(int64_t width) const {
    const int64_t max_rows = rows_.back(), reduce = shape_.steps[0].reduce;
    const int64_t lda = shape_.LdaOf(reduce), ldb = shape_.LdbOf(reduce), ldc = shape_.ldc;
    const auto random = [&](int64_t elems, uint32_t seed) {
      std::vector<uint16_t> out(static_cast<size_t>(elems));
      for (int64_t i = 0; i < elems; ++i) {
        const uint32_t h = (static_cast<uint32_t>(i) ^ seed) * 2654435761u;
        StoreFromF32(out.data(), i, DType::kBF16, static_cast<float>(h >> 8) / 8388608.0f - 1.0f);
      }
      return out;
    };
    const std::vector<uint16_t> a = random(max_rows * lda, 0x27d4u), b = random(width * ldb, 0x1656u);
    std::vector<float> packed(static_cast<size_t>(max_rows * ldc));
    {
      const GemmSequentialScope sequential;
      std::vector<char> scratch(scratchpad_bytes() + 64);
      const std::unique_ptr<Worker> worker = MakeWorker(AlignUp(scratch.data(), 64));
      worker->Run(max_rows, width, reduce, false, a.data(), worker->PrepareB(width, reduce, b.data()),
                  packed.data());
    }
    for (const int64_t rows : {max_rows, std::min<int64_t>(max_rows, 17)}) {
      std::vector<uint32_t> tokens(MoeBf16DotTokensBytes(rows, reduce) / 4);
      std::vector<float> transposed(MoeBf16DotBroadcastScratchBytes(rows, width) / 4);
      std::vector<float> c(static_cast<size_t>(rows * ldc));
      MoeBf16DotPackTokens(rows, reduce, a.data(), lda, tokens.data());
      MoeBf16AmxGemmBroadcastB(rows, width, reduce, tokens.data(), b.data(), ldb, c.data(), ldc,
                               transposed.data());
      for (int64_t r = 0; r < rows; ++r) {
        if (std::memcmp(&c[static_cast<size_t>(r * ldc)], &packed[static_cast<size_t>(r * ldc)],
                        static_cast<size_t>(width) * sizeof(float)) != 0) {
          return false;
        }
      }
    }
    return true;
  }

  bool EachRowGetsItsBits(int64_t width) const {
    const int64_t max_rows = rows_.back(), elem = ElementBytes(shape_.gemm_dtype);
    const auto random = [&](int64_t elems, uint32_t seed) {
      std::vector<uint16_t> out(static_cast<size_t>(elems * elem / 2 + 1));
      for (int64_t i = 0; i < elems; ++i) {
        const uint32_t h = (static_cast<uint32_t>(i) ^ seed) * 2654435761u;
        StoreFromF32(out.data(), i, shape_.gemm_dtype, static_cast<float>(h >> 8) / 8388608.0f - 1.0f);
      }
      return out;
    };
    std::vector<std::vector<uint16_t>> a, b;
    for (size_t step = 0; step < shape_.steps.size(); ++step) {
      const int64_t reduce = shape_.steps[step].reduce;
      a.push_back(random(max_rows * shape_.LdaOf(reduce), 0x9e37u + static_cast<uint32_t>(step)));
      b.push_back(random(width * shape_.LdbOf(reduce), 0x85ebu + static_cast<uint32_t>(step)));
    }
    // A thread's GEMM: its own worker over its own scratch (a worker owns its packed B), run
    // sequentially; the operands are shared, read only.
    struct ThreadGemm {
      const OneDnnTileGemm& gemm;
      const GemmSequentialScope sequential{};
      std::vector<char> scratch = std::vector<char>(gemm.scratchpad_bytes() + 64);
      const std::unique_ptr<Worker> worker = gemm.MakeWorker(AlignUp(scratch.data(), 64));
    };
    const auto run = [&](ThreadGemm& own, int64_t rows, std::vector<float>& c) {
      for (size_t step = 0; step < shape_.steps.size(); ++step) {
        const auto& [reduce, accumulate] = shape_.steps[step];
        own.worker->Run(rows, width, reduce, accumulate, a[step].data(),
                        own.worker->PrepareB(width, reduce, b[step].data()), c.data());
      }
    };
    std::vector<float> whole(static_cast<size_t>(max_rows * shape_.ldc));
    {
      ThreadGemm own{*this};
      run(own, max_rows, whole);
    }
    // Row counts granule, 2 granule, ... below max_rows, round robin over the threads (the cost
    // grows with the square of max_rows). The verdict is the same on any number of threads:
    // every count is checked, or one failed.
    const int64_t granule = row_granule();
    const int64_t counts = (max_rows - 1) / granule;
    const int32_t threads = static_cast<int32_t>(std::clamp<int64_t>(ConfiguredThreads(), 1, std::max<int64_t>(counts, 1)));
    std::atomic<bool> same{true};
    ParallelFor(threads, threads, [&](int64_t t) {
      ThreadGemm own{*this};
      std::vector<float> part(whole.size());
      for (int64_t i = t; i < counts && same.load(std::memory_order_relaxed); i += threads) {
        const int64_t rows = (i + 1) * granule;
        run(own, rows, part);
        for (int64_t r = 0; r < rows; ++r) {
          if (std::memcmp(&part[static_cast<size_t>(r * shape_.ldc)], &whole[static_cast<size_t>(r * shape_.ldc)],
                          static_cast<size_t>(width) * sizeof(float)) != 0) {
            same.store(false, std::memory_order_relaxed);
            return;
          }
        }
      }
    });
    return same.load();
  }

  // Runs one call of each distinct implementation on zeros: some (gemm:jit) generate their
  // kernels on first use, which would otherwise happen in phase 2.
  void WarmUp() {
    std::vector<std::string> done;
    const OmpThreadsScope one(1);
    for (const Entry& e : entries_) {
      const std::string name = e.pd.impl_info_str();
      if (std::find(done.begin(), done.end(), name) != done.end()) continue;
      done.push_back(name);
      const auto zeros = [](const dnnl::memory::desc& d) {
        return std::unique_ptr<void, decltype(&std::free)>(std::calloc(d.get_size() + 64, 1), &std::free);
      };
      auto a = zeros(e.pd.src_desc()), b = zeros(e.pd.weights_desc()), c = zeros(e.pd.dst_desc()),
           s = zeros(e.pd.scratchpad_desc());
      if (!a || !b || !c || !s) throw std::bad_alloc();
      const dnnl::engine& engine = Engine();
      e.primitive.execute(ThreadStream(),
                          {{DNNL_ARG_SRC, dnnl::memory(e.pd.src_desc(), engine, a.get())},
                           {DNNL_ARG_WEIGHTS, dnnl::memory(e.pd.weights_desc(), engine, b.get())},
                           {DNNL_ARG_DST, dnnl::memory(e.pd.dst_desc(), engine, c.get())},
                           {DNNL_ARG_SCRATCHPAD, dnnl::memory(e.pd.scratchpad_desc(), engine, s.get())}});
      ThreadStream().wait();
    }
    for (const Pack& p : packs_) {  // jit reorders too (those phase 2 runs), one of each
      for (const bool kn : {false, true}) {
        if ((kn && !packs_from_kn_) || (kn ? p.own_kn : p.own)) continue;
        const std::string name = (kn ? "reorder kn " : "reorder ") + (kn ? p.impl_kn : p.impl);
        if (std::find(done.begin(), done.end(), name) != done.end()) continue;
        done.push_back(name);
        const dnnl::memory::desc& src_desc = kn ? p.src_kn : p.src;
        auto src = std::unique_ptr<void, decltype(&std::free)>(std::calloc(src_desc.get_size() + 64, 1), &std::free);
        auto dst = std::unique_ptr<void, decltype(&std::free)>(std::calloc(p.dst.get_size() + 64, 1), &std::free);
        if (!src || !dst) throw std::bad_alloc();
        dnnl::memory src_mem(src_desc, Engine(), src.get()), dst_mem(p.dst, Engine(), dst.get());
        (kn ? p.reorder_kn : p.reorder).execute(ThreadStream(), src_mem, dst_mem);
        ThreadStream().wait();
      }
    }
  }

  MoeTileGemmShape shape_;
  std::vector<int64_t> rows_;  // the row counts prepared, ascending
  std::vector<Entry> entries_;
  std::vector<Pack> packs_;
  bool packed_b_ = false;
  bool packs_from_kn_ = false;  // every pack also has its reorder from B^T's rows
  bool in_place_ = false;       // shape.b_in_place taken: B^T's rows read by gemm:jit, no pack
  bool tails_ = false;          // shape.tail_calls taken (AddTailEntries)
  uint64_t scratchpad_bytes_ = 0;
  uint64_t packed_b_bytes_ = 0;
  std::map<int64_t, std::string> impls_;
  std::map<int64_t, bool> brgemm_only_;  // per width: every call of it on brgemm
};

class OneDnnDenseGemm final : public MoeDenseGemm {
 public:
  OneDnnDenseGemm(DType dtype, int64_t m, int64_t reduce, int64_t width, int32_t threads)
      : threads_(threads), m_(m), reduce_(reduce), width_(width), dtype_(dtype) {
    const OmpThreadsScope scope(threads_);
    pd_ = MatmulDesc(dtype, m, reduce, width, reduce, reduce, width, false, false);
    primitive_ = dnnl::matmul(pd_);
  }
  std::string name() const override { return fmt::format("onednn {}", pd_.impl_info_str()); }
  void Run(const void* a, const void* b, float* c, int64_t ldc) const override {
    const OmpThreadsScope scope(threads_);
    dnnl::matmul::primitive_desc pd = pd_;
    dnnl::matmul primitive = primitive_;
    if (ldc != width_) {
      pd = MatmulDesc(dtype_, m_, reduce_, width_, reduce_, reduce_, ldc, false, false);
      primitive = dnnl::matmul(pd);
    }
    dnnl::memory a_mem(pd.src_desc(), Engine(), const_cast<void*>(a));
    dnnl::memory b_mem(pd.weights_desc(), Engine(), const_cast<void*>(b));
    dnnl::memory c_mem(pd.dst_desc(), Engine(), c);
    primitive.execute(ThreadStream(),
                      {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    ThreadStream().wait();
  }

 private:
  int32_t threads_;
  int64_t m_, reduce_, width_;
  DType dtype_;
  dnnl::matmul::primitive_desc pd_;
  dnnl::matmul primitive_;
};
// Whether oneDNN runs the shape's main call (widest block, first k-block, most rows) on a brgemm
// kernel: AVX-512 machines (AMX for bfloat16 where the CPU has it). Elsewhere (AVX2) its float32
// GEMM is gemm:jit, which packs both operands on every call, and it has no bfloat16 GEMM: the own
// micro-kernel measured faster there (docs/benchmarks.md). A property of the CPU and the library.
bool OneDnnRunsBrgemm(const MoeTileGemmShape& shape) {
  if (shape.widths.empty() || shape.steps.empty()) return false;
  try {
    const OmpThreadsScope one(1);
    const MoeTileGemmShape::Step& step = shape.steps.front();
    const int64_t rows = RoundUp(shape.max_rows, shape.row_granule);
    const dnnl::matmul::primitive_desc pd =
        MatmulDesc(shape.gemm_dtype, rows, step.reduce, shape.widths.front(), shape.LdaOf(step.reduce),
                   shape.LdbOf(step.reduce), shape.ldc, step.accumulate, /*user_scratchpad=*/true,
                   /*packed_b=*/shape.prepared_b && kPackBOnce);
    return std::string_view(pd.impl_info_str()).substr(0, 3) == "brg";
  } catch (const dnnl::error&) {
    return false;
  }
}
#endif  // GRADKIT_HAVE_DNNL

}  // namespace

MoeTileGemmChoice MoeTileGemmChoiceFromEnv() {
  const char* value = std::getenv("GRADKIT_GEMM");
  if (value == nullptr || *value == '\0' || std::string_view(value) == "auto") return MoeTileGemmChoice::kAuto;
  if (std::string_view(value) == "onednn") return MoeTileGemmChoice::kOneDnn;
  if (std::string_view(value) == "gradkit") return MoeTileGemmChoice::kGradkit;
  throw ConfigError(fmt::format(
      "environment variable GRADKIT_GEMM = \"{}\": must be auto, onednn or gradkit", value));
}

namespace {
bool IsAmdFamily19(const CpuIdentity& cpu) { return cpu.vendor == "AuthenticAMD" && cpu.family == 0x19; }
}  // namespace

bool MoeOwnF32TilesOutrunBrgemm(const CpuIdentity& cpu) { return IsAmdFamily19(cpu); }

bool MoeOwnStreamedOutrunsBrgemm(const CpuIdentity& cpu) {
  return cpu.vendor == "AuthenticAMD" && cpu.family == 0x1A;
}

bool MoeOwnStreamedBf16OnDot(const CpuIdentity& cpu) {
  return MoeOwnStreamedOutrunsBrgemm(cpu) && MoeBf16DotAvailable();
}

bool MoeF32BroadcastOutrunsBrgemm(const CpuIdentity& cpu) {
  return (cpu.vendor == "AuthenticAMD" && cpu.family == 0x1A) || (cpu.vendor == "GenuineIntel" && cpu.amx_bf16);
}

bool MoeF32InPlaceKNOutrunsPackedBrgemm(const CpuIdentity& cpu) {
  return IsAmdFamily19(cpu) || (cpu.vendor == "AuthenticAMD" && cpu.family == 0x1A);
}

std::unique_ptr<MoeTileGemm> MoeTileGemm::Create(const MoeTileGemmShape& shape) {
  const MoeTileGemmChoice choice = MoeTileGemmChoiceFromEnv();
#if defined(GRADKIT_HAVE_DNNL)
  const CpuIdentity cpu = DetectCpuIdentity();
  const bool own_faster =
      (shape.gemm_dtype == DType::kF32 && shape.own_f32_where_faster && MoeOwnF32TilesOutrunBrgemm(cpu)) ||
      (shape.gemm_dtype == DType::kF32 && shape.streamed_b && MoeOwnStreamedOutrunsBrgemm(cpu)) ||
      (shape.AsksBf16Dot() && MoeOwnStreamedBf16OnDot(cpu)) ||
      (shape.gemm_dtype == DType::kF32 && shape.f32_broadcast && MoeF32BroadcastOutrunsBrgemm(cpu) &&
       MoeF32BroadcastAvailable());
  if (choice == MoeTileGemmChoice::kOneDnn ||
      (choice == MoeTileGemmChoice::kAuto && !own_faster && OneDnnRunsBrgemm(shape))) {
    try {
      return std::make_unique<OneDnnTileGemm>(shape);
    } catch (const dnnl::error&) {
      // The library does not take this shape or dtype on this CPU: the own kernel does.
    }
  }
#else
  (void)choice;
#endif
  return CreateOwn(shape);
}

std::unique_ptr<MoeTileGemm> MoeTileGemm::CreateOwn(const MoeTileGemmShape& shape) {
  return std::make_unique<MicroTileGemm>(shape);
}

std::unique_ptr<MoeDenseGemm> MoeDenseGemm::Create(DType gemm_dtype, int64_t m, int64_t reduce,
                                                   int64_t width, int32_t threads) {
#if defined(GRADKIT_HAVE_DNNL)
  try {
    return std::make_unique<OneDnnDenseGemm>(gemm_dtype, m, reduce, width, threads);
  } catch (const dnnl::error&) {
  }
#endif
  return std::make_unique<MicroDenseGemm>(gemm_dtype, m, reduce, width, threads);
}

GemmSequentialScope::GemmSequentialScope() : saved_threads_(1) {
#if defined(GK_DNNL_OMP)
  saved_threads_ = omp_get_max_threads();
  if (saved_threads_ != 1) omp_set_num_threads(1);
#endif
}

GemmSequentialScope::~GemmSequentialScope() {
#if defined(GK_DNNL_OMP)
  if (saved_threads_ != 1) omp_set_num_threads(saved_threads_);
#endif
}

MoeTileColumns MoeTileColumnsOf(int64_t columns, int64_t base) {
  MoeTileColumns c{base, CeilDiv(columns, base), 0};
  c.last = columns - (c.blocks - 1) * c.base;
  if (c.blocks > 1 && c.last < 16) {
    c.base = RoundUp(CeilDiv(columns, c.blocks), 16);
    c.blocks = CeilDiv(columns, c.base);
    c.last = columns - (c.blocks - 1) * c.base;
  }
  return c;
}

bool MoeGemmHasOneDnn() {
#if defined(GRADKIT_HAVE_DNNL)
  return true;
#else
  return false;
#endif
}

std::string MoeGemmLibraryName() {
#if defined(GRADKIT_HAVE_DNNL)
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
#else
  return "gradkit micro-kernel";
#endif
}

}  // namespace gk
