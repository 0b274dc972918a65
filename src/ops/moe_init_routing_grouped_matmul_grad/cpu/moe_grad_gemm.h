// The GEMM behind every MoE tile, and behind the benchmark's dense ceiling: oneDNN's matmul
// (brgemm; AMX for bfloat16 where the CPU has it) when gradkit is built with it and the CPU has
// brgemm kernels, else gradkit's own register-blocked micro-kernel (moe_grad_microkernel.h).
// oneDNN headers stay inside moe_grad_gemm.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/cpu_info.h"
#include "core/dtype.h"

namespace gk {

// Every tile GEMM call a plan will make, so that all of them are prepared in phase 1.
struct MoeTileGemmShape {
  DType gemm_dtype;             // float32 or bfloat16 (A and B); C is always float32
  int64_t max_rows;             // base_m
  int64_t row_granule;          // rows are always a multiple of this
  // The row counts called with, ascending; empty: every multiple of row_granule up to max_rows.
  std::vector<int64_t> row_counts;
  // With row_counts empty: kernels for 1 .. row_granule - 1 rows too, so that Run takes any row
  // count up to max_rows (row_granule() 1): a count past a multiple of the granule runs as two
  // calls, that multiple and then the rest (A and C advanced by its rows), instead of the caller
  // padding it. Dropped where the library would run a short call on another implementation or
  // want B packed differently for it (MoeTileGemm::row_granule then says the granule).
  bool tail_calls = false;
  int64_t ldc;                  // row stride of C (base_n)
  int64_t ldb;                  // row stride of B (N: weights read in place; base_k: a converted copy)
  std::vector<int64_t> widths;  // the C widths asked for (base_n, and the last block's)
  int64_t lda;                  // row stride of A: = the reduction of a step (A is dense)
  // lda = ldb = each step's own reduce (A and B dense whatever the step; lda and ldb unused).
  bool dense_steps = false;
  // lda = each step's own reduce, B of row stride ldb (GroupedMatmul's k-blocks: A copied dense
  // per k-block, B read where it is).
  bool dense_a_steps = false;
  int64_t LdaOf(int64_t reduce) const { return dense_steps || dense_a_steps ? reduce : lda; }
  int64_t LdbOf(int64_t reduce) const { return dense_steps ? reduce : ldb; }
  // The reduction is cut into k-blocks summed in ascending order into C: each call reduces
  // `reduce` elements and either writes C or adds to it (the first k-block writes).
  struct Step {
    int64_t reduce;
    bool accumulate;
    bool operator==(const Step&) const = default;
  };
  std::vector<Step> steps;
  // The caller hands each B to Worker::PrepareB once and passes what it returns to every Run on
  // that B: the library then packs B into its own layout once instead of on every call.
  bool prepared_b = false;
  // With prepared_b: when > 0, PrepareBFromKN is asked too, with B given as its transpose,
  // [reduce, width] rows of this stride (GroupedMatmul's [G, K, N] weights read in place; with
  // b_in_place, also the B tile's [K, N] copies of [G, N, K] blocks).
  int64_t ldb_kn = 0;
  // With ldb_kn > 0 (> every width): float32 B read where it is by oneDNN's gemm:jit on every
  // call from B^T's rows (PrepareBFromKN hands b_kn back, nothing is packed), on CPUs of
  // MoeF32InPlaceKNOutrunsPackedBrgemm, every call of the shape on gemm:jit or none (else B is
  // packed as above; MoeTileGemm::reads_b_in_place says which). Set by GroupedMatmul's forward for
  // float32 weights without k-blocks, whose blocks serve few rows: [G, K, N] rows in place,
  // [G, N, K] blocks copied into [K, N] rows first, so that both forms run one kernel.
  bool b_in_place = false;
  // The caller's float32 tiles were measured faster (the weight gradient's: at its slowest shape)
  // on gradkit's micro-kernel than on oneDNN 2.6's brgemm on CPUs of MoeOwnF32TilesOutrunBrgemm:
  // auto then takes the micro-kernel there.
  // Set by the fused op and GroupedMatmulWeightGrad, not by GroupedMatmul's forward (whose dense
  // x rows and B packed once per expert block run faster on oneDNN at S1/S4, docs/benchmarks.md).
  bool own_f32_where_faster = false;
  // The caller's Bs are cold weights, each prepared for few rows and followed by the next, which
  // it names by Worker::PrefetchDuringRuns (GroupedMatmul's float32 and bfloat16 forward in
  // k-blocks): the own kernel fetches that one while it multiplies (oneDNN's kernels take no such
  // hint), bfloat16 on its dot-product kernel where the CPU has one (moe_grad_bf16dot.h); auto
  // takes the own kernel on CPUs of MoeOwnStreamedOutrunsBrgemm (float32) and
  // MoeOwnStreamedBf16OnDot (bfloat16).
  bool streamed_b = false;
  // The caller's bfloat16 calls mostly add into C rows that its earlier calls wrote, too many to
  // stay in L2 (GroupedMatmulWeightGrad where an expert averages more than one chunk, its float32
  // gradWeight rows summed chunk after chunk): auto takes the own dot-product kernel
  // (moe_grad_bf16dot.h), which asks for each next register block's C rows while it multiplies,
  // on CPUs of MoeOwnStreamedBf16OnDot. oneDNN 2.6's brgemm, adding by a sum post-op, ran each
  // such call 16-35% slower than a call that only writes C (Zen 5, docs/benchmarks.md, session 41).
  bool bf16_dot_where_faster = false;
  // The caller runs most of its float32 tiles in the weights-broadcast form, whose sums are the
  // micro-kernel's (the fused op where its experts average at most base_m rows): auto then takes
  // the micro-kernel on CPUs of MoeF32BroadcastOutrunsBrgemm, where that form runs
  // (MoeF32BroadcastAvailable), so that the tiles of either form give the same bits.
  bool f32_broadcast = false;

  // Whether the caller asks for the bfloat16 dot-product kernel (streamed_b or
  // bf16_dot_where_faster in bfloat16): the own kernel runs on it where the CPU has it, and auto
  // takes the own kernel on CPUs of MoeOwnStreamedBf16OnDot.
  bool AsksBf16Dot() const { return gemm_dtype == DType::kBF16 && (streamed_b || bf16_dot_where_faster); }
};

// CPUs where oneDNN 2.6's float32 brgemm loses to the micro-kernel on the fused op's tiles (and
// on the weight gradient's at S3, while a few points ahead of it at S2/S4): AMD family 0x19
// (Zen 4, whose AVX-512 executes on 256-bit units; Zen 3 has no AVX-512, so no brgemm).
// Measured on Zen 4 (docs/benchmarks.md); on Zen 5 (family 0x1A, full 512-bit units) the two ran
// within the noise of each other (session 23), so it and other families keep oneDNN's brgemm.
bool MoeOwnF32TilesOutrunBrgemm(const CpuIdentity& cpu);

// CPUs where the own kernel, fetching each next weight block while it multiplies
// (MoeTileGemmShape::streamed_b), outruns oneDNN 2.6's brgemm, whose B a separate pass packs from
// memory first: AMD family 0x1A (Zen 5). GroupedMatmul S3 float32, 2 threads: `gradkit bench`,
// three rounds, percent of dense, oneDNN 75, 84, 79 / own kernel without the fetch 81, 85, 88 /
// with it 86, 87, 90; a one-process harness, six interleaved rounds, mean GFLOP/s 265 / 272 / 286
// (docs/benchmarks.md, session 34). Not measured elsewhere: other CPUs keep brgemm.
bool MoeOwnStreamedOutrunsBrgemm(const CpuIdentity& cpu);

// The same for bfloat16: CPUs of MoeOwnStreamedOutrunsBrgemm where the own kernel runs bfloat16
// tiles on vdpbf16ps (MoeBf16DotAvailable, moe_grad_bf16dot.h; without it the own kernel widens
// bfloat16 to float32 and runs at float32's rate, half of brgemm's). GroupedMatmul bfloat16, 2
// threads, Zen 5 (session 35): a one-process harness, five interleaved rounds of two runs, median
// GFLOP/s oneDNN / dot kernel: S1 689 / 693, S2 614 / 606, S3 563 / 582, S3 [G, N, K] 573 / 618;
// `gradkit bench`, two rounds in turn, plain GFLOP/s: S1 677, 659 / 685, 675; S2 636, 607 / 642,
// 634; S3 585, 580 / 595, 574; S4 676, 693 / 687, 702 (docs/benchmarks.md).
bool MoeOwnStreamedBf16OnDot(const CpuIdentity& cpu);

// CPUs where the fused op's float32 tiles run faster in the weights-broadcast form, the rest on
// the micro-kernel, than packed on oneDNN 2.6's brgemm: AMD family 0x1A (Zen 5), and Intel Xeons
// with AMX (Sapphire Rapids and later; AMX itself serves bfloat16 only, it marks the generation).
// Zen 5: one-process harness, 2 threads, two runs each, median fraction of dense: S3 float32 (137
// rows an expert) 0.85, 0.85 on oneDNN -> 0.93, 0.95; S2 (256) 0.92, 0.90 -> 0.94, 0.90
// (session 45). AMX Xeon: `gradkit bench moe-grad`, 2 threads, three rounds in turn: S3 0.85,
// 0.84, 0.82 -> 0.96, 0.93, 0.95; S2 0.88, 0.90, 0.86 -> 0.87, 0.88, 0.88 (session 48;
// docs/benchmarks.md). Not measured elsewhere: other CPUs keep brgemm (and the packed form).
bool MoeF32BroadcastOutrunsBrgemm(const CpuIdentity& cpu);

// CPUs where oneDNN 2.6 runs GroupedMatmul's float32 forward tiles faster reading [K, N] weight
// rows in place (gemm:jit, which packs them inside its loops, as it computes) than on brgemm
// after a separate pass packs each block: AMD family 0x19 (Zen 4: plain / dense S2 85-89 ->
// 88-90%, S4 94 -> 100-105, S1 and S3 within the noise, gathered / plain 89-98 -> 96-102;
// docs/benchmarks.md, session 15) and 0x1A (Zen 5: S1 93-99 -> 96-97, S2 82-89 -> 87-91, S4
// 89-95 -> 97-102, gathered / plain at S1 90-97 -> 97-100; session 23). On the AMX Xeon (family
// 6 model 167) it lost: S3 81, 81, 74 -> 72, 62, 71, S2 80, 93, 86 -> 82, 75, 82 (session 21),
// so other CPUs keep the packed brgemm.
bool MoeF32InPlaceKNOutrunsPackedBrgemm(const CpuIdentity& cpu);

// Tile GEMM: C[rows, width] (row stride ldc) (+)= A[rows, reduce] (row stride lda) *
// B[width, reduce]^T (row stride ldb). oneDNN 2.6's brgemm takes A only dense (lda = reduce):
// a strided A falls back to gemm:jit, several times slower for bfloat16. Runs on the calling thread only. Calls of one shape on the
// same data give the same bits (the property the determinism of the operator rests on).
class MoeTileGemm {
 public:
  virtual ~MoeTileGemm() = default;
  // By MoeTileGemmChoiceFromEnv: auto (the default) takes oneDNN where it is built in and runs
  // the shape on its brgemm kernels (AVX-512), unless own_f32_where_faster holds on this CPU for
  // float32 tiles (MoeOwnF32TilesOutrunBrgemm) or streamed_b for its tiles
  // (MoeOwnStreamedOutrunsBrgemm, MoeOwnStreamedBf16OnDot), else gradkit's micro-kernel
  // (moe_grad_microkernel.h: AVX2, and every dtype oneDNN has no GEMM for; streamed bfloat16 on
  // moe_grad_bf16dot.h's kernel where the CPU has it); onednn takes oneDNN wherever it accepts
  // every call of the shape; gradkit always the own kernels. oneDNN's kernels
  // are all generated here (phase 1), for one thread: the library sizes its scratchpad and
  // blocking for the single thread each call runs on. Throws ConfigError (core/error.h) for a
  // bad GRADKIT_GEMM.
  static std::unique_ptr<MoeTileGemm> Create(const MoeTileGemmShape& shape);
  // gradkit's micro-kernel for the shape, whatever GRADKIT_GEMM and the CPU (for a caller whose
  // tiles are made again once Create chose it).
  static std::unique_ptr<MoeTileGemm> CreateOwn(const MoeTileGemmShape& shape);
  virtual std::string name() const = 0;                     // the library, e.g. "onednn"
  virtual std::string impl(int64_t width) const = 0;        // its implementation for that width
  virtual uint64_t scratchpad_bytes() const = 0;            // per calling thread
  // Run's row counts must be multiples of this: the shape's row_granule where kernels are
  // prepared per row count (oneDNN), 1 where any count runs (the own kernel: callers then pad
  // nothing).
  virtual int64_t row_granule() const = 0;
  // Whether Worker::PrepareB packs B (else it hands b back and every Run reads it as it is).
  virtual bool packs_b() const { return false; }
  // Whether Worker::PrepareBFromKN packs from shape.ldb_kn rows (else the caller transposes B).
  virtual bool prepares_b_from_kn() const { return false; }
  // Whether Worker::PrepareBStrided and RunStrided take any row stride of A and B per call, and
  // B as itself or its transpose (the own kernel), so that a caller reads operands in place
  // instead of copying them to the shape's strides first (oneDNN's kernels are made for those).
  virtual bool takes_any_stride() const { return false; }
  // Whether the shape's b_in_place was taken: PrepareBFromKN hands B^T's rows back unpacked.
  virtual bool reads_b_in_place() const { return false; }
  // Whether the weights-broadcast form of its dtype gives its bits, so that the fused op may run
  // experts of few rows in that form (MoeGradBroadcastRows): bfloat16 on the dot-product kernel
  // (moe_grad_bf16dot.h), float32 on the micro-kernel's AVX-512 chains (moe_grad_f32bcast.h).
  // oneDNN's bfloat16 brgemm on AMX: the form on AMX tiles (moe_grad_bf16amx.h), where a check on
  // this machine and library found its bits equal to the packed calls' (broadcast_on_amx).
  virtual bool has_broadcast_form() const { return false; }
  // Whether that form runs on AMX (MoeBf16AmxGemmBroadcastB) rather than on vdpbf16ps.
  virtual bool broadcast_on_amx() const { return false; }
  // Whether calls of this width give a row of C the same bits whatever the call's row count and
  // its other rows (every reduction step, accumulating or not), so that a caller may group rows
  // into calls differently (the fused op's whole blocks, which depend on the thread count): the
  // own kernels (each element one chain, whatever the rows); oneDNN where every call of the width
  // runs brgemm and a check of every row count on this machine found it so (the first query per
  // process and configuration runs it: call it in phase 1). oneDNN 2.6's gemm:jit sums K in
  // blocks its call's shape chooses, and oneDNN 3.7's brgemm gave a call of one row other bits:
  // not. Tested: moe_grad_gemm.RowsIndependentGemmsGiveEachRowItsBits.
  virtual bool rows_independent(int64_t width) const {
    (void)width;
    return false;
  }

  // What one thread runs its calls through; holds the library's per-call objects, reused.
  class Worker {
   public:
    virtual ~Worker() = default;
    // With shape.prepared_b: B [width, reduce] (row stride ldb) as Run's `b` wants it, valid
    // until the next PrepareB on this worker (oneDNN: packed into the thread's scratchpad in the
    // blocked layout its kernel reads; the own kernel: b itself). Without: b itself.
    virtual const void* PrepareB(int64_t width, int64_t reduce, const void* b) { return b; }
    // The same from B^T: [reduce, width] rows of stride shape.ldb_kn, packed in one pass (no
    // transposed copy first; bfloat16 on the dot-product kernel: packed by the next Run as it
    // multiplies, so b_kn must stay valid until then; streamed float32 on the own kernel, whole
    // panels starting on 64-byte lines: b_kn itself, read in place by every Run until the next
    // PrepareB, see MoeMicroGemmKN). Only where prepares_b_from_kn().
    virtual const void* PrepareBFromKN(int64_t width, int64_t reduce, const void* b_kn) {
      (void)width, (void)reduce, (void)b_kn;
      return nullptr;
    }
    virtual void Run(int64_t rows, int64_t width, int64_t reduce, bool accumulate, const void* a,
                     const void* b, float* c) = 0;
    // Whether the next calls store C's final values, which nothing reads back while they could
    // still be cached (the weight gradient's last chunk into gradWeight): the own kernel then
    // stores them by non-temporal stores where C's rows are whole aligned lines. The same bits.
    virtual void SetFinalC(bool final_c) { (void)final_c; }
    // Asks `rows` rows of `row_bytes` bytes, `stride` bytes apart, from `base` into the caches
    // while the Runs after it compute, spread over about `macs` multiply-adds of theirs (the own
    // kernel, shape.streamed_b: the next B block's weights, fetched behind the arithmetic instead
    // of stalling the pass that packs them; ignored after a PrepareBFromKN on the dot-product
    // kernel, whose packing register blocks fetch their rows themselves). Until the next
    // PrepareB. A hint: no bit changes.
    virtual void PrefetchDuringRuns(const void* base, int64_t rows, int64_t row_bytes,
                                    int64_t stride, int64_t macs) {
      (void)base, (void)rows, (void)row_bytes, (void)stride, (void)macs;
    }
    // Only where takes_any_stride(): PrepareB from B [width, reduce] of row stride ldb, or with
    // `kn` from B^T [reduce, width] of row stride ldb; Run with A of row stride lda. The same
    // values give the same bits whatever the strides.
    virtual const void* PrepareBStrided(int64_t width, int64_t reduce, const void* b, int64_t ldb,
                                        bool kn);
    virtual void RunStrided(int64_t rows, int64_t width, int64_t reduce, bool accumulate,
                            const void* a, int64_t lda, const void* b, float* c);
  };
  // scratchpad: scratchpad_bytes() bytes owned by the calling thread for the worker's life.
  virtual std::unique_ptr<Worker> MakeWorker(void* scratchpad) const = 0;
};

// The tile GEMM asked for by the environment variable GRADKIT_GEMM: unset, "" or "auto",
// "onednn", "gradkit"; any other value throws ConfigError naming it.
enum class MoeTileGemmChoice { kAuto, kOneDnn, kGradkit };
MoeTileGemmChoice MoeTileGemmChoiceFromEnv();

// The C columns of a tile GEMM cut into blocks: `blocks` of `base` columns, the last one `last`.
struct MoeTileColumns {
  int64_t base;
  int64_t blocks;
  int64_t last;
};
// `columns` cut into blocks of `base` columns, but never with a last block narrower than 16 when
// there are several: such a tail is spread over the blocks instead (each a multiple of 16 wide).
// oneDNN 3.7's brgemm got a C of one column with a row stride past 1 wrong (the one-column tail
// of 257 columns came back as zeros; Debian 13 run).
MoeTileColumns MoeTileColumnsOf(int64_t columns, int64_t base);

// Makes the GEMM library sequential on the calling thread while the scope lives (the operator's
// own pool is the only source of parallelism), and restores the thread's setting after.
class GemmSequentialScope {
 public:
  GemmSequentialScope();
  ~GemmSequentialScope();
  GemmSequentialScope(const GemmSequentialScope&) = delete;
  GemmSequentialScope& operator=(const GemmSequentialScope&) = delete;

 private:
  [[maybe_unused]] int saved_threads_;  // read only where oneDNN runs on OpenMP (GK_DNNL_OMP)
};

// A whole GEMM C[m, width] = A[m, reduce] * B[width, reduce]^T with `threads` threads through the
// same library: the benchmark's ceiling and the unfused composite's grouped GEMM.
class MoeDenseGemm {
 public:
  virtual ~MoeDenseGemm() = default;
  static std::unique_ptr<MoeDenseGemm> Create(DType gemm_dtype, int64_t m, int64_t reduce,
                                              int64_t width, int32_t threads);
  virtual std::string name() const = 0;
  // ldc: row stride of C (width when C is dense).
  virtual void Run(const void* a, const void* b, float* c, int64_t ldc) const = 0;
};

bool MoeGemmHasOneDnn();          // built with oneDNN
std::string MoeGemmLibraryName();  // "oneDNN 2.6.3" or "gradkit micro-kernel"

}  // namespace gk
