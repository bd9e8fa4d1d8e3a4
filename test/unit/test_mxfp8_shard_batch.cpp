// Multi-tensor sharded MXFP8 quantization (scheme A) on the host backend:
// Mxfp8ShardBatch, mxfp8_partial_scales_batch and quantize_mxfp8_shard_data_batch.
// W = 1..8 simulated ranks, each with one batch over its ranges of a mixed list (odd
// widths, partial blocks and tiles, grouped, 1 x 1, empty ranges), run phase 1, the Max
// all-reduce and phase 2; the assembled planes and scales equal the independent
// oracle's quantization of bf16(full master) bitwise, every rank's phase-1 bytes equal
// the oracle's partial scales, boundaries at every offset of a block and hundreds of
// small tensors (most ranges empty) included. The
// batch equals the per-tensor calls; gaps and bytes outside the ranges stay poisoned
// (staging slices passed as address minus range.begin included); scale_spans(),
// numel() and tiles() are counted independently; bad lists are rejected naming the
// tensor; a HostStream capture replays with the current master; a real Layout's
// segments at world 4 assemble the oracle's bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/mxfp8/mxfp8_shard_calls.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/mxfp8.hpp"
#include "shardopt/presets.hpp"
#include "unit/test_mxfp8_shard_batch_common.hpp"

namespace {
using namespace shardopt;
using namespace mxfp8_test;

constexpr Backend kHost = Backend::Host;

// The shared data planes after every rank ran phase 2: the whole oracle quantization of
// every tensor at its place, gaps poisoned (independent of where the boundaries fell).
DataArenas whole_data(const ShardList& list) {
  DataArenas a{std::vector<std::uint8_t>(static_cast<std::size_t>(list.data_bytes), kPoison),
               std::vector<std::uint8_t>(static_cast<std::size_t>(list.data_bytes), kPoison)};
  for (std::size_t t = 0; t < list.size(); ++t) {
    std::copy(list.want[t].data_row.begin(), list.want[t].data_row.end(), a.row.begin() + list.data_at[t]);
    std::copy(list.want[t].data_col.begin(), list.want[t].data_col.end(), a.col.begin() + list.data_at[t]);
  }
  return a;
}

std::string bounds_str(const std::vector<std::vector<std::int64_t>>& bounds) {
  std::string s;
  for (const auto& b : bounds) {
    s += "{";
    for (std::size_t i = 0; i < b.size(); ++i) {
      if (i) s += ',';  // appended in place: GCC 12 -O3 warns (-Wrestrict) on "," + string&&
      s += std::to_string(b[i]);
    }
    s += "} ";
  }
  return s;
}

// Runs the W-rank protocol on the host and checks every arena against the oracle,
// the assembled planes against the whole-tensor quantization, and scale_spans() == 1
// (the list's scale tensors lie back to back). Returns false after a failure.
bool check_world(const ShardList& list, const std::vector<std::vector<std::int64_t>>& bounds, int master_shift,
                 bool null_empty, const std::string& what, Passes scheme = Passes::Split) {
  for (std::size_t t = 0; t < list.size(); ++t) {  // the ranks' ranges tile every tensor
    EXPECT_EQ(bounds[t].front(), 0);
    EXPECT_EQ(bounds[t].back(), list.shapes[t].numel());
  }
  const std::vector<RankLayout> ranks = world_layouts(list, bounds, master_shift, null_empty);
  const ProtocolResult got = run_protocol(kHost, list, ranks, false, scheme);
  const std::string d = check_against_oracle(list, ranks, got);
  EXPECT_TRUE(d.empty()) << what << ", bounds " << bounds_str(bounds) << ": " << d;
  const std::string whole = data_diff(got.after_rank.back(), whole_data(list));
  EXPECT_TRUE(whole.empty()) << what << ": assembled planes vs the whole-tensor oracle: " << whole;
  for (std::size_t s : got.spans) EXPECT_EQ(s, 1u) << what;
  return d.empty() && whole.empty() && !::testing::Test::HasFailure();
}

// ------------------------------------------------------------------ the W-rank protocol

TEST(Mxfp8ShardBatch, WorldsOf1To8RanksAssembleTheWholeTensorQuantization) {
  ShardList list(mixed_shard_shapes());
  std::mt19937 rng(2);
  for (std::uint32_t seed : {1u, 100u}) {
    list.fill(seed);
    for (int world : {1, 2, 3, 4, 8})
      for (int mode = 0; mode < 4; ++mode)
        for (int rep = 0; rep < (mode == 1 ? 3 : 1); ++rep) {
          const std::string what = "seed " + std::to_string(seed) + " world " + std::to_string(world) + " mode " +
                                   std::to_string(mode);
          if (!check_world(list, list_bounds(list, world, mode, rng), (mode + rep) % 4, (mode + rep) % 2 == 0, what))
            return;
        }
  }
}

TEST(Mxfp8ShardBatch, BoundaryAtEveryOffsetWithinABlock) {
  // For every tensor at once: (a) a cut at each of the 33 flat offsets from the start of
  // a middle row (every position inside a rowwise block, and into the next row where
  // cols < 32); (b) a cut at each row offset 0..32 of the first 32-row group, mid-row
  // (every position inside a columnwise block); (c) three ranks with a middle rank
  // owning 0, 1, 5, 31 or 33 elements starting at each offset of (a).
  ShardList list(mixed_shard_shapes());
  list.fill(3);
  for (std::int64_t k = 0; k <= 32; ++k) {
    std::vector<std::vector<std::int64_t>> rowwise, colwise;
    std::vector<std::int64_t> starts;
    for (const Mxfp8Shape& s : list.shapes) {
      const std::int64_t n = s.numel();
      const std::int64_t start = (s.members * s.rows / 2) * s.cols;
      starts.push_back(start);
      rowwise.push_back({0, std::min(n, start + k), n});
      colwise.push_back({0, std::min(n, k * s.cols + s.cols / 2), n});
    }
    if (!check_world(list, rowwise, static_cast<int>(k % 4), k % 2 == 0, "rowwise offset " + std::to_string(k))) return;
    if (!check_world(list, colwise, static_cast<int>(k % 3), k % 2 == 1, "columnwise row " + std::to_string(k))) return;
    for (std::int64_t len : {0, 1, 5, 31, 33}) {
      std::vector<std::vector<std::int64_t>> middle;
      for (std::size_t t = 0; t < list.size(); ++t) {
        const std::int64_t n = list.shapes[t].numel(), b = std::min(n, starts[t] + k);
        middle.push_back({0, b, std::min(n, b + len), n});
      }
      if (!check_world(list, middle, 1, len % 2 == 0,
                       "middle rank of " + std::to_string(len) + " at offset " + std::to_string(k)))
        return;
    }
  }
}

TEST(Mxfp8ShardBatch, HundredsOfSmallTensorsWithManyEmptyRanges) {
  // The GPU suite's many-tensor list (most ranks own nothing of most tensors), here
  // against the oracle.
  ShardList list(many_small_shapes(300, 16));
  list.fill(17);
  std::mt19937 rng(18);
  for (int world : {2, 3, 5})
    if (!check_world(list, list_bounds(list, world, 3, rng), 0, world % 2 == 1, "world " + std::to_string(world))) return;
}

// ------------------------------------------------------------------ the owned / rest split

TEST(Mxfp8ShardBatch, OwnedSchemeWorldsOf1To8RanksEqualTheOracle) {
  // quantize_mxfp8_shard_owned_batch, the Max, quantize_mxfp8_shard_rest_batch: after
  // each rank's owned pass its data arenas hold the oracle's bytes of exactly its whole
  // tile rows (the rest poisoned), its scales are the oracle's partial scales (those of
  // the split scheme), after the rest pass the whole ranges; rest_tiles() counted
  // independently.
  ShardList list(mixed_shard_shapes());
  std::mt19937 rng(2);
  for (std::uint32_t seed : {1u, 100u}) {
    list.fill(seed);
    for (int world : {1, 2, 3, 4, 8})
      for (int mode = 0; mode < 4; ++mode) {
        const std::string what = "owned, seed " + std::to_string(seed) + " world " + std::to_string(world) +
                                 " mode " + std::to_string(mode);
        if (!check_world(list, list_bounds(list, world, mode, rng), mode % 4, mode % 2 == 0, what, Passes::Owned))
          return;
      }
  }
}

TEST(Mxfp8ShardBatch, OwnedSchemeBoundaryAtEveryOffsetWithinABlock) {
  // The boundaries of BoundaryAtEveryOffsetWithinABlock (every position inside a
  // rowwise and a columnwise block, a small middle rank), split as owned + rest.
  ShardList list(mixed_shard_shapes());
  list.fill(3);
  for (std::int64_t k = 0; k <= 32; ++k) {
    std::vector<std::vector<std::int64_t>> rowwise, colwise, middle;
    for (const Mxfp8Shape& s : list.shapes) {
      const std::int64_t n = s.numel();
      const std::int64_t start = std::min(n, (s.members * s.rows / 2) * s.cols + k);
      rowwise.push_back({0, start, n});
      colwise.push_back({0, std::min(n, k * s.cols + s.cols / 2), n});
      middle.push_back({0, start, std::min(n, start + 33 * (k % 3)), n});
    }
    const std::string at = " at " + std::to_string(k);
    if (!check_world(list, rowwise, static_cast<int>(k % 4), k % 2 == 0, "owned rowwise" + at, Passes::Owned)) return;
    if (!check_world(list, colwise, static_cast<int>(k % 3), k % 2 == 1, "owned columnwise" + at, Passes::Owned))
      return;
    if (!check_world(list, middle, 1, k % 2 == 0, "owned middle" + at, Passes::Owned)) return;
  }
}

TEST(Mxfp8ShardBatch, OwnedSchemeEqualsTheSplitSchemeBytewise) {
  // Both schemes over the same ranks (shared planes, staging slices, misaligned
  // masters, hundreds of small tensors): the same partial scales, the same combined
  // scales and the same data bytes after every rank's phase 2.
  ShardList mixed(mixed_shard_shapes(), 2, 1), small(many_small_shapes(300, 16));
  mixed.fill(21);
  small.fill(22);
  std::mt19937 rng(23);
  for (const ShardList* list : {&mixed, &small})
    for (int world : {1, 3, 4})
      for (bool staged : {false, true}) {
        const auto ranks = world_layouts(*list, list_bounds(*list, world, 3, rng), world % 4, world != 3, staged, 3);
        const ProtocolResult split = run_protocol(kHost, *list, ranks, false, Passes::Split);
        const ProtocolResult owned = run_protocol(kHost, *list, ranks, false, Passes::Owned);
        const std::string what = "world " + std::to_string(world) + (staged ? " staged" : " shared");
        EXPECT_EQ(owned.partial, split.partial) << what;
        EXPECT_EQ(owned.combined, split.combined) << what;
        if (staged) {  // each rank's own arena: equal after every rank
          EXPECT_EQ(owned.after_rank, split.after_rank) << what;
        } else {  // shared planes: the owned passes of all ranks ran first, so compare the end
          EXPECT_EQ(owned.after_rank.back(), split.after_rank.back()) << what;
        }
        if (world == 1) {  // one rank: the owned pass is the whole work
          EXPECT_EQ(owned.rest_tiles, std::vector<std::int64_t>{0}) << what;
          EXPECT_EQ(owned.after_owned, owned.after_rank) << what;
        } else {
          EXPECT_NE(owned.after_owned, owned.after_rank) << what << ": the rest pass wrote nothing";
        }
      }
}

/// One phase of a sharded quantize batch on the host backend.
using ShardPhase = void (*)(const Mxfp8ShardBatch&, Backend, Stream);

/// Two ranks (boundaries mid-block) record `first`, the Max exchange and `second` on a
/// capturing HostStream; nothing runs at capture. Each of three replays, after the
/// masters change in place (as Adam writes them) and every arena is poisoned again,
/// gives the oracle's bytes of the new master: the zero-fill, the master reads and the
/// scale reads happen at replay. `rest_tiles`: the batch has boundary tiles for `second`.
void expect_captured_phases_replay_with_the_current_master(ShardPhase first, ShardPhase second, bool rest_tiles) {
  ShardList list({{1, 37, 45}, {3, 40, 72}, {1, 2, 3}, {1, 96, 129}});
  list.fill(14);
  const std::vector<std::vector<std::int64_t>> bounds = {{0, 700, 1665}, {0, 4000, 8640}, {0, 0, 6}, {0, 6000, 12384}};
  std::vector<RankLayout> ranks = world_layouts(list, bounds);
  const std::vector<std::uint8_t> poison(static_cast<std::size_t>(list.data_bytes), kPoison);
  const DeviceBuffer drow = upload(kHost, poison), dcol = upload(kHost, poison);
  const RankRun r0(kHost, list, ranks[0], drow.as<std::uint8_t>(), dcol.as<std::uint8_t>());
  const RankRun r1(kHost, list, ranks[1], drow.as<std::uint8_t>(), dcol.as<std::uint8_t>());
  const Mxfp8ShardBatch b0(r0.tensors(list, ranks[0]), kHost), b1(r1.tensors(list, ranks[1]), kHost);
  if (rest_tiles) {
    EXPECT_GT(b0.rest_tiles(), 0);
  }
  HostStream stream;
  stream.begin_capture();
  first(b0, kHost, stream.handle());
  first(b1, kHost, stream.handle());
  std::uint8_t* s0 = r0.scales.as<std::uint8_t>();
  std::uint8_t* s1 = r1.scales.as<std::uint8_t>();
  const std::size_t bytes = static_cast<std::size_t>(list.scale_bytes);
  host_enqueue(stream.handle(), [s0, s1, bytes] {  // the Max all-reduce: both ranks end with the same bytes
    for (std::size_t i = 0; i < bytes; ++i) s0[i] = s1[i] = std::max(s0[i], s1[i]);
  });
  second(b0, kHost, stream.handle());
  second(b1, kHost, stream.handle());
  const HostGraph graph = stream.end_capture();
  EXPECT_EQ(r0.get_scales(), list.poisoned_scales()) << "the first phase ran at capture";
  EXPECT_EQ(r0.get_data().row, poison) << "a phase ran at capture";
  std::vector<std::uint8_t> previous;
  for (std::uint32_t step = 0; step < 3; ++step) {
    list.fill(40 + 10 * step);  // Adam writes the masters in place
    ranks = world_layouts(list, bounds);
    r0.put_master(ranks[0].master_arena);
    r1.put_master(ranks[1].master_arena);
    r0.put_scales(list.poisoned_scales());
    r1.put_scales(list.poisoned_scales());
    r0.poison_data();
    graph.replay();
    const std::string d = byte_diff("rank 0 scales", r0.get_scales(), list.expected_scales()) +
                          byte_diff("rank 1 scales", r1.get_scales(), list.expected_scales()) +
                          data_diff(r0.get_data(), whole_data(list));
    EXPECT_TRUE(d.empty()) << "replay " << step << ": " << d;
    EXPECT_NE(r0.get_scales(), previous) << "the masters did not change";
    previous = r0.get_scales();
  }
}

TEST(Mxfp8ShardBatch, CapturedOwnedAndRestPassesReplayWithTheCurrentMaster) {
  // The owned pass, the exchange and the rest pass (expect_captured_phases_...).
  expect_captured_phases_replay_with_the_current_master(quantize_mxfp8_shard_owned_batch,
                                                        quantize_mxfp8_shard_rest_batch, /*rest_tiles=*/true);
}

// ------------------------------------------------------------------ batch == per-tensor calls

TEST(Mxfp8ShardBatch, EqualsOnePerTensorCallOfEachPhase) {
  // Same inputs, two sets of outputs: the batch on one, mxfp8_partial_scales and
  // quantize_mxfp8_shard_data per tensor on the other; phase 2 reads each rank's own
  // partial scales (no exchange), so blocks cut by a boundary take rank-local scales.
  ShardList list(mixed_shard_shapes(), 2, 1);
  list.fill(4);
  std::mt19937 rng(5);
  const int world = 3;
  const auto bounds = list_bounds(list, world, 3, rng);
  for (int r = 0; r < world; ++r) {
    const RankLayout rl = rank_layout(list, bounds, r, r, r % 2 == 0, r == 1, 3);
    const RankRun batched(kHost, list, rl), single(kHost, list, rl);
    const Mxfp8ShardBatch batch(batched.tensors(list, rl), kHost);
    mxfp8_partial_scales_batch(batch, kHost, nullptr);
    for (const Mxfp8ShardTensor& t : single.tensors(list, rl))
      mxfp8_partial_scales(t.shape, t.range, t.master, t.out.scale_row, t.out.scale_col, kHost, nullptr);
    const std::string d1 = byte_diff("scales", batched.get_scales(), single.get_scales());
    EXPECT_TRUE(d1.empty()) << "rank " << r << " phase 1: " << d1;
    EXPECT_EQ(batched.get_scales(), expected_partial_scales(list, rl)) << "rank " << r;
    quantize_mxfp8_shard_data_batch(batch, kHost, nullptr);
    for (const Mxfp8ShardTensor& t : single.tensors(list, rl))
      quantize_mxfp8_shard_data(t.shape, t.range, t.master, t.out.scale_row, t.out.scale_col, t.out.data_row,
                                t.out.data_col, kHost, nullptr);
    const std::string d2 = data_diff(batched.get_data(), single.get_data());
    EXPECT_TRUE(d2.empty()) << "rank " << r << " phase 2: " << d2;
    // Sensitivity: the rank wrote data at all.
    EXPECT_NE(batched.get_data().row, std::vector<std::uint8_t>(static_cast<std::size_t>(rl.data_bytes), kPoison));
  }
}

// ------------------------------------------------------------------ poison

TEST(Mxfp8ShardBatch, GapsAndBytesOutsideTheRangesStayPoisoned) {
  // Scale tensors with 5 poisoned bytes before each, data planes at odd offsets after
  // 16-byte gaps, and each rank with data arenas of its own: phase 1 writes every byte of
  // every scale tensor and nothing else (data untouched); phase 2 writes exactly the
  // bytes of the ranges (scales untouched). Shared planes and staging slices.
  ShardList list(mixed_shard_shapes(), 5, 3);
  list.fill(6);
  // The oracle's scale bytes are never the poison byte, so "still poison" means "not written".
  for (std::size_t t = 0; t < list.size(); ++t) {
    std::vector<std::uint8_t> all = list.want[t].scale_row;
    all.insert(all.end(), list.want[t].scale_col.begin(), list.want[t].scale_col.end());
    ASSERT_EQ(std::count(all.begin(), all.end(), kPoison), 0) << "pick another seed";
  }
  std::mt19937 rng(7);
  for (bool staged : {false, true}) {
    const int world = 4;
    const auto bounds = list_bounds(list, world, 3, rng);
    const std::vector<RankLayout> ranks = world_layouts(list, bounds, 1, !staged, staged, 1);
    std::vector<RankRun> runs;
    std::vector<Mxfp8ShardBatch> batches;
    std::vector<std::vector<std::uint8_t>> partial;
    for (const RankLayout& rl : ranks) {
      runs.emplace_back(kHost, list, rl);  // data arenas of its own
      batches.emplace_back(runs.back().tensors(list, rl), kHost);
      EXPECT_EQ(batches.back().scale_spans(), 2 * list.size()) << "every scale tensor is its own span";
    }
    for (int r = 0; r < world; ++r) {
      const RankRun& run = runs[static_cast<std::size_t>(r)];
      mxfp8_partial_scales_batch(batches[static_cast<std::size_t>(r)], kHost, nullptr);
      partial.push_back(run.get_scales());
      const auto want = expected_partial_scales(list, ranks[static_cast<std::size_t>(r)]);
      EXPECT_EQ(std::count(want.begin(), want.end(), kPoison), static_cast<std::ptrdiff_t>(5 * (2 * list.size() + 1)));
      const std::string d = byte_diff("scale arena", partial.back(), want);
      EXPECT_TRUE(d.empty()) << "staged " << staged << " rank " << r << " phase 1: " << d;
      const DataArenas untouched{std::vector<std::uint8_t>(static_cast<std::size_t>(run.data_bytes), kPoison),
                                 std::vector<std::uint8_t>(static_cast<std::size_t>(run.data_bytes), kPoison)};
      EXPECT_TRUE(run.get_data() == untouched) << "phase 1 wrote data bytes";
    }
    const std::vector<std::uint8_t> combined = max_of(partial);
    EXPECT_EQ(combined, list.expected_scales());
    for (int r = 0; r < world; ++r) {
      const RankRun& run = runs[static_cast<std::size_t>(r)];
      const RankLayout& rl = ranks[static_cast<std::size_t>(r)];
      run.put_scales(combined);
      quantize_mxfp8_shard_data_batch(batches[static_cast<std::size_t>(r)], kHost, nullptr);
      const std::string d = data_diff(run.get_data(), expected_data(list, {&rl}, rl.data_bytes));
      EXPECT_TRUE(d.empty()) << "staged " << staged << " rank " << r << " phase 2: " << d;
      EXPECT_EQ(run.get_scales(), combined) << "phase 2 wrote scale bytes";
    }
  }
}

// ------------------------------------------------------------------ scale spans

TEST(Mxfp8ShardBatch, ScaleSpansCountTheMergedRunsOfScaleMemory) {
  const std::vector<Mxfp8Shape> shapes = {{1, 37, 45}, {3, 40, 72}, {1, 1, 1}, {1, 70, 33}, {2, 5, 130}, {1, 64, 256}};
  ShardList list(shapes);
  list.fill(8);
  std::mt19937 rng(9);
  const auto bounds = list_bounds(list, 2, 3, rng);
  // Places the scale tensors (row offset, col offset per tensor) in an arena of `bytes`,
  // builds rank 0's batch (reversed when asked), checks scale_spans() and that phase 1
  // writes the oracle's partial scales and leaves every other byte poisoned.
  auto check = [&](const std::string& what, std::vector<std::pair<std::int64_t, std::int64_t>> at, std::int64_t bytes,
                   std::size_t spans, bool reversed) {
    ShardList placed = list;
    for (std::size_t t = 0; t < at.size(); ++t) {
      placed.scale_row_at[t] = at[t].first;
      placed.scale_col_at[t] = at[t].second;
    }
    placed.scale_bytes = bytes;
    const RankLayout rl = rank_layout(placed, bounds, 0);
    const RankRun run(kHost, placed, rl);
    auto tensors = run.tensors(placed, rl);
    if (reversed) std::reverse(tensors.begin(), tensors.end());
    const Mxfp8ShardBatch batch(tensors, kHost);
    EXPECT_EQ(batch.scale_spans(), spans) << what;
    mxfp8_partial_scales_batch(batch, kHost, nullptr);
    const std::string d = byte_diff("scale arena", run.get_scales(), expected_partial_scales(placed, rl));
    EXPECT_TRUE(d.empty()) << what << ": " << d;
  };
  const std::size_t n = shapes.size();
  std::vector<std::pair<std::int64_t, std::int64_t>> at(n);
  std::int64_t off = 0;
  // Back to back, each tensor's row then col scales, in list order and reversed.
  for (std::size_t t = 0; t < n; ++t) {
    at[t] = {off, off + shapes[t].scale_row_numel()};
    off += shapes[t].scale_row_numel() + shapes[t].scale_col_numel();
  }
  check("back to back", at, off, 1, false);
  check("back to back, list reversed", at, off, 1, true);
  // All rowwise scale tensors first, then all columnwise ones, in a shuffled order.
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::shuffle(order.begin(), order.end(), rng);
  off = 0;
  for (std::size_t t : order) {
    at[t].first = off;
    off += shapes[t].scale_row_numel();
  }
  std::shuffle(order.begin(), order.end(), rng);
  for (std::size_t t : order) {
    at[t].second = off;
    off += shapes[t].scale_col_numel();
  }
  check("rows then columns, shuffled", at, off, 1, false);
  check("rows then columns, shuffled, list reversed", at, off, 1, true);
  // A gap of 4 bytes before each tensor (its col scales right after its row scales,
  // except tensor 3 whose col scales come first).
  off = 0;
  for (std::size_t t = 0; t < n; ++t) {
    off += 4;
    if (t == 3) at[t] = {off + shapes[t].scale_col_numel(), off};
    else at[t] = {off, off + shapes[t].scale_row_numel()};
    off += shapes[t].scale_row_numel() + shapes[t].scale_col_numel();
  }
  check("a gap before every tensor", at, off + 4, n, false);
  check("a gap before every tensor, list reversed", at, off + 4, n, true);
  // A gap before every scale tensor: none merges.
  ShardList gaps(shapes, 1);
  gaps.fill(8);
  std::vector<std::pair<std::int64_t, std::int64_t>> gap_at;
  for (std::size_t t = 0; t < n; ++t) gap_at.push_back({gaps.scale_row_at[t], gaps.scale_col_at[t]});
  check("a gap before every scale tensor", gap_at, gaps.scale_bytes, 2 * n, false);
  // Mixed: [t0 t1] gap [t2 t3 t4] gap [t5 row] gap [t5 col] -> 4 spans.
  off = 0;
  for (std::size_t t = 0; t < n; ++t) {
    if (t == 2) off += 7;
    if (t == 5) {
      off += 7;
      at[t] = {off, off + shapes[t].scale_row_numel() + 1};
      off += shapes[t].scale_row_numel() + 1 + shapes[t].scale_col_numel();
      continue;
    }
    at[t] = {off, off + shapes[t].scale_row_numel()};
    off += shapes[t].scale_row_numel() + shapes[t].scale_col_numel();
  }
  check("two runs, then a tensor split in two", at, off + 2, 4, false);
}

// ------------------------------------------------------------------ accessors

TEST(Mxfp8ShardBatch, AccessorsCountTensorsRangesAndTiles) {
  // The oracle's tile count itself, on hand-checked ranges of a [2, 40, 300] tensor
  // (3 column tiles; 2 tile rows per member).
  const Mxfp8Shape s{2, 40, 300};
  EXPECT_EQ(range_tiles(s, {0, s.numel()}), 4 * 3);
  EXPECT_EQ(range_tiles(s, {10, 20}), 3);                    // inside one row
  EXPECT_EQ(range_tiles(s, {31 * 300 + 5, 33 * 300}), 2 * 3);  // rows 31 and 32: two tile rows
  EXPECT_EQ(range_tiles(s, {39 * 300, 41 * 300}), 2 * 3);     // member 0 row 39, member 1 row 0
  EXPECT_EQ(range_tiles(s, {32 * 300, 40 * 300}), 3);         // the partial tile row of member 0
  EXPECT_EQ(range_tiles(s, {7, 7}), 0);

  ShardList same({s, s, s, s, s, s});
  same.fill(10);
  const std::vector<std::vector<std::int64_t>> bounds = {
      {0, s.numel()}, {10, 20}, {31 * 300 + 5, 33 * 300}, {39 * 300, 41 * 300}, {32 * 300, 40 * 300}, {7, 7}};
  const RankLayout hand = rank_layout(same, bounds, 0);
  const RankRun hand_run(kHost, same, hand);
  const Mxfp8ShardBatch hand_batch(hand_run.tensors(same, hand), kHost);
  EXPECT_EQ(hand_batch.tiles(), 12 + 3 + 6 + 6 + 3 + 0);
  EXPECT_EQ(hand_batch.numel(), s.numel() + 10 + (2 * 300 - 5) + 600 + 2400 + 0);
  EXPECT_EQ(hand_batch.size(), 6u);

  ShardList list(mixed_shard_shapes());
  list.fill(11);
  std::mt19937 rng(12);
  const int world = 3;
  const auto layouts = world_layouts(list, list_bounds(list, world, 1, rng));
  for (int r = 0; r < world; ++r) {
    const RankLayout& rl = layouts[static_cast<std::size_t>(r)];
    const RankRun run(kHost, list, rl);
    Mxfp8ShardBatch batch(run.tensors(list, rl), kHost);
    std::int64_t tiles = 0;
    for (std::size_t t = 0; t < list.size(); ++t) tiles += range_tiles(list.shapes[t], rl.ranges[t]);
    EXPECT_EQ(batch.backend(), kHost);
    EXPECT_EQ(batch.size(), list.size());
    EXPECT_EQ(batch.numel(), rl.numel());
    EXPECT_EQ(batch.tiles(), tiles);
    EXPECT_EQ(batch.grid(), 0);
    EXPECT_EQ(batch.scale_spans(), 1u);
    // A moved batch keeps its table; the moved-from one refuses to work.
    Mxfp8ShardBatch moved = std::move(batch);
    EXPECT_EQ(moved.size(), list.size());
    EXPECT_EQ(moved.tiles(), tiles);
    mxfp8_partial_scales_batch(moved, kHost, nullptr);
    EXPECT_EQ(run.get_scales(), expected_partial_scales(list, rl)) << "rank " << r;
    for (int phase = 1; phase <= 2; ++phase) {
      try {
        if (phase == 1) mxfp8_partial_scales_batch(batch, kHost, nullptr);
        else quantize_mxfp8_shard_data_batch(batch, kHost, nullptr);
        ADD_FAILURE() << "phase " << phase << " ran a moved-from batch";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::InvalidState) << e.what();
      }
    }
    Mxfp8ShardBatch assigned(std::move(moved));  // move assignment over a live batch too
    const RankRun other(kHost, list, rl);
    Mxfp8ShardBatch target(other.tensors(list, rl), kHost);
    target = std::move(assigned);
    run.put_scales(list.poisoned_scales());
    mxfp8_partial_scales_batch(target, kHost, nullptr);
    EXPECT_EQ(run.get_scales(), expected_partial_scales(list, rl)) << "rank " << r << " after move assignment";
    EXPECT_EQ(other.get_scales(), list.poisoned_scales()) << "the replaced batch's outputs were written";
  }
}

// ------------------------------------------------------------------ errors

// The message without the " (at file:line)" suffix.
std::string message_of(const Error& e) {
  const std::string w = e.what();
  return w.substr(0, w.rfind(" (at "));
}

// True when `index` appears in the message as a whole number (hex addresses aside).
// (A plain scan: GCC 12's std::regex trips -Wmaybe-uninitialized in the sanitized build.)
bool names(const std::string& message, std::size_t index) {
  const std::string want = std::to_string(index);
  const auto digit = [&](std::size_t i) { return i < message.size() && std::isdigit(static_cast<unsigned char>(message[i])); };
  for (std::size_t i = 0; i < message.size();) {
    if (message[i] == '0' && i + 1 < message.size() && (message[i + 1] == 'x' || message[i + 1] == 'X')) {
      i += 2;  // a hex address: not a tensor index
      while (i < message.size() && std::isxdigit(static_cast<unsigned char>(message[i]))) ++i;
      continue;
    }
    if (!digit(i)) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (digit(j)) ++j;
    if (message.compare(i, j - i, want) == 0) return true;
    i = j;
  }
  return false;
}

TEST(Mxfp8ShardBatch, BadListsAreRejectedNamingTheTensor) {
  ShardList list(mixed_shard_shapes());
  list.fill(13);
  std::vector<std::vector<std::int64_t>> bounds;
  for (const Mxfp8Shape& s : list.shapes) bounds.push_back({0, s.numel()});  // every range non-empty
  const RankLayout rl = rank_layout(list, bounds, 0);
  const RankRun run(kHost, list, rl);
  const std::vector<Mxfp8ShardTensor> good = run.tensors(list, rl);
  // Every shape of the list, and so every index below, is chosen so that the index
  // cannot appear in the message as a dimension or a range bound.
  auto expect_error = [&](const std::vector<Mxfp8ShardTensor>& tensors, const std::string& what,
                          std::vector<std::size_t> indices, ErrorCode code = ErrorCode::InvalidArgument) {
    try {
      const Mxfp8ShardBatch batch(tensors, kHost);
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << what << ": " << e.what();
      if (!indices.empty()) {
        bool any = false;
        for (std::size_t i : indices) any = any || names(message_of(e), i);
        EXPECT_TRUE(any) << what << ": the message does not name tensor " << indices.front() << ": " << e.what();
      }
    }
  };
  expect_error({}, "an empty list", {});
  auto bad = good;
  bad[5].shape.rows = 0;
  expect_error(bad, "rows 0", {5});
  bad = good;
  bad[6].shape.cols = -3;
  expect_error(bad, "negative cols", {6});
  bad = good;
  bad[7].shape.members = 0;
  expect_error(bad, "0 members", {7});
  const std::int64_t n6 = good[6].shape.numel();  // 78000
  for (const Range& r : {Range{-1, 10}, Range{0, n6 + 1}, Range{10, 9}, Range{n6 + 1, n6 + 1}, Range{-2, -2}}) {
    bad = good;
    bad[6].range = r;
    expect_error(bad, "range [" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ") of tensor 6", {6},
                 ErrorCode::OutOfRange);  // as the per-tensor calls
  }
  bad = good;
  bad[7].out.scale_row = nullptr;
  expect_error(bad, "null scale_row", {7});
  bad = good;
  bad[9].out.scale_col = nullptr;
  expect_error(bad, "null scale_col", {9});
  bad = good;
  bad[7].range = {5, 5};  // even with an empty range the scales are written (zeros)
  bad[7].master = nullptr;
  bad[7].out.data_row = bad[7].out.data_col = nullptr;
  bad[7].out.scale_col = nullptr;
  expect_error(bad, "null scale_col with an empty range", {7});
  bad = good;
  bad[9].master = nullptr;
  expect_error(bad, "null master", {9});
  bad = good;
  bad[10].out.data_row = nullptr;
  expect_error(bad, "null data_row", {10});
  bad = good;
  bad[10].out.data_col = nullptr;
  expect_error(bad, "null data_col", {10});
  // Overlapping scale tensors of two tensors: partly, across the two kinds, exactly.
  bad = good;
  bad[6].out.scale_row = good[9].out.scale_row + 1;
  expect_error(bad, "scale_row of 6 inside scale_row of 9", {6, 9});
  bad = good;
  bad[9].out.scale_col = good[6].out.scale_row + good[6].shape.scale_row_numel() - 1;  // one byte in common
  expect_error(bad, "scale_col of 9 over the last byte of scale_row of 6", {6, 9});
  bad = good;
  bad[10].out.scale_row = good[5].out.scale_row;
  bad[10].out.scale_col = good[5].out.scale_col;
  expect_error(bad, "tensor 10 with the scales of tensor 5", {5, 10});
  // A tensor's own outputs overlapping.
  bad = good;
  bad[6].out.scale_col = good[6].out.scale_row + 1;
  expect_error(bad, "scale_col of 6 inside its scale_row", {6});
  bad = good;
  bad[9].out.data_col = good[9].out.data_row + 5;
  expect_error(bad, "data_col of 9 five bytes after its data_row", {9});
  bad = good;
  bad[10].out.data_row = good[10].out.data_col;
  expect_error(bad, "data_row of 10 = its data_col", {10});
  // Data bytes of a range over another tensor's scale tensor.
  bad = good;
  bad[10].out.data_row = good[6].out.scale_col + 3;
  expect_error(bad, "data_row of 10 over scale_col of 6", {6, 10});
  // Overlapping data bytes of the ranges.
  bad = good;
  bad[6].out.data_row = good[9].out.data_row + 1;
  expect_error(bad, "data_row of 6 one byte after data_row of 9", {6, 9});
  bad = good;
  bad[9].out.data_col = good[6].out.data_row + 77000;  // tensor 9's 12384 bytes over 6's last 1000
  expect_error(bad, "data_col of 9 over data_row of 6", {6, 9});
  // Ranges of two tensors may share a plane where their bytes are disjoint (a staging
  // buffer cut into slices): tensor 9 writes [0, 10) right after tensor 6's [0, 78000),
  // in the 16-byte gap before tensor 7's planes.
  auto ok = good;
  ok[9].range = {0, 10};
  ok[9].out.data_row = good[6].out.data_row + n6;
  ok[9].out.data_col = good[6].out.data_col + n6;
  EXPECT_NO_THROW({ const Mxfp8ShardBatch accepted(ok, kHost); });
  ok[9].out.data_row -= 1;
  expect_error(ok, "tensor 9's first data byte on tensor 6's last", {6, 9});
  // An empty range needs neither a master nor data pointers; its scales are still zeroed.
  ok = good;
  ok[2].range = {3, 3};
  ok[2].master = nullptr;
  ok[2].out.data_row = ok[2].out.data_col = nullptr;
  ok[11].range = {0, 0};
  ok[11].master = nullptr;
  ok[11].out.data_row = ok[11].out.data_col = nullptr;
  {
    EXPECT_EQ(run.get_scales(), list.poisoned_scales()) << "a rejected list wrote something";
    const Mxfp8ShardBatch batch(ok, kHost);
    EXPECT_EQ(batch.numel(), rl.numel() - list.shapes[2].numel() - list.shapes[11].numel());
    mxfp8_partial_scales_batch(batch, kHost, nullptr);
    RankLayout with_empty = rl;
    with_empty.ranges[2] = {3, 3};
    with_empty.ranges[11] = {0, 0};
    EXPECT_EQ(run.get_scales(), expected_partial_scales(list, with_empty));
    EXPECT_NO_THROW(quantize_mxfp8_shard_data_batch(batch, kHost, nullptr));
    // A host batch runs on the host backend only.
    for (int phase = 1; phase <= 2; ++phase) {
      try {
        if (phase == 1) mxfp8_partial_scales_batch(batch, Backend::Cuda, nullptr);
        else quantize_mxfp8_shard_data_batch(batch, Backend::Cuda, nullptr);
        ADD_FAILURE() << "phase " << phase << " of a host batch ran with Backend::Cuda";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
      }
    }
  }
}

// ------------------------------------------------------------------ capture

TEST(Mxfp8ShardBatch, CapturedPhasesReplayWithTheCurrentMaster) {
  // Phase 1, the exchange and phase 2 (expect_captured_phases_...).
  expect_captured_phases_replay_with_the_current_master(mxfp8_partial_scales_batch, quantize_mxfp8_shard_data_batch,
                                                        /*rest_tiles=*/false);
}

// ------------------------------------------------------------------ a real layout

TEST(Mxfp8ShardBatch, LayoutSegmentsOfEveryRankAtWorld4) {
  // The integrator's use: a Layout of a small Llama-like model plus a grouped MoE weight,
  // several buckets; rank r's master shard holds its segments at their shard offsets
  // (padding NaN). Each rank's batch lists every 2-D parameter: its segment's range, or
  // an empty range (null master and data) where it owns nothing of it, since every rank
  // must take part in the scale reduction. Data planes shared, scales back to back.
  std::vector<ParamSpec> specs = presets::transformer(presets::TransformerShape{96, 2, 200, 40, 301});
  specs.push_back(ParamSpec::grouped("moe.w1", 3, {40, 72}));
  const int world = 4;
  LayoutOptions opt;
  opt.bucket_numel = 30000;
  const Layout layout(specs, world, opt);
  std::vector<int> param_of_tensor, tensor_of_param(layout.specs().size(), -1);
  std::vector<Mxfp8Shape> shapes;
  for (std::size_t p = 0; p < layout.specs().size(); ++p) {
    if (layout.specs()[p].shape.size() < 2) continue;  // 1-D weights stay bf16
    tensor_of_param[p] = static_cast<int>(shapes.size());
    param_of_tensor.push_back(static_cast<int>(p));
    shapes.push_back(Mxfp8Shape::of(layout.specs()[p]));
  }
  ASSERT_EQ(shapes.size(), 2u * 7 + 3);
  EXPECT_EQ(shapes.back().members, 3);
  ShardList list(shapes);
  list.fill(15);
  std::vector<RankLayout> ranks;
  int cut_params = 0;
  for (int r = 0; r < world; ++r) {
    RankLayout rl;
    rl.ranges.assign(list.size(), Range{0, 0});
    rl.master_at.assign(list.size(), kNullAt);
    rl.data_at.assign(list.size(), kNullAt);
    rl.data_bytes = list.data_bytes;
    for (std::size_t b = 0; b < layout.buffers().size(); ++b) {
      const std::int64_t base = static_cast<std::int64_t>(rl.master_arena.size());
      rl.master_arena.resize(rl.master_arena.size() + static_cast<std::size_t>(layout.buffers()[b].shard_numel),
                             std::numeric_limits<float>::quiet_NaN());
      for (const Segment& g : layout.segments(static_cast<int>(b), r)) {
        const int t = tensor_of_param[static_cast<std::size_t>(g.param)];
        if (t < 0) continue;
        const auto ti = static_cast<std::size_t>(t);
        ASSERT_EQ(rl.ranges[ti].size(), 0) << "two segments of one param on one rank";
        rl.ranges[ti] = {g.param_offset, g.param_offset + g.length};
        rl.master_at[ti] = base + g.shard_offset;
        rl.data_at[ti] = list.data_at[ti];
        std::copy(list.masters[ti].begin() + g.param_offset, list.masters[ti].begin() + g.param_offset + g.length,
                  rl.master_arena.begin() + base + g.shard_offset);
        cut_params += g.length < list.shapes[ti].numel();
      }
    }
    ranks.push_back(std::move(rl));
  }
  EXPECT_GT(cut_params, 4) << "the layout should cut several params between ranks";
  for (std::size_t t = 0; t < list.size(); ++t) {  // the segments cover every param once
    std::int64_t covered = 0;
    for (const RankLayout& rl : ranks) covered += rl.ranges[t].size();
    ASSERT_EQ(covered, list.shapes[t].numel()) << layout.specs()[static_cast<std::size_t>(param_of_tensor[t])].name;
  }
  const ProtocolResult got = run_protocol(kHost, list, ranks);
  const std::string d = check_against_oracle(list, ranks, got);
  EXPECT_TRUE(d.empty()) << d;
  const std::string whole = data_diff(got.after_rank.back(), whole_data(list));
  EXPECT_TRUE(whole.empty()) << "assembled planes: " << whole;
  for (std::size_t s : got.spans) EXPECT_EQ(s, 1u);
}

}  // namespace
