// moment_q8_cases.hpp - 8-bit block-quantized Adam moments (DType::q8_block, issue 46
// part 2, docs/state_precision.md "8-bit moments"): the same bits on every world size,
// front end and in graph and eager; a per-step parameter error within the bound derived
// from the code's spacing; checkpoints across modes, world sizes and front ends; the
// memory formula; the errors. Run on the host backend under mpiexec (CI) and on GPUs.
//
// The oracles: an unsharded run (one rank) of the same optimizer for determinism; for
// accuracy, the fp32-moment run and a bound computed here in double from the maps as the
// docs define them (not from the library's tables).
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "moment_maps_doc.hpp"
#include "state_precision_cases.hpp"

namespace shardopt::test {

/// Half the gap between the two map entries around a in [0, 1] (the largest error of
/// rounding a to its nearest entry).
inline double half_gap(const std::vector<double>& map, double a) {
  const auto hi = std::upper_bound(map.begin(), map.end(), a);
  if (hi == map.end()) return 0.0;
  return 0.5 * (*hi - *(hi - 1));
}

/// Param i's values of an f32 shard view, whole: every rank of the world contributes its
/// piece (MPI over the world; `comm` must span it).
inline std::vector<float> gather_param_values(const Communicator& comm, DistributedAdam& opt, int i, const ShardView& v) {
  EXPECT_EQ(comm.size(), world_size());
  EXPECT_EQ(v.dtype, DType::f32);
  const std::int64_t numel = opt.layout().params()[static_cast<std::size_t>(i)].numel;
  std::vector<float> mine = v.numel() > 0 ? to_host<float>(opt.backend(), v.data, static_cast<std::size_t>(v.numel()))
                                          : std::vector<float>{};
  std::vector<float> full(static_cast<std::size_t>(numel), 0.0f), part(full.size(), 0.0f);
  for (std::size_t j = 0; j < mine.size(); ++j) part[static_cast<std::size_t>(v.param_offset) + j] = mine[j];
  // Pieces are disjoint: a sum of the zero-padded pieces assembles them exactly.
  MPI_Allreduce(part.data(), full.data(), static_cast<int>(full.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  return full;
}

inline DistributedAdamOptions q8_options(MasterStorage master = MasterStorage::fp32) {
  DistributedAdamOptions o = ckpt_options(DType::f32);
  o.param_dtype = DType::bf16;
  o.moment_dtype = DType::q8_block;
  o.master_storage = master;
  return o;
}

inline FsdpOptions q8_fsdp_options(const DistributedAdamOptions& d, int shard_group = 0) {
  FsdpOptions f = fsdp_options(d);
  f.moment_dtype = d.moment_dtype;
  f.master_storage = d.master_storage;
  f.shard_group_size = shard_group;
  return f;
}

/// This rank's pieces equal the unsharded reference at their parameter offsets: masters
/// (rebuilt from remainders where kept) and both moments' bytes.
template <class Opt>
void expect_q8_matches(Opt& opt, DistributedAdam& ref, const std::string& what) {
  const Backend b = opt.backend();
  for (int i = 0; i < opt.num_params(); ++i) {
    SCOPED_TRACE(what + ": " + opt.layout().specs()[static_cast<std::size_t>(i)].name);
    const ShardView m = opt.shard_exp_avg(i);
    EXPECT_EQ(m.dtype, DType::q8_block);
    const auto off = static_cast<std::size_t>(m.param_offset);
    const auto mine = master_bits(opt, i), full = master_bits(ref, i);
    ASSERT_LE(off + mine.size(), full.size());
    EXPECT_TRUE(std::equal(mine.begin(), mine.end(), full.begin() + static_cast<std::ptrdiff_t>(off))) << "master";
    EXPECT_TRUE(bytes_match_at(read_bytes(b, m), read_bytes(b, ref.shard_exp_avg(i)), off)) << "exp_avg bytes";
    EXPECT_TRUE(bytes_match_at(read_bytes(b, opt.shard_exp_avg_sq(i)), read_bytes(b, ref.shard_exp_avg_sq(i)), off))
        << "exp_avg_sq bytes";
  }
}

/// 8-bit moments are deterministic: a DistributedAdam or Fsdp (HSDP with `shard_group`)
/// on this world, eager or through a captured StepGraph, holds after 12 steps exactly the
/// masters and moment bytes of the one-rank run (clipping and a schedule active).
inline void case_q8_equals_unsharded(Backend b, Front front, bool graph, MasterStorage master,
                                     int shard_group = 0) {
  const int world = world_size();
  if (shard_group > 0 && (world % shard_group != 0 || world == shard_group))
    GTEST_SKIP() << "HSDP needs a world that is a multiple of the shard group, larger than it";
  constexpr int kSteps = 12;
  DistributedAdam ref(Communicator::self(b), fsdp_model(), q8_options(master));
  TestStream rs(b);
  init_params(ref, rs.get());
  da_train(ref, rs.get(), kSteps);
  // Equal gradients average exactly over 2^k ranks; otherwise world rank 0 alone adds
  // them and the ranks Sum (the same sum, exactly).
  const bool sum_of_one = (world & (world - 1)) != 0;
  DistributedAdamOptions o = q8_options(master);
  if (sum_of_one) o.grad_reduce = ReduceOp::Sum;
  TestStream s(b);
  std::optional<StepGraph> g;
  if (front == Front::DistAdam) {
    DistributedAdam x(make_comm(b), fsdp_model(), o);
    init_params(x, s.get());
    if (graph) {
      graph_steps(x, g, [&x, sum_of_one](Stream st, bool) { da_iteration(x, st, sum_of_one); }, s.get(), kSteps);
    } else {
      da_train(x, s.get(), kSteps, sum_of_one);
    }
    EXPECT_EQ(x.read_scalars(s.get()).step, kSteps);
    expect_q8_matches(x, ref, "DistributedAdam");
    for (int i = 0; i < x.num_params(); ++i) EXPECT_EQ(read_bytes(b, x.param(i)), read_bytes(b, ref.param(i)));
  } else {
    Fsdp x(make_comm(b), fsdp_model(), small_units(), q8_fsdp_options(o, shard_group));
    init_fsdp(x, s.get());
    if (graph) {
      graph_steps(
          x, g, [&x, sum_of_one](Stream st, bool) { fsdp_microbatch(x, st, 0, GradKind::Grid, {}, {}, sum_of_one); },
          s.get(), kSteps);
    } else {
      fsdp_train(x, s.get(), kSteps, sum_of_one);
    }
    expect_q8_matches(x, ref, "Fsdp");
  }
  EXPECT_LT(ref.read_scalars(rs.get()).clip_coef, 1.0f) << "clipping must be active in this case";
}

/// The per-step error against fp32 moments, within its derived bound. An fp32-moment run
/// is saved after t steps (t = 2, 5, 9) and loaded into an 8-bit one, which quantizes
/// the moments once (documented rule: per block, scale = max, nearest code); both take
/// the same next step. From the same master, the two updates differ only through the
/// quantized moments: m' = m1 + b1 dm, v' = v1 + b2 dv with m1, v1 the fp32 run's new
/// moments, |dm| <= S half_gap(|m| / S) (S the block's max |m|) and, on r = sqrt(v),
/// |dr| <= R half_gap(r / R), |dv| <= 2 r |dr| + dr^2. The update u = m / (sqrt(v) / c + eps)
/// grows with m and falls with v, so its largest change is at a corner of that box; the
/// parameters may differ by step_size times it, plus the fp32 rounding of the step
/// (a few ulps). Every element of every parameter is checked.
inline void case_q8_step_bound(Backend b) {
  const int world = world_size();
  const bool sum_of_one = (world & (world - 1)) != 0;
  DistributedAdamOptions o32 = ckpt_options(DType::f32);
  o32.param_dtype = DType::bf16;
  o32.clip_max_norm = 0.0f;  // the same step either way; keep the arithmetic plain
  if (sum_of_one) o32.grad_reduce = ReduceOp::Sum;
  DistributedAdamOptions o8 = o32;
  o8.moment_dtype = DType::q8_block;
  const std::vector<double> first = doc_map(false), second = doc_map(true);
  Communicator comm = make_comm(b);
  DistributedAdam ref(comm, fsdp_model(), o32);
  TestStream s(b);
  init_params(ref, s.get());
  SharedDir dir("q8-bound");
  int done = 0;
  double worst = 0.0;  // largest |difference| / bound seen
  std::int64_t checked = 0;
  for (int t : {2, 5, 9}) {
    da_train(ref, s.get(), t - done, sum_of_one);
    done = t;
    const std::string at = dir.sub(std::to_string(t) + "_steps");
    ref.save(at, s.get());
    // The fp32 run's moments before the step, whole (every rank gathers them).
    std::vector<std::vector<float>> m0, v0;
    for (int i = 0; i < ref.num_params(); ++i) {
      m0.push_back(gather_param_values(comm, ref, i, ref.shard_exp_avg(i)));
      v0.push_back(gather_param_values(comm, ref, i, ref.shard_exp_avg_sq(i)));
    }
    DistributedAdam q(comm, fsdp_model(), o8);
    TestStream sq(b);
    q.load(at, sq.get());
    da_train(ref, s.get(), 1, sum_of_one);
    da_train(q, sq.get(), 1, sum_of_one);
    ++done;
    const StepScalars x = ref.read_scalars(s.get());
    const double c = x.bc2_sqrt, eps = o32.eps, b1 = o32.beta1, b2 = o32.beta2;
    for (int i = 0; i < ref.num_params(); ++i) {
      SCOPED_TRACE("t = " + std::to_string(t) + ", " + ref.layout().specs()[static_cast<std::size_t>(i)].name);
      const auto m1 = gather_param_values(comm, ref, i, ref.shard_exp_avg(i));
      const auto v1 = gather_param_values(comm, ref, i, ref.shard_exp_avg_sq(i));
      const auto pr = read_f32(b, ref.param(i)), pq = read_f32(b, q.param(i));
      const int group = ref.layout().params()[static_cast<std::size_t>(i)].group;
      const double step_size = x.group_step_size[group];
      const std::size_t n = m1.size();
      for (std::size_t blk = 0; blk < n; blk += kMomentBlock) {
        const std::size_t end = std::min(n, blk + static_cast<std::size_t>(kMomentBlock));
        double sm = 0.0, sr = 0.0;
        for (std::size_t j = blk; j < end; ++j) {
          sm = std::max(sm, std::fabs(static_cast<double>(m0[i][j])));
          sr = std::max(sr, std::sqrt(static_cast<double>(v0[i][j])));
        }
        for (std::size_t j = blk; j < end; ++j) {
          const double dm = sm > 0 ? sm * half_gap(first, std::fabs(m0[i][j]) / sm) + 1e-6 * sm : 0.0;
          const double r = std::sqrt(static_cast<double>(v0[i][j]));
          const double dr = sr > 0 ? sr * half_gap(second, r / sr) + 1e-6 * sr : 0.0;
          const double dv = 2 * r * dr + dr * dr;
          auto u = [&](double mm, double vv) { return mm / (std::sqrt(std::max(vv, 0.0)) / c + eps); };
          const double u0 = u(m1[j], v1[j]);
          double dev = 0.0;
          for (double sa : {-1.0, 1.0})
            for (double sb : {-1.0, 1.0}) dev = std::max(dev, std::fabs(u(m1[j] + sa * b1 * dm, v1[j] + sb * b2 * dv) - u0));
          // bf16 parameters: the bound on the masters, then one bf16 rounding either way.
          const double ulp_bf16 = std::ldexp(1.0, std::ilogb(std::max(std::fabs(pr[j]), 1e-30f)) - 7);
          const double bound = step_size * dev * (1 + 1e-5) + 1e-6 * std::fabs(pr[j]) + ulp_bf16;
          const double diff = std::fabs(static_cast<double>(pq[j]) - pr[j]);
          ++checked;
          worst = std::max(worst, diff / bound);
          if (diff > bound) {
            ADD_FAILURE() << "element " << j << ": 8-bit " << pq[j] << ", fp32 " << pr[j] << ", bound " << bound;
            return;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
  if (world_rank() == 0) std::printf("[q8 step bound] %lld elements, largest difference / bound = %.3g\n",
                                     static_cast<long long>(checked), worst);
}

/// Save after 6 steps, load into a fresh optimizer (8-bit moments saved decoded as F32,
/// quantized again on load): the loaded optimizer and the uninterrupted one continue
/// bitwise alike (eager, or through a captured graph).
inline void case_q8_resume_bitwise(Backend b, bool graph, MasterStorage master) {
  SharedDir dir("q8-resume");
  Communicator comm = make_comm(b);
  const DistributedAdamOptions o = q8_options(master);
  auto fn = [](DistributedAdam& opt) { return [&opt](Stream s, bool) { da_iteration(opt, s); }; };
  auto run = [&](DistributedAdam& opt, std::optional<StepGraph>& g, Stream s, int steps) {
    if (!graph) return da_train(opt, s, steps);
    graph_steps(opt, g, fn(opt), s, steps);
  };
  auto state = [&](DistributedAdam& opt) {
    std::vector<std::vector<std::uint8_t>> out;
    for (int i = 0; i < opt.num_params(); ++i) {
      out.push_back(read_bytes(b, opt.param(i)));
      const auto mb = master_bits(opt, i);
      out.emplace_back(reinterpret_cast<const std::uint8_t*>(mb.data()),
                       reinterpret_cast<const std::uint8_t*>(mb.data() + mb.size()));
      out.push_back(read_bytes(b, opt.shard_exp_avg(i)));
      out.push_back(read_bytes(b, opt.shard_exp_avg_sq(i)));
    }
    return out;
  };
  DistributedAdam a(comm, fsdp_model(), o);
  TestStream sa(b);
  init_params(a, sa.get());
  std::optional<StepGraph> ga;
  run(a, ga, sa.get(), 6);
  a.save(dir.sub("ckpt"), sa.get());
  const auto at_save = state(a);
  run(a, ga, sa.get(), 6);
  const auto uninterrupted = state(a);
  DistributedAdam fresh(comm, fsdp_model(), o);
  TestStream sf(b);
  fresh.load(dir.sub("ckpt"), sf.get());
  EXPECT_TRUE(state(fresh) == at_save) << "the loaded 8-bit state differs from the saved one";
  std::optional<StepGraph> gf;
  run(fresh, gf, sf.get(), 6);
  EXPECT_TRUE(state(fresh) == uninterrupted) << "resume differs from the uninterrupted run";
}

/// Checkpoints across modes, world sizes and front ends: saved by `from` ranks of front
/// end `a` with moments `ma`, loaded by `to` ranks of front end `c` with moments `mc`.
/// q8 -> q8 continues exactly as the unsharded q8 run; q8 -> f32 loads the decoded
/// moments, the same on every world size (equal to what an unsharded q8 run saves).
inline void case_q8_reshard(Backend b, int from, Front a, int to, Front c, DType mc) {
  const int world = world_size();
  if (world < std::max(from, to)) GTEST_SKIP() << "needs " << std::max(from, to) << " ranks";
  SharedDir dir("q8-reshard");
  Communicator comm = make_comm(b);
  constexpr int t1 = 5, t2 = 4;
  const auto pow2 = [](int n) { return (n & (n - 1)) == 0; };
  const bool sum_of_one = !pow2(from) || !pow2(to);
  DistributedAdamOptions o = q8_options();
  if (sum_of_one) o.grad_reduce = ReduceOp::Sum;
  // The unsharded q8 run: t1 steps, saved (the reference file), then t2 more.
  DistributedAdam ref(Communicator::self(b), fsdp_model(), q8_options());
  TestStream rs(b);
  init_params(ref, rs.get());
  da_train(ref, rs.get(), t1);
  if (comm.rank() == 0) ref.save(dir.sub("ref"), rs.get());
  da_train(ref, rs.get(), t2);
  save_on_first_ranks(comm, from, [&](const Communicator& g) {
    TestStream s(b);
    if (a == Front::DistAdam) {
      DistributedAdam x(g, fsdp_model(), o);
      init_params(x, s.get());
      da_train(x, s.get(), t1, sum_of_one);
      x.save(dir.sub("ckpt"), s.get());
    } else {
      Fsdp x(g, fsdp_model(), small_units(), q8_fsdp_options(o));
      init_fsdp(x, s.get());
      fsdp_train(x, s.get(), t1, sum_of_one);
      x.save(dir.sub("ckpt"), s.get());
    }
  });
  Communicator g = first_ranks(comm, to);
  if (comm.rank() >= to) return;
  TestStream s(b);
  DistributedAdamOptions o2 = o;
  o2.moment_dtype = mc;
  o2.bucket_numel = 170;
  if (mc == DType::q8_block) {
    if (c == Front::DistAdam) {
      DistributedAdam y(g, fsdp_model(), o2);
      y.load(dir.sub("ckpt"), s.get());
      da_train(y, s.get(), t2, sum_of_one);
      expect_q8_matches(y, ref, "q8 -> q8");
    } else {
      Fsdp y(g, fsdp_model(), small_units(), q8_fsdp_options(o2));
      y.load(dir.sub("ckpt"), s.get());
      fsdp_train(y, s.get(), t2, sum_of_one);
      expect_q8_matches(y, ref, "q8 -> q8");
    }
    return;
  }
  // q8 -> f32 / bf16: the moments as the unsharded run saved them.
  DistributedAdam y(g, fsdp_model(), o2), z(g, fsdp_model(), o2);
  y.load(dir.sub("ckpt"), s.get());
  z.load(dir.sub("ref"), s.get());
  for (int i = 0; i < y.num_params(); ++i) {
    EXPECT_EQ(y.shard_exp_avg(i).dtype, mc);
    EXPECT_EQ(read_bytes(b, y.shard_exp_avg(i)), read_bytes(b, z.shard_exp_avg(i)));
    EXPECT_EQ(read_bytes(b, y.shard_exp_avg_sq(i)), read_bytes(b, z.shard_exp_avg_sq(i)));
    EXPECT_EQ(read_bytes(b, y.shard_master(i)), read_bytes(b, z.shard_master(i)));
  }
}

/// The memory report: remainders + 8-bit moments are 4 bytes per shard element, plus two
/// fp32 scales per block of kMomentBlock; fp32 master + 8-bit moments 6.
inline void case_q8_memory_formula(Backend b) {
  const int world = world_size();
  for (MasterStorage master : {MasterStorage::fp32, MasterStorage::bf16_remainder}) {
    SCOPED_TRACE(to_string(master));
    DistributedAdamOptions o = q8_options(master);
    o.nccl_registered = false;
    DistributedAdam opt(make_comm(b), fsdp_model(), o);
    const std::int64_t n = opt.layout().total_numel() / world;  // this rank's shard elements
    EXPECT_EQ(n % kMomentBlock, 0) << "8-bit moments keep shards on block boundaries";
    EXPECT_EQ(opt.layout().alignment() % kMomentBlock, 0);
    const MemoryReport r = opt.memory();
    const std::int64_t state = master == MasterStorage::fp32 ? 6 : 4;
    EXPECT_EQ(r.master + r.remainders + r.moments, state * n);
    EXPECT_EQ(r.moments, 2 * n);
    EXPECT_EQ(r.moment_scales, 2 * 4 * (n / kMomentBlock));
    EXPECT_EQ(r.total(), opt.layout().total_numel() * (2 + 4) + state * n + r.moment_scales);  // bf16 params, f32 grads
  }
}

/// Bad input is a clear error naming the option: 8-bit moments with MXFP8 parameters, a
/// moment dtype the step cannot keep.
inline void case_q8_errors(Backend b) {
  DistributedAdamOptions o = q_ckpt_options(DType::f32, ParamFormat::Mxfp8);
  o.moment_dtype = DType::q8_block;
  const auto e = error_of([&] { DistributedAdam opt(make_comm(b), q_model(ParamFormat::Mxfp8), o); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::Unsupported);
  EXPECT_NE(std::string(e->what()).find("moment_dtype q8_block"), std::string::npos) << e->what();
  DistributedAdamOptions bad = q8_options();
  bad.moment_dtype = DType::e4m3;
  const auto f = error_of([&] { DistributedAdam opt(make_comm(b), fsdp_model(), bad); });
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->code(), ErrorCode::InvalidArgument);
  EXPECT_NE(std::string(f->what()).find("use f32, bf16 or q8_block"), std::string::npos) << f->what();
}

}  // namespace shardopt::test
