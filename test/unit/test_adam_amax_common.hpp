// test_adam_amax_common.hpp - the fused Adam pass that emits the NVFP4 partial amaxes
// (issue 29), on a backend: W simulated ranks (1-4) each run it over their chunks of a
// set of NVFP4 parameters (tiled and odd shapes, grouped members, a block row wider than
// the kernel's shared slots), and every rank's u32 buffers must equal (1) the amaxes a
// plain loop in this file computes from the new master and (2) nvfp4_partial_amax of
// that master, bitwise; master and moments must equal the pass without emission. NaN,
// +-Inf, -0, subnormal and a finite value that rounds to bf16 Inf are among the masters;
// a found-inf step must leave master and moments alone and emit the unchanged master's
// amaxes. Shared by the host suite (test_adam_amax.cpp) and the GPU one.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/adam/adam_amax.hpp"
#include "shardopt/error.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/nvfp4.hpp"
#include "common/back_to_back.hpp"
#include "unit/test_mxfp8_common.hpp"

namespace adam_amax_test {

using shardopt::Backend;
using shardopt::DType;

/// One NVFP4 parameter: `members` members of [rows, cols].
struct Param {
  std::int64_t members, rows, cols;
  std::int64_t member_numel() const { return rows * cols; }
  std::int64_t numel() const { return members * rows * cols; }
  std::int64_t block_cols() const { return (cols + 15) / 16; }
  std::int64_t amax_numel() const { return (rows + 15) / 16 * block_cols() + 1; }
};

/// The oracle's bf16 of an f32 (round to nearest even; NaN stays NaN) and the exchanged
/// amax of it: the bits of the magnitude, 0x7FC00000 for NaN and Inf.
inline std::uint32_t oracle_amax(float x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, 4);
  std::uint32_t h = 0;
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    h = 0x7FC0u;
  } else {
    h = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  }
  const std::uint32_t mag = h & 0x7FFFu;
  return mag >= 0x7F80u ? 0x7FC00000u : mag << 16;
}

/// Per parameter, the u32 entries phase 1 defines for the elements [lo, hi) of the
/// parameter (flat over its members) holding `master` (indexed from lo): per member,
/// the max over its blocks' elements in [lo, hi), then the max over all of them.
inline std::vector<std::uint32_t> oracle_partials(const Param& p, std::int64_t lo, std::int64_t hi,
                                                  const std::vector<float>& master) {
  std::vector<std::uint32_t> out(static_cast<std::size_t>(p.members * p.amax_numel()), 0);
  for (std::int64_t q = lo; q < hi; ++q) {
    const std::int64_t g = q / p.member_numel(), e = q % p.member_numel();
    const std::int64_t r = e / p.cols, c = e % p.cols;
    const std::uint32_t v = oracle_amax(master[static_cast<std::size_t>(q - lo)]);
    auto& blk = out[static_cast<std::size_t>(g * p.amax_numel() + (r / 16) * p.block_cols() + c / 16)];
    auto& all = out[static_cast<std::size_t>(g * p.amax_numel() + p.amax_numel() - 1)];
    blk = std::max(blk, v);
    all = std::max(all, v);
  }
  return out;
}

inline float f32_of(std::uint32_t u) {
  float f = 0;
  std::memcpy(&f, &u, 4);
  return f;
}

/// The parameters: tiled (cols % 16 == 0) and odd shapes, grouped members (odd member
/// sizes make members start mid-run), and a block row of 4096 blocks (cols 65536), which
/// a 64 Ki-element chunk crossing a block-row boundary spans beyond the CUDA kernel's
/// 4096 shared slots.
inline std::vector<Param> params() {
  return {{1, 40, 48}, {3, 17, 32}, {1, 21, 37}, {2, 5, 9}, {1, 8, 2048}, {1, 18, 65536}, {4, 16, 16}};
}

/// Special masters (their gradients are 0 and weight decay 0, so most stay as they
/// are): NaN, +Inf, -Inf, -0 (a whole member of -0), a subnormal, 3.3961e38 (finite,
/// rounds to bf16 Inf) and the largest value that rounds to a finite bf16.
inline void plant_specials(const std::vector<Param>& ps, const std::vector<std::int64_t>& start,
                           std::vector<float>& master, std::vector<float>& grad) {
  auto set = [&](std::size_t p, std::int64_t q, float v) {
    const auto i = static_cast<std::size_t>(start[p] + q);
    master[i] = v;
    grad[i] = 0.0f;
  };
  set(0, 100, std::numeric_limits<float>::quiet_NaN());
  set(1, ps[1].member_numel() + 7, std::numeric_limits<float>::infinity());
  set(2, 300, -std::numeric_limits<float>::infinity());
  for (std::int64_t q = 0; q < ps[3].member_numel(); ++q) set(3, q, -0.0f);
  set(4, 5000, f32_of(0x00000005u));
  set(4, 9000, f32_of(0x7F7F8000u));  // 3.3961e38: bf16 rounds it to Inf
  set(5, 70000, f32_of(0x7F7F7FFFu));  // just below: rounds to the largest finite bf16
  set(6, 3 * 256 + 17, -std::numeric_limits<float>::quiet_NaN());
}

inline void set_array(DType t, std::vector<unsigned char>& bytes, std::size_t i, float f) {
  const std::uint32_t u = shardopt::num::encode(t, f);
  std::memcpy(bytes.data() + i * shardopt::size_of(t), &u, shardopt::size_of(t));
}

/// Runs the case: every rank of `world` (boundaries: `bounds`, W + 1 flat indices over
/// the parameters laid back to back) steps once with emission and once without, then
/// (found_inf) once more with emission on a skipped step.
inline void run_case(Backend b, int world, DType grad_dtype, DType moment_dtype, std::int64_t max_chunk,
                     std::uint32_t seed) {
  using namespace shardopt;
  using mxfp8_test::download;
  using mxfp8_test::upload;
  const std::vector<Param> ps = params();
  const shardopt::test::BackToBack lay = [&] {
    std::vector<std::int64_t> numels;
    for (const Param& p : ps) numels.push_back(p.numel());
    return shardopt::test::BackToBack(numels);
  }();
  const std::vector<std::int64_t>& start = lay.starts();
  const std::int64_t total = lay.total();
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> master(static_cast<std::size_t>(total)), grad(static_cast<std::size_t>(total));
  for (std::size_t i = 0; i < master.size(); ++i) {
    master[i] = nd(rng) * (i % 97 == 0 ? 1e3f : 1.0f);
    grad[i] = nd(rng);
  }
  plant_specials(ps, start, master, grad);
  std::vector<unsigned char> grad_bytes(static_cast<std::size_t>(total) * size_of(grad_dtype) + 16);
  for (std::size_t i = 0; i < grad.size(); ++i) set_array(grad_dtype, grad_bytes, i, grad[i]);
  const DeviceBuffer grads = upload(b, grad_bytes);

  // Ranks' boundaries: even, shifted by an odd amount (mid-byte, mid-block, mid-row).
  std::vector<std::int64_t> bounds(static_cast<std::size_t>(world) + 1, total);
  for (int r = 0; r < world; ++r) bounds[static_cast<std::size_t>(r)] = r == 0 ? 0 : total * r / world + 2 * r + 1;

  AdamConfig cfg;
  cfg.grad_dtype = grad_dtype;
  cfg.moment_dtype = moment_dtype;
  cfg.write_params = false;
  cfg.groups = {AdamGroup{0.0, 1.0}};
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE("world " + std::to_string(world) + " rank " + std::to_string(r) + " grads " + to_string(grad_dtype) +
                 " moments " + to_string(moment_dtype) + " max_chunk " + std::to_string(max_chunk));
    const std::int64_t lo = bounds[static_cast<std::size_t>(r)], hi = bounds[static_cast<std::size_t>(r) + 1];
    // The rank's chunks (one piece per parameter it touches) and their amax entries.
    const std::vector<ShardChunk> chunks = split_shard_chunks(lay.pieces(lo, hi), max_chunk);
    std::vector<DeviceBuffer> amax;
    for (const Param& p : ps)
      amax.push_back(upload(b, std::vector<std::uint32_t>(static_cast<std::size_t>(p.members * p.amax_numel()), 0)));
    std::vector<kernels::AdamAmaxChunk> table;
    for (const ShardChunk& c : chunks) {
      const std::size_t p = lay.tensor_at(c.buffer_offset);
      kernels::AdamAmaxChunk t;
      t.amax = amax[p].as<std::uint32_t>();
      t.first = c.buffer_offset - start[p];
      t.member_numel = ps[p].member_numel();
      t.cols = ps[p].cols;
      t.block_cols = ps[p].block_cols();
      t.amax_numel = ps[p].amax_numel();
      table.push_back(t);
    }
    const std::int64_t n = hi - lo;
    const std::vector<float> shard_master(master.begin() + lo, master.begin() + hi);
    const std::vector<unsigned char> zero_moments(static_cast<std::size_t>(n) * size_of(moment_dtype) + 16, 0);
    struct State {
      DeviceBuffer master, m, v, scalars;
    };
    auto make_state = [&] {
      State s{upload(b, shard_master), upload(b, zero_moments), upload(b, zero_moments), DeviceBuffer()};
      StepScalars sc;
      sc.lr = 1e-3f;
      s.scalars = upload(b, std::vector<StepScalars>{sc});
      return s;
    };
    const DeviceBuffer chunk_dev = upload(b, chunks), table_dev = upload(b, table);
    auto shard_of = [&](State& s) {
      ShardPointers sp;
      sp.chunks = chunk_dev.as<ShardChunk>();
      sp.num_chunks = static_cast<std::int64_t>(chunks.size());
      sp.shard_numel = n;
      sp.grads = grads.data();
      sp.master = s.master.as<float>();
      sp.exp_avg = s.m.data();
      sp.exp_avg_sq = s.v.data();
      return sp;
    };
    State with = make_state(), without = make_state();
    adam_step_prologue(cfg, with.scalars.as<StepScalars>(), b, nullptr);
    kernels::adam_step_apply_emitting(cfg, shard_of(with), table_dev.as<kernels::AdamAmaxChunk>(),
                                      with.scalars.as<StepScalars>(), b, nullptr);
    fused_adam_step(cfg, shard_of(without), without.scalars.as<StepScalars>(), b, nullptr);
    synchronize(b, nullptr);
    const auto nz = static_cast<std::size_t>(n);
    const auto new_master = download<float>(b, with.master, nz);
    const auto mbytes = nz * size_of(moment_dtype);
    EXPECT_EQ(download<std::uint32_t>(b, with.master, nz), download<std::uint32_t>(b, without.master, nz))
        << "the master differs from the pass without emission";
    EXPECT_EQ(download<unsigned char>(b, with.m, mbytes), download<unsigned char>(b, without.m, mbytes));
    EXPECT_EQ(download<unsigned char>(b, with.v, mbytes), download<unsigned char>(b, without.v, mbytes));

    // The amaxes against the plain loop and against phase 1 of the sharded quantize.
    auto check = [&](const std::vector<float>& m, const std::string& when) {
      for (std::size_t p = 0; p < ps.size(); ++p) {
        const Param& P = ps[p];
        const Range o = lay.overlap(p, lo, hi);
        const std::int64_t a = o.begin, e = o.end;
        std::vector<float> mine;
        if (a < e) mine.assign(m.begin() + (a - lo), m.begin() + (e - lo));
        const auto got = download<std::uint32_t>(b, amax[p], static_cast<std::size_t>(P.members * P.amax_numel()));
        const auto want = a < e ? oracle_partials(P, a - start[p], e - start[p], mine)
                                : std::vector<std::uint32_t>(got.size(), 0);
        EXPECT_EQ(got, want) << when << ": param " << p << " differs from the plain loop";
        // nvfp4_partial_amax of each member's range of the same master.
        std::vector<std::uint32_t> pass(got.size(), 0xA5A5A5A5u);
        const DeviceBuffer pass_dev = upload(b, pass);
        const DeviceBuffer m_dev = upload(b, mine.empty() ? std::vector<float>{0.0f} : mine);
        for (std::int64_t g = 0; g < P.members; ++g) {
          const std::int64_t g0 = start[p] + g * P.member_numel(), g1 = g0 + P.member_numel();
          const Range range{std::max(a, g0) - g0, std::max(std::min(e, g1), std::max(a, g0)) - g0};
          const float* src = range.size() > 0 ? m_dev.as<float>() + (g0 + range.begin - a) : nullptr;
          nvfp4_partial_amax(Nvfp4Shape{P.rows, P.cols}, range.size() > 0 ? range : Range{0, 0}, src,
                             pass_dev.as<std::uint32_t>() + g * P.amax_numel(), b, nullptr);
        }
        EXPECT_EQ(got, download<std::uint32_t>(b, pass_dev, got.size()))
            << when << ": param " << p << " differs from nvfp4_partial_amax";
      }
    };
    check(new_master, "after a step");

    // A skipped step: nothing written, the amaxes of the master as it is.
    for (DeviceBuffer& d : amax) fill_zero_async(b, d.data(), d.bytes(), nullptr);
    const auto moments_before = download<unsigned char>(b, with.m, mbytes);
    StepScalars sc = download<StepScalars>(b, with.scalars, 1).front();
    sc.found_inf = 1;
    copy_async(b, with.scalars.data(), &sc, sizeof sc, nullptr);
    kernels::adam_step_apply_emitting(cfg, shard_of(with), table_dev.as<kernels::AdamAmaxChunk>(),
                                      with.scalars.as<StepScalars>(), b, nullptr);
    synchronize(b, nullptr);
    EXPECT_EQ(download<std::uint32_t>(b, with.master, nz), download<std::uint32_t>(b, without.master, nz))
        << "a skipped step changed the master";
    EXPECT_EQ(download<unsigned char>(b, with.m, mbytes), moments_before) << "a skipped step changed exp_avg";
    check(new_master, "after a skipped step");
  }
}

/// Every world size 1-4 and grad / moment dtype (vectors of 8 and of 4), with the
/// default chunks and small odd ones (chunk edges mid-block and mid-vector).
inline void case_emits_partial_amaxes(Backend b) {
  std::uint32_t seed = 1;
  for (int world = 1; world <= 4; ++world) {
    for (DType g : {DType::bf16, DType::f32}) {
      const DType m = g == DType::f32 ? DType::f32 : DType::bf16;
      run_case(b, world, g, m, std::int64_t{1} << 16, seed++);
      run_case(b, world, g, DType::f32, 1001, seed++);
    }
  }
}

/// The entry point refuses a missing table and a variant that writes params.
inline void case_refusals(Backend b) {
  using namespace shardopt;
  AdamConfig cfg;
  cfg.write_params = true;
  StepScalars sc;
  const DeviceBuffer s = mxfp8_test::upload(b, std::vector<StepScalars>{sc});
  kernels::AdamAmaxChunk t;
  const DeviceBuffer tdev = mxfp8_test::upload(b, std::vector<kernels::AdamAmaxChunk>{t});
  ShardPointers sp;
  EXPECT_THROW(kernels::adam_step_apply_emitting(cfg, sp, tdev.as<kernels::AdamAmaxChunk>(), s.as<StepScalars>(), b,
                                                 nullptr),
               shardopt::Error);
  cfg.write_params = false;
  EXPECT_THROW(kernels::adam_step_apply_emitting(cfg, sp, nullptr, s.as<StepScalars>(), b, nullptr), shardopt::Error);
}

}  // namespace adam_amax_test
