// fsdp_mxfp8_cases.hpp - MXFP8 parameters in FSDP (issue 18), run on the host backend
// under mpiexec (test/mpi/test_fsdp_mxfp8.cpp) and on GPUs under mpirun
// (test/gpu/test_fsdp_mxfp8_gpu.cpp).
//
// Oracles: an unsharded DistributedAdam with MXFP8 parameters on one rank (its own
// Communicator::self) fed every rank's gradients, whose master is compared bitwise
// (grid gradients make every reduction exact in any order), and the independent MXFP8
// reference of test/unit/test_mxfp8_reference.hpp applied to bf16 of that master, which
// every gathered plane must equal bitwise. The trainers accumulate (+=) into the
// gradient slot, so staging bytes left in it would change the result.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/fsdp_cases.hpp"
#include "common/mxfp8_params_cases.hpp"

namespace shardopt::test {

/// mx_model() in units: the embedding (MXFP8 only); norm1 + w1 + experts (native and
/// MXFP8); small + bias1 + w2; tiny + head.
inline std::vector<FsdpUnit> mx_units() {
  return {{"embed", 0, 1}, {"block0", 1, 3}, {"block1", 4, 3}, {"head", 7, 2}};
}

/// FsdpOptions with MXFP8 parameters matching the quantized DistributedAdam options.
inline FsdpOptions fsdp_mx_options(const DistributedAdamOptions& d) {
  FsdpOptions o = fsdp_options(d);
  o.param_format = ParamFormat::Mxfp8;
  return o;
}

/// Writes mx_init_value into every shard_master piece and publishes it.
inline void fsdp_mx_init(Fsdp& f, Stream s) {
  for (int i = 0; i < f.num_params(); ++i) {
    const ShardView m = f.shard_master(i);
    const std::int64_t cols = f.layout().specs()[static_cast<std::size_t>(i)].shape.back();
    std::vector<float> v(static_cast<std::size_t>(m.numel()));
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = mx_init_value(i, m.param_offset + static_cast<std::int64_t>(k), cols);
    from_host(f.backend(), m.data, v);
  }
  f.init_from_master(s);
}

/// The bytes of an MXFP8 pass view: its data plane and its scale plane.
struct PassBytes {
  std::vector<std::uint8_t> data, scales;
};

/// Reads the plane of MXFP8 parameter i that its unit's last wait_param gathered for
/// `pass` (waits for `s`'s work first).
inline PassBytes read_pass(Fsdp& f, int i, FsdpPass pass, Stream s) {
  f.synchronize(s);
  const Mxfp8PassView v = f.mxfp8_param(i, pass);
  const Backend b = f.backend();
  PassBytes out;
  out.data = to_host<std::uint8_t>(b, v.data, static_cast<std::size_t>(v.shape.numel()));
  const std::int64_t ns = pass == FsdpPass::Forward ? v.shape.scale_row_numel() : v.shape.scale_col_numel();
  out.scales = to_host<std::uint8_t>(b, v.scales, static_cast<std::size_t>(ns));
  return out;
}

/// Run after each wait_param (position in the iteration, unit, pass, stream).
using PassHook = std::function<void(int position, int unit, FsdpPass pass, Stream)>;

/// The gradient targets of unit `u`'s slot views: one per parameter, with the gradient
/// stream id `id(param)` (grouped members may get their own through `split`).
using TargetsFn = std::function<std::vector<GradTarget>(Fsdp&, int unit, const std::vector<GradView>&)>;

inline std::vector<GradTarget> plain_targets(Fsdp& f, int u, const std::vector<GradView>& grads) {
  std::vector<GradTarget> t;
  int p = 0;
  for (int q = 0; q < f.num_params(); ++q)
    if (f.unit_of(q) == u) {
      t.push_back(GradTarget{grads[static_cast<std::size_t>(p)].data, grads[static_cast<std::size_t>(p)].numel(), q,
                             grads[static_cast<std::size_t>(p)].dtype});
      ++p;
    }
  return t;
}

/// One microbatch: forward gathers every unit (rowwise), backward in reverse order
/// (columnwise), each unit's gradients accumulated into its slot and reduce-scattered.
/// `forward_only`: an evaluation pass (end_forward_only, no gradients);
/// `only_world_rank_zero`: toy_grads'.
inline void fsdp_mx_microbatch(Fsdp& f, Stream s, int rank, GradKind kind, const PassHook& hook = {},
                               bool forward_only = false, const TargetsFn& targets = plain_targets,
                               const std::function<void(Stream)>& before_wait = {},
                               bool only_world_rank_zero = false) {
  int position = 0;
  const int nu = f.num_units();
  auto wait = [&](int u, FsdpPass pass) {
    if (before_wait) before_wait(s);
    (void)f.wait_param(u, pass, s);
    if (hook) hook(position, u, pass, s);
    ++position;
  };
  for (int u = 0; u < nu; ++u) wait(u, FsdpPass::Forward);
  if (forward_only) {
    f.end_forward_only(s);
    return;
  }
  for (int u = nu - 1; u >= 0; --u) {
    wait(u, FsdpPass::Backward);
    const auto grads = f.grad_slot(u, s);
    add_grads(f.backend(), s, toy_grads(kind, rank, f.device_scalars(), f.device_microbatch(), only_world_rank_zero),
              targets(f, u, grads));
    f.grad_ready(u, s);
  }
}

/// The gather paths of one run.
enum class FsdpMxPath {
  Plain,           ///< train only, prefetch and keep_last_unit on
  TrainEvalTrain,  ///< train, eval (forward only), train
  EvalFirst,       ///< eval before the first (learning) iteration
  EvalTwice,       ///< two evals in a row between training iterations
  NoPrefetch,      ///< every gather issued by its wait_param (nothing prefetched)
  NoKeepLastUnit,  ///< the last forward unit's native part is gathered again for its backward
  Hsdp,            ///< shard groups of 2 ranks, 2 replicas (4 ranks)
  DelayedGathers,  ///< the gather stream sleeps ~2 ms before every wait_param (on the host
                   ///< the caller's stream, whose gathers land when waited): a missing wait
                   ///< would let a pass read a place before its plane lands
};

/// Every MXFP8 plane a pass reads equals the oracle's plane (quantize(bf16(master)) of
/// the unsharded reference's master, which trains in lockstep), bitwise; the master and
/// moments equal the reference's bitwise (grid gradients: exact reductions in any
/// order), on every path (`path`): evaluation passes leave staged planes in the gradient
/// slot (checked non-Idle), and the trainer accumulates into the slot, so bytes the
/// library failed to zero before the next backward (seed 001) would change the master.
inline void case_fsdp_mx_equals_dist_adam(Backend b, int microbatches, int steps, FsdpMxPath path = FsdpMxPath::Plain) {
  const int rank = world_rank(), world = world_size();
  const bool pow2 = (world & (world - 1)) == 0;
  DistributedAdamOptions d = mx_options(DType::bf16);
  d.microbatches = microbatches;
  d.grad_reduce = pow2 ? ReduceOp::Average : ReduceOp::Sum;
  Communicator comm = make_comm(b);
  FsdpOptions fo = fsdp_mx_options(d);
  fo.prefetch = path != FsdpMxPath::NoPrefetch;
  fo.keep_last_unit = path != FsdpMxPath::NoKeepLastUnit;
  if (path == FsdpMxPath::Hsdp) fo.shard_group_size = 2;
  Fsdp f(comm, mx_model(), mx_units(), fo);
  DistributedAdamOptions ro = d;
  ro.grad_reduce = ReduceOp::Sum;
  DistributedAdam ref(Communicator::self(b), mx_model(), ro);
  if (pow2) ref.set_loss_scale(static_cast<float>(world));
  TestStream s(b), rs(b);
  fsdp_mx_init(f, s.get());
  mx_init(ref, rs.get());
  const auto rt = grad_targets(ref);
  std::function<void(Stream)> before;
  // The host backend's gather stream is the caller's (its gathers land when waited).
  if (path == FsdpMxPath::DelayedGathers)
    before = [&f, b](Stream st) { delay_stream(b, b == Backend::Host ? st : f.gather_stream(), 2000); };
  int checked = 0, evals = 0;
  for (int t = 0; t < steps; ++t) {
    std::map<int, mxfp8_ref::Quantized> want;
    for (int i = 0; i < ref.num_params(); ++i)
      if (ref.is_mxfp8(i)) want[i] = expected_mx(ref, i);
    PassHook check = [&](int pos, int u, FsdpPass pass, Stream st) {
      for (int i = 0; i < f.num_params(); ++i) {
        if (f.unit_of(i) != u || !f.is_mxfp8(i)) continue;
        SCOPED_TRACE("step " + std::to_string(t) + " position " + std::to_string(pos) + " param " +
                     f.layout().specs()[static_cast<std::size_t>(i)].name);
        const PassBytes got = read_pass(f, i, pass, st);
        const mxfp8_ref::Quantized& w = want.at(i);
        if (pass == FsdpPass::Forward) {
          ASSERT_EQ(got.data, w.data_row);
          ASSERT_EQ(got.scales, w.scale_row);
        } else {
          ASSERT_EQ(got.data, w.data_col);
          ASSERT_EQ(got.scales, w.scale_col);
        }
        ++checked;
      }
    };
    const bool eval_now = (path == FsdpMxPath::EvalFirst && t == 0) ||
                          ((path == FsdpMxPath::TrainEvalTrain || path == FsdpMxPath::EvalTwice) && t == 2);
    for (int e = 0; eval_now && e < (path == FsdpMxPath::EvalTwice ? 2 : 1); ++e) {
      fsdp_mx_microbatch(f, s.get(), rank, GradKind::Grid, check, /*forward_only=*/true);
      EXPECT_TRUE(f.staging_state(0) != GatherState::Idle || f.staging_state(1) != GatherState::Idle)
          << "an eval leaves its planes in the gradient slot";
      ++evals;
    }
    for (int mb = 0; mb < microbatches; ++mb) {
      fsdp_mx_microbatch(f, s.get(), rank, GradKind::Grid, check, false, plain_targets, before);
      f.advance_microbatch(s.get());
      add_every_ranks_grads(ref, rs.get(), rt);
      ref.advance_microbatch(rs.get());
    }
    f.step(s.get());
    f.zero_grad(s.get());
    ref.step(rs.get());
    ref.zero_grad(rs.get());
  }
  EXPECT_GT(checked, 0);
  EXPECT_EQ(evals > 0, path == FsdpMxPath::TrainEvalTrain || path == FsdpMxPath::EvalTwice || path == FsdpMxPath::EvalFirst);
  const StepScalars x = f.read_scalars(s.get()), y = ref.read_scalars(rs.get());
  EXPECT_EQ(x.step, steps);
  EXPECT_LT(x.clip_coef, 1.0f) << "clipping must be active";
  EXPECT_EQ(num::f32_bits(x.grad_norm), num::f32_bits(y.grad_norm));
  for (int i = 0; i < f.num_params(); ++i) {
    SCOPED_TRACE(f.layout().specs()[static_cast<std::size_t>(i)].name);
    const ShardView m = f.shard_master(i);
    ASSERT_TRUE(bytes_match_at(read_bytes(b, m), read_bytes(b, ref.shard_master(i)), m.param_offset * 4));
    const ShardView v = f.shard_exp_avg_sq(i);
    ASSERT_TRUE(bytes_match_at(read_bytes(b, v), read_bytes(b, ref.shard_exp_avg_sq(i)), v.param_offset * 4));
  }
  // Every staging half ends the iteration zeroed or never written.
  EXPECT_EQ(f.staging_state(0), GatherState::Idle);
  EXPECT_EQ(f.staging_state(1), GatherState::Idle);
}

/// The whole FSDP iteration with MXFP8 parameters (gathers, compute, reduce-scatters,
/// step with the quantize, zero_grad) captured in one graph: replay equals eager, bitwise.
inline void case_fsdp_mx_graph_equals_eager(Backend b, int microbatches, int iterations) {
  FsdpCaseModel m{mx_model(), mx_units(), mx_options(DType::bf16), fsdp_mx_options, fsdp_mx_init,
                  [](Fsdp& f, Stream s, int rank) { fsdp_mx_microbatch(f, s, rank, GradKind::Random); }};
  fsdp_graph_vs_eager(b, m, microbatches, iterations, [](Fsdp& fe, Fsdp& fg, Stream se, Stream sg) {
    // The planes the next forward reads, too.
    for (int u = 0; u < fe.num_units(); ++u) {
      (void)fe.wait_param(u, FsdpPass::Forward, se);
      (void)fg.wait_param(u, FsdpPass::Forward, sg);
      for (int i = 0; i < fe.num_params(); ++i) {
        if (fe.unit_of(i) != u || !fe.is_mxfp8(i)) continue;
        const PassBytes x = read_pass(fe, i, FsdpPass::Forward, se), z = read_pass(fg, i, FsdpPass::Forward, sg);
        EXPECT_EQ(x.data, z.data);
        EXPECT_EQ(x.scales, z.scales);
      }
    }
    fe.end_forward_only(se);
    fg.end_forward_only(sg);
  });
}
/// A grouped weight trains bitwise like its discrete members (same ids in the gradient
/// stream, same initial values); the gathered planes of member m equal those of the
/// discrete member m in both passes.
inline void case_fsdp_mx_grouped_vs_discrete(Backend b) {
  const int G = 4;
  const Shape member{35, 24};
  const std::int64_t mn = numel(member);
  const auto [grouped, discrete] = moe_models(G, member);
  const std::vector<FsdpUnit> ug = {{"embed", 0, 1}, {"moe", 1, 2}, {"head", 3, 1}};
  const std::vector<FsdpUnit> ud = {{"embed", 0, 1}, {"moe", 1, 1 + G}, {"head", 2 + G, 1}};
  DistributedAdamOptions d = mx_options(DType::bf16);
  d.bucket_numel = 1000;
  d.clip_max_norm = 0.0f;  // the two layouts sum the norm in different orders
  Communicator comm = make_comm(b);
  Fsdp fg(comm, grouped, ug, fsdp_mx_options(d)), fd(comm, discrete, ud, fsdp_mx_options(d));
  TestStream sg(b), sd(b);
  auto id_of = moe_id;
  for (Fsdp* f : {&fg, &fd}) {
    for (int i = 0; i < f->num_params(); ++i) {
      const ParamSpec& sp = f->layout().specs()[static_cast<std::size_t>(i)];
      const bool grp = sp.name == "experts";
      const ShardView m = f->shard_master(i);
      std::vector<float> v(static_cast<std::size_t>(m.numel()));
      for (std::size_t k = 0; k < v.size(); ++k) {
        const std::int64_t e = m.param_offset + static_cast<std::int64_t>(k);
        v[k] = mx_init_value(id_of(sp.name, grp ? e / mn : 0), grp ? e % mn : e, sp.shape.back());
      }
      from_host(b, m.data, v);
    }
  }
  fg.init_from_master(sg.get());
  fd.init_from_master(sd.get());
  TargetsFn targets = [&](Fsdp& f, int u, const std::vector<GradView>& grads) {
    std::vector<GradTarget> t;
    int p = 0;
    for (int q = 0; q < f.num_params(); ++q) {
      if (f.unit_of(q) != u) continue;
      const GradView& g = grads[static_cast<std::size_t>(p++)];
      const std::string& name = f.layout().specs()[static_cast<std::size_t>(q)].name;
      if (name == "experts") {
        for (int m = 0; m < G; ++m)
          t.push_back(GradTarget{static_cast<char*>(g.data) + static_cast<std::size_t>(m * mn) * size_of(g.dtype), mn,
                                 id_of(name, m), g.dtype});
      } else {
        t.push_back(GradTarget{g.data, g.numel(), id_of(name, 0), g.dtype});
      }
    }
    return t;
  };
  const int ex = fg.layout().param_index("experts");
  int compared = 0;
  for (int t = 0; t < 6; ++t) {
    // Planes of the grouped run, per pass, then the discrete run's members against them.
    std::map<std::pair<int, int>, PassBytes> seen;  // (pass, member)
    PassHook grab = [&](int, int u, FsdpPass pass, Stream st) {
      if (u != 1) return;
      const PassBytes all = read_pass(fg, ex, pass, st);
      const Mxfp8Shape sh = fg.mxfp8_param(ex, pass).shape;
      const std::int64_t scale_per = (pass == FsdpPass::Forward ? sh.scale_row_numel() : sh.scale_col_numel()) / G;
      for (int m = 0; m < G; ++m) {
        PassBytes pm;
        pm.data.assign(all.data.begin() + m * mn, all.data.begin() + (m + 1) * mn);
        pm.scales.assign(all.scales.begin() + m * scale_per, all.scales.begin() + (m + 1) * scale_per);
        seen[{static_cast<int>(pass), m}] = pm;
      }
    };
    PassHook check = [&](int, int u, FsdpPass pass, Stream st) {
      if (u != 1) return;
      for (int m = 0; m < G; ++m) {
        SCOPED_TRACE("step " + std::to_string(t) + " member " + std::to_string(m));
        const PassBytes got = read_pass(fd, fd.layout().param_index("experts." + std::to_string(m)), pass, st);
        const PassBytes& want = seen.at({static_cast<int>(pass), m});
        EXPECT_EQ(got.data, want.data);
        EXPECT_EQ(got.scales, want.scales);
        ++compared;
      }
    };
    fsdp_mx_microbatch(fg, sg.get(), world_rank(), GradKind::Grid, grab, false, targets);
    fsdp_mx_microbatch(fd, sd.get(), world_rank(), GradKind::Grid, check, false, targets);
    for (auto [f, st] : {std::make_pair(&fg, sg.get()), std::make_pair(&fd, sd.get())}) {
      f->advance_microbatch(st);
      f->step(st);
      f->zero_grad(st);
    }
  }
  EXPECT_EQ(compared, 6 * 2 * G);
  for (int m = 0; m < G; ++m) {
    const ShardView mg = fg.shard_master(ex);
    const int dm = fd.layout().param_index("experts." + std::to_string(m));
    const ShardView md = fd.shard_master(dm);
    // Assemble-free check: where this rank's pieces overlap, the bytes agree.
    const auto bg = read_bytes(b, mg), bd = read_bytes(b, md);
    const std::int64_t lo = std::max(mg.param_offset, md.param_offset + m * mn);
    const std::int64_t hi = std::min(mg.param_offset + mg.numel(), md.param_offset + md.numel() + m * mn);
    for (std::int64_t e = lo; e < hi; ++e)
      ASSERT_EQ(0, std::memcmp(bg.data() + (e - mg.param_offset) * 4, bd.data() + (e - m * mn - md.param_offset) * 4, 4))
          << "member " << m << " element " << e;
  }
}

/// Each pass gathers exactly one MXFP8 plane: per iteration the forward moves one byte
/// per (padded) MXFP8 element and the native elements in param_dtype, the backward the
/// same (with keep_last_unit the last unit's native part is not gathered again, its
/// columnwise plane is); the MXFP8 bytes are half of what the same model in bf16 moves.
/// Asking for the other pass or plane is a clear error.
inline void case_fsdp_mx_one_plane_per_pass(Backend b) {
  const int rank = world_rank();
  DistributedAdamOptions d = mx_options(DType::bf16);
  Communicator comm = make_comm(b);
  Fsdp f(comm, mx_model(), mx_units(), fsdp_mx_options(d));
  Fsdp nat(comm, mx_model(), mx_units(), fsdp_options(d));
  TestStream s(b), sn(b);
  fsdp_mx_init(f, s.get());
  init_fsdp(nat, sn.get());
  const Layout& L = f.layout();
  // Padded elements per unit, MXFP8 and native (from the layout's buckets).
  std::vector<std::int64_t> mxe(static_cast<std::size_t>(f.num_units()), 0), nate(mxe.size(), 0);
  for (std::size_t bk = 0; bk < L.buckets().size(); ++bk) {
    const Bucket& k = L.buckets()[bk];
    const bool mx = L.buffers()[static_cast<std::size_t>(k.buffer)].storage != 0;
    (mx ? mxe : nate)[static_cast<std::size_t>(L.bucket_units()[bk])] += k.range.size();
  }
  std::int64_t mx_all = 0, nat_all = 0;
  for (std::size_t u = 0; u < mxe.size(); ++u) {
    mx_all += mxe[u];
    nat_all += nate[u];
  }
  const std::int64_t last = static_cast<std::int64_t>(mxe.size()) - 1;
  for (int t = 0; t < 3; ++t) {
    const FsdpGatherStats before = f.gather_stats(), nb = nat.gather_stats();
    fsdp_mx_microbatch(f, s.get(), rank, GradKind::Grid);
    fsdp_mx_microbatch(nat, sn.get(), rank, GradKind::Grid);  // wait_param(unit, pass) works natively too
    const FsdpGatherStats after = f.gather_stats(), na = nat.gather_stats();
    EXPECT_EQ(after.forward_bytes - before.forward_bytes, mx_all + 2 * nat_all) << "step " << t;
    EXPECT_EQ(after.backward_bytes - before.backward_bytes, mx_all + 2 * (nat_all - nate[static_cast<std::size_t>(last)]))
        << "step " << t;
    EXPECT_EQ(after.mxfp8_bytes - before.mxfp8_bytes, 2 * mx_all) << "one plane per pass, step " << t;
    // The bf16 run moves two bytes per (padded) element per pass: at least twice the
    // MXFP8 elements' bytes, and more than the MXFP8 run in all.
    const std::int64_t bf16_fwd = na.forward_bytes - nb.forward_bytes;
    EXPECT_GE(bf16_fwd, 2 * mx_all + 2 * nat_all - 2 * 128 * static_cast<std::int64_t>(mxe.size()));
    EXPECT_LT(after.forward_bytes - before.forward_bytes, bf16_fwd);
    EXPECT_EQ(na.mxfp8_bytes, 0);
    for (Fsdp* o : {&f, &nat}) {
      Stream st = o == &f ? s.get() : sn.get();
      o->step(st);
      o->zero_grad(st);
    }
  }
  // Errors: the other pass, the other plane, the pass-less call, init_master, shard_param.
  const int w1 = f.layout().param_index("w1");
  const int u1 = f.unit_of(w1);
  (void)f.wait_param(0, FsdpPass::Forward, s.get());
  expect_error(mx_error_of([&] { (void)f.wait_param(u1, FsdpPass::Backward, s.get()); }), ErrorCode::InvalidArgument,
               "Forward");
  (void)f.wait_param(u1, FsdpPass::Forward, s.get());
  expect_error(mx_error_of([&] { (void)f.mxfp8_param(w1, FsdpPass::Backward); }), ErrorCode::InvalidArgument,
               "columnwise");
  EXPECT_NE(f.mxfp8_param(w1, FsdpPass::Forward).data, nullptr);
  EXPECT_EQ(f.mxfp8_param(w1, FsdpPass::Forward).plane, Mxfp8Plane::Rowwise);
  f.end_forward_only(s.get());
  expect_error(mx_error_of([&] { (void)f.wait_param(0, s.get()); }), ErrorCode::InvalidArgument, "name the pass");
  expect_error(mx_error_of([&] { f.init_master(s.get()); }), ErrorCode::InvalidState, "init_from_master");
  expect_error(mx_error_of([&] { (void)f.shard_param(w1); }), ErrorCode::InvalidArgument, "shard_master");
  expect_error(mx_error_of([&] { (void)f.mxfp8_param(f.layout().param_index("norm1"), FsdpPass::Forward); }),
               ErrorCode::InvalidArgument, "not an MXFP8 parameter");
  FsdpOptions bad = fsdp_mx_options(d);
  bad.param_format = ParamFormat::Nvfp4;
  expect_error(mx_error_of([&] { Fsdp x(comm, mx_model(), mx_units(), bad); }), ErrorCode::Unsupported, "Nvfp4");
  s.sync();
  comm.barrier();
}

/// Persistent bytes per rank (docs/mxfp8.md, "FSDP"): master 4/d + moments 8/d per
/// element, the two MXFP8 shard planes 2/d (each rounded up to 16 bytes), the whole
/// scales, gradients grad_dtype/d, native params param_dtype/d; the pool is two native
/// slots, the gradient slot (which also stages the planes) and one columnwise slot.
inline void case_fsdp_mx_memory(Backend b) {
  const int world = world_size();
  auto piece = [](std::int64_t n) { return (n + 15) / 16 * 16; };
  Communicator comm = make_comm(b);
  const DistributedAdamOptions d = mx_options(DType::bf16);
  Fsdp f(comm, mx_model(), mx_units(), fsdp_mx_options(d));
  const Layout& L = f.layout();
  const MemoryReport r = f.memory();
  std::int64_t n = 0, n_mx = 0, planes = 0, scales = 0;
  for (const BufferLayout& buf : L.buffers()) {
    n += buf.numel;
    if (buf.storage != 0) {
      n_mx += buf.numel;
      planes += 2 * piece(buf.shard_numel);
    }
  }
  for (int i = 0; i < f.num_params(); ++i) {
    if (!f.is_mxfp8(i)) continue;
    const Mxfp8Shape sh = Mxfp8Shape::of(L.specs()[static_cast<std::size_t>(i)]);
    scales += piece(sh.scale_row_numel()) + piece(sh.scale_col_numel());
  }
  std::int64_t max_all = 0, max_native = 0, max_mx = 0;
  for (int u = 0; u < f.num_units(); ++u) {
    std::int64_t all = 0, mx = 0;
    for (std::size_t bk = 0; bk < L.buckets().size(); ++bk)
      if (L.bucket_units()[bk] == u) {
        all += L.buckets()[bk].range.size();
        if (L.buffers()[static_cast<std::size_t>(L.buckets()[bk].buffer)].storage != 0) mx += L.buckets()[bk].range.size();
      }
    max_all = std::max(max_all, all);
    max_mx = std::max(max_mx, mx);
    max_native = std::max(max_native, all - mx);
  }
  EXPECT_EQ(r.master, 4 * n / world);
  EXPECT_EQ(r.moments, 8 * n / world);
  EXPECT_EQ(r.grads, 2 * n / world);
  EXPECT_EQ(r.params, 2 * (n - n_mx) / world);
  EXPECT_EQ(r.mxfp8, planes + scales);
  EXPECT_EQ(r.pool, 2 * 2 * max_native + 2 * max_all + max_mx);
  EXPECT_EQ(r.total(), 12 * n / world + 2 * n / world + 2 * (n - n_mx) / world + planes + scales + r.pool);
  // Staging through the gradient slot saves the forward's two plane places and one of
  // the backward's: "one more slot" (two max_mx places of its own) would add max_mx more.
  EXPECT_LT(r.pool, 2 * 2 * max_native + 2 * max_all + 2 * max_mx);
}

}  // namespace shardopt::test


/// The cases above as tests of `Suite` on backend `B` (the host and GPU binaries).
#define SHARDOPT_FSDP_MXFP8_CASES(Suite, B)                                                                               \
TEST(Suite, EqualsDistributedAdamAndOracleBitwise) { case_fsdp_mx_equals_dist_adam(B, 1, 4); }                             \
TEST(Suite, EqualsWithMicrobatches) { case_fsdp_mx_equals_dist_adam(B, 2, 3); }                                            \
TEST(Suite, Hsdp2x2EqualsDistributedAdam) {                                                                                \
  if (world_size() != 4) GTEST_SKIP() << "HSDP 2 x 2 needs 4 ranks";                                                       \
  case_fsdp_mx_equals_dist_adam(B, 2, 3, FsdpMxPath::Hsdp);                                                                \
}                                                                                                                          \
TEST(Suite, DelayedGathersNeverExposeAStalePlace) {                                                                        \
  case_fsdp_mx_equals_dist_adam(B, 2, 3, FsdpMxPath::DelayedGathers);                                                      \
}                                                                                                                          \
TEST(Suite, GraphReplayEqualsEager) { case_fsdp_mx_graph_equals_eager(B, 4, 20); }                                         \
TEST(Suite, TrainEvalTrainEqualsDistributedAdam) { case_fsdp_mx_equals_dist_adam(B, 2, 4, FsdpMxPath::TrainEvalTrain); }   \
TEST(Suite, EvalBeforeLearningEqualsDistributedAdam) { case_fsdp_mx_equals_dist_adam(B, 1, 3, FsdpMxPath::EvalFirst); }    \
TEST(Suite, TwoEvalsEqualDistributedAdam) { case_fsdp_mx_equals_dist_adam(B, 1, 4, FsdpMxPath::EvalTwice); }               \
TEST(Suite, NoPrefetchEqualsDistributedAdam) { case_fsdp_mx_equals_dist_adam(B, 2, 3, FsdpMxPath::NoPrefetch); }           \
TEST(Suite, NoKeepLastUnitEqualsDistributedAdam) { case_fsdp_mx_equals_dist_adam(B, 1, 3, FsdpMxPath::NoKeepLastUnit); }   \
TEST(Suite, GroupedEqualsDiscreteMembers) { case_fsdp_mx_grouped_vs_discrete(B); }                                         \
TEST(Suite, OnePlanePerPassAndErrors) { case_fsdp_mx_one_plane_per_pass(B); }                                              \
TEST(Suite, MemoryEqualsFormula) { case_fsdp_mx_memory(B); }
