// byte_copies_cases.hpp - the landing copy table (src/kernels/common/byte_copies.*): pieces of
// at most kBytePieceMax bytes that cover every copy exactly, run in one launch on either
// backend; the result is checked against plain memcpy into a host image. Shared by
// test/unit (host twin) and test/gpu (the CUDA kernel, co-aligned and misaligned pieces).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/device_copy.hpp"
#include "core/memory.hpp"
#include "kernels/common/byte_copies.hpp"
#include "shardopt/backend.hpp"

namespace shardopt::test {

/// Runs `table` (uploaded to the backend) on `dst` (n bytes) and counts the bytes that
/// then differ from `want`.
inline std::size_t run_pieces_and_count_diffs(Backend b, const std::vector<kernels::BytePiece>& table, void* dst,
                                              const std::vector<std::uint8_t>& want) {
  DeviceBuffer dtable(b, table.size() * sizeof(kernels::BytePiece));
  bytes_to_device(b, dtable.data(), table.data(), dtable.bytes());
  kernels::copy_pieces(dtable.as<kernels::BytePiece>(), static_cast<std::int64_t>(table.size()), b, nullptr);
  std::vector<std::uint8_t> got(want.size());
  bytes_to_host(b, got.data(), dst, want.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < want.size(); ++i) differ += got[i] != want[i] ? 1 : 0;
  return differ;
}

/// Random non-overlapping copies from a source arena into a destination arena: lengths
/// from 0 to several pieces, source and destination offsets with every alignment
/// modulo 16 (equal and different); untouched destination bytes keep their sentinel.
inline void case_copy_pieces_match_memcpy(Backend b, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const std::size_t arena = std::size_t{3} << 20;
  std::vector<std::uint8_t> src(arena), dst_want(arena, 0x5A);
  for (auto& x : src) x = static_cast<std::uint8_t>(rng());
  DeviceBuffer dsrc(b, arena), ddst(b, arena);
  bytes_to_device(b, dsrc.data(), src.data(), arena);
  bytes_to_device(b, ddst.data(), dst_want.data(), arena);
  std::vector<kernels::BytePiece> table;
  std::size_t cursor_src = 0, cursor_dst = 0;
  const std::int64_t lengths[] = {0, 1, 15, 16, 17, 31, 100, 4096, 65535, 65536, 65537, 200001};
  for (int k = 0; cursor_src + 300000 < arena && cursor_dst + 300000 < arena; ++k) {
    const std::int64_t n = lengths[static_cast<std::size_t>(k) % (sizeof lengths / sizeof lengths[0])];
    // Even k: source and destination equal modulo 16 (the vector path); odd k: not.
    const std::size_t s = cursor_src + rng() % 16;
    const std::size_t shift = k % 2 == 0 ? 0 : 1 + rng() % 15;
    const std::size_t d = (cursor_dst + 15) / 16 * 16 + (s + shift) % 16;
    kernels::split_copy(table, dsrc.as<std::uint8_t>() + s, ddst.as<std::uint8_t>() + d, n);
    std::memcpy(dst_want.data() + d, src.data() + s, static_cast<std::size_t>(n));
    cursor_src = s + static_cast<std::size_t>(n) + 1;
    cursor_dst = d + static_cast<std::size_t>(n) + 1;
  }
  for (const auto& p : table) {
    EXPECT_GT(p.bytes, 0);
    EXPECT_LE(p.bytes, kernels::kBytePieceMax);
  }
  EXPECT_EQ(run_pieces_and_count_diffs(b, table, ddst.data(), dst_want), 0u) << table.size() << " pieces";
}

/// Pieces with `also` (the bytes two ranks share at an odd NVFP4 boundary) write the OR
/// of their two sources, mixed in one table with plain copies of the neighbouring bytes;
/// pieces without `also` stay plain copies.
inline void case_or_pieces(Backend b) {
  constexpr std::size_t n = 4096;
  std::vector<std::uint8_t> lo(n), hi(n), want(n, 0x5A);
  for (std::size_t i = 0; i < n; ++i) {
    lo[i] = static_cast<std::uint8_t>((i * 7 + 3) & 0x0F);
    hi[i] = static_cast<std::uint8_t>(((i * 13 + 5) & 0x0F) << 4);
  }
  DeviceBuffer dlo(b, n), dhi(b, n), ddst(b, n);
  bytes_to_device(b, dlo.data(), lo.data(), n);
  bytes_to_device(b, dhi.data(), hi.data(), n);
  bytes_to_device(b, ddst.data(), want.data(), n);
  std::vector<kernels::BytePiece> table;
  // Alternating: 1 shared byte (OR), a run of plain bytes from `lo`, 3 shared bytes.
  for (std::size_t at = 0; at + 40 < n; at += 40) {
    table.push_back({dlo.as<std::uint8_t>() + at, ddst.as<std::uint8_t>() + at, 1, dhi.as<std::uint8_t>() + at});
    want[at] = static_cast<std::uint8_t>(lo[at] | hi[at]);
    kernels::split_copy(table, dlo.as<std::uint8_t>() + at + 1, ddst.as<std::uint8_t>() + at + 1, 30);
    for (std::size_t k = 1; k < 31; ++k) want[at + k] = lo[at + k];
    table.push_back({dhi.as<std::uint8_t>() + at + 33, ddst.as<std::uint8_t>() + at + 33, 3, dlo.as<std::uint8_t>() + at + 33});
    for (std::size_t k = 33; k < 36; ++k) want[at + k] = static_cast<std::uint8_t>(lo[at + k] | hi[at + k]);
  }
  EXPECT_EQ(run_pieces_and_count_diffs(b, table, ddst.data(), want), 0u);
}

}  // namespace shardopt::test
