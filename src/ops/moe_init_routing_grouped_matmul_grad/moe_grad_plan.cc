#include "ops/moe_init_routing_grouped_matmul_grad/moe_grad_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <optional>

#include "core/plan_math.h"
#include "core/thread_pool.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_bf16dot.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_gemm.h"
#include "ops/moe_init_routing_grouped_matmul_grad/cpu/moe_grad_microkernel.h"

namespace gk {
namespace {

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

}  // namespace

double MoeGradLoadBalance(int64_t units, int32_t threads) {
  if (units <= 0 || threads <= 0) return 1.0;
  const double mean = static_cast<double>(units) / threads;
  return static_cast<double>(CeilDiv(units, threads)) / mean;
}

double MoeGradPlan::LoadBalance(int32_t t) const { return MoeGradLoadBalance(units, t); }

namespace {

// The reduction cut into equal k-blocks of at most `most` columns where N allows (one GEMM
// shape for every k-block), multiples of 16 preferred; otherwise the last k-block is shorter.
void ChooseKBlocks(int64_t n, int64_t most, MoeGradTiles& t) {
  const int64_t fewest = CeilDiv(n, std::max<int64_t>(most, 16));
  t.k_blocks = fewest;
  for (int64_t k = fewest; k <= 2 * fewest && fewest > 1; ++k) {
    if (n % k == 0 && (n / k) % 16 == 0) {
      t.k_blocks = k;
      break;
    }
  }
  t.base_k = CeilDiv(n, t.k_blocks);
  if (t.k_blocks > 1 && n % t.k_blocks != 0) t.base_k = RoundUp(t.base_k, 16);
  t.k_blocks = CeilDiv(n, t.base_k);
  t.last_k = n - (t.k_blocks - 1) * t.base_k;
}

// Estimated cost of a unit split, in float operations: padded GEMM rows plus the operand bytes
// each unit reads (thin chunks re-read the weights, thin column blocks re-read gradY), weighted
// by how many operations a thread of a large machine does per byte of its share of memory
// bandwidth. Summed over 1, 2, 4, ... threads, each machine's cost counts its idle threads.
// A thread reads an expert's weight block once for all the chunks of that column block it runs
// (RunThread in moe_grad_api.cc): on t threads, unit u = chunk * blocks + block runs on thread
// u % t, so the units share lcm(t, blocks) (thread, block) pairs, each reading the weights once.
struct SplitCost {
  double total;      // summed over the machines
  double balance;    // the worst balance of the two largest machines
};
SplitCost EstimateSplit(const MoeGradShape& s, DType gemm_dtype, int64_t base_n, int64_t chunks,
                        int32_t largest) {
  const int64_t blocks = CeilDiv(s.k, base_n);
  const int64_t units = chunks * blocks;
  const double rows = static_cast<double>(s.m) / static_cast<double>(chunks);  // per chunk
  const double experts = std::max(1.0, std::min(static_cast<double>(s.g), rows));
  const double per_expert = rows / experts;
  // Tail tiles cost as if padded to the granule: half a granule per expert and chunk, expected
  // (oneDNN now runs tails as short calls, whose rows run at a lower rate; not re-fitted).
  const double padded = experts * std::max<double>(kMoeGradRowGranule,
                                                   per_expert + kMoeGradRowGranule / 2.0);
  const double width = static_cast<double>(s.k) / static_cast<double>(blocks);
  const double n = static_cast<double>(s.n);
  const double elem = static_cast<double>(ElementBytes(s.dtype));
  const double flop_per_byte = gemm_dtype == DType::kBF16 ? 64.0 : 16.0;
  SplitCost cost{0.0, 1.0};
  for (int32_t t = 1; t <= largest; t *= 2) {
    const double pairs = static_cast<double>(std::min<int64_t>(units, std::lcm<int64_t>(t, blocks)));
    const double weight_reads = static_cast<double>(units) / pairs;  // chunks per weight block read
    const double unit = 2.0 * padded * width * n +
                        flop_per_byte * (experts * width * n / weight_reads + rows * n) * elem;
    cost.total += static_cast<double>(CeilDiv(units, t) * t) * unit;
  }
  for (int32_t t : {largest, std::max(1, largest / 2)}) {
    // A machine with idle threads is not balanced, however close the ratio.
    cost.balance = std::max(cost.balance, units < t ? 2.0 * kMoeGradMaxImbalance
                                                    : MoeGradLoadBalance(units, t));
  }
  return cost;
}

// The longest k-block whose operands, as a thread owns them, stay within
// kMoeGradThreadOperandBytes whatever N: the A tile (kMoeGradBestBaseM rows), the packed B (float32
// whatever the dtype: gradkit's own kernel widens bfloat16 weights once, at packing) and, when
// copied, the B tile. N itself when the whole reduction fits.
// - A GEMM of the shape's strides (oneDNN): the packed B counted at the block's own width, as
//   the packer sizes it (float16: at the widest block, below); k-blocks of a longer reduction
//   always copy B (MoeGradCopiesB). S3's 64-column blocks then take the whole reduction of 2048 in one k-block, the weights read in
//   place (counted at 256 columns, it was two k-blocks of 1024, copied: float32 S3 49% -> 79-82%
//   of dense on an AMX Xeon, docs/benchmarks.md, session 16).
// - A GEMM of any stride (gradkit's micro-kernel) reads gradY and the weights in place and packs
//   the block's own columns (MoeMicroPackedBytes: in whole panels): B is copied for float16
//   only.
// Either way longer k-blocks let a weight block be packed once for all of a thread's chunks.
int64_t LongestKBlock(const MoeGradShape& s, const MoeGradTiles& tiles, bool gemm_any_stride) {
  const uint64_t gemm_elem = static_cast<uint64_t>(ElementBytes(tiles.gemm_dtype));
  const uint64_t a_tile = static_cast<uint64_t>(kMoeGradBestBaseM) * gemm_elem;
  const uint64_t n = static_cast<uint64_t>(std::max<int64_t>(s.n, 1));
  const auto longest = [&](uint64_t per_element) {
    return static_cast<int64_t>(std::min(n, kMoeGradThreadOperandBytes / per_element));
  };
  const uint64_t cols = static_cast<uint64_t>(tiles.base_n);
  if (gemm_any_stride) {
    return longest(a_tile + MoeMicroPackedBytes(tiles.base_n, 1) +
                   (s.dtype == DType::kF16 ? cols * gemm_elem : 0));
  }
  // Float16 weights go through the B tile whatever the k-blocks (converted), so a longer
  // k-block saves them no copy: their packed and copied B keep the widest block's count, which
  // keeps their workspace where it was (WorkspaceDoesNotGrowWithM).
  const uint64_t b_cols = s.dtype == DType::kF16 ? static_cast<uint64_t>(kMoeGradBestBaseN) : cols;
  const uint64_t a_and_packed = a_tile + b_cols * sizeof(float);
  const uint64_t copied_b = b_cols * gemm_elem;
  const uint64_t whole = (a_and_packed + (s.dtype == DType::kF16 ? copied_b : 0)) * n;
  return whole <= kMoeGradThreadOperandBytes ? s.n : longest(a_and_packed + copied_b);
}

}  // namespace

MoeGradTiles ChooseMoeGradTiles(const MoeGradShape& shape, bool gemm_any_stride) {
  MoeGradTiles tiles{};
  tiles.gemm_dtype = shape.dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  // As the seed: base = min(best, extent), the row tile rounded up to the padding granule.
  const int64_t rows = RoundUp(std::max<int64_t>(shape.m, 1), kMoeGradRowGranule);
  tiles.base_m = std::min(kMoeGradBestBaseM, rows);

  // Units: the machine size the work is worth (each thread at least kMoeGradMinThreadFlop),
  // at most kMoeGradPlannedThreads; then the cheapest (width, chunks) by EstimateSplit, among
  // those balanced within kMoeGradMaxImbalance on that machine and half of it when any is.
  const double flop = 2.0 * static_cast<double>(shape.m) * static_cast<double>(shape.n) *
                      static_cast<double>(shape.k);
  int32_t largest = 1;
  while (largest < kMoeGradPlannedThreads &&
         flop / (2.0 * largest) >= static_cast<double>(kMoeGradMinThreadFlop)) {
    largest *= 2;
  }
  // Chunks keep, on average, at least one row granule of each expert's rows.
  const int64_t max_chunks = std::clamp<int64_t>(
      shape.m / (kMoeGradRowGranule * std::max<int64_t>(shape.g, 1)), 1, std::max<int64_t>(shape.batch, 1));
  struct Best {
    bool balanced;
    double total;
    int64_t base_n, chunks;
  };
  std::optional<Best> best;
  for (int64_t width = kMoeGradBestBaseN; width >= kMoeGradMinBaseN; width /= 2) {
    const int64_t base_n = std::min(width, shape.k);
    if (base_n != width && width != kMoeGradBestBaseN) continue;  // K narrower than width: once
    for (int64_t chunks = 1; chunks <= max_chunks; ++chunks) {
      const int64_t per_chunk = CeilDiv(std::max<int64_t>(shape.batch, 1), chunks);
      if (CeilDiv(std::max<int64_t>(shape.batch, 1), per_chunk) != chunks) continue;  // same split
      const SplitCost cost = EstimateSplit(shape, tiles.gemm_dtype, base_n, chunks, largest);
      const Best candidate{cost.balance <= kMoeGradMaxImbalance, cost.total, base_n, chunks};
      if (!best || (candidate.balanced && !best->balanced) ||
          (candidate.balanced == best->balanced && candidate.total < best->total)) {
        best = candidate;
      }
    }
  }
  const MoeTileColumns columns = MoeTileColumnsOf(shape.k, best->base_n);
  tiles.base_n = columns.base;
  tiles.col_blocks = columns.blocks;
  tiles.last_block_cols = columns.last;
  tiles.tokens_per_chunk = CeilDiv(std::max<int64_t>(shape.batch, 1), best->chunks);
  tiles.token_chunks = CeilDiv(std::max<int64_t>(shape.batch, 1), tiles.tokens_per_chunk);

  ChooseKBlocks(shape.n, LongestKBlock(shape, tiles, gemm_any_stride), tiles);
  return tiles;
}

bool MoeGradStreamsWeights(const MoeGradShape& shape, const MoeGradTiles& tiles) {
  if (tiles.gemm_dtype != DType::kBF16 || tiles.k_blocks != 1) return false;
  const uint64_t row_bytes = static_cast<uint64_t>(shape.n) * 2;
  const uint64_t expert_rows = static_cast<uint64_t>(CeilDiv(shape.m, std::max<int64_t>(shape.g, 1)));
  const uint64_t block_bytes = static_cast<uint64_t>(tiles.base_n) * row_bytes;
  const uint64_t held_rows_bytes =
      std::min(expert_rows * row_bytes, static_cast<uint64_t>(kMoeBf16DotAChunkBytes));
  return held_rows_bytes + 2 * block_bytes <= kMoeGradStreamedBytes;
}

int64_t MoeGradBroadcastCallRows(int64_t base_m) {
  return base_m >= kMoeBf16DotTokenGroup ? base_m / kMoeBf16DotTokenGroup * kMoeBf16DotTokenGroup : base_m;
}

int64_t MoeGradBroadcastRows(const MoeGradShape& shape, const MoeGradTiles& tiles, bool gemm_broadcast_form,
                             bool amx) {
  const bool dtype_ok = (shape.dtype == DType::kBF16 && shape.n % 2 == 0) || shape.dtype == DType::kF32;
  if (!gemm_broadcast_form || !dtype_ok || tiles.k_blocks != 1 || shape.weight_nk || shape.n == 0 ||
      tiles.base_n % 16 != 0) {
    return 0;
  }
  if (shape.dtype == DType::kF32) return tiles.base_m;
  const uint64_t token_row_bytes = static_cast<uint64_t>(shape.n) * 2;
  const int64_t fit = static_cast<int64_t>(kMoeGradBroadcastTokensBytes / token_row_bytes) / 16 * 16;
  if (amx && tiles.base_m >= kMoeBf16DotTokenGroup) return std::max(fit, std::min(tiles.base_m, fit));
  return std::min(tiles.base_m, fit);
}

bool MoeGradAsksF32Broadcast(const MoeGradShape& shape) {
  if (shape.dtype != DType::kF32) return false;
  for (bool any_stride : {false, true}) {
    const MoeGradTiles tiles = ChooseMoeGradTiles(shape, any_stride);
    const int64_t rows = MoeGradBroadcastRows(shape, tiles, /*gemm_broadcast_form=*/true);
    if (rows == 0 || CeilDiv(shape.m, std::max<int64_t>(shape.g, 1)) > rows) return false;
  }
  return true;
}

bool MoeGradCopiesB(const MoeGradShape& shape, const MoeGradTiles& tiles, bool gemm_any_stride) {
  return shape.dtype == DType::kF16 || (!gemm_any_stride && (tiles.k_blocks > 1 || shape.weight_nk));
}

MoeTileGemmShape MoeGradTileGemmShape(const MoeGradShape& shape, bool gemm_any_stride) {
  const MoeGradTiles t = ChooseMoeGradTiles(shape, gemm_any_stride);
  MoeTileGemmShape g;
  g.gemm_dtype = t.gemm_dtype;
  g.max_rows = t.base_m;
  g.row_granule = kMoeGradGemmRowGranule;
  g.tail_calls = true;
  g.ldc = t.base_n;
  // The strides oneDNN's kernels are made for (a GEMM of any stride copies float16 only, the
  // same B tile).
  g.ldb = MoeGradCopiesB(shape, t, /*gemm_any_stride=*/false) ? t.base_k : shape.n;
  g.widths = {t.base_n};
  if (t.last_block_cols != t.base_n) g.widths.push_back(t.last_block_cols);
  g.lda = t.base_k;
  // B packed once per (block, expert) or k-block, by gradkit's packer into oneDNN's layout
  // (bfloat16 only then: the library's own reorder costs more than it saves, see
  // OneDnnTileGemm in cpu/moe_grad_gemm.cc), measured faster than oneDNN's packing on every call
  // (docs/benchmarks.md).
  g.prepared_b = true;
  g.own_f32_where_faster = true;
  g.streamed_b = MoeGradStreamsWeights(shape, t);
  g.f32_broadcast = MoeGradAsksF32Broadcast(shape);
  g.steps = {{t.base_k, false}};
  if (t.k_blocks > 1) {
    if (t.k_blocks > 2 || t.last_k == t.base_k) g.steps.push_back({t.base_k, true});
    if (t.last_k != t.base_k) g.steps.push_back({t.last_k, true});
  }
  return g;
}

MoeGradMachine MoeGradMachineOf(const MoeTileGemm& gemm, const MoeTileGemmShape& shape) {
  MoeGradMachine machine{ConfiguredThreads(), gemm.scratchpad_bytes(), gemm.name(), {},
                         gemm.row_granule(), gemm.takes_any_stride(), gemm.has_broadcast_form(),
                         gemm.broadcast_on_amx()};
  for (int64_t width : shape.widths) machine.gemm_impls.emplace_back(width, gemm.impl(width));
  return machine;
}

MoeGradGemm CreateMoeGradGemm(const MoeGradShape& shape) {
  MoeGradGemm made{MoeGradTileGemmShape(shape, /*gemm_any_stride=*/false), nullptr};
  made.gemm = MoeTileGemm::Create(made.shape);
  if (made.gemm->takes_any_stride()) {
    MoeTileGemmShape own = MoeGradTileGemmShape(shape, /*gemm_any_stride=*/true);
    if (own.steps != made.shape.steps) {
      made.shape = std::move(own);
      made.gemm = MoeTileGemm::CreateOwn(made.shape);
    }
  }
  return made;
}

MoeGradMachine DetectMoeGradMachine(const MoeGradShape& shape) {
  const MoeGradGemm made = CreateMoeGradGemm(shape);
  return MoeGradMachineOf(*made.gemm, made.shape);
}

MoeGradPlan MakeMoeGradPlan(const MoeGradShape& shape, const MoeGradMachine& machine) {
  MoeGradPlan p{};
  p.shape = shape;
  const MoeGradTiles tiles = ChooseMoeGradTiles(shape, machine.gemm_any_stride);
  p.gemm_dtype = tiles.gemm_dtype;
  p.gemm_backend = machine.gemm_backend;
  p.gemm_impls = machine.gemm_impls;
  p.base_m = tiles.base_m;
  p.base_n = tiles.base_n;
  p.base_k = tiles.base_k;
  p.k_blocks = tiles.k_blocks;
  p.last_k = tiles.last_k;
  p.row_granule = machine.gemm_row_granule;
  p.gemm_any_stride = machine.gemm_any_stride;
  p.b_copied = MoeGradCopiesB(shape, tiles, p.gemm_any_stride);
  p.broadcast_max_rows = p.b_copied ? 0 : MoeGradBroadcastRows(shape, tiles, machine.gemm_broadcast_form,
                                                                    machine.gemm_broadcast_amx);
  p.parall_num = kMoeGradParallNum;
  p.col_blocks = tiles.col_blocks;
  p.last_block_cols = tiles.last_block_cols;
  p.tokens_per_chunk = tiles.tokens_per_chunk;
  p.token_chunks = tiles.token_chunks;
  p.units = p.token_chunks * p.col_blocks;
  p.machine_threads = std::max<int32_t>(machine.threads, 1);
  p.threads = static_cast<int32_t>(std::clamp<int64_t>(machine.threads, 1, p.units));
  p.gemm_scratchpad_bytes = AlignUp(machine.gemm_scratchpad_bytes, kMoeGradAlignment);

  const int64_t gemm_elem = ElementBytes(p.gemm_dtype);
  const int64_t t = p.threads;
  const uint64_t ring = Bytes(p.parall_num * p.base_m * p.base_n, 4);
  // A's tile, or an expert's token panels (the weights-broadcast form; past base_m rows on AMX).
  const uint64_t a_tile = std::max(Bytes(p.base_m * p.base_k, gemm_elem),
                                   p.broadcast_max_rows > p.base_m
                                       ? AlignUp(MoeBf16DotTokensBytes(p.broadcast_max_rows, shape.n),
                                                 kMoeGradAlignment)
                                       : uint64_t{0});
  const uint64_t b_tile = p.b_copied ? Bytes(p.base_n * p.base_k, gemm_elem) : 0;
  p.a_tile_bytes = a_tile;
  p.thread_bytes = ring + a_tile + b_tile + p.gemm_scratchpad_bytes;
  LayoutBuilder b;
  MoeGradLayout& l = p.layout;
  l.matmul_out_ring = b.Add(t * ring);
  l.a_tiles = b.Add(t * a_tile);
  l.b_tiles = b.Add(t * b_tile);
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
  std::string impls;
  for (const auto& [width, impl] : p.gemm_impls) {
    impls += fmt::format("{}\"{}\": \"{}\"", impls.empty() ? "" : ", ", width, impl);
  }
  return fmt::format(
      "{{\"op\": \"moe_init_routing_grouped_matmul_grad\", \"dtype\": \"{}\", "
      "\"gemm_dtype\": \"{}\", \"gemm_backend\": \"{}\", \"gemm_impl\": {{{}}}, "
      "\"shape\": {{\"M\": {}, \"N\": {}, \"K\": {}, \"G\": {}, \"L\": {}, \"batch\": {}, "
      "\"topK\": {}}}, \"weight_layout\": \"{}\", \"row_idx_type\": \"{}\", \"group_list_type\": \"{}\", "
      "\"base_m\": {}, \"base_n\": {}, \"base_k\": {}, \"k_blocks\": {}, \"last_k\": {}, "
      "\"row_granule\": {}, \"gemm_any_stride\": {}, \"b_copied\": {}, \"broadcast_max_rows\": {}, \"parall_num\": {}, "
      "\"threads\": {}, \"machine_threads\": {}, \"work_split\": {{\"col_blocks\": {}, \"last_block_cols\": {}, "
      "\"token_chunks\": {}, \"tokens_per_chunk\": {}, \"units\": {}, \"order\": "
      "\"round_robin\", \"planned_for_threads\": {}, \"units_per_thread_max\": {}, "
      "\"load_balance\": {:.3f}, \"whole_blocks\": {}}}, \"thread_bytes\": {}, "
      "\"workspace\": {{\"alignment\": {}, \"matmul_out_ring\": {}, \"a_tiles\": {}, "
      "\"b_tiles\": {}, \"system\": {}, \"group_offsets\": {}, \"row_token\": {}, "
      "\"chunk_starts\": {}, \"chunk_rows\": {}, \"end\": {}}}, \"workspace_bytes\": {}, "
      "\"unfused_bytes\": {}}}",
      DTypeName(s.dtype), DTypeName(p.gemm_dtype), p.gemm_backend, impls, s.m, s.n, s.k, s.g, s.l,
      s.batch, s.top_k, s.weight_nk ? "GNK" : "GKN", RowIdxTypeName(s.row_idx_type), GroupListTypeName(s.group_list_type),
      p.base_m, p.base_n, p.base_k, p.k_blocks, p.last_k, p.row_granule, p.gemm_any_stride, p.b_copied, p.broadcast_max_rows, p.parall_num, p.threads, p.machine_threads, p.col_blocks,
      p.last_block_cols, p.token_chunks, p.tokens_per_chunk, p.units, kMoeGradPlannedThreads, p.UnitsOfThread(0), p.LoadBalance(p.machine_threads), p.WholeBlocks(), p.thread_bytes,
      kMoeGradAlignment, region(l.matmul_out_ring), region(l.a_tiles), region(l.b_tiles),
      region(l.system), region(l.group_offsets), region(l.row_token), region(l.chunk_starts),
      region(l.chunk_rows), l.end, p.workspace_bytes,
      static_cast<uint64_t>(s.m) * static_cast<uint64_t>(s.k) * 4u);
}

}  // namespace gk
