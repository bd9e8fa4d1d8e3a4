// Multi-tensor sharded MXFP8 quantization (scheme A) on the GPU: the batch kernels of
// mxfp8_partial_scales_batch and quantize_mxfp8_shard_data_batch equal their host twin
// (Backend::Host, itself proven against the oracle in test/unit/test_mxfp8_shard_batch.cpp)
// bitwise, phase 1 and phase 2, on mixed lists simulated over W = 1..8 ranks (and the
// oracle where cheap): boundaries at every offset within a block, misaligned masters
// and data planes, staging slices, every kind of scale layout (memset spans), special
// values in mid-block ranges, thousands of small tensors, and big tensors whose whole
// tiles outnumber one wave of blocks. On the rank-1-of-4 Layout segments of
// Llama-3.2-1B's 114 matrices the batch equals one per-tensor launch pair per tensor.
// A CUDA graph of both phases replays with the master changed in place exactly like
// eager calls, the kernels' first use may happen under capture, and a batch refuses
// another backend or device. The owned / rest split of the same work
// (quantize_mxfp8_shard_owned_batch, quantize_mxfp8_shard_rest_batch) equals its host
// twin and the oracle after each pass, and the split passes on Llama-3.2-1B.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/mxfp8/mxfp8_shard_calls.hpp"
#include "core/check.hpp"
#include "core/memory.hpp"
#include "shardopt/error.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/mxfp8.hpp"
#include "shardopt/presets.hpp"
#include "unit/test_mxfp8_shard_batch_common.hpp"

namespace {
using namespace shardopt;
using namespace mxfp8_test;

constexpr Backend kCuda = Backend::Cuda;
constexpr Backend kHost = Backend::Host;

// Graph of the work `enqueue` puts on a fresh non-blocking stream.
struct CapturedGraph {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  template <class Fn>
  explicit CapturedGraph(Fn&& enqueue) {
    SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    SHARDOPT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    enqueue(reinterpret_cast<Stream>(stream));
    SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    SHARDOPT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  }
  ~CapturedGraph() {
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void replay() const {
    SHARDOPT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  std::size_t nodes() const {
    std::size_t n = 0;
    SHARDOPT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
    return n;
  }
};

// The protocol over `ranks` on the GPU and on the host twin: bitwise equal, and equal
// to the oracle when `oracle`. Returns false after a failure.
bool check_kernel(const ShardList& list, const std::vector<RankLayout>& ranks, const std::string& what,
                  bool oracle = true, Passes passes = Passes::Split) {
  const ProtocolResult gpu = run_protocol(kCuda, list, ranks, false, passes);
  const ProtocolResult host = run_protocol(kHost, list, ranks, false, passes);
  const std::string d = protocol_diff(gpu, host);
  EXPECT_TRUE(d.empty()) << what << ": kernel vs host twin: " << d;
  const std::string o = oracle ? check_against_oracle(list, ranks, gpu) : "";
  EXPECT_TRUE(o.empty()) << what << ": kernel vs oracle: " << o;
  return d.empty() && o.empty();
}

// Both phases of `batch` on `stream`, as the split pair or the owned / rest pair.
void run_phases(const Mxfp8ShardBatch& batch, Backend b, Stream stream, Passes passes) {
  if (passes == Passes::Owned) {
    quantize_mxfp8_shard_owned_batch(batch, b, stream);
    quantize_mxfp8_shard_rest_batch(batch, b, stream);
  } else {
    mxfp8_partial_scales_batch(batch, b, stream);
    quantize_mxfp8_shard_data_batch(batch, b, stream);
  }
}

// The 114 matrices of Llama-3.2-1B (every 2-D parameter) in a Layout at `world`.
std::vector<ParamSpec> llama_matrices() {
  std::vector<ParamSpec> specs2d;
  for (const ParamSpec& p : presets::transformer(presets::kLlama32_1B))
    if (p.shape.size() >= 2) specs2d.push_back(p);
  EXPECT_EQ(specs2d.size(), 114u);
  return specs2d;
}

// Rank `rank`'s view of `list` (the matrices of `layout`, one buffer): its segments'
// ranges (empty where it owns nothing of a matrix), its fp32 master shard (fast_master
// of `seed`, padding included) and a staging arena laid out like the shard (segment at
// its shard offset: the pointers given are staging + shard_offset - param_offset).
RankLayout shard_rank_layout(const ShardList& list, const Layout& layout, int rank, std::uint64_t seed) {
  EXPECT_EQ(layout.buffers().size(), 1u);
  RankLayout rl;
  rl.staged = true;
  rl.ranges.assign(list.size(), Range{0, 0});
  rl.master_at.assign(list.size(), kNullAt);
  rl.data_at.assign(list.size(), kNullAt);
  const std::int64_t shard_numel = layout.buffers()[0].shard_numel;
  rl.master_arena = fast_master(shard_numel, 2048, seed, 0.0002);  // padding gets values too: never read
  for (const Segment& g : layout.segments(0, rank)) {
    const auto t = static_cast<std::size_t>(g.param);
    EXPECT_EQ(rl.ranges[t].size(), 0) << "two segments of one param";
    rl.ranges[t] = {g.param_offset, g.param_offset + g.length};
    rl.master_at[t] = g.shard_offset;
    rl.data_at[t] = g.shard_offset - g.param_offset;
  }
  rl.data_bytes = shard_numel;
  return rl;
}

// Rank 1 of 3 of a mixed list (cuts mid-block): both phases of its batch (`passes`)
// captured once (one memset per scale span, one launch per phase); before each replay
// the master changes in place and the arenas are poisoned again. Each replay equals
// eager calls of the same batch kind on a second set of arenas with the same master,
// and the host twin; its scales are the oracle's partial scales.
void check_graph_replay(Passes passes, std::uint32_t seed) {
  ShardList list(mixed_shard_shapes(), 0, 1);
  list.fill(seed);
  std::mt19937 rng(seed + 1);
  const auto bounds = list_bounds(list, 3, 1, rng);
  RankLayout rl = rank_layout(list, bounds, 1, 1);
  const RankRun graphed(kCuda, list, rl), eager(kCuda, list, rl);
  const Mxfp8ShardBatch graph_batch(graphed.tensors(list, rl), kCuda), eager_batch(eager.tensors(list, rl), kCuda);
  if (passes == Passes::Owned) {
    ASSERT_GT(graph_batch.rest_tiles(), 0) << "the rest pass must have work";
  }
  const CapturedGraph g([&](Stream st) { run_phases(graph_batch, kCuda, st, passes); });
  EXPECT_EQ(g.nodes(), graph_batch.scale_spans() + 2) << "one memset per scale span, one launch per phase";
  std::vector<std::uint8_t> previous;
  for (std::uint32_t step = 0; step < 3; ++step) {
    list.fill(seed + 10 + step);
    rl = rank_layout(list, bounds, 1, 1);  // same places, new values
    for (const RankRun* run : {&graphed, &eager}) {
      run->put_master(rl.master_arena);
      run->put_scales(list.poisoned_scales());
      run->poison_data();
    }
    g.replay();
    run_phases(eager_batch, kCuda, nullptr, passes);
    SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<std::uint8_t> scales = graphed.get_scales();
    const std::string d = byte_diff("scales", scales, eager.get_scales()) + data_diff(graphed.get_data(), eager.get_data());
    EXPECT_TRUE(d.empty()) << "replay " << step << " vs eager: " << d;
    EXPECT_EQ(scales, expected_partial_scales(list, rl)) << "replay " << step << " vs the oracle's partial scales";
    // The host twin, same inputs.
    const RankRun host(kHost, list, rl);
    const Mxfp8ShardBatch host_batch(host.tensors(list, rl), kHost);
    run_phases(host_batch, kHost, nullptr, passes);
    const std::string h = data_diff(graphed.get_data(), host.get_data());
    EXPECT_TRUE(h.empty()) << "replay " << step << " vs host twin: " << h;
    EXPECT_NE(scales, previous) << "the master did not change";
    previous = scales;
  }
}

// ------------------------------------------------------------------ first use under capture

// Runs first in this binary: the shard kernels' first launches (and any launch-geometry
// queries behind them) happen while a stream is being captured.
TEST(Mxfp8ShardBatchGpu, AFirstUseUnderCaptureWorks) {
  ShardList list(mixed_shard_shapes());
  list.fill(1);
  std::vector<std::vector<std::int64_t>> bounds;
  for (const Mxfp8Shape& s : list.shapes) bounds.push_back({0, s.numel()});  // world 1: no exchange needed
  const std::vector<RankLayout> ranks = world_layouts(list, bounds);
  const RankRun run(kCuda, list, ranks[0]);
  const Mxfp8ShardBatch batch(run.tensors(list, ranks[0]), kCuda);  // built (allocates) before the capture
  const CapturedGraph g([&](Stream st) {
    mxfp8_partial_scales_batch(batch, kCuda, st);
    quantize_mxfp8_shard_data_batch(batch, kCuda, st);
  });
  g.replay();
  const std::string d = byte_diff("scales", run.get_scales(), list.expected_scales()) +
                        data_diff(run.get_data(), expected_data(list, {&ranks[0]}, ranks[0].data_bytes));
  EXPECT_TRUE(d.empty()) << d;
}

// ------------------------------------------------------------------ kernel == host twin

TEST(Mxfp8ShardBatchGpu, MixedListsOverWorldsOf1To8KernelEqualsHostTwinAndOracle) {
  // Two scale layouts: back to back (one memset span) and every scale tensor 16-byte
  // aligned with poisoned bytes between (the columnwise scales' alignment enables the
  // whole-tile data path of tensors of whole 128-column tiles). Masters at natural
  // alignment in half the runs (whole-tile paths), shifted in the others; mode 2 writes
  // its data into staging slices (address minus range.begin) at natural alignment.
  std::mt19937 rng(3);
  for (std::int64_t align : {1, 16}) {
    ShardList list(mixed_shard_shapes(), 0, 0, align);
    list.fill(static_cast<std::uint32_t>(2 + align));
    for (int world = 1; world <= 8; ++world)
      for (int mode = 0; mode < 4; ++mode) {
        const int shift = mode % 2 == 0 ? 0 : mode;
        const auto ranks = world_layouts(list, list_bounds(list, world, mode, rng), shift, mode % 2 == 0, mode == 2);
        if (!check_kernel(list, ranks,
                          "scale alignment " + std::to_string(align) + " world " + std::to_string(world) + " mode " +
                              std::to_string(mode)))
          return;
      }
  }
}

TEST(Mxfp8ShardBatchGpu, ScaleLayoutsAndListOrdersKernelEqualsHostTwin) {
  // Phase 1 on the GPU zero-fills merged runs of scale memory (one memset per span)
  // where the host twin fills each tensor's own: for every kind of layout, listed in
  // order and reversed, the poisoned bytes between scale tensors survive and every
  // scale byte is written, as on the host and in the oracle.
  const std::vector<Mxfp8Shape> shapes = mixed_shard_shapes();
  const std::size_t n = shapes.size();
  std::mt19937 rng(8);
  for (int layout = 0; layout < 4; ++layout) {
    // 0: back to back; 1: all rowwise then all columnwise, shuffled; 2: 5 poisoned bytes
    // before every scale tensor; 3: every scale tensor 16-byte aligned.
    ShardList list(shapes, layout == 2 ? 5 : 0, 0, layout == 3 ? 16 : 1);
    if (layout == 1) place_rows_then_cols(list, rng);
    list.fill(static_cast<std::uint32_t>(80 + layout));
    const auto ranks = world_layouts(list, list_bounds(list, 3, 3, rng));
    for (bool reversed : {false, true}) {
      const std::string what = "layout " + std::to_string(layout) + (reversed ? " reversed" : "");
      const ProtocolResult gpu = run_protocol(kCuda, list, ranks, reversed);
      const ProtocolResult host = run_protocol(kHost, list, ranks, reversed);
      const std::string d = protocol_diff(gpu, host);
      EXPECT_TRUE(d.empty()) << what << ": kernel vs host twin: " << d;
      const std::string o = check_against_oracle(list, ranks, gpu);
      EXPECT_TRUE(o.empty()) << what << ": kernel vs oracle: " << o;
      if (layout < 2) {
        EXPECT_EQ(gpu.spans.front(), 1u) << what;
      } else if (layout == 2) {
        EXPECT_EQ(gpu.spans.front(), 2 * n) << what;
      }
      if (!d.empty() || !o.empty()) return;
    }
  }
}

TEST(Mxfp8ShardBatchGpu, ThousandsOfSmallTensorsKernelEqualsHostTwinAndOracle) {
  // 2000 small tensors (most of them one tile, some grouped) over 2-5 ranks: most
  // entries of a rank's table have no tiles (empty ranges), and each block's runs jump
  // over many entries (the table search of the walk).
  ShardList list(many_small_shapes(2000, 90));
  list.fill(91);
  std::mt19937 rng(92);
  for (int world : {2, 3, 5})
    for (int mode : {1, 3}) {
      const auto ranks = world_layouts(list, list_bounds(list, world, mode, rng), mode == 1 ? 0 : 2, true);
      if (!check_kernel(list, ranks, "world " + std::to_string(world) + " mode " + std::to_string(mode))) return;
    }
}

/// The small list of the block-offset cases: tensors of fewer than 32 columns (whose
/// rowwise blocks run into the next rows), odd widths, grouped ones.
std::vector<Mxfp8Shape> offset_case_shapes() {
  return {{1, 37, 45}, {3, 40, 72}, {1, 2, 3}, {1, 70, 33}, {2, 5, 130}, {1, 64, 256}};
}

/// Per tensor of `list`, `world` even ranges whose every inner cut is moved to offset k
/// of its row's first block (kind 0), or to row offset k of its columnwise block, mid-row
/// (kind 1); clamped to the tensor and sorted.
std::vector<std::vector<std::int64_t>> cuts_at_block_offset(const ShardList& list, int world, std::int64_t k, int kind) {
  std::vector<std::vector<std::int64_t>> bounds;
  for (const Mxfp8Shape& s : list.shapes) {
    const std::int64_t n = s.numel();
    std::vector<std::int64_t> b = even_bounds(n, world, 0);
    for (int r = 1; r < world; ++r) {
      auto& cut = b[static_cast<std::size_t>(r)];
      const std::int64_t row = cut / s.cols;
      cut = std::clamp<std::int64_t>(kind == 0 ? row * s.cols + k : ((row / 32) * 32 + k) * s.cols + s.cols / 2, 0, n);
    }
    std::sort(b.begin(), b.end());
    bounds.push_back(b);
  }
  return bounds;
}

TEST(Mxfp8ShardBatchGpu, BoundariesAtEveryOffsetWithinABlockKernelEqualsHostTwin) {
  // A small list; W = 1..8 ranks with every inner cut moved to offset k of its row's
  // first block, k = 0..32 (every rowwise position; tensors of fewer than 32 columns
  // run into the next rows), then to row offset k of a columnwise block, mid-row.
  ShardList list(offset_case_shapes());
  list.fill(4);
  for (int world = 1; world <= 8; ++world)
    for (std::int64_t k = 0; k <= 32; ++k)
      for (int kind = 0; kind < 2; ++kind) {
        const auto ranks = world_layouts(list, cuts_at_block_offset(list, world, k, kind), static_cast<int>(k % 4), k % 2 == 0);
        if (!check_kernel(list, ranks,
                          "world " + std::to_string(world) + (kind ? " column" : " row") + " offset " + std::to_string(k)))
          return;
      }
}

TEST(Mxfp8ShardBatchGpu, MisalignedMastersAndDataPlanesKernelEqualsHostTwin) {
  // Masters 1, 2, 3 floats off 16-byte alignment, data planes at odd offsets (shared
  // planes and staging slices), widths that are no multiple of 8: the scalar paths.
  std::mt19937 rng(5);
  for (std::int64_t data_shift : {1, 3}) {
    ShardList list(mixed_shard_shapes(), 3, data_shift);
    list.fill(static_cast<std::uint32_t>(6 + data_shift));
    for (int master_shift : {0, 1, 2, 3})
      for (bool staged : {false, true}) {
        const auto ranks = world_layouts(list, list_bounds(list, 4, 3, rng), master_shift, !staged, staged, data_shift);
        if (!check_kernel(list, ranks,
                          "data shift " + std::to_string(data_shift) + " master shift " + std::to_string(master_shift) +
                              (staged ? " staged" : " shared")))
          return;
      }
  }
}

TEST(Mxfp8ShardBatchGpu, SpecialValuesInMidBlockRangesKernelEqualsHostTwin) {
  // Masters of special_master rows (zeros, subnormals, amaxes on and around 1.75 * 2^k,
  // 1.75 * 2^127, FLT_MAX, NaN, Inf) with every cut inside a block, rowwise and
  // columnwise, and middle ranks smaller than a block.
  ShardList list({{1, 37, 45}, {3, 40, 72}, {1, 70, 33}, {1, 96, 129}, {2, 33, 260}});
  for (std::uint32_t seed = 20; seed < 25; ++seed) {
    list.fill(seed);
    std::mt19937 rng(seed);
    std::vector<std::vector<std::int64_t>> bounds;
    for (const Mxfp8Shape& s : list.shapes) {
      const std::int64_t n = s.numel(), rows = s.members * s.rows;
      const std::int64_t c1 = (rows / 3) * s.cols + 1 + static_cast<std::int64_t>(rng() % 30);
      const std::int64_t c2 = c1 + 2 + static_cast<std::int64_t>(rng() % 29);  // a rank inside one block
      const std::int64_t c3 = std::min(n, (2 * rows / 3) * s.cols + s.cols / 2 + 1);  // mid-row, mid columnwise block
      bounds.push_back({0, c1, std::min(n, c2), std::max(std::min(n, c2), c3), n});
    }
    if (!check_kernel(list, world_layouts(list, bounds, 1, true), "seed " + std::to_string(seed))) return;
  }
}

TEST(Mxfp8ShardBatchGpu, BigTensorsWholeTilesKernelEqualsHostTwin) {
  // Aligned big tensors: rank 1 of 4 (ranges of whole tile rows, and one cut mid-block),
  // and whole tensors (world 1) whose 8192 tiles outnumber one wave of blocks, so that
  // the whole-tile fast path and the grid's walk over many tiles run.
  ShardList big({{1, 4096, 4096}, {1, 8192, 2048}});
  big.fill_fast(30, 0.0005);
  const std::int64_t q = big.shapes[0].numel() / 4;  // both tensors have 2^24 elements
  const std::vector<std::vector<std::vector<std::int64_t>>> cases = {
      {{0, q, 2 * q, 3 * q, 4 * q}, {0, q, 2 * q, 3 * q, 4 * q}},
      {{0, q, 2 * q, 3 * q, 4 * q}, {0, q + 17, 2 * q - 5, 3 * q, 4 * q}}};
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& bounds : cases) {
    const RankLayout rank1 = rank_layout(big, bounds, 1);
    {
      const RankRun run(kCuda, big, rank1);
      const Mxfp8ShardBatch batch(run.tensors(big, rank1), kCuda);
      std::printf("rank 1 of 4: %lld tiles, grid %d\n", static_cast<long long>(batch.tiles()), batch.grid());
      EXPECT_GT(batch.grid(), 0);
    }
    if (!check_kernel(big, {rank1}, "rank 1 of 4", false)) return;
  }
  const std::vector<std::vector<std::int64_t>> whole = {{0, big.shapes[0].numel()}, {0, big.shapes[1].numel()}};
  const std::vector<RankLayout> world1 = world_layouts(big, whole);
  {
    const RankRun run(kCuda, big, world1[0]);
    const Mxfp8ShardBatch batch(run.tensors(big, world1[0]), kCuda);
    EXPECT_EQ(batch.tiles(), 4096 + 4096);
    EXPECT_GT(batch.grid(), 0);
    EXPECT_LT(batch.grid(), batch.tiles()) << "the test wants more tiles than one wave of blocks";
  }
  check_kernel(big, world1, "whole tensors", false);
  std::printf("big tensors: %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

TEST(Mxfp8ShardBatchGpu, Llama32_1BRank1Of4SegmentsBatchEqualsPerTensorLaunches) {
  // The bench's configuration: the 114 matrices of Llama-3.2-1B in a Layout at world 4,
  // rank 1's segments (fp32 master shard), every matrix listed (an empty range where
  // rank 1 owns nothing of it), scale tensors back to back, data into a staging arena
  // laid out like the rank's shard (segment at its shard offset: the pointers given are
  // staging + shard_offset - param_offset). Batch (one launch per phase) vs mxfp8_partial_scales +
  // quantize_mxfp8_shard_data per tensor (proven against the host twin by
  // test_mxfp8_gpu.cpp), bitwise: all scale bytes and every staged data byte.
  const std::vector<ParamSpec> specs2d = llama_matrices();
  const int world = 4, rank = 1;
  const Layout layout(specs2d, world);
  std::vector<Mxfp8Shape> shapes;
  for (const ParamSpec& p : specs2d) shapes.push_back(Mxfp8Shape::of(p));
  const ShardList list(shapes);  // scale placement only: no full masters here
  const RankLayout rl = shard_rank_layout(list, layout, rank, 40);
  const RankRun batched(kCuda, list, rl), single(kCuda, list, rl);
  const Mxfp8ShardBatch batch(batched.tensors(list, rl), kCuda);
  EXPECT_EQ(batch.size(), 114u);
  EXPECT_EQ(batch.numel(), rl.numel());
  std::int64_t tiles = 0;
  for (std::size_t t = 0; t < list.size(); ++t) tiles += range_tiles(list.shapes[t], rl.ranges[t]);
  EXPECT_EQ(batch.tiles(), tiles);
  EXPECT_GT(batch.grid(), 0);
  EXPECT_LT(batch.grid(), batch.tiles());
  EXPECT_EQ(batch.scale_spans(), 1u);
  std::printf("Llama-3.2-1B rank 1 of 4: %lld elements, %lld tiles, grid %d\n", static_cast<long long>(batch.numel()),
              static_cast<long long>(batch.tiles()), batch.grid());
  mxfp8_partial_scales_batch(batch, kCuda, nullptr);
  quantize_mxfp8_shard_data_batch(batch, kCuda, nullptr);
  const auto tensors = single.tensors(list, rl);
  for (const Mxfp8ShardTensor& t : tensors)
    mxfp8_partial_scales(t.shape, t.range, t.master, t.out.scale_row, t.out.scale_col, kCuda, nullptr);
  for (const Mxfp8ShardTensor& t : tensors)
    quantize_mxfp8_shard_data(t.shape, t.range, t.master, t.out.scale_row, t.out.scale_col, t.out.data_row,
                              t.out.data_col, kCuda, nullptr);
  SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<std::uint8_t> scales = batched.get_scales();
  const std::string ds = byte_diff("scales", scales, single.get_scales());
  EXPECT_TRUE(ds.empty()) << "phase 1, batch vs per-tensor: " << ds;
  const DataArenas data = batched.get_data();
  const std::string dd = data_diff(data, single.get_data());
  EXPECT_TRUE(dd.empty()) << "phase 2, batch vs per-tensor: " << dd;
  // Sensitivity: the staging arena holds the rank's data (poison only in the padding,
  // and where an element's code happens to be the poison byte).
  EXPECT_LT(std::count(data.row.begin(), data.row.end(), kPoison), batch.numel() / 16);
}

// ------------------------------------------------------------------ graphs

TEST(Mxfp8ShardBatchGpu, GraphReplayWithTheMasterChangedInPlaceEqualsEager) {
  check_graph_replay(Passes::Split, 50);
}

// ------------------------------------------------------------------ the owned / rest passes
// quantize_mxfp8_shard_owned_batch (Mode::Owned: whole tile rows quantized in the pass
// that reads them, partial scales elsewhere) and quantize_mxfp8_shard_rest_batch (the
// boundary tile rows' table): kernel == host twin bitwise after each rank's owned pass
// and after its rest pass, and == the oracle (check_against_oracle checks both points).

TEST(Mxfp8ShardBatchGpu, OwnedPassesMixedListsOverWorldsOf1To8KernelEqualsHostTwinAndOracle) {
  std::mt19937 rng(103);
  for (std::int64_t align : {1, 16}) {  // 16: the whole-tile (unchecked) path of owned tiles
    ShardList list(mixed_shard_shapes(), 0, 0, align);
    list.fill(static_cast<std::uint32_t>(102 + align));
    for (int world = 1; world <= 8; ++world)
      for (int mode = 0; mode < 4; ++mode) {
        const int shift = mode % 2 == 0 ? 0 : mode;
        const auto ranks = world_layouts(list, list_bounds(list, world, mode, rng), shift, mode % 2 == 0, mode == 2);
        if (!check_kernel(list, ranks,
                          "owned, scale alignment " + std::to_string(align) + " world " + std::to_string(world) +
                              " mode " + std::to_string(mode),
                          true, Passes::Owned))
          return;
      }
  }
}

TEST(Mxfp8ShardBatchGpu, OwnedPassesBoundariesMisalignmentSpecialsAndSmallTensorsKernelEqualsHostTwin) {
  // Every inner cut at offset k of a rowwise block and at row k of a columnwise block
  // (worlds 2, 3, 8); misaligned masters and odd data offsets (the scalar paths of both
  // passes); special values with a rank inside one block; 2000 small tensors.
  ShardList small(offset_case_shapes());
  small.fill(104);
  for (int world : {2, 3, 8})
    for (std::int64_t k = 0; k <= 32; ++k)
      for (int kind = 0; kind < 2; ++kind) {
        if (!check_kernel(small,
                          world_layouts(small, cuts_at_block_offset(small, world, k, kind), static_cast<int>(k % 4),
                                        k % 2 == 0),
                          "owned, world " + std::to_string(world) + (kind ? " column" : " row") + " offset " +
                              std::to_string(k),
                          true, Passes::Owned))
          return;
      }
  std::mt19937 rng(105);
  ShardList shifted(mixed_shard_shapes(), 3, 1);
  shifted.fill(106);
  for (int master_shift : {1, 3})
    for (bool staged : {false, true})
      if (!check_kernel(shifted, world_layouts(shifted, list_bounds(shifted, 4, 3, rng), master_shift, !staged, staged, 1),
                        "owned, master shift " + std::to_string(master_shift) + (staged ? " staged" : " shared"), true,
                        Passes::Owned))
        return;
  ShardList special({{1, 37, 45}, {3, 40, 72}, {1, 70, 33}, {1, 96, 129}, {2, 33, 260}});
  for (std::uint32_t seed = 120; seed < 123; ++seed) {
    special.fill(seed);
    std::vector<std::vector<std::int64_t>> bounds;
    for (const Mxfp8Shape& s : special.shapes) {
      const std::int64_t n = s.numel(), rows = s.members * s.rows;
      const std::int64_t c1 = (rows / 3) * s.cols + 1 + seed % 30, c2 = std::min(n, c1 + 2 + seed % 29);
      bounds.push_back({0, c1, c2, std::max(c2, std::min(n, (2 * rows / 3) * s.cols + s.cols / 2 + 1)), n});
    }
    if (!check_kernel(special, world_layouts(special, bounds, 1, true), "owned, specials " + std::to_string(seed), true,
                      Passes::Owned))
      return;
  }
  ShardList many(many_small_shapes(2000, 107));
  many.fill(108);
  for (int world : {2, 5})
    if (!check_kernel(many, world_layouts(many, list_bounds(many, world, 3, rng), 2, true),
                      "owned, 2000 small tensors, world " + std::to_string(world), true, Passes::Owned))
      return;
}

TEST(Mxfp8ShardBatchGpu, OwnedPassesBigTensorsWholeTilesKernelEqualsHostTwin) {
  // Whole tensors (one rank: every tile owned, no rest tiles, 8192 tiles over one wave:
  // the unchecked owned path and the walk) and rank 1 of 4 with one cut mid-block.
  ShardList big({{1, 4096, 4096}, {1, 8192, 2048}});
  big.fill_fast(131, 0.0005);
  const std::vector<std::vector<std::int64_t>> whole = {{0, big.shapes[0].numel()}, {0, big.shapes[1].numel()}};
  const std::vector<RankLayout> world1 = world_layouts(big, whole);
  {
    const RankRun run(kCuda, big, world1[0]);
    const Mxfp8ShardBatch batch(run.tensors(big, world1[0]), kCuda);
    EXPECT_EQ(batch.rest_tiles(), 0);
  }
  if (!check_kernel(big, world1, "owned, whole tensors", false, Passes::Owned)) return;
  const std::int64_t q = big.shapes[0].numel() / 4;
  const std::vector<std::vector<std::int64_t>> bounds = {{0, q, 2 * q, 3 * q, 4 * q}, {0, q + 17, 2 * q - 5, 3 * q, 4 * q}};
  const RankLayout rank1 = rank_layout(big, bounds, 1);
  {
    const RankRun run(kCuda, big, rank1);
    const Mxfp8ShardBatch batch(run.tensors(big, rank1), kCuda);
    EXPECT_EQ(batch.rest_tiles(), 2 * (2048 / 128)) << "tensor 1's two cut tile rows";
  }
  check_kernel(big, {rank1}, "owned, rank 1 of 4", false, Passes::Owned);
}

TEST(Mxfp8ShardBatchGpu, OwnedPassesOfLlama32_1BEqualTheSplitPasses) {
  // The benchmark's model, every matrix of Llama-3.2-1B in one Layout: at world 1 (the
  // whole model, the one-rank step: no rest tiles) and rank 1 of 4 (staging laid out
  // like the shard), owned + rest vs partial scales + data of the same batch kind,
  // bitwise: every scale byte and every staged data byte (no exchange: phase 2 reads the
  // rank's own partial scales in both).
  const std::vector<ParamSpec> specs2d = llama_matrices();
  std::vector<Mxfp8Shape> shapes;
  for (const ParamSpec& p : specs2d) shapes.push_back(Mxfp8Shape::of(p));
  const ShardList list(shapes);
  for (int world : {1, 4}) {
    const Layout layout(specs2d, world);
    const RankLayout rl = shard_rank_layout(list, layout, world == 1 ? 0 : 1, 140 + static_cast<std::uint64_t>(world));
    const RankRun owned(kCuda, list, rl), split(kCuda, list, rl);
    const Mxfp8ShardBatch owned_batch(owned.tensors(list, rl), kCuda), split_batch(split.tensors(list, rl), kCuda);
    // No rest tiles at either world: at 4 ranks every shard boundary of these matrices
    // falls between whole 32-row tile rows (measured on the device, 2026-11-27); the cut
    // tile rows are exercised by the boundary, misalignment and big-tensor tests above.
    EXPECT_EQ(owned_batch.rest_tiles(), 0) << "world " << world;
    run_phases(owned_batch, kCuda, nullptr, Passes::Owned);
    run_phases(split_batch, kCuda, nullptr, Passes::Split);
    SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
    const std::string w = "world " + std::to_string(world);
    const std::string ds = byte_diff("scales", owned.get_scales(), split.get_scales());
    EXPECT_TRUE(ds.empty()) << w << ": " << ds;
    const DataArenas data = owned.get_data();
    const std::string dd = data_diff(data, split.get_data());
    EXPECT_TRUE(dd.empty()) << w << ": " << dd;
    EXPECT_LT(std::count(data.row.begin(), data.row.end(), kPoison), owned_batch.numel() / 16) << w;
  }
}

TEST(Mxfp8ShardBatchGpu, OwnedPassesGraphReplayWithTheMasterChangedInPlaceEqualsEagerAndHostTwin) {
  check_graph_replay(Passes::Owned, 150);
}

// ------------------------------------------------------------------ errors

TEST(Mxfp8ShardBatchGpu, ABatchRunsOnlyOnItsBackendAndDevice) {
  ShardList list({{1, 37, 45}, {3, 40, 72}});
  list.fill(70);
  const std::vector<std::vector<std::int64_t>> bounds = {{0, 1665}, {0, 8640}};
  const RankLayout rl = rank_layout(list, bounds, 0);
  const RankRun run(kCuda, list, rl);
  const Mxfp8ShardBatch batch(run.tensors(list, rl), kCuda);
  EXPECT_EQ(batch.backend(), kCuda);
  auto expect_refused = [&](Backend b, const std::string& what) {
    for (int phase = 1; phase <= 2; ++phase) {
      try {
        if (phase == 1) mxfp8_partial_scales_batch(batch, b, nullptr);
        else quantize_mxfp8_shard_data_batch(batch, b, nullptr);
        ADD_FAILURE() << what << ": phase " << phase << " ran";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << what << ": " << e.what();
      }
    }
  };
  expect_refused(kHost, "a CUDA batch called with Backend::Host");
  int devices = 0;
  SHARDOPT_CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (devices > 1) {
    SHARDOPT_CUDA_CHECK(cudaSetDevice(1));
    expect_refused(kCuda, "a batch of device 0 called while device 1 is current");
    SHARDOPT_CUDA_CHECK(cudaSetDevice(0));
  } else {
    std::printf("one CUDA device: the other-device part is not run\n");
  }
  SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(run.get_scales(), list.poisoned_scales()) << "a refused call wrote scales";
  // And the batch still works on its own device.
  mxfp8_partial_scales_batch(batch, kCuda, nullptr);
  quantize_mxfp8_shard_data_batch(batch, kCuda, nullptr);
  EXPECT_EQ(run.get_scales(), list.expected_scales());
  EXPECT_TRUE(run.get_data() == expected_data(list, {&rl}, rl.data_bytes));
}

}  // namespace
