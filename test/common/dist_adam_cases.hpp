// dist_adam_cases.hpp - the distributed-Adam test cases, written once and run on the
// host backend under mpiexec (CI) and on GPUs under mpirun (the device suite).
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/memory.hpp"
#include "device_util.hpp"
#include "grad_stream.hpp"
#include "shardopt/distributed_adam.hpp"
#include "shardopt/error.hpp"
#include "shardopt/mpi.hpp"
#include "shardopt/step_graph.hpp"

namespace shardopt::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

inline Communicator make_comm(Backend b) {
  MpiBootstrapOptions o;
  o.backend = b;
  return communicator_from_mpi(MPI_COMM_WORLD, o);
}

/// A small model with odd sizes, two optimizer groups, a grouped parameter and an f32
/// parameter (so the layout has two buffers).
inline std::vector<ParamSpec> small_model(DType dtype = DType::bf16) {
  return {
      ParamSpec::tensor("embed", {37, 16}, dtype, "decay"),
      ParamSpec::tensor("norm1", {16}, DType::f32, "no_decay"),
      ParamSpec::tensor("w1", {24, 16}, dtype, "decay"),
      ParamSpec::grouped("experts", 3, {8, 13}, dtype, "decay"),
      ParamSpec::tensor("bias1", {24}, dtype, "no_decay"),
      ParamSpec::tensor("w2", {16, 24}, dtype, "decay"),
      ParamSpec::tensor("head", {37, 16}, dtype, "decay"),
  };
}

/// Options used by most cases: small buckets, clipping, a warm-up + cosine schedule.
inline DistributedAdamOptions base_options(DType grad_dtype) {
  DistributedAdamOptions o;
  o.grad_dtype = grad_dtype;
  o.bucket_numel = 300;
  o.clip_max_norm = 0.5f;
  o.groups["decay"] = AdamGroup{0.1f, 1.0f};
  o.groups["no_decay"] = AdamGroup{0.0f, 0.5f};
  o.lr_schedule = LrSchedule::warmup_cosine(1e-2f, 1e-3f, 3, 40);
  return o;
}

/// Deterministic initial parameter value of (param, element).
inline float init_value(int param, std::int64_t j) {
  return static_cast<float>(static_cast<int>(mix64((static_cast<std::uint64_t>(param) << 32) ^
                                                   static_cast<std::uint64_t>(j)) %
                                             201u) -
                            100) /
         128.0f;
}

/// Writes the initial values into every param view and seeds the master.
inline void init_params(DistributedAdam& opt, Stream s) {
  for (int i = 0; i < opt.num_params(); ++i) {
    const ParamView v = opt.param(i);
    const std::int64_t n = v.numel();
    std::vector<std::uint8_t> bytes(v.bytes());
    for (std::int64_t j = 0; j < n; ++j) {
      const std::uint32_t code = num::encode(v.dtype, init_value(i, j));
      std::memcpy(bytes.data() + static_cast<std::size_t>(j) * size_of(v.dtype), &code, size_of(v.dtype));
    }
    from_host(opt.backend(), v.data, bytes);
  }
  opt.init_master(s);
}

/// Decodes any float view into f32 values (synchronous).
inline std::vector<float> read_f32(Backend b, const TensorView& v) {
  const auto bytes = to_host<std::uint8_t>(b, v.data, v.bytes());
  std::vector<float> out(static_cast<std::size_t>(v.numel()));
  for (std::size_t j = 0; j < out.size(); ++j) {
    std::uint32_t code = 0;
    std::memcpy(&code, bytes.data() + j * size_of(v.dtype), size_of(v.dtype));
    out[j] = num::decode(v.dtype, code);
  }
  return out;
}

/// Raw bytes of a view (bitwise comparisons).
inline std::vector<std::uint8_t> read_bytes(Backend b, const TensorView& v) {
  return to_host<std::uint8_t>(b, v.data, v.bytes());
}

/// The gradient targets of an optimizer: one per parameter, in registration order.
inline std::vector<GradTarget> grad_targets(const DistributedAdam& opt) {
  std::vector<GradTarget> t;
  for (int i = 0; i < opt.num_params(); ++i) {
    const GradView g = opt.grad(i);
    t.push_back(GradTarget{g.data, g.numel(), i, g.dtype});
  }
  return t;
}

/// Reports every parameter's gradient as ready, in backward (reverse) order.
inline void report_all(DistributedAdam& opt, Stream s) {
  for (int i = opt.num_params() - 1; i >= 0; --i) opt.grad_ready(i, s);
}

/// A StepGraph microbatch function for `opt`: `before_forward(s)` (may be empty), then
/// random gradients of scale 0.2 seeded by `rank`, the step and microbatch read on the
/// device; the last microbatch reports every gradient ready.
inline StepGraph::MicrobatchFn random_grads_fn(DistributedAdam& opt, Backend b, int rank,
                                    std::function<void(Stream)> before_forward = {}) {
  return [&opt, targets = grad_targets(opt), rank, b, before_forward](Stream s, bool last) {
    if (before_forward) before_forward(s);
    GradStreamParams p;
    p.kind = GradKind::Random;
    p.scale = 0.2f;
    p.rank = rank;
    p.scalars = opt.device_scalars();
    p.microbatch = opt.device_microbatch();
    add_grads(b, s, p, targets);
    if (last) report_all(opt, s);
  };
}

/// Compares every param view, master, moment piece and the step scalars of two
/// optimizers with the same layout on the same ranks, bitwise.
inline void expect_same_state(DistributedAdam& a, DistributedAdam& b, Stream sa, Stream sb) {
  const StepScalars x = a.read_scalars(sa), y = b.read_scalars(sb);
  EXPECT_EQ(x.step, y.step);
  EXPECT_EQ(num::f32_bits(x.lr), num::f32_bits(y.lr));
  EXPECT_EQ(num::f32_bits(x.grad_norm), num::f32_bits(y.grad_norm));
  EXPECT_EQ(num::f32_bits(x.clip_coef), num::f32_bits(y.clip_coef));
  for (int i = 0; i < a.num_params(); ++i) {
    SCOPED_TRACE(a.layout().specs()[static_cast<std::size_t>(i)].name);
    EXPECT_EQ(read_bytes(a.backend(), a.param(i)), read_bytes(b.backend(), b.param(i)));
    EXPECT_EQ(read_bytes(a.backend(), a.shard_master(i)), read_bytes(b.backend(), b.shard_master(i)));
    EXPECT_EQ(read_bytes(a.backend(), a.shard_exp_avg(i)), read_bytes(b.backend(), b.shard_exp_avg(i)));
    EXPECT_EQ(read_bytes(a.backend(), a.shard_exp_avg_sq(i)), read_bytes(b.backend(), b.shard_exp_avg_sq(i)));
  }
}

// ---------------------------------------------------------------------------- cases

/// Sharded training equals unsharded training, bitwise: grid gradients make every
/// reduction exact in any order (sums, averages by 2 or 4, squares and their sums), so
/// the only difference left would be a sharding bug. Ranks that are not a power of two
/// reduce with Sum, and the unsharded reference divides by the loss scale instead.
/// `clip_max_norm` and `specs` default to the 1-4 rank setting; the many-rank runs pass a
/// smaller threshold (an average over N ranks shrinks the norm like 1/sqrt(N)) and other models.
inline void case_sharded_equals_unsharded(Backend b, DType grad_dtype, int microbatches, int steps,
                                          float clip_max_norm = 0.5f,
                                          const std::vector<ParamSpec>& specs = small_model()) {
  const int rank = world_rank(), world = world_size();
  const bool pow2 = (world & (world - 1)) == 0;
  DistributedAdamOptions o = base_options(grad_dtype);
  o.grad_reduce = pow2 ? ReduceOp::Average : ReduceOp::Sum;
  o.microbatches = microbatches;
  o.clip_max_norm = clip_max_norm;
  DistributedAdam sharded(make_comm(b), specs, o);
  DistributedAdamOptions ro = o;
  ro.grad_reduce = ReduceOp::Sum;
  DistributedAdam ref(Communicator::self(b), specs, ro);
  if (pow2) ref.set_loss_scale(static_cast<float>(world));
  TestStream s(b), rs(b);
  init_params(sharded, s.get());
  init_params(ref, rs.get());
  const auto targets = grad_targets(sharded), ref_targets = grad_targets(ref);
  for (int t = 0; t < steps; ++t) {
    for (int mb = 0; mb < microbatches; ++mb) {
      const bool last = mb == microbatches - 1;
      GradStreamParams p;
      p.kind = GradKind::Grid;
      p.rank = rank;
      p.scalars = sharded.device_scalars();
      p.microbatch = sharded.device_microbatch();
      sharded.set_grad_sync(last);
      add_grads(b, s.get(), p, targets);
      if (last) report_all(sharded, s.get());
      sharded.set_grad_sync(true);
      sharded.advance_microbatch(s.get());
      for (int r = 0; r < world; ++r) {
        GradStreamParams q = p;
        q.rank = r;
        q.scalars = ref.device_scalars();
        q.microbatch = ref.device_microbatch();
        add_grads(b, rs.get(), q, ref_targets);
      }
      ref.advance_microbatch(rs.get());
    }
    sharded.step(s.get());
    sharded.zero_grad(s.get());
    ref.step(rs.get());
    ref.zero_grad(rs.get());
  }
  const StepScalars x = sharded.read_scalars(s.get()), y = ref.read_scalars(rs.get());
  EXPECT_EQ(x.step, steps);
  EXPECT_EQ(y.step, steps);
  EXPECT_LT(x.clip_coef, 1.0f) << "clipping must be active in this case";
  EXPECT_EQ(num::f32_bits(x.grad_norm), num::f32_bits(y.grad_norm));
  for (int i = 0; i < sharded.num_params(); ++i) {
    SCOPED_TRACE(sharded.layout().specs()[static_cast<std::size_t>(i)].name);
    EXPECT_EQ(read_bytes(b, sharded.param(i)), read_bytes(b, ref.param(i)));
    // This rank's master and moments equal the matching piece of the unsharded ones.
    const ShardView m = sharded.shard_master(i);
    const auto full = read_f32(b, ref.shard_master(i));
    const auto mine = read_f32(b, m);
    for (std::size_t j = 0; j < mine.size(); ++j)
      ASSERT_EQ(num::f32_bits(mine[j]), num::f32_bits(full[static_cast<std::size_t>(m.param_offset) + j]));
    const auto ma = read_f32(b, sharded.shard_exp_avg(i));
    const auto mr = read_f32(b, ref.shard_exp_avg(i));
    for (std::size_t j = 0; j < ma.size(); ++j)
      ASSERT_EQ(num::f32_bits(ma[j]), num::f32_bits(mr[static_cast<std::size_t>(m.param_offset) + j]));
    const auto va = read_f32(b, sharded.shard_exp_avg_sq(i));
    const auto vr = read_f32(b, ref.shard_exp_avg_sq(i));
    for (std::size_t j = 0; j < va.size(); ++j)
      ASSERT_EQ(num::f32_bits(va[j]), num::f32_bits(vr[static_cast<std::size_t>(m.param_offset) + j]));
  }
}

/// Random gradients: the reduce-scatter sums in its own order, the reference sums in
/// rank order. With f32 grads each reduced element differs by at most (N-1) u |sum|
/// (u = 2^-24), which perturbs Adam's normalised update m/sqrt(v) relatively by about
/// 2(N-1)u; over T steps params then differ by at most T (lr |update| 2(N-1)u + 2 ulp).
/// We check |diff| <= T * (4 N u lr + 4 * 2^-23 |p|) + 1e-7, and that most elements are
/// bitwise equal is not required.
inline void case_random_within_order_tolerance(Backend b, int steps) {
  const int rank = world_rank(), world = world_size();
  DistributedAdamOptions o = base_options(DType::f32);
  o.param_dtype = DType::f32;
  o.grad_reduce = ReduceOp::Sum;
  o.clip_max_norm = 0.0f;
  DistributedAdam sharded(make_comm(b), small_model(DType::f32), o);
  DistributedAdam ref(Communicator::self(b), small_model(DType::f32), o);
  TestStream s(b), rs(b);
  init_params(sharded, s.get());
  init_params(ref, rs.get());
  const auto targets = grad_targets(sharded), ref_targets = grad_targets(ref);
  for (int t = 0; t < steps; ++t) {
    GradStreamParams p;
    p.kind = GradKind::Random;
    p.scale = 0.3f;
    p.rank = rank;
    p.scalars = sharded.device_scalars();
    add_grads(b, s.get(), p, targets);
    report_all(sharded, s.get());
    for (int r = 0; r < world; ++r) {
      GradStreamParams q = p;
      q.rank = r;
      q.scalars = ref.device_scalars();
      add_grads(b, rs.get(), q, ref_targets);
    }
    sharded.step(s.get());
    sharded.zero_grad(s.get());
    ref.step(rs.get());
    ref.zero_grad(rs.get());
  }
  const double u = std::ldexp(1.0, -24), lr_max = 1e-2;
  for (int i = 0; i < sharded.num_params(); ++i) {
    const auto a = read_f32(b, sharded.param(i)), r = read_f32(b, ref.param(i));
    for (std::size_t j = 0; j < a.size(); ++j) {
      const double tol = steps * (4.0 * world * u * lr_max + 4.0 * std::ldexp(1.0, -23) * std::fabs(r[j])) + 1e-7;
      ASSERT_NEAR(a[j], r[j], tol) << "param " << i << " element " << j;
    }
  }
}

/// Turns a graphed trainer's microbatch function into another one, given the stream the
/// trainer passes to capture() and replay() (see on_own_stream()).
using TrainerWrap = std::function<StepGraph::MicrobatchFn(StepGraph::MicrobatchFn, Stream)>;

/// A trainer that ignores the stream StepGraph hands its microbatch function and enqueues
/// each microbatch on `own`, the stream it passes to capture(), after keeping that stream
/// busy for ~delay_us (a sleeping kernel on CUDA, nothing on the host backend): a warm-up
/// on any other stream than `own` would race with the delayed work.
inline TrainerWrap on_own_stream(Backend b, int delay_us) {
  return [b, delay_us](StepGraph::MicrobatchFn inner, Stream own) -> StepGraph::MicrobatchFn {
    return [b, delay_us, inner = std::move(inner), own](Stream, bool last) {
      delay_stream(b, own, delay_us);
      inner(own, last);
    };
  };
}

/// StepGraph: capture + replay equals eager iterations, bitwise (params, master,
/// moments, step, lr, norm), with microbatches, a running schedule and clipping.
/// `wrap` (may be empty) changes the graphed trainer only.
inline void case_graph_equals_eager(Backend b, DType grad_dtype, int microbatches, int iterations,
                                    bool deferred_gather = false, const TrainerWrap& wrap = {},
                                    const std::function<void(DistributedAdamOptions&)>& variant = {}) {
  const int rank = world_rank();
  DistributedAdamOptions o = base_options(grad_dtype);
  o.microbatches = microbatches;
  o.clip_max_norm = 0.05f;
  o.overlap_param_gather = deferred_gather;
  if (variant) variant(o);
  Communicator comm = make_comm(b);
  DistributedAdam eager(comm, small_model(), o);
  DistributedAdam graphed(comm, small_model(), o);
  TestStream se(b), sg(b);
  init_params(eager, se.get());
  init_params(graphed, sg.get());
  auto make_fn = [rank, b](DistributedAdam& opt) {
    // The forward would read the params: wait for deferred gathers first.
    return random_grads_fn(opt, b, rank, [&opt](Stream s) {
      for (int k = 0; k < static_cast<int>(opt.layout().buckets().size()); ++k) opt.wait_param(k, s);
    });
  };
  StepGraph ge(eager, make_fn(eager));
  StepGraph gg(graphed, wrap ? wrap(make_fn(graphed), sg.get()) : make_fn(graphed), StepGraphOptions{1});
  gg.capture(sg.get());
  for (int it = 1; it < iterations; ++it) gg.replay(sg.get());
  for (int it = 0; it < iterations; ++it) ge.run_eager(se.get());
  for (int k = 0; k < static_cast<int>(eager.layout().buckets().size()); ++k) eager.wait_param(k, se.get());
  se.sync();
  sg.sync();
  const StepScalars x = graphed.read_scalars(sg.get());
  EXPECT_EQ(x.step, iterations);
  EXPECT_LT(x.clip_coef, 1.0f) << "clipping must be active";
  expect_same_state(eager, graphed, se.get(), sg.get());
}

/// An Inf in one rank's gradient skips the step on every rank: params, master, moments
/// and the step count stay bitwise as they were; the next step proceeds.
inline void case_inf_skips_everywhere(Backend b) {
  const int rank = world_rank(), world = world_size();
  DistributedAdamOptions o = base_options(DType::bf16);
  DistributedAdam opt(make_comm(b), small_model(), o);
  TestStream s(b);
  init_params(opt, s.get());
  const auto targets = grad_targets(opt);
  auto run_step = [&](bool poison) {
    GradStreamParams p;
    p.kind = GradKind::Random;
    p.rank = rank;
    p.scalars = opt.device_scalars();
    if (poison && rank == world - 1) {
      p.poison_param = 2;
      p.poison_element = 5;
      p.poison_step = 3;
    }
    add_grads(b, s.get(), p, targets);
    report_all(opt, s.get());
    opt.step(s.get());
    opt.zero_grad(s.get());
  };
  run_step(false);
  run_step(false);
  std::vector<std::vector<std::uint8_t>> before;
  for (int i = 0; i < opt.num_params(); ++i) {
    before.push_back(read_bytes(b, opt.param(i)));
    before.push_back(read_bytes(b, opt.shard_master(i)));
    before.push_back(read_bytes(b, opt.shard_exp_avg(i)));
    before.push_back(read_bytes(b, opt.shard_exp_avg_sq(i)));
  }
  run_step(true);
  const StepScalars x = opt.read_scalars(s.get());
  EXPECT_EQ(x.found_inf, 1) << "every rank sees the Inf of rank " << world - 1;
  EXPECT_EQ(x.step, 2) << "a skipped step leaves the step count";
  std::size_t k = 0;
  for (int i = 0; i < opt.num_params(); ++i) {
    EXPECT_EQ(read_bytes(b, opt.param(i)), before[k++]);
    EXPECT_EQ(read_bytes(b, opt.shard_master(i)), before[k++]);
    EXPECT_EQ(read_bytes(b, opt.shard_exp_avg(i)), before[k++]);
    EXPECT_EQ(read_bytes(b, opt.shard_exp_avg_sq(i)), before[k++]);
  }
  run_step(false);
  const StepScalars y = opt.read_scalars(s.get());
  EXPECT_EQ(y.found_inf, 0);
  EXPECT_EQ(y.step, 3);
  EXPECT_GT(y.grad_norm, 0.0f);
}

/// zero_grad: views never move; grads are zeroed in place; cast copies are released in
/// eager mode and persist (same pointer, reported bytes) in graph mode; capturing a step
/// that would free copies is refused before capture, naming the option.
inline void case_zero_grad_and_copies(Backend b) {
  const int rank = world_rank();
  Communicator comm = make_comm(b);
  for (bool persistent : {false, true}) {
    DistributedAdamOptions o = base_options(DType::bf16);
    o.persistent_grad_copies = persistent;
    DistributedAdam opt(comm, small_model(), o);
    TestStream s(b);
    init_params(opt, s.get());
    std::vector<void*> pv, gv;
    for (int i = 0; i < opt.num_params(); ++i) {
      pv.push_back(opt.param(i).data);
      gv.push_back(opt.grad(i).data);
    }
    const auto targets = grad_targets(opt);
    void* first_copy = nullptr;
    for (int t = 0; t < 3; ++t) {
      GradStreamParams p;
      p.rank = rank;
      p.scalars = opt.device_scalars();
      add_grads(b, s.get(), p, targets);
      report_all(opt, s.get());
      opt.step(s.get());
      if (!persistent) {
        EXPECT_EQ(opt.memory().copies, 0);
      }
      // A view in the buffer's dtype is no copy; another dtype is.
      const ShardView same = opt.shard_grad(2, DType::bf16, s.get());
      const ShardView cast = opt.shard_grad(2, DType::f32, s.get());
      if (same.numel() > 0) {
        EXPECT_EQ(same.data, static_cast<char*>(opt.grad(2).data) + same.param_offset * 2);
        EXPECT_GT(opt.memory().copies, 0);
        if (first_copy == nullptr) first_copy = cast.data;
        if (persistent) {
          EXPECT_EQ(cast.data, first_copy) << "graph mode: the copy never moves";
        }
        const auto gb = read_f32(b, same), gf = read_f32(b, cast);
        for (std::size_t j = 0; j < gb.size(); ++j) EXPECT_EQ(gb[j], gf[j]);
      }
      opt.zero_grad(s.get());
      s.sync();
      if (!persistent) {
        EXPECT_EQ(opt.memory().copies, 0) << "eager mode: zero_grad releases copies";
      } else if (same.numel() > 0) {
        EXPECT_GT(opt.memory().copies, 0) << "graph mode: copies persist";
      }
      for (int i = 0; i < opt.num_params(); ++i) {
        EXPECT_EQ(opt.param(i).data, pv[static_cast<std::size_t>(i)]);
        EXPECT_EQ(opt.grad(i).data, gv[static_cast<std::size_t>(i)]);
        for (float x : read_f32(b, opt.grad(i))) ASSERT_EQ(x, 0.0f);
      }
    }
    if (!persistent) {
      StepGraph g(opt, [](Stream, bool) {});
      try {
        g.capture(s.get());
        ADD_FAILURE() << "capture must be refused";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::CaptureRefused);
        EXPECT_NE(std::string(e.what()).find("persistent_grad_copies"), std::string::npos) << e.what();
      }
    }
  }
}

/// An external optimizer (SGD with momentum) on the shard through shard_grad (f32 cast
/// copies of bf16 grads) and shard_master / shard_param, then gather_params, against a
/// plain oracle of the same update in the same arithmetic (double momentum, f32
/// parameters): grid gradients make the reduced sums exact, so the match is bitwise.
inline void case_external_sgd(Backend b) {
  const int rank = world_rank(), world = world_size();
  DistributedAdamOptions o = base_options(DType::bf16);
  o.param_dtype = DType::f32;
  o.grad_reduce = ReduceOp::Sum;
  o.persistent_grad_copies = true;
  DistributedAdam opt(make_comm(b), small_model(), o);
  TestStream s(b);
  init_params(opt, s.get());
  const auto targets = grad_targets(opt);
  const float lr = 0.05f, mu = 0.9f;
  const std::size_t np = static_cast<std::size_t>(opt.num_params());
  std::vector<std::vector<double>> momentum(np), mom_ref(np);
  std::vector<std::vector<float>> p_ref(np);
  for (std::size_t i = 0; i < np; ++i) {
    const auto n = static_cast<std::size_t>(opt.param(static_cast<int>(i)).numel());
    momentum[i].assign(n, 0.0);
    mom_ref[i].assign(n, 0.0);
    for (std::size_t j = 0; j < n; ++j) p_ref[i].push_back(init_value(static_cast<int>(i), static_cast<std::int64_t>(j)));
  }
  // The external optimizer never calls step(), so the gradient stream's step comes from
  // a counter of its own.
  DeviceBuffer counter(b, sizeof(StepScalars));
  for (int t = 0; t < 4; ++t) {
    StepScalars c{};
    c.step = t;
    from_host(b, counter.data(), std::vector<StepScalars>{c});
    GradStreamParams p;
    p.kind = GradKind::Grid;
    p.rank = rank;
    p.scalars = counter.as<StepScalars>();
    add_grads(b, s.get(), p, targets);
    report_all(opt, s.get());
    opt.reduce_grads(s.get());
    for (int i = 0; i < opt.num_params(); ++i) {
      const ShardView g = opt.shard_grad(i, DType::f32, s.get());
      const ShardView pm = opt.shard_param(i);
      if (g.numel() == 0) continue;
      s.sync();
      const auto gv = read_f32(b, g);
      auto pvv = read_f32(b, pm);
      auto& mom = momentum[static_cast<std::size_t>(i)];
      for (std::size_t j = 0; j < gv.size(); ++j) {
        double& m = mom[static_cast<std::size_t>(pm.param_offset) + j];
        m = mu * m + gv[j];
        pvv[j] = static_cast<float>(pvv[j] - lr * m);
      }
      from_host(b, pm.data, pvv);
    }
    opt.gather_params(s.get());
    opt.zero_grad(s.get());
    // Oracle on every element: the reduced grad is the exact sum over ranks (grid values).
    for (std::size_t i = 0; i < np; ++i) {
      for (std::size_t j = 0; j < p_ref[i].size(); ++j) {
        double g = 0;
        for (int r = 0; r < world; ++r)
          g += grad_value(GradKind::Grid, 1.0f, t, 0, r, static_cast<std::int32_t>(i), static_cast<std::int64_t>(j));
        mom_ref[i][j] = mu * mom_ref[i][j] + g;
        p_ref[i][j] = static_cast<float>(p_ref[i][j] - lr * mom_ref[i][j]);
      }
    }
  }
  for (int i = 0; i < opt.num_params(); ++i) {
    const auto got = read_f32(b, opt.param(i));
    for (std::size_t j = 0; j < got.size(); ++j)
      ASSERT_EQ(num::f32_bits(got[j]), num::f32_bits(p_ref[static_cast<std::size_t>(i)][j]))
          << "param " << i << " element " << j << ": " << got[j] << " vs " << p_ref[static_cast<std::size_t>(i)][j];
  }
}

/// Each element of `g` (this rank's f32 piece of parameter i's reduced gradient) is the
/// sum over ranks of the grid gradients of step 0, microbatch 0 (exact), divided by the
/// number of ranks in f32, bitwise: the oracle of Average.
inline void expect_grid_average(Backend b, const ShardView& g, int i) {
  const int world = world_size();
  const auto got = read_f32(b, g);
  for (std::size_t j = 0; j < got.size(); ++j) {
    const std::int64_t e = g.param_offset + static_cast<std::int64_t>(j);
    float sum = 0.0f;
    for (int r = 0; r < world; ++r) sum += grad_value(GradKind::Grid, 1.0f, 0, 0, r, i, e);
    const float want = sum / static_cast<float>(world);
    ASSERT_EQ(num::f32_bits(got[j]), num::f32_bits(want)) << "param " << i << " element " << e;
  }
}

/// The default reduction (Average) at any world size, 3 included: each reduced f32
/// gradient element is the sum over ranks (exact: grid values) divided by the number of
/// ranks in f32, bitwise. Host backend: NCCL's average pre-multiplies instead.
inline void case_average_is_sum_then_divide(Backend b) {
  const int rank = world_rank();
  DistributedAdamOptions o = base_options(DType::f32);
  ASSERT_EQ(o.grad_reduce, ReduceOp::Average) << "Average is the default";
  DistributedAdam opt(make_comm(b), small_model(), o);
  TestStream s(b);
  init_params(opt, s.get());
  GradStreamParams p;
  p.kind = GradKind::Grid;
  p.rank = rank;
  p.scalars = opt.device_scalars();
  add_grads(b, s.get(), p, grad_targets(opt));
  report_all(opt, s.get());
  opt.reduce_grads(s.get());
  for (int i = 0; i < opt.num_params(); ++i) {
    const ShardView g = opt.shard_grad(i, DType::f32, s.get());
    s.sync();
    expect_grid_average(b, g, i);
  }
}

/// StepGraph::replay_step in one-graph mode is Error(InvalidState) (there is no separate
/// step graph), before and after capture; replay() still works.
inline void case_replay_step_refused_in_one_graph_mode(Backend b) {
  DistributedAdam opt(make_comm(b), small_model(), base_options(DType::bf16));
  TestStream s(b);
  init_params(opt, s.get());
  StepGraphOptions go;
  go.one_graph = true;
  StepGraph g(opt, random_grads_fn(opt, b, world_rank()), go);
  std::int64_t before = 0;
  for (bool captured : {false, true}) {
    if (captured) {
      g.capture(s.get());
      before = opt.read_scalars(s.get()).step;
    }
    try {
      g.replay_step(s.get());
      ADD_FAILURE() << "replay_step in one-graph mode must throw (captured: " << captured << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidState) << e.what();
      EXPECT_NE(std::string(e.what()).find("one-graph mode"), std::string::npos) << e.what();
    }
  }
  g.replay(s.get());
  EXPECT_EQ(opt.read_scalars(s.get()).step, before + 1) << "replay() still trains in one-graph mode";
}

/// Different ParamSpec lists across ranks: a clear error on every rank, not a hang.
inline void case_mismatched_specs(Backend b) {
  const int rank = world_rank();
  auto specs = small_model();
  if (rank == world_size() - 1 && world_size() > 1) specs[3] = ParamSpec::grouped("experts", 3, {8, 14});
  try {
    DistributedAdam opt(make_comm(b), specs, base_options(DType::f32));
    if (world_size() > 1) ADD_FAILURE() << "mismatched specs must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::LayoutMismatch);
    EXPECT_NE(std::string(e.what()).find("experts"), std::string::npos) << e.what();
  }
}

/// The memory report equals the DESIGN.md formula: bf16 params + f32 main grads
/// -> 6 + 12/d bytes per (padded) element; bf16 params + bf16 grads -> 4 + 12/d.
inline void case_memory_formula(Backend b) {
  const int world = world_size();
  for (DType g : {DType::f32, DType::bf16}) {
    DistributedAdamOptions o = base_options(g);
    o.param_dtype = DType::bf16;
    o.nccl_registered = false;
    DistributedAdam opt(make_comm(b), small_model(), o);
    const std::int64_t n = opt.layout().total_numel();
    const std::int64_t real = opt.layout().param_numel();
    const std::int64_t gsize = g == DType::f32 ? 4 : 2;
    const MemoryReport r = opt.memory();
    EXPECT_EQ(r.params, 2 * n);
    EXPECT_EQ(r.grads, gsize * n);
    EXPECT_EQ(r.master, 4 * n / world);
    EXPECT_EQ(r.moments, 8 * n / world);
    EXPECT_EQ(r.copies, 0);
    EXPECT_EQ(r.total(), (2 + gsize) * n + 12 * n / world);
    // Padding: all of params+grads padding, and this rank's shard padding in master+moments.
    std::int64_t shard_real = 0;
    for (int i = 0; i < opt.num_params(); ++i) shard_real += opt.shard_master(i).numel();
    EXPECT_EQ(r.padding, (2 + gsize) * (n - real) + 12 * (n / world - shard_real));
  }
}

/// A variant of the options (deferred gathers, pipelined Adam + gathers, grouped
/// collectives) trains exactly like the plain configuration: same bits everywhere. With
/// overlap_param_gather the all-gathers stay in flight after step(); wait_param(bucket)
/// before use gives exactly the params of the non-deferred run.
inline void case_same_as_plain(Backend b, const std::function<void(DistributedAdamOptions&)>& variant) {
  const int rank = world_rank();
  Communicator comm = make_comm(b);
  DistributedAdamOptions o = base_options(DType::bf16);
  o.gather_pipeline = 1;
  o.grouped_collectives = false;
  DistributedAdamOptions od = o;
  variant(od);
  DistributedAdam plain(comm, small_model(), o), deferred(comm, small_model(), od);
  TestStream s(b), sd(b);
  init_params(plain, s.get());
  init_params(deferred, sd.get());
  for (int t = 0; t < 3; ++t) {
    for (auto* opt : {&plain, &deferred}) {
      Stream st = opt == &plain ? s.get() : sd.get();
      GradStreamParams p;
      p.rank = rank;
      p.scalars = opt->device_scalars();
      add_grads(b, st, p, grad_targets(*opt));
      if (opt == &deferred)
        for (int k = 0; k < static_cast<int>(opt->layout().buckets().size()); ++k) opt->wait_param(k, st);
      report_all(*opt, st);
      opt->step(st);
      opt->zero_grad(st);
    }
  }
  for (int k = 0; k < static_cast<int>(deferred.layout().buckets().size()); ++k) deferred.wait_param(k, sd.get());
  expect_same_state(plain, deferred, s.get(), sd.get());
}

}  // namespace shardopt::test
