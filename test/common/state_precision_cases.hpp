// state_precision_cases.hpp - the precision of the optimizer state (issue 46,
// docs/state_precision.md): masters kept as bf16 parameters plus 16-bit remainders, in
// DistributedAdam, Fsdp and HSDP, eager and graph, with clipping, a skipped step, Muon
// groups, checkpoints across storages, world sizes and front ends, the memory report and
// the errors. Run on the host backend under mpiexec (CI) and on GPUs (device suite).
//
// The oracle: an fp32-master run of the same optimizer on the same gradients. A remainder
// run must hold, for every element of its shard, the documented split of that run's
// master: the low half as remainder, and as parameter the master rounded to the nearest
// bf16 with ties away from zero, computed here in double from the two neighbouring bf16
// values (not by the library's bit arithmetic).
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint_cases.hpp"
#include "error_of.hpp"
#include "shardopt/numerics.hpp"

namespace shardopt::test {

/// x rounded to the nearest bf16, ties away from zero, as bits; NaN: the quiet NaN with
/// x's sign and top payload (as f32_to_bf16). Computed in double: the candidates are the
/// bf16 values just below and just above |x| in magnitude.
inline std::uint16_t nearest_bf16_ties_away(float x) {
  const std::uint32_t u = num::f32_bits(x);
  if (std::isnan(x)) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  const std::uint32_t toward_zero = u & 0xFFFF0000u;  // truncation keeps the sign
  const double a = static_cast<double>(num::f32_from_bits(toward_zero));
  const std::uint16_t a_bits = static_cast<std::uint16_t>(toward_zero >> 16);
  if (static_cast<double>(x) == a) return a_bits;
  // The next bf16 away from zero (one more in the magnitude bits; past the largest
  // finite value this is Inf, whose distance counts as infinite except for a tie).
  const std::uint16_t b_bits = static_cast<std::uint16_t>(a_bits + 1);
  const double b = (b_bits & 0x7FFFu) == 0x7F80u
                       ? std::ldexp(std::copysign(1.0, static_cast<double>(x)), 128)  // 2^128: Inf's place
                       : static_cast<double>(num::bf16_to_f32(b_bits));
  const double da = std::fabs(static_cast<double>(x) - a), db = std::fabs(b - static_cast<double>(x));
  return db <= da ? b_bits : a_bits;
}

/// True when x lies exactly halfway above an even bf16 (where ties away and ties to
/// even differ).
inline bool tie_above_even(float x) {
  const std::uint32_t u = num::f32_bits(x);
  return !std::isnan(x) && (u & 0xFFFFu) == 0x8000u && ((u >> 16) & 1u) == 0;
}

/// The bits of this rank's master of parameter i: its fp32 master, or, where it keeps a
/// remainder, the split's documented inverse of its parameter piece and remainder.
template <class Opt>
std::vector<std::uint32_t> master_bits(Opt& opt, int i) {
  const Backend b = opt.backend();
  const ShardView r = opt.shard_remainder(i);
  std::vector<std::uint32_t> out;
  if (r.numel() == 0) {
    const auto m = to_host<std::uint32_t>(b, opt.shard_master(i).data, static_cast<std::size_t>(opt.shard_master(i).numel()));
    return m;
  }
  const ShardView p = opt.shard_param(i);
  EXPECT_EQ(p.dtype, DType::bf16);
  EXPECT_EQ(p.numel(), r.numel());
  const auto hi = to_host<std::uint16_t>(b, p.data, static_cast<std::size_t>(p.numel()));
  const auto lo = to_host<std::uint16_t>(b, r.data, static_cast<std::size_t>(r.numel()));
  for (std::size_t j = 0; j < hi.size(); ++j) {
    // The parameter is one above the truncation exactly when the low half is >= 0x8000.
    const std::uint32_t top = static_cast<std::uint32_t>(hi[j]) - (lo[j] >= 0x8000u ? 1u : 0u);
    out.push_back(((top & 0xFFFFu) << 16) | lo[j]);
  }
  return out;
}

/// `rem` (a remainder run) holds the split of `ref`'s (an fp32-master run's) masters:
/// every element's remainder is the low half and its parameter the nearest bf16 with
/// ties away; moments and step scalars are bitwise equal; full parameter views differ
/// from ref's only by ties (one bf16 step up from an even value). Returns this rank's
/// count of ties.
template <class Opt>
std::int64_t expect_split_of(Opt& rem, Opt& ref, Stream sr, Stream sf) {
  const Backend b = rem.backend();
  const StepScalars x = rem.read_scalars(sr), y = ref.read_scalars(sf);
  EXPECT_EQ(x.step, y.step);
  EXPECT_EQ(num::f32_bits(x.grad_norm), num::f32_bits(y.grad_norm));
  std::int64_t ties = 0, remainder_elements = 0;
  for (int i = 0; i < rem.num_params(); ++i) {
    SCOPED_TRACE(rem.layout().specs()[static_cast<std::size_t>(i)].name);
    const ShardView r = rem.shard_remainder(i);
    const auto want = to_host<std::uint32_t>(b, ref.shard_master(i).data, static_cast<std::size_t>(ref.shard_master(i).numel()));
    if (r.numel() > 0) {
      remainder_elements += r.numel();
      const auto hi = to_host<std::uint16_t>(b, rem.shard_param(i).data, static_cast<std::size_t>(r.numel()));
      const auto lo = to_host<std::uint16_t>(b, r.data, static_cast<std::size_t>(r.numel()));
      EXPECT_EQ(want.size(), hi.size());
      std::int64_t bad = 0;
      for (std::size_t j = 0; j < hi.size() && j < want.size(); ++j) {
        const float m = num::f32_from_bits(want[j]);
        const bool ok = lo[j] == (want[j] & 0xFFFFu) && hi[j] == nearest_bf16_ties_away(m);
        if (!ok && bad++ == 0)
          ADD_FAILURE() << "element " << j << ": parameter 0x" << std::hex << hi[j] << " remainder 0x" << lo[j]
                        << ", want the split of master 0x" << want[j];
        ties += tie_above_even(m) ? 1 : 0;
      }
      EXPECT_EQ(bad, 0);
    } else {
      EXPECT_EQ(to_host<std::uint32_t>(b, rem.shard_master(i).data, want.size()), want);
    }
    EXPECT_EQ(master_bits(rem, i), want);
    EXPECT_EQ(read_bytes(b, rem.shard_exp_avg(i)), read_bytes(b, ref.shard_exp_avg(i)));
    EXPECT_EQ(read_bytes(b, rem.shard_exp_avg_sq(i)), read_bytes(b, ref.shard_exp_avg_sq(i)));
  }
  return ties;
}

/// Full parameter views (every rank holds them after the gather): equal to the fp32
/// run's but at ties, where they are one bf16 step above an even value. Returns the count.
inline std::int64_t full_param_ties(DistributedAdam& rem, DistributedAdam& ref) {
  std::int64_t ties = 0;
  for (int i = 0; i < rem.num_params(); ++i) {
    const ParamView a = rem.param(i), f = ref.param(i);
    if (a.dtype != DType::bf16) {
      EXPECT_EQ(read_bytes(rem.backend(), a), read_bytes(ref.backend(), f));
      continue;
    }
    const auto x = to_host<std::uint16_t>(rem.backend(), a.data, static_cast<std::size_t>(a.numel()));
    const auto y = to_host<std::uint16_t>(ref.backend(), f.data, static_cast<std::size_t>(f.numel()));
    for (std::size_t j = 0; j < x.size(); ++j) {
      if (x[j] == y[j]) continue;
      EXPECT_TRUE((y[j] & 1u) == 0 && x[j] == y[j] + 1) << "param " << i << " element " << j;
      ++ties;
    }
  }
  return ties;
}

inline DistributedAdamOptions with_storage(DistributedAdamOptions o, MasterStorage m) {
  o.master_storage = m;
  return o;
}

/// An eager DistributedAdam iteration of random gradients; `inf`: world rank 0 writes an
/// Inf into its first gradient element, so that every rank skips the step.
inline void da_random_step(DistributedAdam& opt, Stream s, int rank, bool inf) {
  const Backend b = opt.backend();
  random_grads_fn(opt, b, rank)(s, !inf);
  if (inf) {
    opt.synchronize(s);
    if (rank == 0) {
      std::vector<std::uint16_t> bits{0x7F80u};
      from_host(b, opt.grad(0).data, bits);
    }
    report_all(opt, s);
  }
  opt.step(s);
  opt.zero_grad(s);
}

/// `steps` iterations of random gradients (clipping active in base_options) of two
/// DistributedAdam optimizers side by side: eager (iteration `inf_step` with an Inf, so
/// skipped), or each through a StepGraph of its own.
inline void da_random_train_both(DistributedAdam& a, DistributedAdam& c, Stream sa, Stream sc, bool graph, int steps,
                                 int inf_step = -1) {
  const int rank = world_rank();
  if (!graph) {
    for (int t = 0; t < steps; ++t) {
      da_random_step(a, sa, rank, t == inf_step);
      da_random_step(c, sc, rank, t == inf_step);
    }
    return;
  }
  StepGraph ga(a, random_grads_fn(a, a.backend(), rank)), gc(c, random_grads_fn(c, c.backend(), rank));
  ga.capture(sa);
  gc.capture(sc);
  for (int t = 1; t < steps; ++t) {
    ga.replay(sa);
    gc.replay(sc);
  }
}

/// DistributedAdam with remainders trains as the fp32-master run does (random
/// gradients, clipping active, 30 steps; `graph`: both through a captured StepGraph).
inline void case_da_remainder_equals_fp32(Backend b, bool graph, DType grad_dtype = DType::bf16) {
  DistributedAdamOptions o = base_options(grad_dtype);  // bf16 tensors and the f32 norm1
  o.grad_reduce = ReduceOp::Sum;
  DistributedAdam ref(make_comm(b), small_model(), o);
  DistributedAdam rem(make_comm(b), small_model(), with_storage(o, MasterStorage::bf16_remainder));
  TestStream sf(b), sr(b);
  init_params(ref, sf.get());
  init_params(rem, sr.get());
  da_random_train_both(ref, rem, sf.get(), sr.get(), graph, 30);
  EXPECT_LT(ref.read_scalars(sf.get()).clip_coef, 1.0f) << "clipping must be active in this case";
  const std::int64_t ties = expect_split_of(rem, ref, sr.get(), sf.get());
  std::int64_t all = ties;
  MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(full_param_ties(rem, ref), all) << "full parameters differ exactly at the owners' ties";
  // Memory: the bf16 buffer keeps remainders, the f32 norm an fp32 master.
  EXPECT_GT(rem.memory().remainders, 0);
  EXPECT_LT(rem.memory().master, ref.memory().master);
}

/// A step with a non-finite gradient is skipped: parameters, remainders and moments keep
/// every bit.
inline void case_da_remainder_skipped_step(Backend b) {
  const int rank = world_rank();
  DistributedAdamOptions o = base_options(DType::bf16);
  o.master_storage = MasterStorage::bf16_remainder;
  DistributedAdam opt(make_comm(b), small_model(), o);
  TestStream s(b);
  init_params(opt, s.get());
  for (int t = 0; t < 3; ++t) {
    random_grads_fn(opt, b, rank)(s.get(), true);
    opt.step(s.get());
    opt.zero_grad(s.get());
  }
  std::vector<std::vector<std::uint8_t>> before;
  for (int i = 0; i < opt.num_params(); ++i) {
    before.push_back(read_bytes(b, opt.param(i)));
    before.push_back(read_bytes(b, opt.shard_remainder(i)));
    before.push_back(read_bytes(b, opt.shard_exp_avg(i)));
  }
  // Rank 0 writes an Inf into its first gradient element; everyone skips.
  random_grads_fn(opt, b, rank)(s.get(), false);
  opt.synchronize(s.get());
  if (rank == 0) {
    const GradView g = opt.grad(0);
    std::vector<std::uint16_t> inf{0x7F80u};
    from_host(b, g.data, inf);
  }
  report_all(opt, s.get());
  opt.step(s.get());
  opt.zero_grad(s.get());
  EXPECT_NE(opt.read_scalars(s.get()).found_inf, 0);
  std::size_t k = 0;
  for (int i = 0; i < opt.num_params(); ++i) {
    EXPECT_EQ(read_bytes(b, opt.param(i)), before[k++]);
    EXPECT_EQ(read_bytes(b, opt.shard_remainder(i)), before[k++]);
    EXPECT_EQ(read_bytes(b, opt.shard_exp_avg(i)), before[k++]);
  }
}

/// Muon groups in the same optimizer: their matrices keep an fp32 master (and Muon's
/// rounding to nearest even), the AdamW parameters remainders; both as the fp32 run.
inline void case_da_remainder_with_muon(Backend b) {
  const int rank = world_rank();
  DistributedAdamOptions o = base_options(DType::bf16);
  o.grad_reduce = ReduceOp::Sum;
  AdamGroup muon{0.0, 1.0};
  muon.algorithm = GroupAlgorithm::Muon;
  o.groups["decay"] = muon;  // the 2-D weights and the grouped experts
  DistributedAdam ref(make_comm(b), small_model(), o);
  DistributedAdam rem(make_comm(b), small_model(), with_storage(o, MasterStorage::bf16_remainder));
  TestStream sf(b), sr(b);
  init_params(ref, sf.get());
  init_params(rem, sr.get());
  for (int t = 0; t < 8; ++t) {
    for (auto* opt : {&ref, &rem}) {
      const Stream s = opt == &ref ? sf.get() : sr.get();
      random_grads_fn(*opt, b, rank)(s, true);
      opt->step(s);
      opt->zero_grad(s);
    }
  }
  expect_split_of(rem, ref, sr.get(), sf.get());
  for (int i = 0; i < rem.num_params(); ++i) {
    const std::string& group = rem.layout().specs()[static_cast<std::size_t>(i)].group;
    if (group == "decay") {  // Muon: an fp32 master, parameters as the fp32 run's
      EXPECT_EQ(rem.shard_remainder(i).numel(), 0);
      EXPECT_EQ(read_bytes(b, rem.param(i)), read_bytes(b, ref.param(i)));
    }
  }
}

/// `steps` grid-gradient iterations of two Fsdp optimizers side by side: eager, or each
/// through a StepGraph of its own (captured on the first iteration, then replayed).
inline void fsdp_train_both(Fsdp& a, Fsdp& c, Stream sa, Stream sc, bool graph, int steps) {
  if (!graph) {
    fsdp_train(a, sa, steps);
    fsdp_train(c, sc, steps);
    return;
  }
  std::optional<StepGraph> ga, gc;
  auto body = [](Fsdp& f) {
    return [&f](Stream s, bool) { fsdp_microbatch(f, s, /*rank=*/0, GradKind::Grid, {}, {}, false); };
  };
  graph_steps(a, ga, body(a), sa, steps);
  graph_steps(c, gc, body(c), sc, steps);
}

/// Fsdp (and HSDP with `shard_group` > 0) with remainders: the split of the fp32 run's
/// state after 12 steps, eager or through a captured StepGraph.
inline void case_fsdp_remainder_equals_fp32(Backend b, bool graph, int shard_group = 0) {
  const int world = world_size();
  if (shard_group > 0 && (world % shard_group != 0 || world == shard_group))
    GTEST_SKIP() << "HSDP needs a world that is a multiple of the shard group, larger than it";
  DistributedAdamOptions d = ckpt_options(DType::f32);
  FsdpOptions o = fsdp_options(d);
  o.shard_group_size = shard_group;
  FsdpOptions orem = o;
  orem.master_storage = MasterStorage::bf16_remainder;
  Fsdp ref(make_comm(b), fsdp_model(), small_units(), o);
  Fsdp rem(make_comm(b), fsdp_model(), small_units(), orem);
  TestStream sf(b), sr(b);
  init_fsdp(ref, sf.get());
  init_fsdp(rem, sr.get());
  fsdp_train_both(ref, rem, sf.get(), sr.get(), graph, 12);
  expect_split_of(rem, ref, sr.get(), sf.get());
  EXPECT_EQ(rem.memory().master, 0) << "every parameter is bf16: no fp32 master at all";
}

/// Checkpoints stay model-space: saved from `from` ranks of front end `a` in storage
/// `sa`, loaded into `to` ranks of front end `c` in storage `sc`, trained on: every
/// master equals an unsharded fp32 run's bitwise (remainder <-> fp32 both ways exact).
inline void case_remainder_reshard(Backend b, int from, Front a, MasterStorage sa, int to, Front c, MasterStorage sc) {
  const int world = world_size();
  if (world < std::max(from, to)) GTEST_SKIP() << "needs " << std::max(from, to) << " ranks";
  SharedDir dir("remainder");
  Communicator comm = make_comm(b);
  DistributedAdamOptions base = ckpt_options(DType::f32);
  base.param_dtype = DType::bf16;
  const auto pow2 = [](int n) { return (n & (n - 1)) == 0; };
  const bool sum_of_one = !pow2(from) || !pow2(to);
  if (sum_of_one) base.grad_reduce = ReduceOp::Sum;
  constexpr int t1 = 5, t2 = 4;
  DistributedAdamOptions ro = ckpt_options(DType::f32);
  ro.param_dtype = DType::bf16;
  DistributedAdam ref(Communicator::self(b), fsdp_model(), ro);
  TestStream rs(b);
  init_params(ref, rs.get());
  da_train(ref, rs.get(), t1 + t2);
  save_on_first_ranks(comm, from, [&](const Communicator& g) {
    TestStream s(b);
    if (a == Front::DistAdam) {
      DistributedAdam x(g, fsdp_model(), with_storage(base, sa));
      init_params(x, s.get());
      da_train(x, s.get(), t1, sum_of_one);
      x.save(dir.sub("ckpt"), s.get());
    } else {
      FsdpOptions fo = fsdp_options(base);
      fo.master_storage = sa;
      Fsdp x(g, fsdp_model(), small_units(), fo);
      init_fsdp(x, s.get());
      fsdp_train(x, s.get(), t1, sum_of_one);
      x.save(dir.sub("ckpt"), s.get());
    }
  });
  Communicator g = first_ranks(comm, to);
  if (comm.rank() >= to) return;
  TestStream s(b);
  auto check = [&](auto& y) {
    for (int i = 0; i < y.num_params(); ++i) {
      SCOPED_TRACE(y.layout().specs()[static_cast<std::size_t>(i)].name);
      const ShardView m = y.shard_param(i);
      const auto full = to_host<std::uint32_t>(b, ref.shard_master(i).data, static_cast<std::size_t>(ref.shard_master(i).numel()));
      const auto mine = master_bits(y, i);
      for (std::size_t j = 0; j < mine.size(); ++j)
        ASSERT_EQ(mine[j], full[static_cast<std::size_t>(m.param_offset) + j]) << "element " << j;
      EXPECT_EQ(y.shard_remainder(i).numel(), sc == MasterStorage::bf16_remainder ? m.numel() : 0);
    }
  };
  DistributedAdamOptions o2 = with_storage(base, sc);
  o2.bucket_numel = 170;
  if (c == Front::DistAdam) {
    DistributedAdam y(g, fsdp_model(), o2);
    y.load(dir.sub("ckpt"), s.get());
    da_train(y, s.get(), t2, sum_of_one);
    check(y);
  } else {
    FsdpOptions fo = fsdp_options(o2);
    fo.master_storage = sc;
    Fsdp y(g, fsdp_model(), small_units(), fo);
    y.load(dir.sub("ckpt"), s.get());
    fsdp_train(y, s.get(), t2, sum_of_one);
    check(y);
  }
}

/// The memory report holds each mode to its formula: per shard element, fp32 master and
/// moments 12 bytes, remainders + fp32 moments 10, remainders + bf16 moments 6.
inline void case_state_memory_formula(Backend b) {
  const int world = world_size();
  struct Mode {
    MasterStorage master;
    DType moments;
    std::int64_t bytes;
  };
  for (const Mode& m : {Mode{MasterStorage::fp32, DType::f32, 12}, Mode{MasterStorage::bf16_remainder, DType::f32, 10},
                        Mode{MasterStorage::bf16_remainder, DType::bf16, 6}}) {
    SCOPED_TRACE(std::string(to_string(m.master)) + " + " + to_string(m.moments) + " moments");
    DistributedAdamOptions o = base_options(DType::bf16);
    o.param_dtype = DType::bf16;
    o.nccl_registered = false;
    o.master_storage = m.master;
    o.moment_dtype = m.moments;
    DistributedAdam opt(make_comm(b), small_model(), o);
    const std::int64_t n = opt.layout().total_numel();
    const MemoryReport r = opt.memory();
    EXPECT_EQ(r.master + r.remainders + r.moments, m.bytes * n / world);
    EXPECT_EQ(r.remainders, m.master == MasterStorage::fp32 ? 0 : 2 * n / world);
    EXPECT_EQ(r.total(), 2 * n + 2 * n + m.bytes * n / world);  // bf16 params and grads
  }
}

/// Bad input is a clear error on every rank, naming the option.
inline void case_remainder_errors(Backend b) {
  DistributedAdamOptions o = base_options(DType::f32);
  o.param_dtype = DType::f32;
  o.master_storage = MasterStorage::bf16_remainder;
  const auto e = error_of([&] { DistributedAdam opt(make_comm(b), small_model(DType::f32), o); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::InvalidArgument);
  EXPECT_NE(std::string(e->what()).find("master_storage is bf16_remainder"), std::string::npos) << e->what();
  EXPECT_NE(std::string(e->what()).find("no parameter is a native bf16 tensor"), std::string::npos) << e->what();
  o.param_dtype.reset();  // small_model(): bf16 tensors and the f32 norm1
  DistributedAdam opt(make_comm(b), small_model(), o);
  const auto m = error_of([&] { (void)opt.shard_master(0); });
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->code(), ErrorCode::Unsupported);
  EXPECT_NE(std::string(m->what()).find("keeps no fp32 master"), std::string::npos) << m->what();
  // A parameter in f32 (norm1) keeps its fp32 master and has no remainder.
  EXPECT_EQ(opt.shard_remainder(1).numel(), 0);
  EXPECT_EQ(opt.shard_master(1).dtype, DType::f32);
}

}  // namespace shardopt::test
