// test_adam_mxfp8_common.hpp - the fused Adam step of MXFP8 shards (AdamMxfp8Pass,
// issue 29) on a backend. A list of MXFP8 tensors (whole tiles, partial widths and
// heights, grouped members, odd widths, gaps that misalign their starts) lies back to
// back in one flat buffer; W simulated ranks (random boundaries that cut tiles, tile
// rows and bands) each run two compositions from the same state:
//   today's:  adam_step_apply over all the rank's chunks, then
//             quantize_mxfp8_shard_owned_batch, then quantize_mxfp8_shard_rest_batch;
//   fused:    adam_step_apply over adam_mxfp8_plain_chunks (the owned bands left out),
//             then AdamMxfp8Pass::run, then the same rest pass;
// a normal step, then a skipped one (found_inf), and every output (master, both moments,
// every byte of both data planes and both scale tensors, poisoned around the ranges) must
// be bitwise equal. At one rank the planes must equal the oracle quantization
// (test_mxfp8_reference.hpp) of the new master, and a few new masters must match a
// double-precision Adam written here. With a moment shift P (ShardChunk::moment_shift)
// the shard starts with P elements that have no moments (as Muon pieces before compact
// moments do): master index P + k, moment index k. Shared by the host suite (test_adam_mxfp8.cpp;
// the host twin is the composition itself) and the GPU one.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/adam/adam_mxfp8.hpp"
#include "shardopt/error.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/mxfp8.hpp"
#include "shardopt/numerics.hpp"
#include "common/back_to_back.hpp"
#include "unit/test_mxfp8_common.hpp"

namespace adam_mxfp8_test {

using shardopt::Backend;
using shardopt::DType;

/// One tensor of the list and the gap (elements) before it in the flat buffer.
struct Tensor {
  shardopt::Mxfp8Shape shape;
  std::int64_t gap;
};

/// Whole tiles (96 x 256, 64 x 384), partial width and height (70 x 200), grouped members
/// with 33 rows each, a narrow one (8 columns), odd widths (37, 130) and gaps of odd
/// lengths (tensors start misaligned for 16-byte accesses).
inline std::vector<Tensor> tensors() {
  return {{{1, 96, 256}, 0}, {{1, 70, 200}, 3}, {{3, 33, 128}, 0}, {{1, 64, 8}, 5},
          {{1, 37, 37}, 1},  {{2, 40, 136}, 2}, {{1, 64, 384}, 0}, {{1, 45, 130}, 7}};
}

inline std::uint32_t bits(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  return u;
}

/// The state of one rank's run, in the backend's memory.
struct Run {
  shardopt::DeviceBuffer master, m, v, scalars;
  std::vector<mxfp8_test::DevicePlanes> planes;
};

/// The planes poisoned again in place (the batches and the pass keep their addresses).
inline void poison(Backend b, const mxfp8_test::DevicePlanes& d, const shardopt::Mxfp8Shape& s) {
  const mxfp8_ref::Quantized p = mxfp8_test::poisoned(s);
  shardopt::copy_async(b, d.data_row.data(), p.data_row.data(), p.data_row.size(), nullptr);
  shardopt::copy_async(b, d.data_col.data(), p.data_col.data(), p.data_col.size(), nullptr);
  shardopt::copy_async(b, d.scale_row.data(), p.scale_row.data(), p.scale_row.size(), nullptr);
  shardopt::copy_async(b, d.scale_col.data(), p.scale_col.data(), p.scale_col.size(), nullptr);
  shardopt::synchronize(b, nullptr);
}

/// A double-precision Adam step of one element (step t >= 1, group lr lr_g, weight
/// decay wd, AdamW when decoupled), from the initial values.
inline double oracle_adam(double p, double g, double m, double v, double lr_g, double wd, bool decoupled,
                          std::int64_t t, double& m_out, double& v_out) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  if (decoupled) {
    p *= 1.0 - lr_g * wd;
  } else {
    g += wd * p;
  }
  m_out = b1 * m + (1.0 - b1) * g;
  v_out = b2 * v + (1.0 - b2) * g * g;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t)), bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
  return p - lr_g / bc1 * m_out / (std::sqrt(v_out) / std::sqrt(bc2) + eps);
}

/// Runs the case: every rank of `world` steps once, then once skipped, both ways; the
/// shard's moments shifted by `shift` elements (0: none).
inline void run_case(Backend b, int world, DType grad_dtype, DType moment_dtype, bool decoupled, std::uint32_t seed,
                     std::int64_t shift = 0) {
  using namespace shardopt;
  using mxfp8_test::download;
  using mxfp8_test::upload;
  const std::vector<Tensor> ts = tensors();
  const shardopt::test::BackToBack lay = [&] {
    std::vector<std::int64_t> numels, gaps;
    for (const Tensor& t : ts) {
      numels.push_back(t.shape.numel());
      gaps.push_back(t.gap);
    }
    return shardopt::test::BackToBack(numels, gaps);
  }();
  const std::vector<std::int64_t>& start = lay.starts();
  const std::int64_t total = lay.total();
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> master(static_cast<std::size_t>(total)), grad(master.size()), m0(master.size()),
      v0(master.size());
  for (std::size_t i = 0; i < master.size(); ++i) {
    master[i] = nd(rng) * (i % 89 == 0 ? 300.0f : 1.0f);
    grad[i] = nd(rng) * 0.01f;
    m0[i] = nd(rng) * 0.001f;
    v0[i] = std::fabs(nd(rng)) * 1e-7f;
  }
  // Specials in owned bands and at their edges: NaN, +-Inf, -0 (zero gradient).
  for (const std::int64_t i : {std::int64_t{100}, start[2] + 5000, start[6] + 129, start[7] + 44}) {
    const auto k = static_cast<std::size_t>(i);
    grad[k] = 0.0f;
    master[k] = i == 100 ? std::numeric_limits<float>::quiet_NaN()
                : i == start[2] + 5000 ? std::numeric_limits<float>::infinity()
                : i == start[6] + 129  ? -std::numeric_limits<float>::infinity()
                                       : -0.0f;
  }
  auto to_bytes = [](DType t, const std::vector<float>& x, std::size_t from, std::size_t n) {
    std::vector<unsigned char> out(n * size_of(t) + 16, 0);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t u = num::encode(t, x[from + i]);
      std::memcpy(out.data() + i * size_of(t), &u, size_of(t));
    }
    return out;
  };
  const DeviceBuffer grads = upload(b, to_bytes(grad_dtype, grad, 0, grad.size()));

  AdamConfig cfg;
  cfg.grad_dtype = grad_dtype;
  cfg.moment_dtype = moment_dtype;
  cfg.write_params = false;
  cfg.decoupled_weight_decay = decoupled;
  cfg.groups = {AdamGroup{0.01, 1.0}, AdamGroup{0.1, 0.5}};

  std::mt19937 brng(seed + 7);
  const std::vector<std::int64_t> bounds =
      world == 1 ? std::vector<std::int64_t>{0, total} : mxfp8_test::random_bounds(total, world, brng);
  for (int r = 0; r < world; ++r) {
    const std::int64_t lo = bounds[static_cast<std::size_t>(r)], hi = bounds[static_cast<std::size_t>(r) + 1];
    SCOPED_TRACE("world " + std::to_string(world) + " rank " + std::to_string(r) + " shard [" + std::to_string(lo) +
                 ", " + std::to_string(hi) + ") grads " + to_string(grad_dtype) + " moments " +
                 to_string(moment_dtype) + (decoupled ? " AdamW" : " Adam") + " moment shift " +
                 std::to_string(shift));
    const std::int64_t n = hi - lo;
    const auto nz = static_cast<std::size_t>(n);
    const auto sz = static_cast<std::size_t>(shift);  // master element k of the rank at shift + k
    auto group_of = [](std::size_t t) { return static_cast<std::int32_t>(t % 2); };
    std::vector<ShardChunk> pieces = lay.pieces(lo, hi, group_of);
    for (ShardChunk& c : pieces) {  // the rank's masters start after `shift` moment-less elements
      c.shard_offset += shift;
      c.moment_shift = shift;
    }
    std::vector<kernels::AdamMxfp8Place> places;
    std::vector<Range> ranges;
    for (std::size_t t = 0; t < ts.size(); ++t) {
      const Range o = lay.overlap(t, lo, hi);
      const std::int64_t a = o.begin, e = o.end;
      kernels::AdamMxfp8Place pl;
      pl.group = group_of(t);
      pl.shard_offset = shift + std::max<std::int64_t>(a - lo, 0);
      pl.buffer_offset = a;
      pl.moment_shift = shift;
      places.push_back(pl);
      ranges.push_back(a < e ? Range{a - start[t], e - start[t]} : Range{0, 0});
    }
    const std::vector<ShardChunk> all = split_shard_chunks(pieces, 4096);
    auto make_run = [&] {
      std::vector<float> mine(sz, 1.5f);  // the elements without moments: Adam must not touch them
      mine.insert(mine.end(), master.begin() + lo, master.begin() + hi);
      Run run{upload(b, mine),
              upload(b, to_bytes(moment_dtype, m0, static_cast<std::size_t>(lo), nz)),
              upload(b, to_bytes(moment_dtype, v0, static_cast<std::size_t>(lo), nz)), DeviceBuffer(), {}};
      StepScalars sc;
      sc.lr = 2e-3f;
      sc.inv_loss_scale = 0.5f;
      sc.clip_coef = 0.75f;
      run.scalars = upload(b, std::vector<StepScalars>{sc});
      for (const Tensor& t : ts) run.planes.emplace_back(b, t.shape);
      return run;
    };
    auto shard_of = [&](Run& run, const DeviceBuffer& chunks, std::size_t count) {
      ShardPointers sp;
      sp.chunks = chunks.as<ShardChunk>();
      sp.num_chunks = static_cast<std::int64_t>(count);
      sp.shard_numel = shift + n;
      sp.moment_numel = n;
      sp.grads = grads.data();
      sp.master = run.master.as<float>();
      sp.exp_avg = run.m.data();
      sp.exp_avg_sq = run.v.data();
      return sp;
    };
    auto tensors_of = [&](Run& run) {
      std::vector<Mxfp8ShardTensor> list;
      for (std::size_t t = 0; t < ts.size(); ++t) {
        Mxfp8ShardTensor x;
        x.shape = ts[t].shape;
        x.range = ranges[t];
        x.master = ranges[t].size() > 0 ? run.master.as<float>() + places[t].shard_offset : nullptr;
        x.out = run.planes[t].planes();
        list.push_back(x);
      }
      return list;
    };
    Run today = make_run(), fused = make_run();
    const Mxfp8ShardBatch today_batch(tensors_of(today), b), fused_batch(tensors_of(fused), b);
    const kernels::AdamMxfp8Pass pass(tensors_of(fused), places, cfg, shard_of(fused, grads, 0),
                                      fused.scalars.as<StepScalars>(), b);
    const std::vector<ShardChunk> plain = kernels::adam_mxfp8_plain_chunks(all, pass.bands());
    std::int64_t plain_n = 0, band_n = 0;
    for (const ShardChunk& c : plain) plain_n += c.length;
    for (const ShardChunk& c : pass.bands()) band_n += c.length;
    ASSERT_EQ(plain_n + band_n, [&] {
      std::int64_t k = 0;
      for (const ShardChunk& c : pieces) k += c.length;
      return k;
    }()) << "the plain chunks and the bands do not cover the rank's pieces";
    const DeviceBuffer all_dev = upload(b, all.empty() ? std::vector<ShardChunk>(1) : all);
    const DeviceBuffer plain_dev = upload(b, plain.empty() ? std::vector<ShardChunk>(1) : plain);

    for (int stepno = 1; stepno <= 2; ++stepno) {
      const bool skip = stepno == 2;
      SCOPED_TRACE(skip ? "skipped step" : "step");
      for (Run* run : {&today, &fused}) {
        StepScalars sc = download<StepScalars>(b, run->scalars, 1).front();
        sc.found_inf = skip ? 1 : 0;
        copy_async(b, run->scalars.data(), &sc, sizeof sc, nullptr);
        for (std::size_t t = 0; t < ts.size(); ++t) poison(b, run->planes[t], ts[t].shape);
      }
      synchronize(b, nullptr);
      const auto before = download<std::uint32_t>(b, fused.master, sz + nz);
      // Today's composition.
      adam_step_prologue(cfg, today.scalars.as<StepScalars>(), b, nullptr);
      adam_step_apply(cfg, shard_of(today, all_dev, all.size()), today.scalars.as<StepScalars>(), b, nullptr);
      quantize_mxfp8_shard_owned_batch(today_batch, b, nullptr);
      quantize_mxfp8_shard_rest_batch(today_batch, b, nullptr);
      // The fused one.
      adam_step_prologue(cfg, fused.scalars.as<StepScalars>(), b, nullptr);
      adam_step_apply(cfg, shard_of(fused, plain_dev, plain.size()), fused.scalars.as<StepScalars>(), b, nullptr);
      pass.run(nullptr);
      quantize_mxfp8_shard_rest_batch(fused_batch, b, nullptr);
      synchronize(b, nullptr);

      const auto got_all = download<std::uint32_t>(b, fused.master, sz + nz);
      EXPECT_EQ(got_all, download<std::uint32_t>(b, today.master, sz + nz)) << "master";
      for (std::size_t k = 0; k < sz; ++k) ASSERT_EQ(got_all[k], bits(1.5f)) << "an element without moments changed";
      const std::vector<std::uint32_t> got(got_all.begin() + static_cast<std::ptrdiff_t>(sz), got_all.end());
      if (skip) {
        EXPECT_EQ(got_all, before) << "a skipped step changed the master";
      }
      const std::size_t mbytes = nz * size_of(moment_dtype);
      EXPECT_EQ(download<unsigned char>(b, fused.m, mbytes), download<unsigned char>(b, today.m, mbytes)) << "exp_avg";
      EXPECT_EQ(download<unsigned char>(b, fused.v, mbytes), download<unsigned char>(b, today.v, mbytes))
          << "exp_avg_sq";
      for (std::size_t t = 0; t < ts.size(); ++t) {
        const mxfp8_ref::Quantized x = fused.planes[t].get(b, ts[t].shape), y = today.planes[t].get(b, ts[t].shape);
        EXPECT_EQ(x.data_row, y.data_row) << "tensor " << t << " rowwise data: " << mxfp8_test::first_diff(x.data_row, y.data_row);
        EXPECT_EQ(x.data_col, y.data_col) << "tensor " << t << " columnwise data: " << mxfp8_test::first_diff(x.data_col, y.data_col);
        EXPECT_EQ(x.scale_row, y.scale_row) << "tensor " << t << " rowwise scales";
        EXPECT_EQ(x.scale_col, y.scale_col) << "tensor " << t << " columnwise scales";
        if (world == 1) {  // the whole tensor is the rank's: the planes are the oracle's quantization
          const std::vector<float> mine(reinterpret_cast<const float*>(got.data()) + (start[t] - lo),
                                        reinterpret_cast<const float*>(got.data()) + (start[t] - lo) +
                                            ts[t].shape.numel());
          EXPECT_TRUE(x == mxfp8_test::reference(ts[t].shape, mxfp8_test::to_bf16(mine)))
              << "tensor " << t << " differs from the oracle's quantization of the new master";
        }
      }
      if (!skip && world == 1) {
        // A few elements of owned bands against Adam in double.
        for (const std::int64_t i : {std::int64_t{7}, start[0] + 3000, start[2] + 40, start[6] + 20000}) {
          const auto k = static_cast<std::size_t>(i);
          const std::size_t t = lay.tensor_at(i);
          const AdamGroup& grp = cfg.groups[t % 2];
          // The gradient as the kernel reads it (rounded to its dtype), unscaled and clipped.
          const double g = static_cast<double>(num::decode(grad_dtype, num::encode(grad_dtype, grad[k]))) * 0.5 * 0.75;
          const double m = num::decode(moment_dtype, num::encode(moment_dtype, m0[k]));
          const double v = num::decode(moment_dtype, num::encode(moment_dtype, v0[k]));
          double mo = 0, vo = 0;
          const double want = oracle_adam(master[k], g, m, v, 2e-3 * grp.lr_scale, grp.weight_decay, decoupled, 1, mo, vo);
          float p = 0;
          std::memcpy(&p, &got[k], 4);
          // The update to 1e-4 of itself, plus a few roundings of the master.
          const double update = want - static_cast<double>(master[k]);
          EXPECT_NEAR(p, want, 1e-4 * std::fabs(update) + 0x1p-22 * std::fabs(want))
              << "element " << i << " against Adam in double (update " << update << ")";
        }
      }
    }
  }
}

/// What the pass refuses when it is built.
inline void case_refusals(Backend b) {
  using namespace shardopt;
  const Mxfp8Shape shape{1, 64, 128};
  mxfp8_test::DevicePlanes planes(b, shape);
  const DeviceBuffer master = mxfp8_test::upload(b, std::vector<float>(static_cast<std::size_t>(shape.numel()), 1.0f));
  const DeviceBuffer other = mxfp8_test::upload(b, std::vector<float>(static_cast<std::size_t>(shape.numel()), 1.0f));
  const DeviceBuffer grads = mxfp8_test::upload(b, std::vector<float>(static_cast<std::size_t>(shape.numel()), 0.0f));
  const DeviceBuffer scalars = mxfp8_test::upload(b, std::vector<StepScalars>(1));
  Mxfp8ShardTensor t;
  t.shape = shape;
  t.range = Range{0, shape.numel()};
  t.master = master.as<float>();
  t.out = planes.planes();
  ShardPointers sp;
  sp.shard_numel = shape.numel();
  sp.grads = grads.data();
  sp.master = master.as<float>();
  sp.exp_avg = other.data();
  sp.exp_avg_sq = other.data();
  AdamConfig cfg;
  cfg.write_params = false;
  auto* sc = scalars.as<StepScalars>();
  const std::vector<kernels::AdamMxfp8Place> one(1);
  EXPECT_NO_THROW(kernels::AdamMxfp8Pass({t}, one, cfg, sp, sc, b));
  AdamConfig writes = cfg;
  writes.write_params = true;
  EXPECT_THROW(kernels::AdamMxfp8Pass({t}, one, writes, sp, sc, b), Error) << "param writes";
  EXPECT_THROW(kernels::AdamMxfp8Pass({t}, {}, cfg, sp, sc, b), Error) << "no place for the tensor";
  ShardPointers small = sp;
  small.shard_numel = shape.numel() - 1;
  EXPECT_THROW(kernels::AdamMxfp8Pass({t}, one, cfg, small, sc, b), Error) << "a band outside the shard";
  ShardPointers moved = sp;
  moved.master = other.as<float>();
  EXPECT_THROW(kernels::AdamMxfp8Pass({t}, one, cfg, moved, sc, b), Error) << "a master that is not the shard's";
  std::vector<kernels::AdamMxfp8Place> bad_group(1);
  bad_group[0].group = 3;
  EXPECT_THROW(kernels::AdamMxfp8Pass({t}, bad_group, cfg, sp, sc, b), Error) << "a group the config lacks";
}

}  // namespace adam_mxfp8_test
