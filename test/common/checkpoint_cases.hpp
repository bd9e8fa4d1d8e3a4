// checkpoint_cases.hpp - save / load / reshard cases, written once and run on the host
// backend under mpiexec (CI, 1-4 ranks) and on one GPU (device suite).
//
// Gradients here are the same on every rank (the grid stream of rank 0), reduced with
// Average: the sum of W equal grid values is exact and so is its division by W on the
// host backend, so the reduced gradient is the same value whatever the world size. A
// run that reshards therefore equals the uninterrupted run bitwise.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fsdp_cases.hpp"
#include "fsdp_mxfp8_cases.hpp"
#include "mxfp8_params_cases.hpp"
#include "formats/json.hpp"
#include "shardopt/checkpoint.hpp"

namespace shardopt::test {

/// A directory shared by every rank of MPI_COMM_WORLD (rank 0's pid in the name),
/// removed by the destructor.
class SharedDir {
 public:
  explicit SharedDir(const std::string& name) {
    long long pid = static_cast<long long>(::getpid());
    MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    path_ = (std::filesystem::temp_directory_path() / ("shardopt-ckpt-" + std::to_string(pid) + "-" + name)).string();
    if (world_rank() == 0) {
      std::filesystem::remove_all(path_);
      std::filesystem::create_directories(path_);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  ~SharedDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::filesystem::remove_all(path_);
  }
  SharedDir(const SharedDir&) = delete;
  SharedDir& operator=(const SharedDir&) = delete;
  std::string sub(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::vector<std::uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::vector<std::uint8_t>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

inline std::string shard_file(const std::string& dir, int rank, int world) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "/shard-%05d-of-%05d.safetensors", rank, world);
  return dir + buf;
}

/// Checkpoint options: f32 gradients, Average, small buckets, clipping, a schedule.
inline DistributedAdamOptions ckpt_options(DType grad_dtype = DType::f32) {
  DistributedAdamOptions o = base_options(grad_dtype);
  o.grad_reduce = ReduceOp::Average;
  return o;
}

/// The same for quantized parameters in `format` (mx_options), Average.
inline DistributedAdamOptions q_ckpt_options(DType grad_dtype, ParamFormat format) {
  DistributedAdamOptions o = mx_options(grad_dtype, format);
  o.grad_reduce = ReduceOp::Average;
  return o;
}

/// One iteration of distributed Adam: every rank adds rank 0's grid gradients (with
/// `only_world_rank_zero`, world rank 0 alone: GradStreamParams::only_world_rank_zero).
inline void da_iteration(DistributedAdam& opt, Stream s, bool only_world_rank_zero = false) {
  GradStreamParams p;
  p.kind = GradKind::Grid;
  p.rank = 0;
  p.scalars = opt.device_scalars();
  p.microbatch = opt.device_microbatch();
  p.only_world_rank_zero = only_world_rank_zero;
  add_grads(opt.backend(), s, p, grad_targets(opt));
  report_all(opt, s);
  opt.advance_microbatch(s);
}

inline void da_train(DistributedAdam& opt, Stream s, int steps, bool only_world_rank_zero = false) {
  for (int t = 0; t < steps; ++t) {
    da_iteration(opt, s, only_world_rank_zero);
    opt.step(s);
    opt.zero_grad(s);
  }
}

inline void fsdp_train(Fsdp& f, Stream s, int steps, bool only_world_rank_zero = false) {
  for (int t = 0; t < steps; ++t) {
    fsdp_microbatch(f, s, /*rank=*/0, GradKind::Grid, {}, {}, only_world_rank_zero);
    f.advance_microbatch(s);
    f.step(s);
    f.zero_grad(s);
  }
}

/// `steps` iterations of the MXFP8 FSDP trainer: every rank adds rank 0's grid
/// gradients (`hook` sees every plane a pass reads; `only_world_rank_zero`: da_iteration's).
inline void fsdp_mx_train(Fsdp& f, Stream s, int steps, const PassHook& hook = {}, bool only_world_rank_zero = false) {
  for (int t = 0; t < steps; ++t) {
    fsdp_mx_microbatch(f, s, /*rank=*/0, GradKind::Grid, hook, false, plain_targets, {}, only_world_rank_zero);
    f.advance_microbatch(s);
    f.step(s);
    f.zero_grad(s);
  }
}

/// Everything a DistributedAdam holds on this rank, as bytes (params, MXFP8 or NVFP4
/// planes, master, moments, step).
inline std::vector<std::vector<std::uint8_t>> da_state(DistributedAdam& opt, Stream s) {
  const Backend b = opt.backend();
  std::vector<std::vector<std::uint8_t>> out;
  for (int i = 0; i < opt.num_params(); ++i) {
    if (is_quantized(opt, i)) {
      for (const auto& plane : read_q(opt, i).planes) out.push_back(plane.second);
    } else {
      out.push_back(read_bytes(b, opt.param(i)));
    }
    out.push_back(read_bytes(b, opt.shard_master(i)));
    out.push_back(read_bytes(b, opt.shard_exp_avg(i)));
    out.push_back(read_bytes(b, opt.shard_exp_avg_sq(i)));
  }
  const StepScalars x = opt.read_scalars(s);
  out.push_back({reinterpret_cast<const std::uint8_t*>(&x.step), reinterpret_cast<const std::uint8_t*>(&x.step) + 8});
  return out;
}

/// The same for an Fsdp (parameter shards of the native parameters: MXFP8 ones have none).
inline std::vector<std::vector<std::uint8_t>> fsdp_state(Fsdp& f, Stream s) {
  const Backend b = f.backend();
  std::vector<std::vector<std::uint8_t>> out;
  for (int i = 0; i < f.num_params(); ++i) {
    if (!f.is_mxfp8(i)) out.push_back(read_bytes(b, f.shard_param(i)));
    out.push_back(read_bytes(b, f.shard_master(i)));
    out.push_back(read_bytes(b, f.shard_exp_avg(i)));
    out.push_back(read_bytes(b, f.shard_exp_avg_sq(i)));
  }
  const StepScalars x = f.read_scalars(s);
  out.push_back({reinterpret_cast<const std::uint8_t*>(&x.step), reinterpret_cast<const std::uint8_t*>(&x.step) + 8});
  return out;
}

// ---------------------------------------------------------------------------- resume

/// `steps` training iterations through a StepGraph of `opt` whose iteration is `body`:
/// the first call captures (its warm-up iteration is a training step), later ones replay.
template <class Opt, class Body>
void graph_steps(Opt& opt, std::optional<StepGraph>& g, const Body& body, Stream s, int steps) {
  for (int t = 0; t < steps; ++t) {
    if (!g) {
      g.emplace(opt, body);
      g->capture(s);
    } else {
      g->replay(s);
    }
  }
}

/// Train 10 steps, save, train 10 more; a fresh optimizer that loads and trains the same
/// 10 ends bitwise where the uninterrupted one did. With `graph`, both train through a
/// captured StepGraph (the fresh one captures after its load); then the first optimizer
/// loads the checkpoint again, under its live graph, and replays on without recapture.
/// `mxfp8`: quantized parameters, in `format` (MXFP8 or NVFP4).
inline void case_resume_bitwise(Backend b, DType grad_dtype, bool graph, bool mxfp8,
                                ParamFormat format = ParamFormat::Mxfp8) {
  SharedDir dir("resume");
  Communicator comm = make_comm(b);
  DistributedAdamOptions o = ckpt_options(grad_dtype);
  std::vector<ParamSpec> specs = small_model();
  if (mxfp8) {
    o = q_ckpt_options(grad_dtype, format);
    specs = q_model(format);
  }
  auto init = [&](DistributedAdam& opt, Stream s) {
    if (mxfp8) {
      mx_init(opt, s);
    } else {
      init_params(opt, s);
    }
  };
  auto fn = [](DistributedAdam& opt) { return [&opt](Stream s, bool) { da_iteration(opt, s); }; };
  DistributedAdam a(comm, specs, o);
  TestStream sa(b);
  init(a, sa.get());
  std::optional<StepGraph> ga;
  auto run = [&](DistributedAdam& opt, std::optional<StepGraph>& g, Stream s, int steps) {
    if (!graph) return da_train(opt, s, steps);
    graph_steps(opt, g, fn(opt), s, steps);
  };
  run(a, ga, sa.get(), 10);
  a.save(dir.sub("ckpt"), sa.get(), {{"data_position", "1234"}});
  const auto at_save = da_state(a, sa.get());
  run(a, ga, sa.get(), 10);
  const auto uninterrupted = da_state(a, sa.get());

  DistributedAdam fresh(comm, specs, o);
  TestStream sf(b);
  const CheckpointInfo info = fresh.load(dir.sub("ckpt"), sf.get());
  EXPECT_EQ(info.step, 10);
  EXPECT_EQ(info.user.at("data_position"), "1234");
  EXPECT_EQ(info.saved_world_size, comm.size());
  EXPECT_TRUE(da_state(fresh, sf.get()) == at_save) << "the loaded state differs from the saved one";
  std::optional<StepGraph> gf;
  run(fresh, gf, sf.get(), 10);
  EXPECT_TRUE(da_state(fresh, sf.get()) == uninterrupted) << "resume differs from the uninterrupted run";

  if (graph) {
    // A load into a live optimizer: the graph captured before it replays on.
    a.load(dir.sub("ckpt"), sa.get());
    EXPECT_TRUE(da_state(a, sa.get()) == at_save);
    for (int t = 0; t < 10; ++t) ga->replay(sa.get());
    EXPECT_TRUE(da_state(a, sa.get()) == uninterrupted) << "replay after an in-place load differs";
  }
}

/// The same for FSDP (eager, or the whole iteration as one graph).
inline void case_fsdp_resume_bitwise(Backend b, bool graph) {
  SharedDir dir("fsdp-resume");
  Communicator comm = make_comm(b);
  const FsdpOptions fo = fsdp_options(ckpt_options(DType::f32));
  auto fn = [](Fsdp& f) { return [&f](Stream s, bool) { fsdp_microbatch(f, s, 0, GradKind::Grid); }; };
  auto run = [&](Fsdp& f, std::optional<StepGraph>& g, Stream s, int steps) {
    if (!graph) return fsdp_train(f, s, steps);
    graph_steps(f, g, fn(f), s, steps);
  };
  Fsdp a(comm, fsdp_model(), small_units(), fo);
  TestStream sa(b);
  init_fsdp(a, sa.get());
  std::optional<StepGraph> ga;
  run(a, ga, sa.get(), 10);
  a.save(dir.sub("ckpt"), sa.get());
  const auto at_save = fsdp_state(a, sa.get());
  run(a, ga, sa.get(), 10);
  const auto uninterrupted = fsdp_state(a, sa.get());
  Fsdp fresh(comm, fsdp_model(), small_units(), fo);
  TestStream sf(b);
  fresh.load(dir.sub("ckpt"), sf.get());
  EXPECT_TRUE(fsdp_state(fresh, sf.get()) == at_save);
  std::optional<StepGraph> gf;
  run(fresh, gf, sf.get(), 10);
  EXPECT_TRUE(fsdp_state(fresh, sf.get()) == uninterrupted) << "FSDP resume differs from the uninterrupted run";
}

// ---------------------------------------------------------------------------- reshard

/// A sub-group of the first `n` ranks of `comm` (the others get a group of their own,
/// unused). Collective over `comm`.
inline Communicator first_ranks(const Communicator& comm, int n) {
  return comm.split(comm.rank() < n ? 0 : 1, comm.rank());
}

/// The save half of a reshard case: `save(group)` runs on the first `from` ranks of
/// `comm` (a throw fails the test, and the ranks still meet: the load then fails on all),
/// then every rank meets at a barrier. Collective over `comm`.
template <class Save>
void save_on_first_ranks(const Communicator& comm, int from, Save&& save) {
  {
    Communicator g = first_ranks(comm, from);
    if (comm.rank() < from) {
      try {
        save(g);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "the save failed: " << e.what();
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

/// This rank's master pieces equal the matching elements of an unsharded reference.
template <class Opt>
void expect_master_matches(Opt& opt, DistributedAdam& ref, const std::string& what) {
  for (int i = 0; i < opt.num_params(); ++i) {
    SCOPED_TRACE(what + ": " + opt.layout().specs()[static_cast<std::size_t>(i)].name);
    const ShardView m = opt.shard_master(i);
    const auto mine = read_bytes(opt.backend(), m);
    const auto full = read_bytes(ref.backend(), ref.shard_master(i));
    EXPECT_TRUE(bytes_match_at(mine, full, static_cast<std::size_t>(m.param_offset) * 4));
    const ShardView v = opt.shard_exp_avg_sq(i);
    EXPECT_TRUE(bytes_match_at(read_bytes(opt.backend(), v), read_bytes(ref.backend(), ref.shard_exp_avg_sq(i)),
                               static_cast<std::size_t>(v.param_offset) * 4));
  }
}

enum class Front { DistAdam, Fsdp };

/// What a reshard case trains: the model, its options, and how each front end seeds and
/// trains it (every rank adds rank 0's grid gradients; fsdp_train's last argument:
/// world rank 0 alone adds, da_iteration's `only_world_rank_zero`).
struct ReshardModel {
  std::vector<ParamSpec> specs;
  std::vector<FsdpUnit> units;
  DistributedAdamOptions options;
  std::function<FsdpOptions(const DistributedAdamOptions&)> fsdp_options;
  std::function<void(DistributedAdam&, Stream)> da_init;
  std::function<void(Fsdp&, Stream)> fsdp_init;
  std::function<void(Fsdp&, Stream, int, bool)> fsdp_train;
};

/// Extra checks of a loaded-and-trained optimizer against the unsharded reference.
template <class Opt>
using ReshardCheck = std::function<void(Opt&, DistributedAdam& ref, Stream, const std::string& what)>;

/// Saves after `t1` steps from `from` ranks with front end `a`, loads into `to` ranks
/// with front end `c` (and bucket size `bucket`), trains `t2` more: every rank's master
/// and moments equal an unsharded DistributedAdam run of t1 + t2 steps, bitwise, then the
/// front end's `check` runs. Needs max(from, to) ranks.
inline void reshard_run(Backend b, int from, Front a, int to, Front c, const ReshardModel& m, std::int64_t bucket,
                        int t1, int t2, const ReshardCheck<DistributedAdam>& check_da,
                        const ReshardCheck<Fsdp>& check_fsdp) {
  const int world = world_size();
  if (world < std::max(from, to)) GTEST_SKIP() << "needs " << std::max(from, to) << " ranks";
  SharedDir dir("reshard");
  Communicator comm = make_comm(b);
  DistributedAdam ref(Communicator::self(b), m.specs, m.options);
  TestStream rs(b);
  m.da_init(ref, rs.get());
  da_train(ref, rs.get(), t1 + t2);
  // Equal gradients average exactly over 2^k ranks on every backend; over other group
  // sizes NCCL's average (inputs pre-multiplied by 1/size) is not exact, so there the
  // groups reduce with Sum and rank 0 alone adds its gradients (the same sum, exactly).
  const auto pow2 = [](int n) { return (n & (n - 1)) == 0; };
  const bool sum_of_one = !pow2(from) || !pow2(to);
  DistributedAdamOptions options = m.options;
  if (sum_of_one) options.grad_reduce = ReduceOp::Sum;
  save_on_first_ranks(comm, from, [&](const Communicator& g) {
    TestStream s(b);
    if (a == Front::DistAdam) {
      DistributedAdam x(g, m.specs, options);
      m.da_init(x, s.get());
      da_train(x, s.get(), t1, sum_of_one);
      x.save(dir.sub("ckpt"), s.get());
    } else {
      Fsdp x(g, m.specs, m.units, m.fsdp_options(options));
      m.fsdp_init(x, s.get());
      m.fsdp_train(x, s.get(), t1, sum_of_one);
      x.save(dir.sub("ckpt"), s.get());
    }
  });
  Communicator g = first_ranks(comm, to);
  if (comm.rank() >= to) return;
  TestStream s(b);
  DistributedAdamOptions o2 = options;
  o2.bucket_numel = bucket;  // another bucket size too
  const std::string what = std::to_string(from) + " -> " + std::to_string(to) + " ranks";
  auto finish = [&](auto& y, auto train, const auto& check) {
    const CheckpointInfo info = y.load(dir.sub("ckpt"), s.get());
    EXPECT_EQ(info.saved_world_size, from);
    train(y, s.get(), t2, sum_of_one);
    EXPECT_EQ(y.read_scalars(s.get()).step, t1 + t2);
    expect_master_matches(y, ref, what);
    if (check) check(y, ref, s.get(), what);
  };
  if (c == Front::DistAdam) {
    DistributedAdam y(g, m.specs, o2);
    finish(y, da_train, check_da);
  } else {
    Fsdp y(g, m.specs, m.units, m.fsdp_options(o2));
    finish(y, m.fsdp_train, check_fsdp);
  }
}

/// Native parameters (bf16, as FSDP keeps them): also every DistributedAdam parameter
/// equals the reference's.
inline void case_reshard(Backend b, int from, Front a, int to, Front c, int t1 = 6, int t2 = 5) {
  ReshardModel m{fsdp_model(), small_units(), ckpt_options(DType::f32), fsdp_options, init_params, init_fsdp,
                 [](Fsdp& f, Stream s, int steps, bool only_rank_zero) { fsdp_train(f, s, steps, only_rank_zero); }};
  m.options.param_dtype = DType::bf16;  // one dtype, as FSDP keeps
  reshard_run(b, from, a, to, c, m, 170, t1, t2,
              [b](DistributedAdam& y, DistributedAdam& ref, Stream, const std::string&) {
                for (int i = 0; i < y.num_params(); ++i) EXPECT_EQ(read_bytes(b, y.param(i)), read_bytes(b, ref.param(i)));
              },
              {});
}

/// small_model() with its grouped "experts" registered as three discrete parameters
/// named like the grouped one's members.
inline std::vector<ParamSpec> discrete_model() {
  std::vector<ParamSpec> out;
  for (const ParamSpec& s : small_model()) {
    if (s.member_shapes.empty()) {
      out.push_back(s);
      continue;
    }
    for (int m = 0; m < s.members(); ++m) out.push_back(ParamSpec::tensor(s.member_name(m), s.member_shapes[0], s.dtype, s.group));
  }
  return out;
}

/// Host-written gradients keyed by model tensor (name, element) and step, so that a
/// grouped registration and its discrete members get the same values.
inline void named_grads(DistributedAdam& opt, int step) {
  for (int i = 0; i < opt.num_params(); ++i) {
    const ParamSpec& spec = opt.layout().specs()[static_cast<std::size_t>(i)];
    const GradView g = opt.grad(i);
    const std::int64_t M = g.numel() / spec.members();
    std::vector<float> v(static_cast<std::size_t>(g.numel()));
    for (std::int64_t j = 0; j < g.numel(); ++j) {
      const std::string name = spec.member_name(static_cast<int>(j / M));
      const std::uint64_t id = std::hash<std::string>{}(name) & 0xFFFF;
      v[static_cast<std::size_t>(j)] = grad_value(GradKind::Grid, 1.0f, step, 0, 0, static_cast<std::int32_t>(id), j % M);
    }
    std::vector<std::uint8_t> bytes(g.bytes());
    for (std::size_t k = 0; k < v.size(); ++k) {
      const std::uint32_t code = num::encode(g.dtype, v[k]);
      std::memcpy(bytes.data() + k * size_of(g.dtype), &code, size_of(g.dtype));
    }
    from_host(opt.backend(), g.data, bytes);
  }
}

/// Grouped -> discrete and back: a checkpoint of the grouped registration loads into the
/// discrete one (and the reverse), and both then train identically.
inline void case_grouped_discrete(Backend b, bool grouped_first) {
  SharedDir dir("grouped");
  Communicator comm = make_comm(b);
  DistributedAdamOptions o = ckpt_options(DType::f32);
  const auto first = grouped_first ? small_model() : discrete_model();
  const auto second = grouped_first ? discrete_model() : small_model();
  auto train = [&](DistributedAdam& opt, Stream s, int from, int steps) {
    for (int t = from; t < from + steps; ++t) {
      named_grads(opt, t);
      report_all(opt, s);
      opt.step(s);
      opt.zero_grad(s);
    }
  };
  TestStream s(b), s2(b);
  DistributedAdam x(comm, first, o);
  init_params(x, s.get());  // values by parameter index: the two registrations differ here
  train(x, s.get(), 0, 4);
  x.save(dir.sub("a"), s.get());
  DistributedAdam y(comm, second, o);
  y.load(dir.sub("a"), s2.get());
  train(x, s.get(), 4, 4);
  train(y, s2.get(), 4, 4);
  // Compare by model tensor: the first's member m of 'experts' is the second's 'experts.m'.
  auto tensor_bytes = [](DistributedAdam& opt, const std::string& name) {
    for (int i = 0; i < opt.num_params(); ++i) {
      const ParamSpec& spec = opt.layout().specs()[static_cast<std::size_t>(i)];
      for (int m = 0; m < spec.members(); ++m) {
        if (spec.member_name(m) != name) continue;
        const auto all = read_bytes(opt.backend(), opt.param(i));
        const std::size_t per = all.size() / static_cast<std::size_t>(spec.members());
        return std::vector<std::uint8_t>(all.begin() + static_cast<std::ptrdiff_t>(per * m),
                                         all.begin() + static_cast<std::ptrdiff_t>(per * (m + 1)));
      }
    }
    return std::vector<std::uint8_t>{};
  };
  for (const ParamSpec& spec : small_model())
    for (int m = 0; m < spec.members(); ++m) {
      const std::string name = spec.member_name(m);
      const auto bx = tensor_bytes(x, name), by = tensor_bytes(y, name);
      EXPECT_FALSE(bx.empty()) << name;
      EXPECT_EQ(bx, by) << name;
    }
  // And back: the second's checkpoint loads into a fresh first registration.
  y.save(dir.sub("b"), s2.get());
  DistributedAdam z(comm, first, o);
  z.load(dir.sub("b"), s.get());
  for (const ParamSpec& spec : small_model())
    for (int m = 0; m < spec.members(); ++m) EXPECT_EQ(tensor_bytes(z, spec.member_name(m)), tensor_bytes(y, spec.member_name(m)));
}

/// A native (bf16) checkpoint loads into MXFP8 parameters: the master is the saved one
/// and the MXFP8 storage is quantize(bf16(master)), as a fresh quantize makes it; and the
/// MXFP8 optimizer's checkpoint loads back into native parameters.
inline void case_native_to_mxfp8(Backend b, ParamFormat format = ParamFormat::Mxfp8) {
  SharedDir dir("mx");
  Communicator comm = make_comm(b);
  DistributedAdamOptions native = ckpt_options(DType::bf16);
  native.param_dtype = DType::bf16;
  DistributedAdam x(comm, q_model(format), native);
  TestStream s(b);
  init_params(x, s.get());
  da_train(x, s.get(), 3);
  x.save(dir.sub("ckpt"), s.get());
  DistributedAdamOptions mo = q_ckpt_options(DType::bf16, format);
  DistributedAdam y(comm, q_model(format), mo);
  y.load(dir.sub("ckpt"), s.get());
  // The two layouts differ (MXFP8 keeps its 1-D parameters in a buffer of their own), so
  // compare whole masters, assembled from every rank's pieces.
  for (int i = 0; i < y.num_params(); ++i) {
    const auto my = full_master(y, i), mx = full_master(x, i);
    EXPECT_TRUE(my == mx) << y.layout().specs()[static_cast<std::size_t>(i)].name;
  }
  expect_matches_oracle(y, "after loading a bf16 checkpoint into MXFP8 parameters");
  // And back: the MXFP8 optimizer's checkpoint (MXFP8 planes, no bf16 parameter) loads
  // into native parameters, which are then bf16(master).
  y.save(dir.sub("mx"), s.get());
  DistributedAdam z(comm, q_model(format), native);
  z.load(dir.sub("mx"), s.get());
  for (int i = 0; i < z.num_params(); ++i) {
    const auto mz = full_master(z, i), mx = full_master(x, i);
    EXPECT_TRUE(mz == mx) << "MXFP8 -> native: " << z.layout().specs()[static_cast<std::size_t>(i)].name;
    EXPECT_EQ(read_bytes(b, z.param(i)), read_bytes(b, x.param(i)));
  }
}

/// The NVFP4 kinds of a checkpoint: assembled from every file's slices (each byte
/// exactly once, though two ranks' pieces share data bytes at odd boundaries), the
/// nvfp4_data, nvfp4_scale and nvfp4_amax of each member equal the saving optimizer's
/// storage, and the index says format "nvfp4". Read with a minimal safetensors parser
/// of its own (8-byte header length, JSON header, data), as an outside reader would.
inline void case_nvfp4_saved_planes(Backend b) {
  SharedDir dir("nv");
  Communicator comm = make_comm(b);
  DistributedAdamOptions o = q_ckpt_options(DType::bf16, ParamFormat::Nvfp4);
  DistributedAdam x(comm, q_model(ParamFormat::Nvfp4), o);
  TestStream s(b);
  mx_init(x, s.get());
  da_train(x, s.get(), 3);
  x.save(dir.sub("ckpt"), s.get());
  s.sync();
  if (world_size() > 1) {
    EXPECT_GT(count_odd_boundaries(x), 0);
  }
  const std::string ck = dir.sub("ckpt");
  const std::vector<std::uint8_t> index_bytes = file_bytes(ck + "/index.json");
  const json::Value index = json::parse(std::string(index_bytes.begin(), index_bytes.end()));
  struct Parsed {
    std::vector<std::uint8_t> bytes;
    json::Value header;
    std::size_t data = 0;
  };
  std::vector<Parsed> files;
  for (const json::Value& f : json::as_array(json::at(index, "files"))) {
    Parsed p;
    p.bytes = file_bytes(ck + "/" + json::as_string(json::at(f, "file")));
    std::uint64_t n = 0;
    std::memcpy(&n, p.bytes.data(), 8);
    p.header = json::parse(std::string(p.bytes.begin() + 8, p.bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n)));
    p.data = 8 + n;
    files.push_back(std::move(p));
  }
  // The bytes of model tensor `name`'s kind `kind` (n bytes), every byte from one slice.
  auto assemble = [&](const std::string& name, const std::string& kind, std::size_t elem, std::size_t n) {
    std::vector<std::uint8_t> out(n, 0);
    std::vector<int> seen(n, 0);
    const json::Value* list = json::find(json::at(index, "slices"), name + "/" + kind);
    EXPECT_NE(list, nullptr) << name << "/" << kind;
    if (list == nullptr) return out;
    for (const json::Value& sl : json::as_array(*list)) {
      const Parsed& f = files[static_cast<std::size_t>(json::as_int(json::at(sl, "file")))];
      const std::int64_t off = json::as_int(json::at(sl, "offset")), len = json::as_int(json::at(sl, "length"));
      const json::Value* t = json::find(f.header, name + "/" + kind + "@" + std::to_string(off));
      EXPECT_NE(t, nullptr);
      if (t == nullptr) continue;
      EXPECT_EQ(json::as_string(json::at(*t, "dtype")), elem == 1 ? "U8" : "F32");
      const std::int64_t begin = json::as_int(json::as_array(json::at(*t, "data_offsets"))[0]);
      for (std::int64_t k = 0; k < len * static_cast<std::int64_t>(elem); ++k) {
        const auto at = static_cast<std::size_t>(off) * elem + static_cast<std::size_t>(k);
        if (at >= n) continue;
        out[at] = f.bytes[f.data + static_cast<std::size_t>(begin + k)];
        ++seen[at];
      }
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }))
        << name << "/" << kind << ": not every byte saved exactly once";
    return out;
  };
  int checked = 0;
  for (int i = 0; i < x.num_params(); ++i) {
    if (!x.is_nvfp4(i)) continue;
    const ParamSpec& spec = x.layout().specs()[static_cast<std::size_t>(i)];
    const Nvfp4View v = x.nvfp4_param(i);
    for (int m = 0; m < spec.members(); ++m) {
      const std::string name = spec.member_name(m);
      SCOPED_TRACE(name);
      const nvfp4_ref::Quantized want = read_nvfp4_member(x, i, m);
      EXPECT_EQ(json::as_string(json::at(json::at(json::at(index, "tensors"), name), "format")), "nvfp4");
      EXPECT_EQ(assemble(name, "nvfp4_data", 1, static_cast<std::size_t>(v.shape.data_bytes())), want.data);
      EXPECT_EQ(assemble(name, "nvfp4_scale", 1, static_cast<std::size_t>(v.shape.scale_numel())), want.scale);
      EXPECT_EQ(assemble(name, "nvfp4_amax", 4, 4), bytes_of(want.amax));
      ++checked;
    }
  }
  EXPECT_GT(checked, 3);
}

// ---------------------------------------------------------------------------- async

/// save_async overlapped with ten training steps writes the same files as a synchronous
/// save at the same step.
inline void case_async_equals_sync(Backend b) {
  SharedDir dir("async");
  Communicator comm = make_comm(b);
  const DistributedAdamOptions o = ckpt_options(DType::bf16);
  DistributedAdam x(comm, small_model(), o), y(comm, small_model(), o);
  TestStream sx(b), sy(b);
  init_params(x, sx.get());
  init_params(y, sy.get());
  da_train(x, sx.get(), 5);
  da_train(y, sy.get(), 5);
  SaveHandle h = x.save_async(dir.sub("async"), sx.get(), {{"k", "v"}});
  EXPECT_FALSE(h.done());
  da_train(x, sx.get(), 10);  // training goes on while the file is written
  h.wait();
  EXPECT_TRUE(h.done());
  y.save(dir.sub("sync"), sy.get(), {{"k", "v"}});
  const int r = comm.rank(), w = comm.size();
  EXPECT_EQ(file_bytes(shard_file(dir.sub("async"), r, w)), file_bytes(shard_file(dir.sub("sync"), r, w)));
  if (r == 0) { EXPECT_EQ(file_bytes(dir.sub("async/index.json")), file_bytes(dir.sub("sync/index.json"))); }
  // The snapshot was of step 5: loading it gives step 5, and the same state as y.
  DistributedAdam z(comm, small_model(), o);
  TestStream sz(b);
  EXPECT_EQ(z.load(dir.sub("async"), sz.get()).step, 5);
  EXPECT_TRUE(da_state(z, sz.get()) == da_state(y, sy.get()));
}

// ---------------------------------------------------------------------------- Python

/// Writes `count` elements as a 1-D .npy file (format 1.0) of numpy type `descr`.
inline void write_npy(const std::string& path, const std::string& descr, const void* data, std::size_t count,
                      std::size_t elem) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + std::to_string(count) + ",), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const auto n = static_cast<std::uint16_t>(header.size());
  const char len[2] = {static_cast<char>(n & 0xFF), static_cast<char>(n >> 8)};
  f.write(len, 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(count * elem));
}

/// For test/python/run_cpp_checkpoint.sh: saves a trained checkpoint (bf16 moments, a
/// grouped parameter, an f32 parameter) into $SHARDOPT_CKPT_OUT/ckpt and, from an
/// unsharded twin trained identically, every tensor's expected values as
/// $SHARDOPT_CKPT_OUT/expect/TENSOR__KIND.npy, for the Python tool to compare. Also an
/// NVFP4 optimizer's checkpoint (odd member sizes: rank boundaries inside bytes) into
/// ckpt_nvfp4, with the NVFP4 planes it holds as expect_nvfp4/TENSOR__nvfp4_*.npy.
inline void case_write_for_python(Backend b) {
  const char* out = std::getenv("SHARDOPT_CKPT_OUT");
  if (out == nullptr) GTEST_SKIP() << "SHARDOPT_CKPT_OUT is not set (test/python/run_cpp_checkpoint.sh sets it)";
  Communicator comm = make_comm(b);
  DistributedAdamOptions o = ckpt_options(DType::f32);
  o.moment_dtype = DType::bf16;
  DistributedAdam x(comm, small_model(), o), ref(Communicator::self(b), small_model(), o);
  TestStream s(b), rs(b);
  init_params(x, s.get());
  init_params(ref, rs.get());
  da_train(x, s.get(), 4);
  da_train(ref, rs.get(), 4);
  x.save(std::string(out) + "/ckpt", s.get());
  DistributedAdamOptions nvo = q_ckpt_options(DType::bf16, ParamFormat::Nvfp4);
  DistributedAdam nv(comm, q_model(ParamFormat::Nvfp4), nvo);
  TestStream ns(b);
  mx_init(nv, ns.get());
  da_train(nv, ns.get(), 2);
  nv.save(std::string(out) + "/ckpt_nvfp4", ns.get());
  // The same MXFP8 state saved by Fsdp and by DistributedAdam: the tool must read the
  // same tensors, every kind, from both (run_cpp_checkpoint.sh compares them).
  {
    const DistributedAdamOptions mo = q_ckpt_options(DType::f32, ParamFormat::Mxfp8);
    DistributedAdam dm(comm, mx_model(), mo);
    FsdpOptions fmo = fsdp_mx_options(mo);
    fmo.param_dtype = DType::f32;  // the 1-D parameters as DistributedAdam keeps them beside MXFP8
    std::vector<ParamSpec> fspecs = mx_model();
    for (ParamSpec& spec : fspecs)
      if (spec.shape.size() < 2) spec.dtype = DType::f32;  // what Fsdp stores them in must be their spec dtype
    Fsdp fm(comm, fspecs, mx_units(), fmo);
    TestStream ds(b), fs(b);
    mx_init(dm, ds.get());
    fsdp_mx_init(fm, fs.get());
    da_train(dm, ds.get(), 3);
    fsdp_mx_train(fm, fs.get(), 3);
    dm.save(std::string(out) + "/ckpt_da_mxfp8", ds.get());
    fm.save(std::string(out) + "/ckpt_fsdp_mxfp8", fs.get());
  }
  ns.sync();
  if (comm.rank() != 0) return;
  const std::string expect_nv = std::string(out) + "/expect_nvfp4";
  std::filesystem::create_directories(expect_nv);
  for (int i = 0; i < nv.num_params(); ++i) {
    if (!nv.is_nvfp4(i)) continue;
    const ParamSpec& spec = nv.layout().specs()[static_cast<std::size_t>(i)];
    for (int m = 0; m < spec.members(); ++m) {
      const nvfp4_ref::Quantized q = read_nvfp4_member(nv, i, m);
      const std::string base = expect_nv + "/" + spec.member_name(m) + "__";
      write_npy(base + "nvfp4_data.npy", "|u1", q.data.data(), q.data.size(), 1);
      write_npy(base + "nvfp4_scale.npy", "|u1", q.scale.data(), q.scale.size(), 1);
      write_npy(base + "nvfp4_amax.npy", "<f4", &q.amax, 1, 4);
    }
  }
  const std::string expect = std::string(out) + "/expect";
  std::filesystem::create_directories(expect);
  auto dump = [&](const std::string& tensor, const char* kind, const TensorView& v, std::int64_t first,
                  std::int64_t count) {
    const auto bytes = read_bytes(b, v);
    const std::size_t es = size_of(v.dtype);
    const std::string descr = v.dtype == DType::f32 ? "<f4" : "<u2";  // bf16 as its bit patterns
    write_npy(expect + "/" + tensor + "__" + kind + ".npy", descr, bytes.data() + static_cast<std::size_t>(first) * es,
              static_cast<std::size_t>(count), es);
  };
  for (int i = 0; i < ref.num_params(); ++i) {
    const ParamSpec& spec = ref.layout().specs()[static_cast<std::size_t>(i)];
    const std::int64_t M = numel(spec.shape) / spec.members();
    for (int m = 0; m < spec.members(); ++m) {
      dump(spec.member_name(m), "master", ref.shard_master(i), m * M, M);
      dump(spec.member_name(m), "exp_avg", ref.shard_exp_avg(i), m * M, M);
      dump(spec.member_name(m), "exp_avg_sq", ref.shard_exp_avg_sq(i), m * M, M);
      dump(spec.member_name(m), "param", ref.param(i), m * M, M);
    }
  }
}

// ---------------------------------------------------------------------------- bad input

/// load(dir) of `opt` throws an Error whose message contains `part`.
inline void expect_load_error(DistributedAdam& opt, const std::string& dir, const std::string& part) {
  TestStream s(opt.backend());
  std::optional<Error> e;
  try {
    opt.load(dir, s.get());
  } catch (const Error& err) {
    e = err;
  }
  ASSERT_TRUE(e.has_value()) << "load(" << dir << ") did not refuse it";
  EXPECT_NE(std::string(e->what()).find(part), std::string::npos) << e->what();
}

/// Member `key` of JSON object `v`, to change in place.
inline json::Value& member_ref(json::Value& v, const std::string& key) {
  const auto it = v.find(key);
  if (it == v.end()) throw std::runtime_error("the JSON object has no member '" + key + "'");
  return *it;
}

/// Rewrites `file` as its 8-byte little-endian header length `length`, `header` and its
/// old data section (the bytes after its old header).
inline void put_header(const std::string& file, std::uint64_t length, const std::string& header) {
  const auto bytes = file_bytes(file);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<std::size_t>(i)];
  std::vector<std::uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(length >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), bytes.begin() + static_cast<std::ptrdiff_t>(8 + n), bytes.end());
  write_bytes(file, out);
}

/// Changes the safetensors header of `file` in place: `edit` gets the tensor entry whose
/// data ends last (its "shape" and "data_offsets" members).
inline void edit_last_tensor(const std::string& file, const std::function<void(json::Value& shape, json::Value& offsets)>& edit) {
  const auto bytes = file_bytes(file);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<std::size_t>(i)];
  json::Value h = json::parse(std::string(bytes.begin() + 8, bytes.begin() + static_cast<std::ptrdiff_t>(8 + n)));
  json::Value* last = nullptr;
  for (auto& [name, t] : h.items())
    if (name != "__metadata__" && (last == nullptr || json::as_int(json::as_array(t.at("data_offsets"))[1]) >
                                                          json::as_int(json::as_array(last->at("data_offsets"))[1])))
      last = &t;
  edit(member_ref(*last, "shape"), member_ref(*last, "data_offsets"));
  const std::string text = json::write(h);
  put_header(file, text.size(), text);
}

/// Changes `dir`/index.json in place.
inline void edit_index(const std::string& dir, const std::function<void(json::Value&)>& edit) {
  const auto bytes = file_bytes(dir + "/index.json");
  json::Value index = json::parse(std::string(bytes.begin(), bytes.end()));
  edit(index);
  const std::string text = json::write(index, 1);
  write_bytes(dir + "/index.json", {text.begin(), text.end()});
}

/// The last slice listed of the first "/master" kind in an index: a piece only its
/// saving rank reads back, at the highest offset of its tensor.
inline json::Value& last_master_slice(json::Value& index) {
  for (auto& [key, list] : member_ref(index, "slices").items())
    if (key.size() > 7 && key.compare(key.size() - 7, 7, "/master") == 0) return list.back();
  throw std::runtime_error("the index has no master slices");
}

/// Every bad checkpoint is refused on every rank with a clear error, and the optimizer
/// is left exactly as it was: damaged or incomplete ones, and hostile ones (a copy of a
/// good one with a header or the index rewritten, issue 30).
inline void case_bad_checkpoints(Backend b) {
  SharedDir dir("bad");
  Communicator comm = make_comm(b);
  const DistributedAdamOptions o = ckpt_options(DType::f32);
  const int r = comm.rank(), w = comm.size();
  DistributedAdam x(comm, small_model(), o);
  TestStream s(b);
  init_params(x, s.get());
  da_train(x, s.get(), 2);
  const std::string good = dir.sub("good");
  x.save(good, s.get());
  da_train(x, s.get(), 1);
  const auto before = da_state(x, s.get());
  auto expect_refused = [&](const std::string& path, const std::string& part) {
    SCOPED_TRACE(path + " (" + part + ")");
    std::optional<Error> e;
    try {
      x.load(path, s.get());
    } catch (const Error& err) {
      e = err;
    }
    ASSERT_TRUE(e.has_value()) << "load did not refuse it";
    EXPECT_NE(std::string(e->what()).find(part), std::string::npos) << e->what();
    EXPECT_TRUE(da_state(x, s.get()) == before) << "a refused load changed the optimizer";
  };
  // A copy of the good checkpoint, damaged by rank 0 with `damage`.
  auto variant = [&](const std::string& name, const std::function<void(const std::string&)>& damage) {
    const std::string d = dir.sub(name);
    if (r == 0) {
      std::filesystem::copy(good, d, std::filesystem::copy_options::recursive);
      damage(d);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return d;
  };
  expect_refused(dir.sub("missing"), "does not exist");
  expect_refused(variant("empty", [](const std::string& d) {
                   for (const auto& e : std::filesystem::directory_iterator(d)) std::filesystem::remove(e.path());
                 }),
                 "not a shardopt checkpoint");
  // A save killed between files: no index, only some shard files.
  expect_refused(variant("killed", [w](const std::string& d) {
                   std::filesystem::remove(d + "/index.json");
                   if (w > 1) std::filesystem::remove(shard_file(d, w - 1, w));
                 }),
                 "incomplete checkpoint");
  expect_refused(variant("truncated", [w](const std::string& d) {
                   const std::string f = shard_file(d, w - 1, w);
                   auto bytes = file_bytes(f);
                   bytes.resize(bytes.size() - 7);
                   write_bytes(f, bytes);
                 }),
                 "bytes");
  expect_refused(variant("flipped", [w](const std::string& d) {
                   const std::string f = shard_file(d, w - 1, w);
                   auto bytes = file_bytes(f);
                   bytes[bytes.size() - 3] ^= 0x40;  // a data byte
                   write_bytes(f, bytes);
                 }),
                 "checksum");
  expect_refused(variant("newer", [](const std::string& d) {
                   auto text = file_bytes(d + "/index.json");
                   std::string t(text.begin(), text.end());
                   const auto at = t.find("\"format_version\": 1");
                   if (at != std::string::npos) t.replace(at, 19, "\"format_version\": 7");
                   write_bytes(d + "/index.json", {t.begin(), t.end()});
                 }),
                 "newer");
  expect_refused(variant("dtype", [](const std::string& d) {
                   for (const auto& e : std::filesystem::directory_iterator(d)) {
                     if (e.path().extension() != ".safetensors") continue;
                     auto bytes = file_bytes(e.path().string());
                     std::string t(bytes.begin(), bytes.end());
                     const auto at = t.find("\"F32\"");
                     if (at != std::string::npos) t.replace(at, 5, "\"Q32\"");
                     write_bytes(e.path().string(), {t.begin(), t.end()});
                   }
                 }),
                 "Q32");
  // Hostile headers (of the last rank's file).
  const std::string last_file = shard_file("", w - 1, w);
  expect_refused(variant("header-2p60", [&](const std::string& d) {
                   auto bytes = file_bytes(d + last_file);
                   for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = i == 7 ? 0x10 : 0;  // 2^60
                   write_bytes(d + last_file, bytes);
                 }),
                 "header length 1152921504606846976 exceeds the limit");
  expect_refused(variant("offsets-past-end", [&](const std::string& d) {
                   edit_last_tensor(d + last_file, [](json::Value& shape, json::Value& off) {
                     // Shape and offsets agree, but the data would run 1 MiB elements
                     // past the end of the file.
                     const std::int64_t n = json::as_int(json::as_array(shape)[0]);
                     const std::int64_t b0 = json::as_int(json::as_array(off)[0]), e0 = json::as_int(json::as_array(off)[1]);
                     const std::int64_t grow = std::int64_t{1} << 20;
                     json::as_array(shape)[0] = json::Value(n + grow);
                     json::as_array(off)[1] = json::Value(e0 + grow * ((e0 - b0) / n));
                   });
                 }),
                 "file is truncated: its header describes");
  expect_refused(variant("offsets-reversed", [&](const std::string& d) {
                   edit_last_tensor(d + last_file, [](json::Value&, json::Value& off) {
                     std::swap(json::as_array(off)[0], json::as_array(off)[1]);
                   });
                 }),
                 "is not [begin, end] with 0 <= begin <= end");
  expect_refused(variant("shape-2p62", [&](const std::string& d) {
                   edit_last_tensor(d + last_file, [](json::Value& shape, json::Value&) {
                     json::as_array(shape)[0] = json::Value(std::int64_t{1} << 62);
                   });
                 }),
                 "shape [4611686018427387904] of");
  expect_refused(variant("shape-negative", [&](const std::string& d) {
                   edit_last_tensor(d + last_file, [](json::Value& shape, json::Value&) {
                     json::as_array(shape)[0] = json::Value(std::int64_t{-3});
                   });
                 }),
                 "not a non-negative integer");
  expect_refused(variant("nested", [&](const std::string& d) {
                   const std::string text = "{\"x\":" + std::string(200000, '[') + std::string(200000, ']') + "}";
                   put_header(d + last_file, text.size(), text);
                 }),
                 "nesting deeper than");
  // Hostile indexes.
  expect_refused(variant("slice-offset-2p62", [](const std::string& d) {
                   edit_index(d, [](json::Value& index) {
                     member_ref(last_master_slice(index), "offset") = json::Value(std::int64_t{1} << 62);
                   });
                 }),
                 "slices cover");
  expect_refused(variant("slice-length-2p40", [](const std::string& d) {
                   edit_index(d, [](json::Value& index) {
                     member_ref(last_master_slice(index), "length") = json::Value(std::int64_t{1} << 40);
                   });
                 }),
                 "the index gives its slice 1099511627776");
  expect_refused(variant("slice-overflow", [](const std::string& d) {
                   edit_index(d, [](json::Value& index) {
                     member_ref(last_master_slice(index), "offset") = json::Value(std::int64_t{1} << 62);
                     member_ref(last_master_slice(index), "length") = json::Value(std::int64_t{3} << 61);
                   });
                 }),
                 "which is no range of elements");
  auto name_file = [&](const std::string& tag, const std::string& name) {
    return variant(tag, [&](const std::string& d) {
      edit_index(d, [&](json::Value& index) {
        member_ref(json::as_array(member_ref(index, "files"))[static_cast<std::size_t>(w - 1)], "file") = json::Value(name);
      });
    });
  };
  const std::string plain = "a checkpoint names only plain files inside its directory";
  expect_refused(name_file("name-passwd", "../../../../etc/passwd"), plain);
  // A valid shard moved next to the directory and named as "../NAME": refused, not loaded.
  expect_refused(variant("name-moved", [&](const std::string& d) {
                   std::filesystem::rename(d + last_file, d + "/../moved-" + last_file.substr(1));
                   edit_index(d, [&](json::Value& index) {
                     member_ref(json::as_array(member_ref(index, "files"))[static_cast<std::size_t>(w - 1)], "file") =
                         json::Value("../moved-" + last_file.substr(1));
                   });
                 }),
                 plain);
  expect_refused(name_file("name-absolute", "/etc/passwd"), plain);
  expect_refused(name_file("name-backslash", "..\\x.safetensors"), plain);
  expect_refused(name_file("name-dot", "."), plain);
  expect_refused(name_file("name-dotdot", ".."), plain);
  expect_refused(name_file("name-empty", ""), plain);
  expect_refused(name_file("name-nul", std::string("shard") + '\0' + ".safetensors"), plain);
  expect_refused(variant("world-100000", [](const std::string& d) {
                   edit_index(d, [](json::Value& index) { member_ref(index, "world_size") = json::Value(100000); });
                 }),
                 "gives world_size 100000 but lists " + std::to_string(w) + " files");
  // Another model: a parameter missing, or of another shape.
  {
    auto specs = small_model();
    specs.push_back(ParamSpec::tensor("extra", {9, 5}));
    DistributedAdam big(comm, specs, o);
    expect_load_error(big, good, "no tensor 'extra'");
  }
  {
    auto specs = small_model();
    specs[2] = ParamSpec::tensor("w1", {16, 24});
    DistributedAdam other(comm, specs, o);
    expect_load_error(other, good, "has shape [24, 16]");
  }
  // The good one still loads.
  x.load(good, s.get());
  EXPECT_EQ(x.read_scalars(s.get()).step, 2);
}

// ---------------------------------------------------------------------------- FSDP + MXFP8

/// A hook that appends every MXFP8 plane (data and scales) a pass reads to `out`.
inline PassHook record_planes(Fsdp& f, std::vector<std::vector<std::uint8_t>>& out) {
  return [&f, &out](int, int u, FsdpPass pass, Stream st) {
    for (int i = 0; i < f.num_params(); ++i) {
      if (f.unit_of(i) != u || !f.is_mxfp8(i)) continue;
      PassBytes got = read_pass(f, i, pass, st);
      out.push_back(std::move(got.data));
      out.push_back(std::move(got.scales));
    }
  };
}

/// Every MXFP8 plane (data and scales) each pass reads, copied on the stream right after
/// its wait_param into buffers of its own, so that a captured iteration copies them at
/// every replay too; collect() reads them after each iteration (eager or replayed).
struct PlaneSnapshots {
  Backend b;
  std::vector<DeviceBuffer> bufs;  // in hook order: position, parameter, data then scales
  std::vector<std::size_t> sizes;
  std::size_t next = 0;
  explicit PlaneSnapshots(Backend backend) : b(backend) {}
  PassHook hook(Fsdp& f) {
    return [this, &f](int position, int u, FsdpPass pass, Stream st) {
      if (position == 0) next = 0;  // an iteration's first pass (a warm-up's, the capture's, an eager one's)
      for (int i = 0; i < f.num_params(); ++i) {
        if (f.unit_of(i) != u || !f.is_mxfp8(i)) continue;
        const Mxfp8PassView v = f.mxfp8_param(i, pass);
        const std::int64_t ns = pass == FsdpPass::Forward ? v.shape.scale_row_numel() : v.shape.scale_col_numel();
        for (const auto& [from, n] : {std::pair<const void*, std::int64_t>{v.data, v.shape.numel()}, {v.scales, ns}}) {
          if (next == bufs.size()) {
            bufs.emplace_back(b, static_cast<std::size_t>(n));
            sizes.push_back(static_cast<std::size_t>(n));
          }
          copy_async(b, bufs[next].data(), from, static_cast<std::size_t>(n), st);
          ++next;
        }
      }
    };
  }
  /// Appends the last iteration's snapshots to `out` (null: drops them); waits for `s`.
  void collect(Fsdp& f, Stream s, std::vector<std::vector<std::uint8_t>>* out) {
    f.synchronize(s);
    for (std::size_t k = 0; out != nullptr && k < bufs.size(); ++k) out->push_back(to_host<std::uint8_t>(b, bufs[k].data(), sizes[k]));
    next = 0;
  }
};

/// The planes of one probe iteration (forward rowwise, backward columnwise; no step).
inline std::vector<std::vector<std::uint8_t>> fsdp_mx_probe(Fsdp& f, Stream s) {
  std::vector<std::vector<std::uint8_t>> planes;
  fsdp_mx_microbatch(f, s, 0, GradKind::Grid, record_planes(f, planes));
  return planes;
}

/// Fsdp + MXFP8: train 10, save, train 10; a fresh one loads and trains 10: master,
/// moments and step equal the saved ones after the load and the uninterrupted run's at
/// the end, and every plane the passes gather after the load (every iteration's, eager
/// or replayed, snapshotted on the stream; then a final eager probe iteration's, rowwise
/// and columnwise) equals the uninterrupted run's bitwise. `graph`: both train through a
/// whole-iteration StepGraph.
inline void case_fsdp_mx_resume_bitwise(Backend b, bool graph) {
  SharedDir dir("fsdp-mx-resume");
  Communicator comm = make_comm(b);
  const FsdpOptions fo = fsdp_mx_options(q_ckpt_options(DType::f32, ParamFormat::Mxfp8));
  auto run = [&](Fsdp& f, PlaneSnapshots& snaps, std::optional<StepGraph>& g, Stream s, int steps,
                 std::vector<std::vector<std::uint8_t>>* planes) {
    for (int t = 0; t < steps; ++t) {
      if (graph)
        graph_steps(
            f, g, [&f, &snaps](Stream st, bool) { fsdp_mx_microbatch(f, st, 0, GradKind::Grid, snaps.hook(f)); }, s, 1);
      else
        fsdp_mx_train(f, s, 1, snaps.hook(f));
      snaps.collect(f, s, planes);
    }
  };
  Fsdp a(comm, mx_model(), mx_units(), fo);
  TestStream sa(b);
  fsdp_mx_init(a, sa.get());
  std::optional<StepGraph> ga;
  PlaneSnapshots snaps_a(b), snaps_f(b);
  run(a, snaps_a, ga, sa.get(), 10, nullptr);
  a.save(dir.sub("ckpt"), sa.get(), {{"data_position", "77"}});
  const auto at_save = fsdp_state(a, sa.get());
  std::vector<std::vector<std::uint8_t>> planes_a, planes_f;
  run(a, snaps_a, ga, sa.get(), 10, &planes_a);
  const auto uninterrupted = fsdp_state(a, sa.get());
  const auto probe_a = fsdp_mx_probe(a, sa.get());

  Fsdp fresh(comm, mx_model(), mx_units(), fo);
  TestStream sf(b);
  const CheckpointInfo info = fresh.load(dir.sub("ckpt"), sf.get());
  EXPECT_EQ(info.step, 10);
  EXPECT_EQ(info.user.at("data_position"), "77");
  EXPECT_TRUE(fsdp_state(fresh, sf.get()) == at_save) << "the loaded state differs from the saved one";
  std::optional<StepGraph> gf;
  run(fresh, snaps_f, gf, sf.get(), 10, &planes_f);
  EXPECT_TRUE(fsdp_state(fresh, sf.get()) == uninterrupted) << "FSDP MXFP8 resume differs from the uninterrupted run";
  int mx_params = 0;
  for (int i = 0; i < a.num_params(); ++i) mx_params += a.is_mxfp8(i) ? 1 : 0;
  EXPECT_GT(mx_params, 0);
  // 10 iterations x 2 passes x (data, scales) per MXFP8 parameter.
  const std::size_t per_iteration = static_cast<std::size_t>(2 * 2 * mx_params);
  ASSERT_EQ(planes_a.size(), 10 * per_iteration);
  // The snapshots follow the training (a replay that copied nothing would repeat them).
  EXPECT_FALSE(std::equal(planes_a.begin(), planes_a.begin() + static_cast<std::ptrdiff_t>(per_iteration),
                          planes_a.end() - static_cast<std::ptrdiff_t>(per_iteration)))
      << "the first and the last iteration's planes are the same";
  EXPECT_TRUE(planes_f == planes_a) << "the planes gathered after the load differ from the uninterrupted run's";
  const auto probe_f = fsdp_mx_probe(fresh, sf.get());
  EXPECT_FALSE(probe_a.empty());
  EXPECT_TRUE(probe_f == probe_a) << "the planes after resume differ from the uninterrupted run's";
}

/// MXFP8 checkpoints between front ends and world sizes (reshard_run with MXFP8
/// parameters): besides master and moments, the MXFP8 planes (Fsdp: the gathered ones of
/// both passes; DistributedAdam: its storage) equal the independent oracle's quantize of
/// the unsharded reference's master, bitwise.
inline void case_mx_reshard(Backend b, int from, Front a, int to, Front c, int t1 = 4, int t2 = 3) {
  const ReshardModel m{mx_model(), mx_units(), q_ckpt_options(DType::f32, ParamFormat::Mxfp8), fsdp_mx_options,
                       mx_init, fsdp_mx_init,
                       [](Fsdp& f, Stream s, int steps, bool only_rank_zero) {
                         fsdp_mx_train(f, s, steps, {}, only_rank_zero);
                       }};
  auto check_da = [](DistributedAdam& y, DistributedAdam& ref, Stream, const std::string& what) {
    for (int i = 0; i < y.num_params(); ++i)
      if (y.is_mxfp8(i)) { EXPECT_EQ(differing_planes(read_mx(y, i), expected_mx(ref, i)), "") << "MXFP8 " << what; }
  };
  auto check_fsdp = [](Fsdp& y, DistributedAdam& ref, Stream s, const std::string& what) {
    int checked = 0, mx_params = 0;
    for (int i = 0; i < y.num_params(); ++i) mx_params += y.is_mxfp8(i) ? 1 : 0;
    fsdp_mx_microbatch(y, s, 0, GradKind::Grid, [&](int, int u, FsdpPass pass, Stream st) {
      for (int i = 0; i < y.num_params(); ++i) {
        if (y.unit_of(i) != u || !y.is_mxfp8(i)) continue;
        SCOPED_TRACE("MXFP8 " + what + ": " + y.layout().specs()[static_cast<std::size_t>(i)].name);
        const PassBytes got = read_pass(y, i, pass, st);
        const mxfp8_ref::Quantized w = expected_mx(ref, i);
        EXPECT_EQ(got.data, pass == FsdpPass::Forward ? w.data_row : w.data_col);
        EXPECT_EQ(got.scales, pass == FsdpPass::Forward ? w.scale_row : w.scale_col);
        ++checked;
      }
    });
    EXPECT_EQ(checked, 2 * mx_params);  // both passes of every MXFP8 parameter
  };
  reshard_run(b, from, a, to, c, m, 1500, t1, t2, check_da, check_fsdp);
}

}  // namespace shardopt::test

/// Instantiates every checkpoint case as tests of suite `Suite` on backend `B`.
#define SHARDOPT_CHECKPOINT_CASES(Suite, B)                                                                   \
  TEST(Suite, ResumeEqualsUninterruptedF32Grads) { case_resume_bitwise(B, DType::f32, false, false); }      \
  TEST(Suite, ResumeEqualsUninterruptedBf16Grads) { case_resume_bitwise(B, DType::bf16, false, false); }    \
  TEST(Suite, ResumeEqualsUninterruptedGraph) { case_resume_bitwise(B, DType::bf16, true, false); }         \
  TEST(Suite, ResumeEqualsUninterruptedMxfp8) { case_resume_bitwise(B, DType::bf16, false, true); }         \
  TEST(Suite, ResumeEqualsUninterruptedMxfp8Graph) { case_resume_bitwise(B, DType::f32, true, true); }      \
  TEST(Suite, FsdpResumeEqualsUninterrupted) { case_fsdp_resume_bitwise(B, false); }                        \
  TEST(Suite, FsdpResumeEqualsUninterruptedGraph) { case_fsdp_resume_bitwise(B, true); }                    \
  TEST(Suite, Reshard2To3) { case_reshard(B, 2, Front::DistAdam, 3, Front::DistAdam); }                      \
  TEST(Suite, Reshard4To1) { case_reshard(B, 4, Front::DistAdam, 1, Front::DistAdam); }                      \
  TEST(Suite, Reshard1To4) { case_reshard(B, 1, Front::DistAdam, 4, Front::DistAdam); }                      \
  TEST(Suite, ReshardSameWorldOtherBuckets) {                                                                \
    case_reshard(B, world_size(), Front::DistAdam, world_size(), Front::DistAdam);                           \
  }                                                                                                          \
  TEST(Suite, DistAdamToFsdp) { case_reshard(B, world_size(), Front::DistAdam, world_size(), Front::Fsdp); } \
  TEST(Suite, FsdpToDistAdam) { case_reshard(B, world_size(), Front::Fsdp, 1, Front::DistAdam); }            \
  TEST(Suite, GroupedToDiscrete) { case_grouped_discrete(B, true); }                                         \
  TEST(Suite, DiscreteToGrouped) { case_grouped_discrete(B, false); }                                        \
  TEST(Suite, NativeToMxfp8) { case_native_to_mxfp8(B); }                                                    \
  TEST(Suite, ResumeEqualsUninterruptedNvfp4) {                                                              \
    case_resume_bitwise(B, DType::bf16, false, true, ParamFormat::Nvfp4);                                    \
  }                                                                                                          \
  TEST(Suite, ResumeEqualsUninterruptedNvfp4Graph) {                                                         \
    case_resume_bitwise(B, DType::f32, true, true, ParamFormat::Nvfp4);                                      \
  }                                                                                                          \
  TEST(Suite, NativeToNvfp4) { case_native_to_mxfp8(B, ParamFormat::Nvfp4); }                                \
  TEST(Suite, Nvfp4SavedPlanesEqualStorage) { case_nvfp4_saved_planes(B); }                                  \
  TEST(Suite, AsyncSaveEqualsSyncSave) { case_async_equals_sync(B); }                                        \
  TEST(Suite, BadCheckpointsAreRefusedOnEveryRank) { case_bad_checkpoints(B); }                             \
  TEST(Suite, FsdpMxfp8ResumeEqualsUninterrupted) { case_fsdp_mx_resume_bitwise(B, false); }                 \
  TEST(Suite, FsdpMxfp8ResumeEqualsUninterruptedGraph) { case_fsdp_mx_resume_bitwise(B, true); }             \
  TEST(Suite, Mxfp8DistAdamToFsdp) {                                                                         \
    case_mx_reshard(B, world_size(), Front::DistAdam, world_size(), Front::Fsdp);                            \
  }                                                                                                          \
  TEST(Suite, Mxfp8FsdpToDistAdam) { case_mx_reshard(B, world_size(), Front::Fsdp, world_size(), Front::DistAdam); } \
  TEST(Suite, Mxfp8FsdpReshard2To1) { case_mx_reshard(B, 2, Front::Fsdp, 1, Front::Fsdp); }                  \
  TEST(Suite, Mxfp8FsdpReshard1To2) { case_mx_reshard(B, 1, Front::Fsdp, 2, Front::Fsdp); }                  \
  TEST(Suite, Mxfp8FsdpReshard4To2) { case_mx_reshard(B, 4, Front::Fsdp, 2, Front::Fsdp); }                  \
  TEST(Suite, WriteForPython) { case_write_for_python(B); }
