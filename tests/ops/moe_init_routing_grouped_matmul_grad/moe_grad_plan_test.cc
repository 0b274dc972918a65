// The MoeInitRoutingGroupedMatmulGrad plan, as plain data: tiles, work split, workspace layout.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "core/plan_math.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_bf16dot.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_microkernel.h"
#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_plan.h"
#include "tests/ops/op_test_support.h"

namespace gk {
namespace {

MoeGradShape Shape(int64_t batch, int64_t top_k, int64_t g, int64_t k, int64_t n,
                   DType dtype = DType::kF32, int64_t m = -1) {
  return MoeGradGatherCountShape(batch, top_k, m < 0 ? batch * top_k : m, g, k, n, dtype);
}

MoeGradMachine Machine(int32_t threads) { return {threads, 4000, "test", {}}; }

std::vector<MoeGradRegion> Regions(const MoeGradLayout& l) {
  return {l.matmul_out_ring, l.a_tiles, l.b_tiles, l.system, l.group_offsets, l.row_token,
          l.chunk_starts, l.chunk_rows};
}

TEST(moe_grad_plan, RegionsAreAlignedDisjointAndInside) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int32_t threads : {1, 2, 3, 8}) {
      const MoeGradPlan p = MakeMoeGradPlan(Shape(4096, 2, 8, 2048, 1408, dtype), Machine(threads));
      std::vector<MoeGradRegion> used;
      for (const auto& r : Regions(p.layout)) {
        if (r.bytes == 0) continue;
        EXPECT_EQ(r.offset % 512, 0u);
        EXPECT_LE(r.offset + r.bytes, p.layout.end);
        for (const auto& other : used) {
          EXPECT_TRUE(r.offset >= other.offset + other.bytes || other.offset >= r.offset + r.bytes);
        }
        used.push_back(r);
      }
      EXPECT_EQ(p.layout.end % 512, 0u);
      EXPECT_EQ(p.workspace_bytes, p.layout.end + 512);  // room to align the caller's pointer
      EXPECT_EQ(p.layout.b_tiles.bytes > 0, dtype == DType::kF16);
    }
  }
}

TEST(moe_grad_plan, RingHasParallNumSlotsPerThread) {
  const MoeGradPlan p = MakeMoeGradPlan(Shape(4096, 2, 8, 2048, 1408), Machine(2));
  EXPECT_GE(p.parall_num, 2);
  EXPECT_EQ(p.layout.matmul_out_ring.bytes,
            static_cast<uint64_t>(p.threads * p.parall_num * p.base_m * p.base_n * 4));
  EXPECT_EQ(p.layout.system.bytes, 2u * AlignUp(uint64_t{4000}, uint64_t{512}));
}

TEST(moe_grad_plan, TilesFollowTheSeed) {
  // base = min(best, extent); rows rounded up to the padding granule.
  MoeGradPlan p = MakeMoeGradPlan(Shape(1, 1, 1, 128, 256), Machine(2));
  EXPECT_EQ(p.base_m, kMoeGradRowGranule);
  EXPECT_EQ(p.base_n, 128);
  EXPECT_EQ(p.base_k, 256);
  EXPECT_EQ(p.col_blocks, 1);
  EXPECT_EQ(p.last_block_cols, 128);
  p = MakeMoeGradPlan(Shape(10, 3, 4, 128 + 50 + 256, 286), Machine(2));
  EXPECT_EQ(p.base_m, 32);
  EXPECT_EQ(p.base_n, kMoeGradBestBaseN);
  EXPECT_EQ(p.col_blocks, 2);
  EXPECT_EQ(p.last_block_cols, 434 - kMoeGradBestBaseN);
  p = MakeMoeGradPlan(Shape(4096, 2, 8, 2048, 1408), Machine(2));
  EXPECT_EQ(p.base_m, kMoeGradBestBaseM);
  EXPECT_EQ(p.base_m % kMoeGradRowGranule, 0);
  EXPECT_EQ(p.gemm_dtype, DType::kF32);
  EXPECT_EQ(MakeMoeGradPlan(Shape(8, 2, 2, 64, 64, DType::kF16), Machine(1)).gemm_dtype, DType::kF32);
  EXPECT_EQ(MakeMoeGradPlan(Shape(8, 2, 2, 64, 64, DType::kBF16), Machine(1)).gemm_dtype, DType::kBF16);
}

// Determinism rests on this: everything that shapes a GEMM call or the order of additions is
// the same for every thread count; only the thread count and the per-thread regions change.
TEST(moe_grad_plan, WorkDoesNotDependOnThreads) {
  for (const MoeGradShape& s : {Shape(4096, 2, 8, 2048, 1408), Shape(110592, 2, 60, 128, 256),
                                Shape(700, 4, 3, 600, 200, DType::kBF16, 2500)}) {
    const MoeGradPlan one = MakeMoeGradPlan(s, Machine(1));
    for (int32_t threads = 2; threads <= 8; ++threads) {
      const MoeGradPlan p = MakeMoeGradPlan(s, Machine(threads));
      EXPECT_EQ(p.threads, std::min<int64_t>(threads, p.units));
      EXPECT_EQ(p.base_m, one.base_m);
      EXPECT_EQ(p.base_n, one.base_n);
      EXPECT_EQ(p.col_blocks, one.col_blocks);
      EXPECT_EQ(p.token_chunks, one.token_chunks);
      EXPECT_EQ(p.tokens_per_chunk, one.tokens_per_chunk);
      EXPECT_EQ(p.units, one.units);
      int64_t units = 0;
      for (int32_t t = 0; t < p.threads; ++t) units += p.UnitsOfThread(t);
      EXPECT_EQ(units, p.units);
    }
  }
}

// Units go round robin; a thread owns a column block's unit of every chunk exactly where
// WholeBlocks says so, the property the executor runs an expert's rows as one range on.
TEST(moe_grad_plan, WholeBlocksIsOwningEveryChunkOfEachBlock) {
  for (const MoeGradShape& s : {Shape(4096, 2, 8, 2048, 1408), Shape(110592, 2, 60, 128, 256),
                                Shape(700, 4, 3, 600, 200), Shape(100, 2, 4, 600, 64)}) {
    for (int32_t threads = 1; threads <= 8; ++threads) {
      const MoeGradPlan p = MakeMoeGradPlan(s, Machine(threads));
      SCOPED_TRACE(::testing::Message() << "K " << s.k << ", " << threads << " threads, "
                                        << p.col_blocks << " blocks, " << p.token_chunks << " chunks");
      bool every_block_whole = true;
      for (int64_t block = 0; block < p.col_blocks; ++block) {
        for (int64_t chunk = 1; chunk < p.token_chunks; ++chunk) {
          every_block_whole = every_block_whole && p.ThreadOfUnit(chunk, block) == p.ThreadOfUnit(0, block);
        }
      }
      EXPECT_EQ(p.WholeBlocks(), every_block_whole);
      int64_t units = 0;
      for (int64_t u = 0; u < p.units; ++u) {
        units += p.ThreadOfUnit(u / p.col_blocks, u % p.col_blocks) == 0;
      }
      EXPECT_EQ(units, p.UnitsOfThread(0));
    }
  }
  // S1 on 2 threads (8 blocks, 16 chunks): whole; on 3: not.
  EXPECT_TRUE(MakeMoeGradPlan(Shape(4096, 2, 8, 2048, 1408), Machine(2)).WholeBlocks());
  EXPECT_FALSE(MakeMoeGradPlan(Shape(4096, 2, 8, 2048, 1408), Machine(3)).WholeBlocks());
}

TEST(moe_grad_plan, TokenChunks) {
  // Few gradX columns and many rows: the tokens are split, each chunk keeps on average at least
  // a row granule of every expert's rows.
  MoeGradPlan p = MakeMoeGradPlan(Shape(110592, 2, 60, 128, 256), Machine(2));
  EXPECT_LE(p.col_blocks, 4);
  EXPECT_GT(p.token_chunks, 1);
  EXPECT_GE(221184 / p.token_chunks, kMoeGradRowGranule * 60);
  EXPECT_GE(p.tokens_per_chunk * p.token_chunks, 110592);
  EXPECT_LT(p.tokens_per_chunk * (p.token_chunks - 1), 110592);
  EXPECT_GT(p.layout.chunk_rows.bytes, 0u);
  // A problem too small to be worth a second thread: one unit per column block, whole tiles.
  p = MakeMoeGradPlan(Shape(100, 2, 4, 600, 64), Machine(2));
  EXPECT_EQ(p.token_chunks, 1);
  EXPECT_EQ(p.base_n, kMoeGradBestBaseN);
  EXPECT_EQ(p.layout.chunk_rows.bytes, 0u);
}

// The reduction is cut into k-blocks so that nothing a thread owns grows with N; they cover N
// exactly, equal where N allows.
TEST(moe_grad_plan, KBlocksBoundThreadMemory) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t n : {1, 256, 1408, 2048, 2100, 7168, 14336, 65536}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " N " << n);
      const MoeGradPlan p = MakeMoeGradPlan(Shape(4096, 2, 8, 4096, n, dtype), Machine(4));
      EXPECT_EQ((p.k_blocks - 1) * p.base_k + p.last_k, n);
      EXPECT_GT(p.last_k, 0);
      EXPECT_LE(p.last_k, p.base_k);
      if (n % 16 == 0 && p.k_blocks > 1) {
        EXPECT_EQ(p.last_k, p.base_k);
      }
      EXPECT_LE(p.thread_bytes - p.gemm_scratchpad_bytes, kMoeGradThreadOperandBytes);
      EXPECT_EQ(p.layout.b_tiles.bytes > 0, dtype == DType::kF16 || p.k_blocks > 1);
      // A GEMM that reads the weights at their own stride packs k-blocks in place: only float16
      // (converted) goes through the B tile.
      MoeGradMachine any_stride = Machine(4);
      any_stride.gemm_any_stride = true;
      const MoeGradPlan q = MakeMoeGradPlan(Shape(4096, 2, 8, 4096, n, dtype), any_stride);
      EXPECT_EQ(q.b_copied, dtype == DType::kF16);
      EXPECT_EQ(q.layout.b_tiles.bytes > 0, dtype == DType::kF16);
      // Its operands: the A and B tiles, and its packed B (the block's own columns in float32
      // panels, in the GEMM's scratchpad).
      EXPECT_EQ((q.k_blocks - 1) * q.base_k + q.last_k, n);
      EXPECT_LE((q.layout.a_tiles.bytes + q.layout.b_tiles.bytes) / q.threads +
                    MoeMicroPackedBytes(q.base_n, q.base_k),
                kMoeGradThreadOperandBytes);
      EXPECT_LE(q.k_blocks, p.k_blocks);
    }
  }
  // S3 (N 2048, 64-column blocks): one k-block on either GEMM, each weight block then packed
  // once for all of a thread's chunks (the packed B counts the block's own 64 columns; on one of
  // the shape's strides k-blocks would copy B first).
  MoeGradMachine any_stride = Machine(2);
  any_stride.gemm_any_stride = true;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const MoeGradShape s3 = Shape(1024, 8, 60, 7168, 2048, dtype);
    EXPECT_EQ(MakeMoeGradPlan(s3, any_stride).k_blocks, 1);
    const MoeGradPlan p = MakeMoeGradPlan(s3, Machine(2));
    EXPECT_EQ(p.base_n, 64);
    EXPECT_EQ(p.k_blocks, 1);
    EXPECT_FALSE(p.b_copied);
  }
  // 3 MiB over (256 A rows in bfloat16 + 256 packed B columns in float32 + 256 copied B
  // columns in bfloat16) bytes per reduction element: at most 1536, equal blocks of 1024.
  EXPECT_EQ(MakeMoeGradPlan(Shape(4096, 2, 8, 4096, 14336, DType::kBF16), Machine(4)).base_k, 1024);
  EXPECT_EQ(MakeMoeGradPlan(Shape(4096, 2, 8, 4096, 1408, DType::kBF16), Machine(4)).k_blocks, 1);
}

// Apart from the index tables (8 bytes per row), the workspace does not grow with M: whatever
// the split chosen for M, at most 4 MiB a thread (the tiles may differ between 8192 and 131072
// rows, the bound does not), so nothing of [M, K] size exists.
TEST(moe_grad_plan, WorkspaceDoesNotGrowWithM) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t batch : {4096, 65536}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " batch " << batch);
      const MoeGradPlan p = MakeMoeGradPlan(Shape(batch, 2, 8, 2048, 1408, dtype), Machine(2));
      const MoeGradLayout& l = p.layout;
      const uint64_t per_thread = l.matmul_out_ring.bytes + l.a_tiles.bytes + l.b_tiles.bytes +
                                  l.system.bytes;
      EXPECT_EQ(per_thread, 2 * p.thread_bytes);
      EXPECT_LE(p.thread_bytes, 4u << 20);
      const uint64_t tables = l.group_offsets.bytes + l.row_token.bytes + l.chunk_starts.bytes +
                              l.chunk_rows.bytes;
      EXPECT_LE(tables, 2 * 8 * static_cast<uint64_t>(batch * 2) + 8 * (p.token_chunks * 8 + 10));
      EXPECT_LE(p.workspace_bytes, per_thread + tables + 9 * 512);
      EXPECT_LE(p.workspace_bytes, 2 * (uint64_t{4} << 20) + tables + 9 * 512);
      EXPECT_LT(p.workspace_bytes, static_cast<uint64_t>(batch) * 2 * 2048 * 4 / 16);
      if (batch == 65536) {  // the [M, K] float32 intermediate is 1 GiB there
        EXPECT_LT(p.workspace_bytes, static_cast<uint64_t>(batch) * 2 * 2048 * 4 / 64);
      }
    }
  }
}

// The weights-broadcast form's rows (MoeGradBroadcastRows): where the GEMM has the form, with one
// k-block, [K, N] weights and 16-column blocks; bfloat16 (N even) up to base_m rows whose token
// panels (rows rounded down to 16, N bfloat16 each) fit kMoeGradBroadcastTokensBytes, float32 up
// to base_m (its kernel chunks the reduction), float16 never; 0 otherwise. S3's 4 KiB rows: 160;
// S2's 1.5 KiB rows: base_m (256). The plan carries it (0 without the form). The fused op asks for
// the float32 form's GEMM where its experts average at most that many rows (S2, S3; not S1).
TEST(moe_grad_plan, BroadcastRowsFromTheTokenPanelBudget) {
  const auto rows = [](const MoeGradShape& s, bool dot = true) {
    return MoeGradBroadcastRows(s, ChooseMoeGradTiles(s, /*gemm_any_stride=*/true), dot);
  };
  const MoeGradShape s2 = Shape(2048, 8, 64, 2048, 768, DType::kBF16);
  const MoeGradShape s3 = Shape(1024, 8, 60, 7168, 2048, DType::kBF16);
  EXPECT_EQ(rows(s3), static_cast<int64_t>(kMoeGradBroadcastTokensBytes / (2048 * 2)) / 16 * 16);
  EXPECT_EQ(rows(s3), 160);
  EXPECT_EQ(rows(s2), ChooseMoeGradTiles(s2, true).base_m);
  EXPECT_EQ(rows(s3, /*dot=*/false), 0);
  MoeGradShape f32 = s3, nk = s3, odd = s3, long_n = Shape(64, 2, 8, 256, 65536, DType::kBF16);
  f32.dtype = DType::kF32;
  nk.weight_nk = true;
  odd.n = 2047;
  EXPECT_EQ(rows(f32), ChooseMoeGradTiles(f32, true).base_m);
  MoeGradShape f16 = s3;
  f16.dtype = DType::kF16;
  EXPECT_EQ(rows(f16), 0);
  EXPECT_EQ(rows(nk), 0);
  EXPECT_EQ(rows(odd), 0);
  ASSERT_GT(ChooseMoeGradTiles(long_n, true).k_blocks, 1);
  EXPECT_EQ(rows(long_n), 0);
  // Rounded down to 16 rows: 2080 bfloat16 a row leave room for 157.
  const MoeGradShape wider = Shape(1024, 8, 60, 7168, 2080, DType::kBF16);
  ASSERT_EQ(ChooseMoeGradTiles(wider, true).k_blocks, 1);
  EXPECT_EQ(rows(wider), 144);
  MoeGradMachine dot = Machine(2), plain = Machine(2);
  dot.gemm_any_stride = plain.gemm_any_stride = true;
  dot.gemm_broadcast_form = true;
  EXPECT_EQ(MakeMoeGradPlan(s3, dot).broadcast_max_rows, 160);
  EXPECT_EQ(MakeMoeGradPlan(s3, plain).broadcast_max_rows, 0);
  MoeGradShape s1 = Shape(4096, 2, 8, 2048, 1408), s2_f32 = s2, s3_f32 = s3;
  s2_f32.dtype = s3_f32.dtype = DType::kF32;
  EXPECT_TRUE(MoeGradAsksF32Broadcast(s3_f32));
  EXPECT_TRUE(MoeGradAsksF32Broadcast(s2_f32));
  EXPECT_FALSE(MoeGradAsksF32Broadcast(s1));  // 1024 rows an expert
  EXPECT_FALSE(MoeGradAsksF32Broadcast(s3));  // bfloat16
  EXPECT_EQ(MoeGradTileGemmShape(s3_f32, false).f32_broadcast, true);
  EXPECT_EQ(MoeGradTileGemmShape(s1, false).f32_broadcast, false);
}

// Weights stream (the next block fetched during the GEMMs) for bfloat16 with one k-block where the
// gradY rows the kernel holds (an expert's average, at most kMoeBf16DotAChunkBytes) and two
// weight blocks fit in kMoeGradStreamedBytes: of the benchmark's shapes S2 and S3, not S1's long
// experts of 704 KiB blocks; never float32 or float16, never with k-blocks. The boundary from the
// rule's own terms: one row more per expert crosses it where the blocks leave less than a chunk,
// and any number of rows past the chunk streams where they leave more.
TEST(moe_grad_plan, WeightsStreamForBfloat16ShortExperts) {
  const auto streams = [](const MoeGradShape& s) {
    return MoeGradStreamsWeights(s, ChooseMoeGradTiles(s, /*gemm_any_stride=*/true));
  };
  const MoeGradShape s1 = Shape(4096, 2, 8, 2048, 1408, DType::kBF16);
  const MoeGradShape s2 = Shape(2048, 8, 64, 2048, 768, DType::kBF16);
  const MoeGradShape s3 = Shape(1024, 8, 60, 7168, 2048, DType::kBF16);
  EXPECT_FALSE(streams(s1));
  EXPECT_TRUE(streams(s2));
  EXPECT_TRUE(streams(s3));
  for (DType dtype : {DType::kF32, DType::kF16}) {
    MoeGradShape other = s2;
    other.dtype = dtype;
    EXPECT_FALSE(streams(other)) << DTypeName(dtype);
  }
  // Rows per expert at the boundary (rows * row + 2 * block <= the bytes) where the two blocks
  // leave less than a chunk: S3's rows of 7 KiB in its 64-column blocks (448 KiB), the tiles held.
  const MoeGradShape wide = Shape(1024, 8, 60, 7168, 3584, DType::kBF16);
  const MoeGradTiles tw = ChooseMoeGradTiles(wide, true);
  ASSERT_EQ(tw.k_blocks, 1);
  const int64_t row = wide.n * 2, block = tw.base_n * row;
  const int64_t room = static_cast<int64_t>(kMoeGradStreamedBytes) - 2 * block;
  ASSERT_GT(room, row);
  ASSERT_LT(room, kMoeBf16DotAChunkBytes);
  const int64_t most_rows = room / row;
  MoeGradShape at = wide, past = wide;
  at.m = at.l = most_rows * wide.g;
  past.m = past.l = (most_rows + 1) * wide.g;
  EXPECT_TRUE(MoeGradStreamsWeights(at, tw));
  EXPECT_FALSE(MoeGradStreamsWeights(past, tw));
  // Rows far past the chunk where the blocks leave a chunk's room: S3's tiles with 16 times its
  // rows per expert.
  MoeGradShape long_s3 = s3;
  long_s3.m *= 16, long_s3.l *= 16;
  EXPECT_TRUE(MoeGradStreamsWeights(long_s3, ChooseMoeGradTiles(s3, true)));
  // A reduction long enough for k-blocks: B is prepared per k-block, nothing streams.
  MoeGradShape long_n = Shape(64, 2, 8, 256, 65536, DType::kBF16);
  ASSERT_GT(ChooseMoeGradTiles(long_n, true).k_blocks, 1);
  EXPECT_FALSE(streams(long_n));
  // The GEMM shape carries it.
  EXPECT_TRUE(MoeGradTileGemmShape(s3, true).streamed_b);
  EXPECT_FALSE(MoeGradTileGemmShape(s1, true).streamed_b);
}

// The issue's shapes with the machine's own GEMM library, 2 threads: at most 16 MiB each.
TEST(moe_grad_plan, IssueShapesFitIn16MiB) {
  const MoeGradShape shapes[] = {Shape(4096, 2, 8, 2048, 1408), Shape(2048, 8, 64, 2048, 768),
                                 Shape(1024, 8, 60, 7168, 2048), Shape(110592, 2, 60, 128, 256)};
  for (const MoeGradShape& base : shapes) {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      MoeGradShape s = base;
      s.dtype = dtype;
      MoeGradMachine machine = DetectMoeGradMachine(s);
      machine.threads = 2;
      const MoeGradPlan p = MakeMoeGradPlan(s, machine);
      EXPECT_LE(p.workspace_bytes, 16u << 20) << MoeGradPlanToJson(p);
    }
  }
}

// The models the split is planned for, at 4096 tokens, on 64 and 128 threads, with the
// machine's own GEMM library (its real scratchpad): every thread has work, the static schedule is
// balanced within 1.15 (max over mean units per thread) and the workspace stays within 16 MiB
// plus 4 MiB per thread. Both matmuls of the FFN: the first (d_x: K = hidden, N = FFN width) and
// the second (d_h: K = FFN width, N = hidden).
TEST(moe_grad_plan, ModelShapesOn64And128Threads) {
  struct Model {
    const char* name;
    int64_t hidden, ffn, experts, top_k;
  };
  const Model models[] = {{"DeepSeek-V3", 7168, 2048, 256, 8},
                          {"Qwen3-30B-A3B", 2048, 768, 128, 8},
                          {"Mixtral-8x7B", 4096, 14336, 8, 2}};
  for (const Model& m : models) {
    for (bool first_matmul : {true, false}) {
      for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
        const int64_t k = first_matmul ? m.hidden : m.ffn, n = first_matmul ? m.ffn : m.hidden;
        const MoeGradShape s = Shape(4096, m.top_k, m.experts, k, n, dtype);
        const MoeGradMachine detected = DetectMoeGradMachine(s);
        for (int32_t threads : {64, 128}) {
          SCOPED_TRACE(::testing::Message() << m.name << (first_matmul ? " d_x" : " d_h") << " "
                                            << DTypeName(dtype) << " " << threads << " threads");
          MoeGradMachine machine = detected;
          machine.threads = threads;
          const MoeGradPlan p = MakeMoeGradPlan(s, machine);
          EXPECT_EQ(p.threads, threads) << MoeGradPlanToJson(p);
          EXPECT_LE(p.LoadBalance(threads), kMoeGradMaxImbalance) << MoeGradPlanToJson(p);
          EXPECT_LE(p.workspace_bytes, (16u << 20) + static_cast<uint64_t>(threads) * (4u << 20))
              << MoeGradPlanToJson(p);
        }
      }
    }
  }
}

TEST(moe_grad_plan, LoadBalanceOfTheStaticSchedule) {
  EXPECT_DOUBLE_EQ(MoeGradLoadBalance(128, 128), 1.0);
  EXPECT_DOUBLE_EQ(MoeGradLoadBalance(128, 64), 1.0);
  EXPECT_DOUBLE_EQ(MoeGradLoadBalance(224, 128), 2.0 / 1.75);
  EXPECT_DOUBLE_EQ(MoeGradLoadBalance(3, 2), 2.0 / 1.5);
  EXPECT_DOUBLE_EQ(MoeGradLoadBalance(64, 128), 2.0);  // half the threads idle
}

// The tiles of the plan are those the tile GEMM was made for (its packed B and prepared kernels
// are sized by them), whichever library each GRADKIT_GEMM choice gets: the micro-kernel's tiles
// are made again for it (longer k-blocks), oneDNN keeps those of the shape's strides.
TEST(moe_grad_plan, TilesAreThoseTheGemmWasMadeFor) {
  const MoeGradShape shapes[] = {Shape(4096, 2, 8, 2048, 1408), Shape(1024, 8, 60, 7168, 2048),
                                 Shape(300, 4, 3, 160, 3200), Shape(4096, 2, 8, 4096, 14336)};
  for (const char* choice : {"auto", "onednn", "gradkit"}) {
    const gk::testing::EnvScope env("GRADKIT_GEMM", choice);
    for (const MoeGradShape& base : shapes) {
      for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
        SCOPED_TRACE(::testing::Message() << choice << " " << DTypeName(dtype) << " N " << base.n);
        MoeGradShape s = base;
        s.dtype = dtype;
        const MoeGradGemm made = CreateMoeGradGemm(s);
        const MoeGradPlan p = MakeMoeGradPlan(s, MoeGradMachineOf(*made.gemm, made.shape));
        ASSERT_FALSE(made.shape.steps.empty());
        EXPECT_EQ(made.shape.steps.front().reduce, p.base_k);
        EXPECT_EQ(made.shape.steps.back().reduce, p.last_k);
        EXPECT_EQ(made.shape.steps.size() > 1, p.k_blocks > 1);
        EXPECT_EQ(p.gemm_any_stride, made.gemm->takes_any_stride());
        if (std::string_view(choice) == "gradkit") {
          EXPECT_EQ(made.gemm->name(), "gradkit");
        }
        const MoeGradTiles strided = ChooseMoeGradTiles(s, /*gemm_any_stride=*/false);
        if (!p.gemm_any_stride) {
          EXPECT_EQ(p.base_k, strided.base_k);
        }
        EXPECT_LE(p.k_blocks, strided.k_blocks);
      }
    }
  }
}

// On oneDNN 2.x B is packed once per block by gradkit's packer (MoePackB), which phase 1 checks
// byte for byte against oneDNN's own reorder into the same layout; a mismatch falls back to
// the reorder (float32) or to per-call packing (bfloat16) and shows in the implementation
// string. Widths and reductions of the presets and odd ones, B's rows and B^T's rows. (A
// narrower last column block runs on oneDNN 2.6's gemm:jit, whose B is plain: not covered, nor
// are dtypes the CPU has no brgemm kernel for (CpuHasBrgemmFor), as on AVX2 without AVX-512:
// there float32 runs on gemm:jit and bfloat16 on gradkit's own GEMM.)
TEST(moe_grad_plan, BPackedOnceByGradkitsPackerOnOneDnn2) {
  if (MoeGemmLibraryName().rfind("oneDNN 2.", 0) != 0) {
    GTEST_SKIP() << MoeGemmLibraryName() << ": B is packed once on oneDNN 2.x only";
  }
  if (MoeTileGemmChoiceFromEnv() == MoeTileGemmChoice::kGradkit) {
    GTEST_SKIP() << "GRADKIT_GEMM=gradkit: the tiles do not run on oneDNN";
  }
  int cases = 0;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    if (!gk::testing::CpuHasBrgemmFor(dtype)) continue;
    for (const auto& [widths, reduce, ldb] : std::vector<std::tuple<std::vector<int64_t>, int64_t, int64_t>>{
             {{128}, 1408, 1408}, {{64}, 2048, 2048}, {{64}, 200, 203}, {{48}, 33, 33}}) {
      MoeTileGemmShape shape{};
      shape.gemm_dtype = dtype;
      shape.max_rows = 64;
      shape.row_granule = 16;
      shape.ldc = widths.front();
      shape.ldb = ldb;
      shape.lda = reduce;
      shape.widths = widths;
      shape.steps = {{reduce, false}};
      shape.prepared_b = true;
      shape.ldb_kn = widths.front() + 5;
      const auto gemm = MoeTileGemm::Create(shape);
      for (int64_t width : widths) {
        SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " width " << width << " reduce " << reduce);
        ++cases;
        EXPECT_EQ(gemm->name(), "onednn");
        EXPECT_TRUE(gemm->packs_b());
        EXPECT_TRUE(gemm->prepares_b_from_kn());
        EXPECT_NE(gemm->impl(width).find("B packed once per block by gradkit"), std::string::npos)
            << gemm->impl(width);
      }
    }
  }
  if (cases == 0) GTEST_SKIP() << "this CPU has no brgemm kernel for float32 or bfloat16 (AVX-512)";
}

TEST(moe_grad_plan, JsonNamesEveryField) {
  const MoeGradPlan p = MakeMoeGradPlan(Shape(4096, 2, 8, 2048, 1408, DType::kBF16), Machine(2));
  const std::string json = MoeGradPlanToJson(p);
  for (const char* key : {"\"base_m\": ", "\"base_n\": ", "\"base_k\": 1408", "\"parall_num\": 2",
                          "\"threads\": 2", "\"work_split\"", "\"token_chunks\"", "\"units\"",
                          "\"load_balance\": ", "\"whole_blocks\": true", "\"k_blocks\": ", "\"gemm_impl\": ", "\"thread_bytes\": ",
                          "\"matmul_out_ring\"", "\"row_token\"", "\"system\"", "\"alignment\": 512",
                          "\"workspace_bytes\"", "\"gemm_dtype\": \"bfloat16\"", "\"broadcast_max_rows\": 0"}) {
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  }
  EXPECT_EQ(p, MakeMoeGradPlan(p.shape, Machine(2)));  // computed, not stateful
}

}  // namespace
}  // namespace gk
