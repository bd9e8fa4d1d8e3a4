// test_mxfp8_shard_batch_common.hpp - lists of sharded MXFP8 tensors (scheme A) for the
// multi-tensor shard tests of the host suite (test/unit/test_mxfp8_shard_batch.cpp) and
// the GPU suite (test/gpu/test_mxfp8_shard_batch_gpu.cpp).
//
// A ShardList holds the tensors' shapes, their full fp32 masters and the oracle's
// quantization of bf16(master) (test_mxfp8_reference.hpp), and places the tensors in
// arenas: ONE scale arena (rowwise and columnwise scale tensors of every tensor, back to
// back or with poisoned gaps) that each rank owns a copy of, and two data arenas (the
// planes, with poisoned gaps) that the ranks share. A RankLayout is one rank's view:
// its range of every tensor, its master pieces in a master arena whose gaps hold NaN (a
// read outside the range turns a scale into 0xFF), and where its data pointers point
// (the shared planes, or a staging arena of its ranges only, passed as address minus
// range.begin). run_protocol simulates W ranks on a backend: phase 1 of each rank's
// batch, the Max all-reduce of the scale arenas, phase 2 of each rank into the planes.
// The expected_* functions give the oracle's bytes of every arena, gaps included.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/memory.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/mxfp8.hpp"
#include "unit/test_mxfp8_batch_common.hpp"
#include "unit/test_mxfp8_common.hpp"

namespace mxfp8_test {

/// fp32 masters that exercise every scale rule: random_master's values and specials,
/// plus whole rows of one pattern each: zeros (+0 and -0), fp32 / bf16 subnormals and
/// tiny normals (scale 0x00), a block amax exactly on 1.75 * 2^k or one bf16 step above
/// or below it in every 32-element piece of the row, the extremes 1.75 * 2^127,
/// 1.75 * 2^-127 (a subnormal) and FLT_MAX (rounds to bf16 Inf), and NaN (quiet,
/// negative, signalling) or +-Inf at one spot.
inline std::vector<float> special_master(std::int64_t n, std::int64_t cols, std::uint32_t seed) {
  std::vector<float> v = random_master(n, cols, seed, 0.02);
  std::mt19937 rng(seed * 7919u + 1u);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (std::int64_t row0 = 0; row0 < n; row0 += cols) {
    const std::int64_t row1 = std::min(n, row0 + cols);
    auto at = [&](std::int64_t i) -> float& { return v[static_cast<std::size_t>(i)]; };
    float rowmax = 0.0f;
    for (std::int64_t i = row0; i < row1; ++i)
      if (std::isfinite(at(i))) rowmax = std::max(rowmax, std::fabs(at(i)));
    // 1.75 * 2^k (and its bf16 neighbours) exceeds every finite value of the row.
    const int k = rowmax > 0.0f ? std::ilogb(rowmax) + 1 : 0;
    auto one_per_piece = [&](float value) {
      for (std::int64_t p = row0; p < row1; p += 32) {
        const std::int64_t len = std::min<std::int64_t>(32, row1 - p);
        at(p + static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(len))) = (rng() % 2 ? -value : value);
      }
    };
    switch (rng() % 10) {
      case 3:
        for (std::int64_t i = row0; i < row1; ++i) at(i) = i % 2 ? 0.0f : -0.0f;
        break;
      case 4:
        for (std::int64_t i = row0; i < row1; ++i) {
          const std::uint32_t r = rng();
          if (r % 5 == 0) at(i) = f32_of(r % 2 ? 0x00010000u : 0x80000001u);  // a bf16 subnormal / the smallest f32
          else at(i) = std::ldexp(unit(rng), -120 - static_cast<int>(r % 30));  // tiny normals and subnormals
        }
        break;
      case 5: one_per_piece(std::ldexp(1.75f, k)); break;
      case 6: one_per_piece(std::ldexp(1.7578125f, k)); break;  // one bf16 step above
      case 7: one_per_piece(std::ldexp(1.7421875f, k)); break;  // one bf16 step below
      case 8: {
        const std::uint32_t which = rng() % 3;
        for (std::int64_t i = row0; i < row1; ++i) at(i) = std::ldexp(unit(rng), which == 0 ? 120 : -140);
        one_per_piece(which == 0 ? std::ldexp(1.75f, 127) : which == 1 ? std::ldexp(1.75f, -127) : f32_of(0x7F7FFFFFu));
        break;
      }
      case 9: {
        static constexpr std::uint32_t kNonFinite[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7F800000u, 0xFF800000u};
        at(row0 + static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(row1 - row0))) =
            f32_of(kNonFinite[rng() % 5]);
        break;
      }
      default: break;
    }
  }
  return v;
}

/// Fast fp32 masters for big tensors: fast_random_bf16 patterns (`special` of them
/// zeros, subnormals, +-Inf, NaN) with random low 16 bits, so that the rounding to bf16
/// matters (and carries some values up into the next binade or to Inf).
inline std::vector<float> fast_master(std::int64_t n, std::int64_t cols, std::uint64_t seed, double special) {
  const std::vector<std::uint16_t> h = fast_random_bf16(n, cols, seed, special);
  std::vector<float> out(h.size());
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < h.size(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const bool nonfinite = (h[i] & 0x7F80) == 0x7F80;
    out[i] = f32_of(static_cast<std::uint32_t>(h[i]) << 16 | (nonfinite ? 0u : static_cast<std::uint32_t>(x & 0xFFFF)));
  }
  return out;
}

/// The oracle of one rank's phase 1 over the bf16 values x of a whole tensor: the scale
/// byte of the amax over each block's elements inside `range`, 0x00 for blocks the range
/// does not touch. Indices written out here from the format's definition.
inline void partial_scales_ref(const shardopt::Mxfp8Shape& s, const std::vector<std::uint16_t>& x, shardopt::Range range,
                               std::vector<std::uint8_t>* row, std::vector<std::uint8_t>* col) {
  const std::int64_t rb = (s.cols + 31) / 32, cb = (s.rows + 31) / 32;
  std::vector<mxfp8_ref::Amax> ar(static_cast<std::size_t>(s.members * s.rows * rb));
  std::vector<mxfp8_ref::Amax> ac(static_cast<std::size_t>(s.members * cb * s.cols));
  for (std::int64_t i = range.begin; i < range.end; ++i) {
    const std::int64_t g = i / (s.rows * s.cols), r = (i / s.cols) % s.rows, c = i % s.cols;
    ar[static_cast<std::size_t>((g * s.rows + r) * rb + c / 32)].add(x[static_cast<std::size_t>(i)]);
    ac[static_cast<std::size_t>((g * cb + r / 32) * s.cols + c)].add(x[static_cast<std::size_t>(i)]);
  }
  row->resize(ar.size());
  col->resize(ac.size());
  for (std::size_t i = 0; i < ar.size(); ++i) (*row)[i] = mxfp8_ref::scale_of(ar[i].value);
  for (std::size_t i = 0; i < ac.size(); ++i) (*col)[i] = mxfp8_ref::scale_of(ac[i].value);
}

/// Tiles of 32 rows x 128 columns (of one member) that `range` touches, counted as the
/// batch does: every 32-row tile row that holds an element of the range, times the
/// member's column tiles.
inline std::int64_t range_tiles(const shardopt::Mxfp8Shape& s, shardopt::Range range) {
  if (range.size() == 0) return 0;
  std::set<std::pair<std::int64_t, std::int64_t>> tile_rows;  // (member, row / 32)
  for (std::int64_t flat_row = range.begin / s.cols; flat_row <= (range.end - 1) / s.cols; ++flat_row)
    tile_rows.insert({flat_row / s.rows, (flat_row % s.rows) / 32});
  return static_cast<std::int64_t>(tile_rows.size()) * ((s.cols + 127) / 128);
}

/// The first byte where two arenas differ ("" when equal).
inline std::string byte_diff(const char* name, const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want) {
  if (got.size() != want.size())
    return std::string(name) + ": " + std::to_string(got.size()) + " bytes, expected " + std::to_string(want.size()) + "; ";
  const auto m = std::mismatch(got.begin(), got.end(), want.begin());
  if (m.first == got.end()) return "";
  std::size_t count = 0;
  for (std::size_t i = 0; i < got.size(); ++i) count += got[i] != want[i];
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s: %zu bytes differ, first at %td (got 0x%02x, expected 0x%02x); ", name, count,
                m.first - got.begin(), *m.first, *m.second);
  return buf;
}

/// The two data planes of an arena layout (host copies).
struct DataArenas {
  std::vector<std::uint8_t> row, col;
  bool operator==(const DataArenas&) const = default;
};

inline std::string data_diff(const DataArenas& got, const DataArenas& want) {
  return byte_diff("data_row", got.row, want.row) + byte_diff("data_col", got.col, want.col);
}

/// Offset value meaning "pass a null pointer".
inline constexpr std::int64_t kNullAt = std::numeric_limits<std::int64_t>::min();

/// Pointer `base + offset` computed on the integers, so that offsets before an
/// allocation (a staging slice passed as its address minus range.begin) are fine.
template <class T>
T* offset_ptr(T* base, std::int64_t offset) {
  if (offset == kNullAt) return nullptr;
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(base) +
                              static_cast<std::uintptr_t>(offset) * sizeof(T));
}

/// The tensors of a list, their full masters, the oracle, and their arena placement.
struct ShardList {
  std::vector<shardopt::Mxfp8Shape> shapes;
  std::vector<std::vector<float>> masters;             // full fp32 master of each tensor
  std::vector<std::vector<std::uint16_t>> bf16;         // bf16(master), the oracle's rounding
  std::vector<mxfp8_ref::Quantized> want;               // the oracle's quantization of bf16
  std::vector<std::int64_t> scale_row_at, scale_col_at; // in the scale arena (every rank's)
  std::int64_t scale_bytes = 0;
  std::vector<std::int64_t> data_at;  // element 0 of each tensor in the shared data arenas
  std::int64_t data_bytes = 0;

  /// scale_gap: poisoned bytes before every scale tensor and at the end (0: all scale
  /// tensors back to back, rowwise then columnwise of each tensor in list order).
  /// scale_align: every scale tensor starts at a multiple of it (the bytes skipped stay
  /// poisoned). data_shift: extra bytes before each tensor's planes (odd: no 8-byte
  /// alignment).
  ShardList(std::vector<shardopt::Mxfp8Shape> list, std::int64_t scale_gap = 0, std::int64_t data_shift = 0,
            std::int64_t scale_align = 1)
      : shapes(std::move(list)) {
    for (const auto& s : shapes) {
      scale_bytes = round_up(scale_bytes + scale_gap, scale_align);
      scale_row_at.push_back(scale_bytes);
      scale_bytes = round_up(scale_bytes + s.scale_row_numel() + scale_gap, scale_align);
      scale_col_at.push_back(scale_bytes);
      scale_bytes += s.scale_col_numel();
      data_bytes = round_up(data_bytes, 64) + 16 + data_shift;
      data_at.push_back(data_bytes);
      data_bytes += s.numel();
    }
    scale_bytes += scale_gap;
    data_bytes += 16;
    masters.resize(shapes.size());
    bf16.resize(shapes.size());
    want.resize(shapes.size());
  }

  std::size_t size() const { return shapes.size(); }

  /// Sets tensor t's master; the oracle follows unless `oracle` is false (big tensors:
  /// then bf16 and want stay empty and no expected_* function may be used).
  void set_master(std::size_t t, std::vector<float> m, bool oracle = true) {
    masters[t] = std::move(m);
    bf16[t] = oracle ? to_bf16(masters[t]) : std::vector<std::uint16_t>{};
    want[t] = oracle ? reference(shapes[t], bf16[t]) : mxfp8_ref::Quantized{};
  }

  /// special_master values in every tensor (threads over tensors).
  void fill(std::uint32_t seed) {
    TensorList::parallel_for(size(), [&](std::size_t t) {
      set_master(t, special_master(shapes[t].numel(), shapes[t].cols, seed + static_cast<std::uint32_t>(t)));
    });
  }

  /// fast_master values in every tensor, no oracle (big tensors, compared kernel vs twin).
  void fill_fast(std::uint64_t seed, double special) {
    TensorList::parallel_for(size(), [&](std::size_t t) {
      set_master(t, fast_master(shapes[t].numel(), shapes[t].cols, seed + t, special), false);
    });
  }

  std::vector<std::uint8_t> poisoned_scales() const {
    return std::vector<std::uint8_t>(static_cast<std::size_t>(scale_bytes), kPoison);
  }

  /// The scale arena after the all-reduce: every tensor's full scales, gaps poisoned.
  std::vector<std::uint8_t> expected_scales() const {
    std::vector<std::uint8_t> a = poisoned_scales();
    for (std::size_t t = 0; t < size(); ++t) {
      std::copy(want[t].scale_row.begin(), want[t].scale_row.end(), a.begin() + scale_row_at[t]);
      std::copy(want[t].scale_col.begin(), want[t].scale_col.end(), a.begin() + scale_col_at[t]);
    }
    return a;
  }
};

/// Moves a list's scale tensors into one run: all rowwise scale tensors first, then all
/// columnwise ones, each kind in a random order (one scale span, not in list order).
inline void place_rows_then_cols(ShardList& list, std::mt19937& rng) {
  std::vector<std::size_t> order(list.size());
  for (std::size_t t = 0; t < order.size(); ++t) order[t] = t;
  std::int64_t off = 0;
  std::shuffle(order.begin(), order.end(), rng);
  for (std::size_t t : order) {
    list.scale_row_at[t] = off;
    off += list.shapes[t].scale_row_numel();
  }
  std::shuffle(order.begin(), order.end(), rng);
  for (std::size_t t : order) {
    list.scale_col_at[t] = off;
    off += list.shapes[t].scale_col_numel();
  }
  list.scale_bytes = off;
}

/// One rank's view of a list.
struct RankLayout {
  std::vector<shardopt::Range> ranges;
  std::vector<float> master_arena;      // the rank's master pieces, NaN between them
  std::vector<std::int64_t> master_at;  // piece of tensor t in master_arena; kNullAt: null pointer
  std::vector<std::int64_t> data_at;    // where element 0 of tensor t would be in the data arenas; kNullAt: null
  std::int64_t data_bytes = 0;          // bytes of the data arenas this rank writes into
  bool staged = false;                  // data arenas of its own ranges only (else the shared planes)

  std::int64_t numel() const {
    std::int64_t n = 0;
    for (const auto& r : ranges) n += r.size();
    return n;
  }
};

/// Rank r's layout: tensor t's range is [bounds[t][r], bounds[t][r + 1]). Master
/// pieces sit after a NaN gap at "natural" alignment (element i at a multiple of 16
/// bytes when i % 4 == 0, as in a Layout's shard) moved by master_shift floats (1, 2, 3:
/// misaligned). null_empty: null master and data pointers for empty ranges (else valid
/// pointers). staged: the data pointers address a staging arena that holds only the
/// rank's ranges (each after a gap, element i at a multiple of 8 bytes when i % 8 == 0,
/// moved by data_shift bytes), passed as address minus range.begin.
inline RankLayout rank_layout(const ShardList& list, const std::vector<std::vector<std::int64_t>>& bounds, int r,
                              int master_shift = 0, bool null_empty = true, bool staged = false,
                              std::int64_t data_shift = 0) {
  RankLayout rl;
  rl.staged = staged;
  std::int64_t m = 0, d = 0;
  for (std::size_t t = 0; t < list.size(); ++t) {
    const shardopt::Range range{bounds[t][static_cast<std::size_t>(r)], bounds[t][static_cast<std::size_t>(r) + 1]};
    rl.ranges.push_back(range);
    if (range.size() == 0 && null_empty) {
      rl.master_at.push_back(kNullAt);
      rl.data_at.push_back(kNullAt);
      continue;
    }
    m = round_up(m, 16) + 4 + (range.begin + master_shift) % 4;
    rl.master_at.push_back(m);
    m += range.size();
    if (staged) {
      d = round_up(d, 64) + 16 + (range.begin + data_shift) % 8;
      rl.data_at.push_back(d - range.begin);
      d += range.size();
    } else {
      rl.data_at.push_back(list.data_at[t]);
    }
  }
  rl.data_bytes = staged ? d + 16 : list.data_bytes;
  rl.master_arena.assign(static_cast<std::size_t>(m + 4), std::numeric_limits<float>::quiet_NaN());
  for (std::size_t t = 0; t < list.size(); ++t)
    if (rl.master_at[t] != kNullAt)
      std::copy(list.masters[t].begin() + rl.ranges[t].begin, list.masters[t].begin() + rl.ranges[t].end,
                rl.master_arena.begin() + rl.master_at[t]);
  return rl;
}

/// All ranks' layouts of one world (bounds[t] has W + 1 entries).
inline std::vector<RankLayout> world_layouts(const ShardList& list, const std::vector<std::vector<std::int64_t>>& bounds,
                                             int master_shift = 0, bool null_empty = true, bool staged = false,
                                             std::int64_t data_shift = 0) {
  std::vector<RankLayout> out;
  const int world = static_cast<int>(bounds.front().size()) - 1;
  for (int r = 0; r < world; ++r) out.push_back(rank_layout(list, bounds, r, master_shift, null_empty, staged, data_shift));
  return out;
}

/// A rank's batch tensors with its arenas at the given base pointers (any backend).
inline std::vector<shardopt::Mxfp8ShardTensor> shard_tensors(const ShardList& list, const RankLayout& rl,
                                                             const float* master_base, std::uint8_t* scale_base,
                                                             std::uint8_t* data_row_base, std::uint8_t* data_col_base) {
  std::vector<shardopt::Mxfp8ShardTensor> out;
  for (std::size_t t = 0; t < list.size(); ++t) {
    shardopt::Mxfp8ShardTensor x;
    x.shape = list.shapes[t];
    x.range = rl.ranges[t];
    x.master = offset_ptr(master_base, rl.master_at[t]);
    x.out.scale_row = scale_base + list.scale_row_at[t];
    x.out.scale_col = scale_base + list.scale_col_at[t];
    x.out.data_row = offset_ptr(data_row_base, rl.data_at[t]);
    x.out.data_col = offset_ptr(data_col_base, rl.data_at[t]);
    out.push_back(x);
  }
  return out;
}

/// The oracle of rank rl's phase 1: its partial scales in the scale arena, gaps poisoned.
inline std::vector<std::uint8_t> expected_partial_scales(const ShardList& list, const RankLayout& rl) {
  std::vector<std::uint8_t> a = list.poisoned_scales(), row, col;
  for (std::size_t t = 0; t < list.size(); ++t) {
    partial_scales_ref(list.shapes[t], list.bf16[t], rl.ranges[t], &row, &col);
    std::copy(row.begin(), row.end(), a.begin() + list.scale_row_at[t]);
    std::copy(col.begin(), col.end(), a.begin() + list.scale_col_at[t]);
  }
  return a;
}

/// The oracle of data arenas of `bytes` bytes into which the given ranks ran phase 2
/// (from the combined scales): the whole-tensor bytes at the ranks' ranges, poison
/// everywhere else.
inline DataArenas expected_data(const ShardList& list, const std::vector<const RankLayout*>& ranks, std::int64_t bytes) {
  DataArenas a{std::vector<std::uint8_t>(static_cast<std::size_t>(bytes), kPoison),
               std::vector<std::uint8_t>(static_cast<std::size_t>(bytes), kPoison)};
  for (const RankLayout* rl : ranks)
    for (std::size_t t = 0; t < list.size(); ++t)
      for (std::int64_t i = rl->ranges[t].begin; i < rl->ranges[t].end; ++i) {
        a.row[static_cast<std::size_t>(rl->data_at[t] + i)] = list.want[t].data_row[static_cast<std::size_t>(i)];
        a.col[static_cast<std::size_t>(rl->data_at[t] + i)] = list.want[t].data_col[static_cast<std::size_t>(i)];
      }
  return a;
}

/// Element-wise Max of equally long byte arenas (the all-reduce of scheme A).
inline std::vector<std::uint8_t> max_of(const std::vector<std::vector<std::uint8_t>>& arenas) {
  return all_reduce_max(arenas);
}

/// One rank's arenas in memory of backend `b`: its master arena uploaded, its scale
/// arena poisoned, and (staged, or when no shared planes are given) its own poisoned
/// data arenas.
struct RankRun {
  shardopt::Backend backend;
  shardopt::DeviceBuffer master, scales, data_row, data_col;
  std::uint8_t* row_base = nullptr;  // the data arenas it writes into
  std::uint8_t* col_base = nullptr;
  std::int64_t data_bytes = 0;

  RankRun(shardopt::Backend b, const ShardList& list, const RankLayout& rl, std::uint8_t* shared_row = nullptr,
          std::uint8_t* shared_col = nullptr)
      : backend(b) {
    master = upload(b, rl.master_arena);
    scales = upload(b, list.poisoned_scales());
    data_bytes = rl.data_bytes;
    if (shared_row != nullptr && !rl.staged) {
      row_base = shared_row;
      col_base = shared_col;
    } else {
      const std::vector<std::uint8_t> poison(static_cast<std::size_t>(rl.data_bytes), kPoison);
      data_row = upload(b, poison);
      data_col = upload(b, poison);
      row_base = data_row.as<std::uint8_t>();
      col_base = data_col.as<std::uint8_t>();
    }
  }
  std::vector<shardopt::Mxfp8ShardTensor> tensors(const ShardList& list, const RankLayout& rl) const {
    return shard_tensors(list, rl, master.as<float>(), scales.as<std::uint8_t>(), row_base, col_base);
  }
  std::vector<std::uint8_t> get_scales() const { return download<std::uint8_t>(backend, scales, scales.bytes()); }
  void put_scales(const std::vector<std::uint8_t>& v) const { put(scales.data(), v); }
  void put_master(const std::vector<float>& v) const { put(master.data(), v); }
  DataArenas get_data() const {
    DataArenas a{std::vector<std::uint8_t>(static_cast<std::size_t>(data_bytes)),
                 std::vector<std::uint8_t>(static_cast<std::size_t>(data_bytes))};
    shardopt::test::bytes_to_host(backend, a.row.data(), row_base, a.row.size());
    shardopt::test::bytes_to_host(backend, a.col.data(), col_base, a.col.size());
    return a;
  }
  void poison_data() const {
    const std::vector<std::uint8_t> poison(static_cast<std::size_t>(data_bytes), kPoison);
    put(row_base, poison);
    put(col_base, poison);
  }
  template <class T>
  void put(void* dst, const std::vector<T>& v) const {
    shardopt::test::from_host(backend, dst, v);
  }
};

/// What run_protocol saw.
struct ProtocolResult {
  std::vector<std::vector<std::uint8_t>> partial;  // each rank's scale arena after phase 1
  std::vector<std::uint8_t> combined;              // their Max
  std::vector<DataArenas> after_rank;  // the data arenas after rank r's phase 2 (shared: cumulative)
  std::vector<DataArenas> after_owned;  // Passes::Owned: ... after rank r's phase 1 (shared: cumulative)
  std::vector<std::int64_t> tiles, numel, rest_tiles;  // each rank's batch's accessors
  std::vector<std::size_t> spans;
  bool operator==(const ProtocolResult&) const = default;
};

/// The two ways to run scheme A's phases: Split (mxfp8_partial_scales_batch, then
/// quantize_mxfp8_shard_data_batch) or Owned (quantize_mxfp8_shard_owned_batch, then
/// quantize_mxfp8_shard_rest_batch).
enum class Passes { Split, Owned };

/// Simulates the ranks of `ranks` on backend `b` with one Mxfp8ShardBatch each: phase 1
/// on every rank, the Max all-reduce (on the host) written back into every rank's scale
/// arena, phase 2 on every rank in order. Ranks that are not staged share one pair of
/// data planes. `reversed`: each batch lists the tensors in reverse order.
inline ProtocolResult run_protocol(shardopt::Backend b, const ShardList& list, const std::vector<RankLayout>& ranks,
                                   bool reversed = false, Passes scheme = Passes::Split) {
  const std::vector<std::uint8_t> poison(static_cast<std::size_t>(list.data_bytes), kPoison);
  const shardopt::DeviceBuffer shared_row = upload(b, poison), shared_col = upload(b, poison);
  std::vector<RankRun> runs;
  std::vector<shardopt::Mxfp8ShardBatch> batches;
  ProtocolResult res;
  for (const RankLayout& rl : ranks) {
    runs.emplace_back(b, list, rl, shared_row.as<std::uint8_t>(), shared_col.as<std::uint8_t>());
    auto tensors = runs.back().tensors(list, rl);
    if (reversed) std::reverse(tensors.begin(), tensors.end());
    batches.emplace_back(tensors, b);
    res.tiles.push_back(batches.back().tiles());
    res.numel.push_back(batches.back().numel());
    res.spans.push_back(batches.back().scale_spans());
    res.rest_tiles.push_back(batches.back().rest_tiles());
  }
  const bool owned = scheme == Passes::Owned;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (owned) {
      shardopt::quantize_mxfp8_shard_owned_batch(batches[r], b, nullptr);
      res.after_owned.push_back(runs[r].get_data());
    } else {
      shardopt::mxfp8_partial_scales_batch(batches[r], b, nullptr);
    }
    res.partial.push_back(runs[r].get_scales());
  }
  res.combined = max_of(res.partial);
  for (const RankRun& run : runs) run.put_scales(res.combined);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (owned) {
      shardopt::quantize_mxfp8_shard_rest_batch(batches[r], b, nullptr);
    } else {
      shardopt::quantize_mxfp8_shard_data_batch(batches[r], b, nullptr);
    }
    res.after_rank.push_back(runs[r].get_data());
  }
  return res;
}

/// The oracle's owned elements of `range`: the union of the tile rows (32 rows of one
/// member, all its columns, fewer rows at a member's end) lying wholly inside it, as
/// [begin, end) (contiguous; empty: begin == end). Also counts in *rest the tiles of
/// the tile rows the range touches but does not hold wholly.
inline shardopt::Range owned_elements(const shardopt::Mxfp8Shape& s, shardopt::Range range, std::int64_t* rest = nullptr) {
  shardopt::Range out{range.begin, range.begin};
  bool any = false;
  std::int64_t rest_rows = 0;
  for (std::int64_t g = 0; g < s.members; ++g)
    for (std::int64_t r0 = 0; r0 < s.rows; r0 += 32) {
      const std::int64_t first = (g * s.rows + r0) * s.cols, end = (g * s.rows + std::min(s.rows, r0 + 32)) * s.cols;
      const bool touched = range.size() > 0 && range.begin < end && first < range.end;
      if (range.begin <= first && end <= range.end) {
        if (!any) out.begin = first;
        out.end = end;
        any = true;
      } else if (touched) {
        ++rest_rows;
      }
    }
  if (rest != nullptr) *rest = rest_rows * ((s.cols + 127) / 128);
  return out;
}

/// The oracle of data arenas of `bytes` bytes into which the ranks `full` ran both
/// phases and the ranks `owned_only` ran the owned pass only (Passes::Owned): the
/// whole-tensor bytes at the former's ranges and the latter's owned elements, poison
/// everywhere else.
inline DataArenas expected_owned_data(const ShardList& list, const std::vector<const RankLayout*>& full,
                                      const std::vector<const RankLayout*>& owned_only, std::int64_t bytes) {
  DataArenas a = expected_data(list, full, bytes);
  for (const RankLayout* rl : owned_only)
    for (std::size_t t = 0; t < list.size(); ++t) {
      const shardopt::Range o = owned_elements(list.shapes[t], rl->ranges[t]);
      for (std::int64_t i = o.begin; i < o.end; ++i) {
        a.row[static_cast<std::size_t>(rl->data_at[t] + i)] = list.want[t].data_row[static_cast<std::size_t>(i)];
        a.col[static_cast<std::size_t>(rl->data_at[t] + i)] = list.want[t].data_col[static_cast<std::size_t>(i)];
      }
    }
  return a;
}

/// The data arenas of a Passes::Owned run against the oracle: after rank r's owned pass
/// (staged: its own whole tile rows; shared: those of ranks 0..r), after its rest pass
/// (staged: its range; shared: every rank's whole tile rows and the ranges of ranks
/// 0..r), and each rank's rest_tiles().
inline std::string check_owned_against_oracle(const ShardList& list, const std::vector<RankLayout>& ranks,
                                              const ProtocolResult& got) {
  std::string out;
  std::vector<const RankLayout*> shared;
  for (const RankLayout& rl : ranks)
    if (!rl.staged) shared.push_back(&rl);
  std::vector<const RankLayout*> owned, done;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const RankLayout* rl = &ranks[r];
    std::vector<const RankLayout*> mine{rl};
    if (!rl->staged) owned.push_back(rl);
    const std::string d1 = data_diff(got.after_owned[r], expected_owned_data(list, {}, rl->staged ? mine : owned, rl->data_bytes));
    if (!d1.empty()) out += "after rank " + std::to_string(r) + " owned pass: " + d1;
    if (!rl->staged) done.push_back(rl);
    const std::string d2 = data_diff(got.after_rank[r], rl->staged ? expected_data(list, mine, rl->data_bytes)
                                                                   : expected_owned_data(list, done, shared, rl->data_bytes));
    if (!d2.empty()) out += "after rank " + std::to_string(r) + " rest pass: " + d2;
    std::int64_t rest = 0;
    for (std::size_t t = 0; t < list.size(); ++t) {
      std::int64_t n = 0;
      owned_elements(list.shapes[t], rl->ranges[t], &n);
      rest += n;
    }
    if (got.rest_tiles[r] != rest)
      out += "rank " + std::to_string(r) + ": rest_tiles() " + std::to_string(got.rest_tiles[r]) + ", expected " +
             std::to_string(rest) + "; ";
  }
  return out;
}

/// Compares a protocol run with the oracle; returns "" when every arena matches. A run
/// of Passes::Owned is also checked after each rank's owned pass (the data of its whole
/// tile rows only) and for rest_tiles().
inline std::string check_against_oracle(const ShardList& list, const std::vector<RankLayout>& ranks,
                                        const ProtocolResult& got) {
  std::string out;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const std::string d = byte_diff("partial scales", got.partial[r], expected_partial_scales(list, ranks[r]));
    if (!d.empty()) out += "rank " + std::to_string(r) + " phase 1: " + d;
    std::int64_t tiles = 0;
    for (std::size_t t = 0; t < list.size(); ++t) tiles += range_tiles(list.shapes[t], ranks[r].ranges[t]);
    if (got.numel[r] != ranks[r].numel())
      out += "rank " + std::to_string(r) + ": numel() " + std::to_string(got.numel[r]) + ", expected " +
             std::to_string(ranks[r].numel()) + "; ";
    if (got.tiles[r] != tiles)
      out += "rank " + std::to_string(r) + ": tiles() " + std::to_string(got.tiles[r]) + ", expected " +
             std::to_string(tiles) + "; ";
  }
  out += byte_diff("combined scales", got.combined, list.expected_scales());
  if (!got.after_owned.empty()) return out + check_owned_against_oracle(list, ranks, got);
  std::vector<const RankLayout*> done;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].staged) done = {&ranks[r]};
    else done.push_back(&ranks[r]);
    const std::string d = data_diff(got.after_rank[r], expected_data(list, done, ranks[r].data_bytes));
    if (!d.empty()) out += "after rank " + std::to_string(r) + " phase 2: " + d;
  }
  return out;
}

/// Kernel run vs host-twin run of the same protocol; "" when bitwise equal.
inline std::string protocol_diff(const ProtocolResult& got, const ProtocolResult& want) {
  std::string out;
  if (got.partial.size() != want.partial.size()) return "different rank counts";
  for (std::size_t r = 0; r < got.partial.size(); ++r) {
    const std::string a = byte_diff("partial scales", got.partial[r], want.partial[r]);
    const std::string d = data_diff(got.after_rank[r], want.after_rank[r]);
    if (!a.empty()) out += "rank " + std::to_string(r) + " phase 1: " + a;
    if (!d.empty()) out += "rank " + std::to_string(r) + " phase 2: " + d;
    if (r < got.after_owned.size() && r < want.after_owned.size()) {
      const std::string o = data_diff(got.after_owned[r], want.after_owned[r]);
      if (!o.empty()) out += "rank " + std::to_string(r) + " owned pass: " + o;
    }
  }
  if (got.after_owned.size() != want.after_owned.size()) out += "different schemes; ";
  if (got.rest_tiles != want.rest_tiles) out += "rest_tiles() differ; ";
  if (got.tiles != want.tiles) out += "tiles() differ; ";
  if (got.numel != want.numel) out += "numel() differ; ";
  if (got.spans != want.spans) out += "scale_spans() differ; ";
  return out;
}

/// Per-tensor rank boundaries: `world` + 1 offsets for every tensor of the list.
/// mode 0: even split shifted by a random amount in [-40, 40] per cut; 1: random cuts
/// (empty ranges and pieces smaller than a block included); 2: one random rank owns
/// the whole tensor, the others nothing.
inline std::vector<std::vector<std::int64_t>> list_bounds(const ShardList& list, int world, int mode, std::mt19937& rng) {
  std::vector<std::vector<std::int64_t>> out;
  for (std::size_t t = 0; t < list.size(); ++t) {
    const std::int64_t n = list.shapes[t].numel();
    const int m = mode == 3 ? static_cast<int>(t % 3) : mode;  // 3: a mix of the three
    if (m == 0) {
      out.push_back(even_bounds(n, world, 0));
      for (int r = 1; r < world; ++r)
        out.back()[static_cast<std::size_t>(r)] = std::clamp<std::int64_t>(
            out.back()[static_cast<std::size_t>(r)] + static_cast<std::int64_t>(rng() % 81) - 40, 0, n);
      std::sort(out.back().begin(), out.back().end());
    } else if (m == 1) {
      out.push_back(random_bounds(n, world, rng));
    } else {
      const int owner = static_cast<int>(rng() % static_cast<std::uint32_t>(world));
      std::vector<std::int64_t> b(static_cast<std::size_t>(world) + 1, 0);
      for (int r = owner + 1; r <= world; ++r) b[static_cast<std::size_t>(r)] = n;
      out.push_back(b);
    }
  }
  return out;
}

/// Mixed shapes: odd widths (45, 129, 33, 7), widths that are no multiple of 4 or 8,
/// rows that are no multiple of 32, grouped tensors of 3 and 2 members, 1 x 1 and
/// 2 x 3, one of a few hundred by a few hundred, and widths of whole 128-column tiles
/// (with whole and partial 32-row tiles) for the kernels' whole-tile paths.
inline std::vector<shardopt::Mxfp8Shape> mixed_shard_shapes() {
  return {{1, 37, 45},   {1, 1, 1},    {1, 2, 3},   {3, 40, 72},  {3, 33, 129}, {1, 70, 33},  {1, 300, 260},
          {1, 64, 256},  {2, 5, 130},  {1, 96, 129}, {1, 31, 7},  {1, 200, 42}, {2, 96, 384}, {1, 100, 512}};
}

/// `n` small shapes (most of them one tile; some grouped) from many_small_list: with
/// random ranges, many entries of the batch have no tiles at all, and a grid stride
/// jumps over many tensors.
inline std::vector<shardopt::Mxfp8Shape> many_small_shapes(int n, std::uint32_t seed) {
  std::vector<shardopt::Mxfp8Shape> out;
  for (const ListItem& it : many_small_list(n, seed)) out.push_back(it.shape);
  return out;
}

}  // namespace mxfp8_test
