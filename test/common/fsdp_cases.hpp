// fsdp_cases.hpp - FSDP / HSDP test cases, run on the host backend under mpiexec (CI)
// and on GPUs under mpirun (device suite).
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "dist_adam_cases.hpp"
#include "shardopt/fsdp.hpp"

namespace shardopt::test {

/// small_model() as Fsdp takes it: every parameter in `dtype`, norm1 too (Fsdp stores
/// one dtype, FsdpOptions::param_dtype, and refuses a spec that says another).
inline std::vector<ParamSpec> fsdp_model(DType dtype = DType::bf16) {
  std::vector<ParamSpec> s = small_model(dtype);
  for (ParamSpec& p : s) p.dtype = dtype;
  return s;
}

/// small_model() in units: the embedding; norm1 + w1; the experts + bias1; w2 + head.
inline std::vector<FsdpUnit> small_units() {
  return {{"embed", 0, 1}, {"block0", 1, 2}, {"experts", 3, 2}, {"block1", 5, 2}};
}

inline FsdpOptions fsdp_options(const DistributedAdamOptions& d) {
  FsdpOptions o;
  o.param_dtype = DType::bf16;
  o.grad_dtype = d.grad_dtype == DType::f32 ? DType::f32 : DType::bf16;
  o.slot_grad_dtype = DType::bf16;
  o.bucket_numel = d.bucket_numel;
  o.clip_max_norm = d.clip_max_norm;
  o.groups = d.groups;
  o.lr_schedule = d.lr_schedule;
  o.grad_reduce = d.grad_reduce;
  o.microbatches = d.microbatches;
  return o;
}

/// Writes initial values into this rank's shard pieces and seeds the master.
inline void init_fsdp(Fsdp& f, Stream s) {
  for (int i = 0; i < f.num_params(); ++i) {
    const ShardView v = f.shard_param(i);
    std::vector<std::uint16_t> codes(static_cast<std::size_t>(v.numel()));
    for (std::size_t j = 0; j < codes.size(); ++j)
      codes[j] = num::f32_to_bf16(init_value(i, v.param_offset + static_cast<std::int64_t>(j)));
    from_host(f.backend(), v.data, codes);
  }
  f.init_master(s);
}

/// The gradient stream of a toy trainer: `kind` gradients of scale 0.2 for `rank`, the
/// step and microbatch read from the optimizer's device state (`only_world_rank_zero`:
/// GradStreamParams::only_world_rank_zero).
inline GradStreamParams toy_grads(GradKind kind, int rank, const StepScalars* scalars, const MicrobatchState* microbatch,
                                  bool only_world_rank_zero = false) {
  GradStreamParams p;
  p.kind = kind;
  p.scale = 0.2f;
  p.rank = rank;
  p.scalars = scalars;
  p.microbatch = microbatch;
  p.only_world_rank_zero = only_world_rank_zero;
  return p;
}

/// Hook run on the compute stream right after each wait_param (e.g. snapshots).
using UnitHook = std::function<void(int position, int unit, const std::vector<ParamView>&, Stream)>;

/// One microbatch of a toy trainer: forward gathers every unit in order, backward in
/// reverse order; each unit's gradient slot receives the gradient stream and is
/// reduce-scattered at once (`only_world_rank_zero`: toy_grads').
inline void fsdp_microbatch(Fsdp& f, Stream s, int rank, GradKind kind, const UnitHook& hook = {},
                            const std::function<void(Stream)>& before_wait = {}, bool only_world_rank_zero = false) {
  int position = 0;
  const int nu = f.num_units();
  auto wait = [&](int u) {
    if (before_wait) before_wait(s);
    auto views = f.wait_param(u, s);
    if (hook) hook(position, u, views, s);
    ++position;
  };
  for (int u = 0; u < nu; ++u) wait(u);
  for (int u = nu - 1; u >= 0; --u) {
    wait(u);
    const auto grads = f.grad_slot(u, s);
    std::vector<GradTarget> targets;
    const FsdpUnit unit = small_units()[static_cast<std::size_t>(u)];
    for (int k = 0; k < unit.count; ++k)
      targets.push_back(GradTarget{grads[static_cast<std::size_t>(k)].data, grads[static_cast<std::size_t>(k)].numel(),
                                   unit.first + k, grads[static_cast<std::size_t>(k)].dtype});
    add_grads(f.backend(), s, toy_grads(kind, rank, f.device_scalars(), f.device_microbatch(), only_world_rank_zero),
              targets);
    f.grad_ready(u, s);
  }
}

/// The unsharded reference's gradients: every rank's grid gradients (scale 0.2) of the
/// current microbatch added into `ref`'s targets, rank after rank.
inline void add_every_ranks_grads(DistributedAdam& ref, Stream s, const std::vector<GradTarget>& targets) {
  for (int r = 0; r < world_size(); ++r)
    add_grads(ref.backend(), s, toy_grads(GradKind::Grid, r, ref.device_scalars(), ref.device_microbatch()), targets);
}

/// True when `part` equals `whole[offset, offset + part.size())` bytewise. An empty part
/// (a rank whose piece of a parameter is empty) matches without calling memcmp, whose
/// pointer arguments must not be null even for size 0.
inline bool bytes_match_at(const std::vector<std::uint8_t>& part, const std::vector<std::uint8_t>& whole,
                           std::int64_t offset) {
  if (offset < 0 || static_cast<std::size_t>(offset) + part.size() > whole.size()) return false;
  return part.empty() || std::memcmp(part.data(), whole.data() + offset, part.size()) == 0;
}

/// Checks that this rank's FSDP shard pieces (params, master, both moments) equal the
/// matching parts of an unsharded DistributedAdam's full tensors, bitwise.
inline void expect_fsdp_matches(Fsdp& f, DistributedAdam& ref) {
  const Backend b = f.backend();
  for (int i = 0; i < f.num_params(); ++i) {
    SCOPED_TRACE(f.layout().specs()[static_cast<std::size_t>(i)].name);
    const ShardView p = f.shard_param(i);
    const auto mine = read_bytes(b, p);
    const auto full = read_bytes(b, ref.param(i));
    ASSERT_TRUE(bytes_match_at(mine, full, p.param_offset * 2));
    const ShardView m = f.shard_master(i);
    const auto mm = read_bytes(b, m), mf = read_bytes(b, ref.shard_master(i));
    ASSERT_TRUE(bytes_match_at(mm, mf, m.param_offset * 4));
    const ShardView a = f.shard_exp_avg(i);
    const auto am = read_bytes(b, a), af = read_bytes(b, ref.shard_exp_avg(i));
    ASSERT_TRUE(bytes_match_at(am, af, a.param_offset * 4));
    const ShardView v = f.shard_exp_avg_sq(i);
    const auto vm = read_bytes(b, v), vf = read_bytes(b, ref.shard_exp_avg_sq(i));
    ASSERT_TRUE(bytes_match_at(vm, vf, v.param_offset * 4));
  }
}

/// FSDP (and HSDP with `shard_group`) equals unsharded training and sharded distributed
/// Adam, bitwise, with grid gradients (every reduction exact in any order).
/// `clip_max_norm`: as in case_sharded_equals_unsharded.
inline void case_fsdp_equals_dist_adam(Backend b, int shard_group, int microbatches, int steps,
                                       float clip_max_norm = 0.5f) {
  const int rank = world_rank(), world = world_size();
  const bool pow2 = (world & (world - 1)) == 0;
  DistributedAdamOptions d = base_options(DType::bf16);
  d.clip_max_norm = clip_max_norm;
  d.param_dtype = DType::bf16;
  d.microbatches = microbatches;
  d.grad_reduce = pow2 ? ReduceOp::Average : ReduceOp::Sum;
  Communicator comm = make_comm(b);
  FsdpOptions fo = fsdp_options(d);
  fo.shard_group_size = shard_group;
  Fsdp f(comm, fsdp_model(), small_units(), fo);
  DistributedAdam sharded(comm, small_model(), d);
  DistributedAdamOptions ro = d;
  ro.grad_reduce = ReduceOp::Sum;
  DistributedAdam ref(Communicator::self(b), small_model(), ro);
  if (pow2) ref.set_loss_scale(static_cast<float>(world));
  TestStream s(b), ss(b), rs(b);
  init_fsdp(f, s.get());
  init_params(sharded, ss.get());
  init_params(ref, rs.get());
  const auto st = grad_targets(sharded), rt = grad_targets(ref);
  for (int t = 0; t < steps; ++t) {
    for (int mb = 0; mb < microbatches; ++mb) {
      fsdp_microbatch(f, s.get(), rank, GradKind::Grid);
      f.advance_microbatch(s.get());
      GradStreamParams p;
      p.kind = GradKind::Grid;
      p.scale = 0.2f;
      p.rank = rank;
      p.scalars = sharded.device_scalars();
      p.microbatch = sharded.device_microbatch();
      sharded.set_grad_sync(mb == microbatches - 1);
      add_grads(b, ss.get(), p, st);
      if (mb == microbatches - 1) report_all(sharded, ss.get());
      sharded.set_grad_sync(true);
      sharded.advance_microbatch(ss.get());
      for (int r = 0; r < world; ++r) {
        GradStreamParams q = p;
        q.rank = r;
        q.scalars = ref.device_scalars();
        q.microbatch = ref.device_microbatch();
        add_grads(b, rs.get(), q, rt);
      }
      ref.advance_microbatch(rs.get());
    }
    f.step(s.get());
    f.zero_grad(s.get());
    sharded.step(ss.get());
    sharded.zero_grad(ss.get());
    ref.step(rs.get());
    ref.zero_grad(rs.get());
  }
  const StepScalars x = f.read_scalars(s.get()), y = ref.read_scalars(rs.get());
  EXPECT_EQ(x.step, steps);
  EXPECT_LT(x.clip_coef, 1.0f) << "clipping must be active";
  EXPECT_EQ(num::f32_bits(x.grad_norm), num::f32_bits(y.grad_norm));
  expect_fsdp_matches(f, ref);
  for (int i = 0; i < sharded.num_params(); ++i)
    EXPECT_EQ(read_bytes(b, sharded.param(i)), read_bytes(b, ref.param(i)));
}

/// FSDP's default reduction (Average) at any world size, 3 included: each element of the
/// f32 gradient shard is the sum over ranks of the grid gradients (exact) divided by the
/// number of ranks in f32, bitwise (host backend: NCCL's average pre-multiplies).
inline void case_fsdp_average_is_sum_then_divide(Backend b) {
  const int rank = world_rank();
  FsdpOptions o = fsdp_options(base_options(DType::f32));
  o.slot_grad_dtype = DType::f32;
  ASSERT_EQ(o.grad_reduce, ReduceOp::Average) << "Average is the default";
  ASSERT_EQ(o.grad_dtype, DType::f32);
  Fsdp f(make_comm(b), fsdp_model(), small_units(), o);
  TestStream s(b);
  init_fsdp(f, s.get());
  fsdp_microbatch(f, s.get(), rank, GradKind::Grid);
  for (int i = 0; i < f.num_params(); ++i) {
    const ShardView g = f.shard_grad(i, DType::f32, s.get());
    s.sync();
    expect_grid_average(b, g, i);
  }
}

/// Two FSDP optimizers with the same layout hold the same step scalars, parameter
/// shards (native ones), master and moments, bitwise (waits for both streams).
inline void expect_same_fsdp_state(Fsdp& a, Fsdp& c, Stream sa, Stream sc) {
  const Backend b = a.backend();
  const StepScalars x = a.read_scalars(sa), y = c.read_scalars(sc);
  EXPECT_EQ(x.step, y.step);
  EXPECT_EQ(num::f32_bits(x.grad_norm), num::f32_bits(y.grad_norm));
  for (int i = 0; i < a.num_params(); ++i) {
    SCOPED_TRACE(a.layout().specs()[static_cast<std::size_t>(i)].name);
    if (!a.is_mxfp8(i)) { EXPECT_EQ(read_bytes(b, a.shard_param(i)), read_bytes(b, c.shard_param(i))); }
    EXPECT_EQ(read_bytes(b, a.shard_master(i)), read_bytes(b, c.shard_master(i)));
    EXPECT_EQ(read_bytes(b, a.shard_exp_avg(i)), read_bytes(b, c.shard_exp_avg(i)));
    EXPECT_EQ(read_bytes(b, a.shard_exp_avg_sq(i)), read_bytes(b, c.shard_exp_avg_sq(i)));
  }
}

/// What a graph case trains: the model, its units, the FSDP options made from the
/// distributed-Adam ones, the initial values and one microbatch of the toy trainer.
struct FsdpCaseModel {
  std::vector<ParamSpec> specs;
  std::vector<FsdpUnit> units;
  DistributedAdamOptions adam;
  std::function<FsdpOptions(const DistributedAdamOptions&)> options;
  std::function<void(Fsdp&, Stream)> init;
  std::function<void(Fsdp&, Stream, int rank)> microbatch;
};

/// The whole FSDP iteration of `model` captured in one graph and replayed equals eager
/// iterations, bitwise (step scalars, parameter shards, master, moments). `after` (may
/// be empty) compares more of the two optimizers; `wrap` (may be empty) changes the
/// graphed trainer only.
inline void fsdp_graph_vs_eager(Backend b, const FsdpCaseModel& model, int microbatches, int iterations,
                                const std::function<void(Fsdp&, Fsdp&, Stream, Stream)>& after = {},
                                const TrainerWrap& wrap = {}) {
  const int rank = world_rank();
  DistributedAdamOptions d = model.adam;
  d.microbatches = microbatches;
  d.clip_max_norm = 0.05f;
  Communicator comm = make_comm(b);
  Fsdp fe(comm, model.specs, model.units, model.options(d));
  Fsdp fg(comm, model.specs, model.units, model.options(d));
  TestStream se(b), sg(b);
  model.init(fe, se.get());
  model.init(fg, sg.get());
  auto fn = [&model, rank](Fsdp& f) -> StepGraph::MicrobatchFn {
    return [&model, &f, rank](Stream s, bool) { model.microbatch(f, s, rank); };
  };
  StepGraph ge(fe, fn(fe)), gg(fg, wrap ? wrap(fn(fg), sg.get()) : fn(fg));
  gg.capture(sg.get());
  for (int it = 1; it < iterations; ++it) gg.replay(sg.get());
  for (int it = 0; it < iterations; ++it) ge.run_eager(se.get());
  const StepScalars y = fg.read_scalars(sg.get());
  EXPECT_EQ(y.step, iterations);
  EXPECT_LT(y.clip_coef, 1.0f);
  expect_same_fsdp_state(fe, fg, se.get(), sg.get());
  if (after) after(fe, fg, se.get(), sg.get());
}

/// The whole FSDP iteration captured in one graph and replayed equals eager, bitwise.
inline void case_fsdp_graph_equals_eager(Backend b, int microbatches, int iterations, const TrainerWrap& wrap = {}) {
  FsdpCaseModel m{fsdp_model(), small_units(), base_options(DType::bf16), fsdp_options, init_fsdp,
                  [](Fsdp& f, Stream s, int rank) { fsdp_microbatch(f, s, rank, GradKind::Random); }};
  fsdp_graph_vs_eager(b, m, microbatches, iterations, {}, wrap);
}

/// Every gathered unit the compute stream reads (snapshotted right after wait_param) is
/// exactly the current parameters, although gathers are prefetched into alternating
/// slots. `delay` runs on the gather stream before each wait (on GPUs a sleep kernel; on
/// the host, whose gathers land only when waited, a sleep on the caller's stream), so a
/// missing wait would expose a stale slot.
inline void case_fsdp_prefetch_never_stale(Backend b, const std::function<void(Stream)>& delay) {
  const int rank = world_rank();
  DistributedAdamOptions d = base_options(DType::bf16);
  d.grad_reduce = ReduceOp::Sum;
  d.param_dtype = DType::bf16;  // FSDP keeps one dtype; the reference must too
  Communicator comm = make_comm(b);
  Fsdp f(comm, fsdp_model(), small_units(), fsdp_options(d));
  DistributedAdamOptions ro = d;
  DistributedAdam ref(Communicator::self(b), small_model(), ro);
  TestStream s(b), rs(b);
  init_fsdp(f, s.get());
  init_params(ref, rs.get());
  const auto rt = grad_targets(ref);
  // One snapshot buffer per position of an iteration (2 x units), sized for the unit.
  const int positions = 2 * f.num_units();
  std::vector<DeviceBuffer> snaps;
  std::vector<std::vector<ParamView>> seen(static_cast<std::size_t>(positions));
  for (int k = 0; k < positions; ++k) snaps.emplace_back(b, 64 * 1024);
  UnitHook snap = [&](int pos, int, const std::vector<ParamView>& views, Stream st) {
    std::size_t off = 0;
    for (const auto& v : views) {
      copy_async(b, static_cast<char*>(snaps[static_cast<std::size_t>(pos)].data()) + off, v.data, v.bytes(), st);
      off += v.bytes();
    }
    seen[static_cast<std::size_t>(pos)] = views;
  };
  std::function<void(Stream)> before = [&](Stream st) {
    if (delay) delay(b == Backend::Host ? st : f.gather_stream());  // the host's gather stream is the caller's
  };
  for (int t = 0; t < 4; ++t) {
    fsdp_microbatch(f, s.get(), rank, GradKind::Grid, snap, before);
    s.sync();
    // The snapshots must equal the reference's current (pre-step) params.
    for (int pos = 0; pos < positions; ++pos) {
      const int u = pos < f.num_units() ? pos : positions - 1 - pos;
      const FsdpUnit unit = small_units()[static_cast<std::size_t>(u)];
      const auto got = to_host<std::uint8_t>(b, snaps[static_cast<std::size_t>(pos)].data(), 64 * 1024);
      std::size_t off = 0;
      for (int k = 0; k < unit.count; ++k) {
        const auto want = read_bytes(b, ref.param(unit.first + k));
        ASSERT_EQ(0, std::memcmp(got.data() + off, want.data(), want.size()))
            << "step " << t << " position " << pos << " unit " << unit.name << " param " << unit.first + k;
        off += want.size();
      }
    }
    f.step(s.get());
    f.zero_grad(s.get());
    add_every_ranks_grads(ref, rs.get(), rt);
    ref.step(rs.get());
    ref.zero_grad(rs.get());
  }
  // The slots alternate: forward positions 0 and 1 use different memory.
  EXPECT_NE(seen[0].front().data, seen[1].front().data);
}

/// Asking for units in another order after the first iteration is a clear error.
inline void case_fsdp_order_change(Backend b) {
  const int rank = world_rank();
  Communicator comm = make_comm(b);
  Fsdp f(comm, fsdp_model(), small_units(), fsdp_options(base_options(DType::bf16)));
  TestStream s(b);
  init_fsdp(f, s.get());
  fsdp_microbatch(f, s.get(), rank, GradKind::Grid);
  f.step(s.get());
  f.zero_grad(s.get());
  EXPECT_EQ(f.unit_order().size(), static_cast<std::size_t>(2 * f.num_units()));
  (void)f.wait_param(0, s.get());
  try {
    (void)f.wait_param(2, s.get());
    ADD_FAILURE() << "a changed order must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidState);
    EXPECT_NE(std::string(e.what()).find("order changed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("experts"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("block0"), std::string::npos) << e.what();
  }
  s.sync();
  comm.barrier();
}

/// The code of the Error `f` throws on this rank (a failure if none).
template <class F>
inline void expect_error_code(F&& f, ErrorCode code, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "expected Error(" << to_string(code) << ") containing '" << part << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

/// end_forward_only is Error(InvalidState) after a Backward wait_param and while a unit
/// holds the gradient slot (shardopt/fsdp.hpp); every rank gets it (each makes the same
/// calls), and the iteration can then be finished as usual.
inline void case_fsdp_end_forward_only_refused(Backend b) {
  const int rank = world_rank();
  Communicator comm = make_comm(b);
  Fsdp f(comm, fsdp_model(), small_units(), fsdp_options(base_options(DType::bf16)));
  TestStream s(b);
  init_fsdp(f, s.get());
  fsdp_microbatch(f, s.get(), rank, GradKind::Grid);  // learns the order
  f.step(s.get());
  f.zero_grad(s.get());
  const int nu = f.num_units();
  for (int u = 0; u < nu; ++u) (void)f.wait_param(u, FsdpPass::Forward, s.get());
  (void)f.wait_param(nu - 1, FsdpPass::Backward, s.get());
  (void)f.grad_slot(nu - 1, s.get());
  expect_error_code([&] { f.end_forward_only(s.get()); }, ErrorCode::InvalidState, "holds the gradient slot");
  f.grad_ready(nu - 1, s.get());
  expect_error_code([&] { f.end_forward_only(s.get()); }, ErrorCode::InvalidState, "after a Backward wait_param");
  for (int u = nu - 2; u >= 0; --u) {
    (void)f.wait_param(u, FsdpPass::Backward, s.get());
    (void)f.grad_slot(u, s.get());
    f.grad_ready(u, s.get());
  }
  f.step(s.get());
  f.zero_grad(s.get());
  EXPECT_EQ(f.read_scalars(s.get()).step, 2) << "the iteration finished after the refusals";
}

/// Capturing an Fsdp iteration is Error(CaptureRefused) before the unit order is learned
/// (no warm-up iteration) and while shard_grad cast copies would be freed by zero_grad
/// (persistent_grad_copies off); every rank gets it.
inline void case_fsdp_capture_refused(Backend b) {
  const int rank = world_rank();
  Communicator comm = make_comm(b);
  const FsdpOptions o = fsdp_options(base_options(DType::bf16));
  auto body = [rank](Fsdp& f) -> StepGraph::MicrobatchFn {
    return [&f, rank](Stream st, bool) { fsdp_microbatch(f, st, rank, GradKind::Grid); };
  };
  {
    Fsdp f(comm, fsdp_model(), small_units(), o);
    TestStream s(b);
    init_fsdp(f, s.get());
    StepGraphOptions go;
    go.warmup_iterations = 0;
    StepGraph g(f, body(f), go);
    expect_error_code([&] { g.capture(s.get()); }, ErrorCode::CaptureRefused, "unit order is learned");
    EXPECT_FALSE(g.captured());
  }
  {
    Fsdp f(comm, fsdp_model(), small_units(), o);
    TestStream s(b);
    init_fsdp(f, s.get());
    fsdp_microbatch(f, s.get(), rank, GradKind::Grid);
    (void)f.shard_grad(0, DType::f32, s.get());  // a cast copy of the bf16 gradient shard
    f.step(s.get());
    f.zero_grad(s.get());
    StepGraph g(f, body(f));
    expect_error_code([&] { g.capture(s.get()); }, ErrorCode::CaptureRefused, "persistent_grad_copies");
  }
}

/// Persistent bytes per rank = 16/d per (padded) parameter for bf16 params and grads
/// (2 + 2 + 4 + 8), plus a pool of two parameter slots and one gradient slot.
inline void case_fsdp_memory(Backend b) {
  const int world = world_size();
  Communicator comm = make_comm(b);
  Fsdp f(comm, fsdp_model(), small_units(), fsdp_options(base_options(DType::bf16)));
  const MemoryReport r = f.memory();
  const std::int64_t n = f.layout().total_numel();
  std::int64_t max_unit = 0;
  for (int u = 0; u < f.num_units(); ++u) {
    std::int64_t lo = -1, hi = 0;
    for (std::size_t bk = 0; bk < f.layout().buckets().size(); ++bk)
      if (f.layout().bucket_units()[bk] == u) {
        if (lo < 0) lo = f.layout().buckets()[bk].range.begin;
        hi = f.layout().buckets()[bk].range.end;
      }
    max_unit = std::max(max_unit, hi - lo);
  }
  EXPECT_EQ(r.params, 2 * n / world);
  EXPECT_EQ(r.grads, 2 * n / world);
  EXPECT_EQ(r.master, 4 * n / world);
  EXPECT_EQ(r.moments, 8 * n / world);
  EXPECT_EQ(r.pool, 2 * 2 * max_unit + 2 * max_unit);
  EXPECT_EQ(r.total(), 16 * n / world + 6 * max_unit);
}

}  // namespace shardopt::test
