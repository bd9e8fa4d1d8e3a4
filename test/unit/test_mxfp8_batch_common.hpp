// test_mxfp8_batch_common.hpp - lists of MXFP8 tensors laid out in shared arenas, for
// the multi-tensor quantize tests of the host suite (test/unit/test_mxfp8_batch.cpp)
// and the GPU suite (test/gpu/test_mxfp8_batch_gpu.cpp).
//
// Every tensor of a list lives in five arenas (bf16 sources, the two data planes, the
// two scale tensors) at its own offsets, with gaps between tensors (and, for
// "scattered" grouped tensors, between members, which sit in reverse order and are
// found through a member table). Sources can be shifted off 16-byte alignment. Gaps of
// the source arena hold NaN and the output arenas start poisoned, so a read or a write
// outside a tensor shows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shardopt/mxfp8.hpp"
#include "shardopt/presets.hpp"
#include "unit/test_mxfp8_common.hpp"

namespace mxfp8_test {

/// One tensor of a test list.
struct ListItem {
  shardopt::Mxfp8Shape shape;
  bool scattered = false;  ///< members placed through a member table (reverse order, gaps)
  int src_shift = 0;       ///< extra elements before the source (breaks 16-byte alignment)
  int out_shift = 0;       ///< extra bytes before each data plane
};

/// Where a tensor lies in the arenas; member offsets are relative to the tensor's bases.
struct Placement {
  std::int64_t src = 0, data = 0, scale_row = 0, scale_col = 0;  // bases (elements / bytes)
  std::int64_t member_index = -1;  // first entry in the member-table arena; -1: contiguous
  std::vector<shardopt::Mxfp8Member> members;  // offsets of each member (always filled)
};

/// The five output arenas (host copies).
struct Arenas {
  std::vector<std::uint8_t> data_row, data_col, scale_row, scale_col;
  bool operator==(const Arenas&) const = default;
};

inline std::int64_t round_up(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }

/// A list of tensors, their placements and their source values.
struct TensorList {
  std::vector<ListItem> items;
  std::vector<Placement> at;
  std::int64_t src_elems = 0, data_bytes = 0, scale_row_bytes = 0, scale_col_bytes = 0;
  std::vector<shardopt::Mxfp8Member> member_arena;  // tables of the scattered tensors
  std::vector<std::uint16_t> src;                   // the source arena

  explicit TensorList(std::vector<ListItem> list) : items(std::move(list)) {
    for (const ListItem& it : items) {
      const shardopt::Mxfp8Shape& s = it.shape;
      Placement p;
      src_elems = round_up(src_elems, 64) + 8 + it.src_shift;  // a gap, then the shift
      data_bytes = round_up(data_bytes, 64) + 16 + it.out_shift;
      scale_row_bytes = round_up(scale_row_bytes, 16) + 3;
      scale_col_bytes = round_up(scale_col_bytes, 16) + 5;
      p.src = src_elems;
      p.data = data_bytes;
      p.scale_row = scale_row_bytes;
      p.scale_col = scale_col_bytes;
      const shardopt::Mxfp8Shape m{1, s.rows, s.cols};
      p.members.resize(static_cast<std::size_t>(s.members));
      std::int64_t e = 0, sr = 0, sc = 0;  // extents relative to the bases
      if (it.scattered) {
        // Both data planes and the source share element offsets; members in reverse
        // order with gaps, like discretely registered members placed by a layout.
        for (std::int64_t g = s.members - 1; g >= 0; --g) {
          e = round_up(e, 64) + 8;
          p.members[static_cast<std::size_t>(g)] = {e, sr + 3, sc + 5};
          e += m.numel();
          sr += 3 + m.scale_row_numel();
          sc += 5 + m.scale_col_numel();
        }
        p.member_index = static_cast<std::int64_t>(member_arena.size());
        member_arena.insert(member_arena.end(), p.members.begin(), p.members.end());
      } else {
        p.members = shardopt::mxfp8_contiguous_members(s);
        e = s.numel();
        sr = s.scale_row_numel();
        sc = s.scale_col_numel();
      }
      src_elems += e;
      data_bytes += e;
      scale_row_bytes += sr;
      scale_col_bytes += sc;
      at.push_back(std::move(p));
    }
    src_elems += 8;
    data_bytes += 16;
    src.assign(static_cast<std::size_t>(src_elems), 0x7FC0);  // NaN in every gap
  }

  std::size_t size() const { return items.size(); }

  /// Writes the contiguous values x of tensor i into the source arena.
  void set_source(std::size_t i, const std::vector<std::uint16_t>& x) {
    const shardopt::Mxfp8Shape& s = items[i].shape;
    const std::int64_t n = s.rows * s.cols;
    for (std::int64_t g = 0; g < s.members; ++g)
      std::copy(x.begin() + g * n, x.begin() + (g + 1) * n,
                src.begin() + at[i].src + at[i].members[static_cast<std::size_t>(g)].element_offset);
  }

  /// Fills every tensor with fast_random_bf16 data (threads over tensors).
  void fill_random(std::uint64_t seed, double special) {
    parallel_for(size(), [&](std::size_t i) {
      const shardopt::Mxfp8Shape& s = items[i].shape;
      set_source(i, fast_random_bf16(s.numel(), s.cols, seed + i, special));
    });
  }

  /// The contiguous values of tensor i, read back from the source arena.
  std::vector<std::uint16_t> source(std::size_t i) const {
    const shardopt::Mxfp8Shape& s = items[i].shape;
    const std::int64_t n = s.rows * s.cols;
    std::vector<std::uint16_t> x(static_cast<std::size_t>(s.numel()));
    for (std::int64_t g = 0; g < s.members; ++g) {
      const auto first = src.begin() + at[i].src + at[i].members[static_cast<std::size_t>(g)].element_offset;
      std::copy(first, first + n, x.begin() + g * n);
    }
    return x;
  }

  /// Poisoned output arenas.
  Arenas poisoned_arenas() const {
    return {std::vector<std::uint8_t>(static_cast<std::size_t>(data_bytes), kPoison),
            std::vector<std::uint8_t>(static_cast<std::size_t>(data_bytes), kPoison),
            std::vector<std::uint8_t>(static_cast<std::size_t>(scale_row_bytes), kPoison),
            std::vector<std::uint8_t>(static_cast<std::size_t>(scale_col_bytes), kPoison)};
  }

  /// The tensors with the arenas at the given base pointers (any backend's memory).
  std::vector<shardopt::Mxfp8Tensor> tensors(const std::uint16_t* src_base, std::uint8_t* data_row,
                                             std::uint8_t* data_col, std::uint8_t* scale_row, std::uint8_t* scale_col,
                                             const shardopt::Mxfp8Member* member_base) const {
    std::vector<shardopt::Mxfp8Tensor> out;
    for (std::size_t i = 0; i < size(); ++i) {
      const Placement& p = at[i];
      shardopt::Mxfp8Tensor t;
      t.shape = items[i].shape;
      t.src = src_base + p.src;
      t.out = {data_row + p.data, scale_row + p.scale_row, data_col + p.data, scale_col + p.scale_col};
      t.members = p.member_index >= 0 ? member_base + p.member_index : nullptr;
      out.push_back(t);
    }
    return out;
  }

  /// Tensor i's four outputs gathered from arenas into contiguous [G, rows, cols] order.
  mxfp8_ref::Quantized extract(const Arenas& a, std::size_t i) const {
    const shardopt::Mxfp8Shape& s = items[i].shape;
    const shardopt::Mxfp8Shape m{1, s.rows, s.cols};
    const Placement& p = at[i];
    mxfp8_ref::Quantized q;
    for (std::int64_t g = 0; g < s.members; ++g) {
      const shardopt::Mxfp8Member& mm = p.members[static_cast<std::size_t>(g)];
      auto take = [](std::vector<std::uint8_t>& dst, const std::vector<std::uint8_t>& arena, std::int64_t at_,
                     std::int64_t n) { dst.insert(dst.end(), arena.begin() + at_, arena.begin() + at_ + n); };
      take(q.data_row, a.data_row, p.data + mm.element_offset, m.numel());
      take(q.data_col, a.data_col, p.data + mm.element_offset, m.numel());
      take(q.scale_row, a.scale_row, p.scale_row + mm.scale_row_offset, m.scale_row_numel());
      take(q.scale_col, a.scale_col, p.scale_col + mm.scale_col_offset, m.scale_col_numel());
    }
    return q;
  }

  /// Poisoned arenas with the oracle's quantization of every tensor written in place.
  Arenas oracle_arenas() const {
    Arenas a = poisoned_arenas();
    for (std::size_t i = 0; i < size(); ++i) {
      const shardopt::Mxfp8Shape& s = items[i].shape;
      const shardopt::Mxfp8Shape m{1, s.rows, s.cols};
      const mxfp8_ref::Quantized q = reference(s, source(i));
      const Placement& p = at[i];
      for (std::int64_t g = 0; g < s.members; ++g) {
        const shardopt::Mxfp8Member& mm = p.members[static_cast<std::size_t>(g)];
        auto put = [](std::vector<std::uint8_t>& arena, std::int64_t at_, const std::vector<std::uint8_t>& v,
                      std::int64_t first, std::int64_t n) {
          std::copy(v.begin() + first, v.begin() + first + n, arena.begin() + at_);
        };
        put(a.data_row, p.data + mm.element_offset, q.data_row, g * m.numel(), m.numel());
        put(a.data_col, p.data + mm.element_offset, q.data_col, g * m.numel(), m.numel());
        put(a.scale_row, p.scale_row + mm.scale_row_offset, q.scale_row, g * m.scale_row_numel(), m.scale_row_numel());
        put(a.scale_col, p.scale_col + mm.scale_col_offset, q.scale_col, g * m.scale_col_numel(), m.scale_col_numel());
      }
    }
    return a;
  }

  /// Tiles of 32 x 128 elements of every tensor (counted here, independently).
  std::int64_t tiles() const {
    std::int64_t n = 0;
    for (const ListItem& it : items)
      n += it.shape.members * ((it.shape.rows + 31) / 32) * ((it.shape.cols + 127) / 128);
    return n;
  }

  std::int64_t numel() const {
    std::int64_t n = 0;
    for (const ListItem& it : items) n += it.shape.numel();
    return n;
  }

  /// fn(i) for every i < n on the machine's threads.
  template <class Fn>
  static void parallel_for(std::size_t n, Fn&& fn) {
    const std::size_t workers = std::max<std::size_t>(1, std::min<std::size_t>(n, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (std::size_t w = 0; w < workers; ++w)
      pool.emplace_back([&, w] {
        for (std::size_t i = w; i < n; i += workers) fn(i);
      });
    for (auto& t : pool) t.join();
  }
};

/// Which plane of two arenas differs first, and where ("equal" when none).
inline std::string arena_diff(const Arenas& a, const Arenas& b) {
  std::string out;
  auto one = [&](const char* name, const std::vector<std::uint8_t>& x, const std::vector<std::uint8_t>& y) {
    if (x.size() != y.size()) {
      out += std::string(name) + " sizes differ; ";
      return;
    }
    const auto m = std::mismatch(x.begin(), x.end(), y.begin());
    if (m.first == x.end()) return;
    char buf[128];
    std::snprintf(buf, sizeof buf, "%s differs first at byte %td (0x%02x vs 0x%02x); ", name, m.first - x.begin(),
                  *m.first, *m.second);
    out += buf;
  };
  one("data_row", a.data_row, b.data_row);
  one("data_col", a.data_col, b.data_col);
  one("scale_row", a.scale_row, b.scale_row);
  one("scale_col", a.scale_col, b.scale_col);
  return out.empty() ? "equal" : out;
}

/// A list's arenas in memory of backend `b`: sources and member tables uploaded,
/// outputs poisoned. (Synchronous copies on the backend's default stream.)
struct ListRun {
  shardopt::Backend backend;
  shardopt::DeviceBuffer src, data_row, data_col, scale_row, scale_col, members;
  ListRun(shardopt::Backend b, const TensorList& list) : backend(b) {
    src = upload(b, list.src);
    members = upload(b, list.member_arena);
    const Arenas p = list.poisoned_arenas();
    data_row = upload(b, p.data_row);
    data_col = upload(b, p.data_col);
    scale_row = upload(b, p.scale_row);
    scale_col = upload(b, p.scale_col);
  }
  /// Copies the list's source arena in again (the buffers stay where they are).
  void upload_sources(const TensorList& list) const { put(src, list.src); }
  /// Poisons the output arenas in place.
  void poison(const TensorList& list) const {
    const Arenas p = list.poisoned_arenas();
    put(data_row, p.data_row);
    put(data_col, p.data_col);
    put(scale_row, p.scale_row);
    put(scale_col, p.scale_col);
  }
  template <class T>
  void put(const shardopt::DeviceBuffer& dst, const std::vector<T>& v) const {
    shardopt::test::from_host(backend, dst.data(), v);
  }
  std::vector<shardopt::Mxfp8Tensor> tensors(const TensorList& list) const {
    return list.tensors(src.as<std::uint16_t>(), data_row.as<std::uint8_t>(), data_col.as<std::uint8_t>(),
                        scale_row.as<std::uint8_t>(), scale_col.as<std::uint8_t>(),
                        members.as<shardopt::Mxfp8Member>());
  }
  /// The output arenas, after the work queued on the backend's default stream.
  Arenas get(const TensorList& list) const {
    return {download<std::uint8_t>(backend, data_row, static_cast<std::size_t>(list.data_bytes)),
            download<std::uint8_t>(backend, data_col, static_cast<std::size_t>(list.data_bytes)),
            download<std::uint8_t>(backend, scale_row, static_cast<std::size_t>(list.scale_row_bytes)),
            download<std::uint8_t>(backend, scale_col, static_cast<std::size_t>(list.scale_col_bytes))};
  }
  /// One quantize_mxfp8 call per tensor.
  void quantize_each(const TensorList& list, shardopt::Stream stream = nullptr) const {
    for (const shardopt::Mxfp8Tensor& t : tensors(list))
      shardopt::quantize_mxfp8(t.shape, t.src, t.out, nullptr, backend, stream, t.members);
  }
};

/// The host twin of a batch over `list`, in host memory: quantize_mxfp8_batch on the
/// host backend, the list split round-robin into one batch per thread (the tensors'
/// outputs are disjoint, so the bytes are those of one batch of the whole list).
inline Arenas host_twin(const TensorList& list) {
  Arenas out = list.poisoned_arenas();
  const auto tensors = list.tensors(list.src.data(), out.data_row.data(), out.data_col.data(), out.scale_row.data(),
                                    out.scale_col.data(), list.member_arena.data());
  const std::size_t parts =
      std::max<std::size_t>(1, std::min<std::size_t>(tensors.size(), std::thread::hardware_concurrency()));
  std::vector<std::vector<shardopt::Mxfp8Tensor>> sub(parts);
  for (std::size_t i = 0; i < tensors.size(); ++i) sub[i % parts].push_back(tensors[i]);
  TensorList::parallel_for(parts, [&](std::size_t k) {
    const shardopt::Mxfp8Batch batch(sub[k], shardopt::Backend::Host);
    shardopt::quantize_mxfp8_batch(batch, nullptr, shardopt::Backend::Host, nullptr);
  });
  return out;
}

/// The list of a model's 2-D weights (presets::transformer), plain tensors.
inline std::vector<ListItem> model_list(const shardopt::presets::TransformerShape& shape) {
  std::vector<ListItem> out;
  for (const shardopt::ParamSpec& p : shardopt::presets::transformer(shape))
    if (p.shape.size() >= 2) out.push_back({shardopt::Mxfp8Shape::of(p)});
  return out;
}

/// Mixed shapes: partial blocks and tiles, 1 x 1, grouped (contiguous and scattered),
/// sources off 16-byte alignment, data planes off by a byte, wide and tall.
inline std::vector<ListItem> mixed_list() {
  return {{{1, 3, 5}},
          {{1, 1, 1}, false, 1},
          {{1, 33, 31}, false, 3},
          {{2, 40, 72}},
          {{3, 33, 130}, true},
          {{1, 64, 256}},
          {{1, 64, 256}, false, 0, 1},
          {{1, 130, 136}, false, 8},
          {{4, 17, 130}, true, 2, 3},
          {{1, 96, 1000}},
          {{1, 7, 300}, false, 5},
          {{1, 200, 40}}};
}

/// `n` small tensors of random shapes (most of them a single tile), some grouped and
/// some misaligned: a list whose tiles jump over several tensors per grid stride.
inline std::vector<ListItem> many_small_list(int n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<ListItem> out;
  for (int i = 0; i < n; ++i) {
    ListItem it;
    const std::int64_t members = 1 + static_cast<std::int64_t>(rng() % 4 == 0 ? rng() % 3 : 0);
    const std::int64_t rows = 1 + static_cast<std::int64_t>(rng() % 40);
    it.shape = {members, rows, 1 + static_cast<std::int64_t>(rng() % 200)};
    it.scattered = it.shape.members > 1 && rng() % 2 == 0;
    it.src_shift = static_cast<int>(rng() % 4 == 0 ? rng() % 8 : 0);
    out.push_back(it);
  }
  return out;
}

}  // namespace mxfp8_test
