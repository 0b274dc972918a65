#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/executor.h"
#include "core/thread_pool.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"

namespace gk {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Places regions one after another, each 512-byte aligned.
class LayoutBuilder {
 public:
  MoeGradRegion Add(uint64_t bytes) {
    if (bytes == 0) return {0, 0};
    const MoeGradRegion region{end_, bytes};
    end_ = AlignUp(end_ + bytes, kMoeGradAlignment);
    return region;
  }
  uint64_t end() const { return end_; }

 private:
  uint64_t end_ = 0;
};

uint64_t Bytes(int64_t elems, int64_t elem_bytes) {
  return static_cast<uint64_t>(elems) * static_cast<uint64_t>(elem_bytes);
}

}  // namespace

MoeGradTiles ChooseMoeGradTiles(const MoeGradShape& shape) {
  MoeGradTiles tiles;
  tiles.gemm_dtype = shape.dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  // As the seed: base = min(best, extent), the row tile rounded up to the padding granule.
  const int64_t rows = CeilDiv(std::max<int64_t>(shape.m, 1), kMoeGradRowGranule) * kMoeGradRowGranule;
  tiles.base_m = std::min(kMoeGradBestBaseM, rows);
  tiles.base_n = std::min(kMoeGradBestBaseN, shape.k);
  tiles.last_block_cols = shape.k - (CeilDiv(shape.k, tiles.base_n) - 1) * tiles.base_n;
  return tiles;
}

MoeTileGemmShape MoeGradTileGemmShape(const MoeGradShape& shape) {
  const MoeGradTiles tiles = ChooseMoeGradTiles(shape);
  std::vector<int64_t> widths{tiles.base_n};
  if (tiles.last_block_cols != tiles.base_n) widths.push_back(tiles.last_block_cols);
  return {tiles.gemm_dtype, shape.n, tiles.base_m, kMoeGradRowGranule, tiles.base_n, widths};
}

MoeGradMachine DetectMoeGradMachine(const MoeGradShape& shape) {
  const auto gemm = MoeTileGemm::Create(MoeGradTileGemmShape(shape));
  return {ConfiguredThreads(), gemm->scratchpad_bytes(), gemm->name()};
}

MoeGradPlan MakeMoeGradPlan(const MoeGradShape& shape, const MoeGradMachine& machine) {
  MoeGradPlan p{};
  p.shape = shape;
  const MoeGradTiles tiles = ChooseMoeGradTiles(shape);
  p.gemm_dtype = tiles.gemm_dtype;
  p.gemm_backend = machine.gemm_backend;
  p.base_m = tiles.base_m;
  p.base_n = tiles.base_n;
  p.base_k = shape.n;
  p.row_granule = kMoeGradRowGranule;
  p.parall_num = kMoeGradParallNum;
  p.col_blocks = CeilDiv(shape.k, p.base_n);
  p.last_block_cols = tiles.last_block_cols;

  // Token chunks: a function of the shapes only, so that every GEMM call is the same whatever
  // the thread count. Enough units to share out, but chunks thick enough that each expert's
  // rows in a chunk still fill GEMM tiles.
  const int64_t wanted = CeilDiv(kMoeGradTargetUnits, p.col_blocks);
  const int64_t thickest = std::max<int64_t>(1, shape.m / (kMoeGradMinRowsPerExpertChunk * shape.g));
  const int64_t chunks = std::clamp<int64_t>(std::min(wanted, thickest), 1, shape.batch);
  p.tokens_per_chunk = CeilDiv(shape.batch, chunks);
  p.token_chunks = CeilDiv(shape.batch, p.tokens_per_chunk);
  p.units = p.token_chunks * p.col_blocks;
  p.threads = static_cast<int32_t>(std::clamp<int64_t>(machine.threads, 1, p.units));
  p.gemm_scratchpad_bytes = AlignUp(machine.gemm_scratchpad_bytes, kMoeGradAlignment);

  const int64_t gemm_elem = ElementBytes(p.gemm_dtype);
  const int64_t t = p.threads;
  LayoutBuilder b;
  MoeGradLayout& l = p.layout;
  l.matmul_out_ring = b.Add(Bytes(t * p.parall_num * p.base_m * p.base_n, 4));
  l.a_tiles = b.Add(Bytes(t * p.base_m * shape.n, gemm_elem));
  l.b_tiles = b.Add(shape.dtype == DType::kF16 ? Bytes(t * p.base_n * shape.n, 4) : 0);
  l.system = b.Add(static_cast<uint64_t>(t) * p.gemm_scratchpad_bytes);
  l.group_offsets = b.Add(Bytes(shape.g + 1, 8));
  l.row_token = b.Add(Bytes(shape.m, 8));
  l.chunk_starts = b.Add(p.token_chunks > 1 ? Bytes(p.token_chunks * shape.g + 1, 8) : 0);
  l.chunk_rows = b.Add(p.token_chunks > 1 ? Bytes(shape.m, 8) : 0);
  l.end = b.end();
  p.workspace_bytes = l.end + kMoeGradAlignment;
  return p;
}

std::string MoeGradPlanToJson(const MoeGradPlan& p) {
  const auto region = [](const MoeGradRegion& r) {
    return fmt::format("{{\"offset\": {}, \"bytes\": {}}}", r.offset, r.bytes);
  };
  const MoeGradShape& s = p.shape;
  const MoeGradLayout& l = p.layout;
  return fmt::format(
      "{{\"op\": \"moe_init_routing_grouped_matmul_grad\", \"dtype\": \"{}\", "
      "\"gemm_dtype\": \"{}\", \"gemm_backend\": \"{}\", "
      "\"shape\": {{\"M\": {}, \"N\": {}, \"K\": {}, \"G\": {}, \"L\": {}, \"batch\": {}, "
      "\"topK\": {}}}, \"row_idx_type\": \"{}\", \"group_list_type\": \"{}\", "
      "\"base_m\": {}, \"base_n\": {}, \"base_k\": {}, \"row_granule\": {}, \"parall_num\": {}, "
      "\"threads\": {}, \"work_split\": {{\"col_blocks\": {}, \"last_block_cols\": {}, "
      "\"token_chunks\": {}, \"tokens_per_chunk\": {}, \"units\": {}, \"order\": "
      "\"round_robin\", \"units_per_thread_max\": {}}}, "
      "\"workspace\": {{\"alignment\": {}, \"matmul_out_ring\": {}, \"a_tiles\": {}, "
      "\"b_tiles\": {}, \"system\": {}, \"group_offsets\": {}, \"row_token\": {}, "
      "\"chunk_starts\": {}, \"chunk_rows\": {}, \"end\": {}}}, \"workspace_bytes\": {}, "
      "\"unfused_bytes\": {}}}",
      DTypeName(s.dtype), DTypeName(p.gemm_dtype), p.gemm_backend, s.m, s.n, s.k, s.g, s.l,
      s.batch, s.top_k, RowIdxTypeName(s.row_idx_type), GroupListTypeName(s.group_list_type),
      p.base_m, p.base_n, p.base_k, p.row_granule, p.parall_num, p.threads, p.col_blocks,
      p.last_block_cols, p.token_chunks, p.tokens_per_chunk, p.units, p.UnitsOfThread(0),
      kMoeGradAlignment, region(l.matmul_out_ring), region(l.a_tiles), region(l.b_tiles),
      region(l.system), region(l.group_offsets), region(l.row_token), region(l.chunk_starts),
      region(l.chunk_rows), l.end, p.workspace_bytes,
      static_cast<uint64_t>(s.m) * static_cast<uint64_t>(s.k) * 4u);
}

}  // namespace gk
