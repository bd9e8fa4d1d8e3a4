// offload_cases.hpp - optimizer state in pinned host memory, streamed through the step
// (issue 47, AdamOptions::offload_fraction, docs/offload.md): bitwise the on-GPU run in
// DistributedAdam, Fsdp and HSDP, eager and graph, with remainders and 8-bit moments,
// clipping and a skipped step, and with Muon groups (their masters and momentum on the
// host too); checkpoints in the same format from any fraction to any other; the memory
// report; the errors (a refused pinned allocation on every rank). Run on the host backend
// under mpiexec (CI) and on GPUs (device suite).
//
// The oracle is the same optimizer with everything on the GPU (offload_fraction 0), fed
// the same gradients: the offload changes where the state lives, never a bit of it.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/memory.hpp"
#include "muon_cases.hpp"
#include "mxfp8_params_cases.hpp"
#include "state_precision_cases.hpp"

namespace shardopt::test {

/// `o` with `fraction` of the state offloaded, through stages of `stage` elements (small,
/// so that the test models stream many stages through the ring of four slots).
template <class Options>
Options offloaded(Options o, double fraction, std::int64_t stage = 256) {
  o.offload_fraction = fraction;
  o.offload_stage_numel = stage;
  return o;
}

/// Bytes of the state a MemoryReport counts on the device.
inline std::int64_t device_state(const MemoryReport& r) { return r.master + r.remainders + r.moments + r.moment_scales; }

/// Every shard piece (parameter, master or its bf16 + remainder rebuild, remainder,
/// moments) and the step scalars of `a` equal `r`'s, bitwise.
template <class Opt>
void expect_same_shards(Opt& a, Opt& r, Stream sa, Stream sr) {
  const Backend b = a.backend();
  const StepScalars x = a.read_scalars(sa), y = r.read_scalars(sr);
  EXPECT_EQ(x.step, y.step);
  EXPECT_EQ(num::f32_bits(x.grad_norm), num::f32_bits(y.grad_norm));
  EXPECT_EQ(num::f32_bits(x.clip_coef), num::f32_bits(y.clip_coef));
  for (int i = 0; i < a.num_params(); ++i) {
    SCOPED_TRACE(a.layout().specs()[static_cast<std::size_t>(i)].name);
    EXPECT_EQ(read_bytes(b, a.shard_param(i)), read_bytes(b, r.shard_param(i)));
    EXPECT_EQ(master_bits(a, i), master_bits(r, i));
    EXPECT_EQ(read_bytes(b, a.shard_remainder(i)), read_bytes(b, r.shard_remainder(i)));
    EXPECT_EQ(read_bytes(b, a.shard_exp_avg(i)), read_bytes(b, r.shard_exp_avg(i)));
    EXPECT_EQ(read_bytes(b, a.shard_exp_avg_sq(i)), read_bytes(b, r.shard_exp_avg_sq(i)));
  }
}

/// DistributedAdam with `fraction` of its state offloaded trains bitwise as the on-GPU
/// run (30 steps of random gradients, clipping active; eager with a skipped step at step
/// 9, or both through a captured StepGraph), with the master kept as `master` and the
/// moments in `moments`. Its device state shrinks by what it reports offloaded.
inline void case_da_offload_equals_on_gpu(Backend b, double fraction, bool graph, MasterStorage master = MasterStorage::fp32,
                                          DType moments = DType::f32) {
  DistributedAdamOptions o = base_options(DType::bf16);
  o.grad_reduce = ReduceOp::Sum;
  o.master_storage = master;
  o.moment_dtype = moments;
  DistributedAdam ref(make_comm(b), small_model(), o);
  DistributedAdam off(make_comm(b), small_model(), offloaded(o, fraction));
  TestStream sf(b), so(b);
  init_params(ref, sf.get());
  init_params(off, so.get());
  constexpr int kSteps = 30;
  da_random_train_both(ref, off, sf.get(), so.get(), graph, kSteps, 9);
  if (!graph) {
    EXPECT_EQ(off.read_scalars(so.get()).step, kSteps - 1) << "the step with an Inf is skipped";
  }
  EXPECT_LT(ref.read_scalars(sf.get()).clip_coef, 1.0f) << "clipping must be active in this case";
  expect_same_shards(off, ref, so.get(), sf.get());
  for (int i = 0; i < off.num_params(); ++i)
    EXPECT_EQ(read_bytes(b, off.param(i)), read_bytes(b, ref.param(i))) << "full parameter " << i;
  const MemoryReport r = off.memory(), f = ref.memory();
  EXPECT_GT(r.offloaded, 0);
  // A ring where there is state to stream: rank 0's slices start every bucket (a rank whose
  // offloaded slices are padding only keeps none).
  if (world_rank() == 0) {
    EXPECT_GT(r.offload_staging, 0);
  }
  EXPECT_EQ(device_state(r) + r.offloaded, device_state(f)) << "the state is on the device or on the host, once";
  if (fraction == 1.0) {
    EXPECT_EQ(device_state(r), 0) << "offload_fraction 1 keeps no state on the device";
  }
}

/// Fsdp (HSDP with `shard_group` > 0) with `fraction` offloaded: bitwise the on-GPU run
/// after 12 steps, eager or through a captured StepGraph.
inline void case_fsdp_offload_equals_on_gpu(Backend b, double fraction, bool graph, int shard_group = 0,
                                            MasterStorage master = MasterStorage::fp32, DType moments = DType::f32) {
  const int world = world_size();
  if (shard_group > 0 && (world % shard_group != 0 || world == shard_group))
    GTEST_SKIP() << "HSDP needs a world that is a multiple of the shard group, larger than it";
  DistributedAdamOptions d = ckpt_options(DType::f32);
  FsdpOptions o = fsdp_options(d);
  o.shard_group_size = shard_group;
  o.master_storage = master;
  o.moment_dtype = moments;
  Fsdp ref(make_comm(b), fsdp_model(), small_units(), o);
  Fsdp off(make_comm(b), fsdp_model(), small_units(), offloaded(o, fraction));
  TestStream sf(b), so(b);
  init_fsdp(ref, sf.get());
  init_fsdp(off, so.get());
  fsdp_train_both(ref, off, sf.get(), so.get(), graph, 12);
  expect_same_shards(off, ref, so.get(), sf.get());
  EXPECT_EQ(device_state(off.memory()) + off.memory().offloaded, device_state(ref.memory()));
}

/// Muon groups beside AdamW ones (muon::model: matrices of three shapes, one grouped, with
/// and without Nesterov) with `fraction` of the state offloaded: the Muon pieces' fp32
/// masters and their homes' momentum live in pinned host memory, which Muon's pass updates
/// in place, while the AdamW pieces' state streams through the ring. After 8 steps of random
/// gradients (eager with a skipped step, or a captured StepGraph's replays) every shard
/// equals the on-GPU run's bitwise; both
/// runs save the same checkpoint files (Muon's momentum among them), and the offloaded
/// run's files, loaded into an optimizer with all of its state offloaded, train on as
/// the reference does.
inline void case_muon_offload_equals_on_gpu(Backend b, double fraction, bool graph,
                                            MasterStorage master = MasterStorage::fp32, DType moments = DType::f32) {
  DistributedAdamOptions o = muon::dist_options();
  o.grad_dtype = DType::bf16;  // da_random_step's Inf is a bf16 one
  o.master_storage = master;
  o.moment_dtype = moments;
  DistributedAdam ref(make_comm(b), muon::model(), o);
  DistributedAdam off(make_comm(b), muon::model(), offloaded(o, fraction));
  TestStream s(b);
  for (DistributedAdam* x : {&ref, &off}) {
    x->set_lr(muon::kLr);
    init_params(*x, s.get());  // bf16 parameters, then init_master (remainders keep no fp32 master to write)
  }
  constexpr int kSteps = 8;
  da_random_train_both(ref, off, s.get(), s.get(), graph, kSteps, graph ? -1 : 3);  // eager: step 3 skipped
  ref.synchronize(s.get());
  off.synchronize(s.get());
  EXPECT_EQ(off.read_scalars(s.get()).step, graph ? kSteps : kSteps - 1);
  expect_same_shards(off, ref, s.get(), s.get());
  for (int i = 0; i < off.num_params(); ++i)
    EXPECT_EQ(read_bytes(b, off.param(i)), read_bytes(b, ref.param(i))) << "full parameter " << i;
  EXPECT_GT(off.memory().offloaded, 0);
  EXPECT_LT(device_state(off.memory()), device_state(ref.memory()));
  if (fraction == 1.0) {
    EXPECT_EQ(device_state(off.memory()), 0) << "no master, moment or Muon momentum stays on the device";
  }

  SharedDir dir("offload_muon");
  ref.save(dir.sub("gpu"), s.get());
  off.save(dir.sub("host"), s.get());
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    bool momentum = false;
    for (const auto& e : std::filesystem::directory_iterator(dir.sub("gpu"))) {
      const std::string name = e.path().filename().string();
      const std::vector<std::uint8_t> bytes = file_bytes(e.path().string());
      momentum = momentum || std::string(bytes.begin(), bytes.end()).find("muon_momentum") != std::string::npos;
      EXPECT_EQ(bytes, file_bytes(dir.sub("host") + "/" + name)) << name;
    }
    EXPECT_TRUE(momentum) << "the files hold Muon's momentum";
  }
  DistributedAdam all(make_comm(b), muon::model(), offloaded(o, 1.0));
  all.set_lr(muon::kLr);
  all.load(dir.sub("host"), s.get());
  for (int t = 0; t < 3; ++t) {
    da_random_step(ref, s.get(), world_rank(), false);
    da_random_step(all, s.get(), world_rank(), false);
  }
  expect_same_shards(all, ref, s.get(), s.get());
}

/// Fsdp (HSDP with `shard_group` > 0) with Muon groups and `fraction` offloaded: bitwise
/// the on-GPU Fsdp after 6 iterations.
inline void case_muon_fsdp_offload_equals_on_gpu(Backend b, double fraction, int shard_group = 0) {
  const int world = world_size();
  if (shard_group > 0 && (world % shard_group != 0 || world == shard_group))
    GTEST_SKIP() << "HSDP needs a world that is a multiple of the shard group, larger than it";
  FsdpOptions o = muon::fsdp_options();
  o.shard_group_size = shard_group;
  Fsdp ref(make_comm(b), muon::model(), muon::units(), o);
  Fsdp off(make_comm(b), muon::model(), muon::units(), offloaded(o, fraction));
  TestStream s(b);
  for (Fsdp* x : {&ref, &off}) {
    x->set_lr(muon::kLr);
    muon::init(*x, s.get());
  }
  for (int t = 0; t < 6; ++t) {
    muon::fsdp_step(ref, t, s.get());
    muon::fsdp_step(off, t, s.get());
  }
  expect_same_shards(off, ref, s.get(), s.get());
  EXPECT_GT(off.memory().offloaded, 0);
  if (fraction == 1.0) {
    EXPECT_EQ(device_state(off.memory()), 0) << "no master, moment or Muon momentum stays on the device";
  }
}

/// Checkpoints save from and load into host-resident state in the same format: a run
/// with half its state offloaded writes the same files as the on-GPU run (with save_async,
/// training on while they are written); loaded into
/// another fraction (all offloaded) or into Fsdp, training goes on bitwise as without
/// offload.
/// With `master` / `moments` other than fp32 the checkpoint rebuilds masters and decodes
/// moments from the pinned arrays (kernels reading host memory on a GPU) and splits and
/// quantizes them back into it on load.
inline void case_offload_checkpoints(Backend b, MasterStorage master = MasterStorage::fp32,
                                     DType moments = DType::f32) {
  SharedDir dir("offload");
  DistributedAdamOptions base = ckpt_options(DType::f32);
  base.master_storage = master;
  base.moment_dtype = moments;
  constexpr int t1 = 5, t2 = 4;
  DistributedAdam ref(make_comm(b), fsdp_model(), base);
  TestStream rs(b);
  init_params(ref, rs.get());
  da_train(ref, rs.get(), t1);
  ref.save(dir.sub("gpu"), rs.get());
  {
    DistributedAdam off(make_comm(b), fsdp_model(), offloaded(base, 0.5));
    TestStream s(b);
    init_params(off, s.get());
    da_train(off, s.get(), t1);
    SaveHandle h = off.save_async(dir.sub("half"), s.get());  // its snapshot is of the host arrays at step t1
    da_train(off, s.get(), 3);  // training goes on over them while the files are written
    h.wait();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    int files = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.sub("gpu"))) {
      const std::string name = e.path().filename().string();
      EXPECT_EQ(file_bytes(e.path().string()), file_bytes(dir.sub("half") + "/" + name)) << name;
      ++files;
    }
    EXPECT_GT(files, 1);
  }
  da_train(ref, rs.get(), t2);
  // Half offloaded -> all offloaded, and -> on the GPU: the same state as the run that never stopped.
  for (double fraction : {1.0, 0.0}) {
    SCOPED_TRACE("loaded into offload_fraction " + std::to_string(fraction));
    DistributedAdam y(make_comm(b), fsdp_model(), offloaded(base, fraction));
    TestStream s(b);
    y.load(dir.sub("half"), s.get());
    da_train(y, s.get(), t2);
    expect_same_shards(y, ref, s.get(), rs.get());
    for (int i = 0; i < y.num_params(); ++i)
      EXPECT_EQ(read_bytes(b, y.param(i)), read_bytes(b, ref.param(i))) << "full parameter " << i;
  }
  // On-GPU files into an Fsdp with offloaded state, against an on-GPU Fsdp that loads them.
  Fsdp fz(make_comm(b), fsdp_model(), small_units(), fsdp_options(base));
  Fsdp fo(make_comm(b), fsdp_model(), small_units(), offloaded(fsdp_options(base), 0.7));
  TestStream sz(b), so(b);
  fz.load(dir.sub("gpu"), sz.get());
  fo.load(dir.sub("gpu"), so.get());
  fsdp_train(fz, sz.get(), t2);
  fsdp_train(fo, so.get(), t2);
  expect_same_shards(fo, fz, so.get(), sz.get());
}

/// The memory report: the offloaded bytes are the state of the last buckets, whole, at
/// least `fraction` of the shard (and no more than the bucket that crossed it); the device
/// keeps the rest and a ring of four slots of offload_stage_numel elements.
inline void case_offload_memory(Backend b) {
  DistributedAdamOptions o = base_options(DType::bf16);
  o.param_dtype = DType::bf16;
  o.nccl_registered = false;
  DistributedAdam gpu(make_comm(b), small_model(), o);
  const std::int64_t shard = gpu.layout().total_numel() / world_size();
  const std::int64_t state = device_state(gpu.memory());
  ASSERT_EQ(state, 12 * shard);
  std::int64_t largest = 0;  // the largest bucket slice, in bytes of state
  for (const Bucket& bk : gpu.layout().buckets()) largest = std::max(largest, 12 * bk.range.size() / world_size());
  for (double fraction : {0.25, 0.5, 1.0}) {
    SCOPED_TRACE("offload_fraction " + std::to_string(fraction));
    DistributedAdam off(make_comm(b), small_model(), offloaded(o, fraction, 512));
    const MemoryReport r = off.memory();
    const auto target = static_cast<std::int64_t>(std::ceil(fraction * static_cast<double>(shard))) * 12;
    EXPECT_GE(r.offloaded, target);
    EXPECT_LE(r.offloaded, target + largest);
    EXPECT_EQ(device_state(r) + r.offloaded, state);
    if (world_rank() == 0) {
      EXPECT_GT(r.offload_staging, 0);
    }
    EXPECT_LE(r.offload_staging, 4 * 512 * 12);  // four slots of fp32 master and moments, at most a stage wide
    EXPECT_EQ(r.offload_staging % (4 * 256 * 12), 0) << "slots are whole 8-bit blocks wide";
    EXPECT_EQ(r.total(), gpu.memory().total() - r.offloaded + r.offload_staging);
  }
  // Stages far wider than any bucket: the slots are as wide as the widest stage, a bucket's
  // slice from its block-aligned start, not offload_stage_numel.
  std::int64_t widest = 0;
  for (const Bucket& bk : gpu.layout().buckets()) {
    const std::int64_t lo = bk.shard_offset, hi = lo + bk.range.size() / world_size();
    widest = std::max(widest, hi - lo / 256 * 256);
  }
  const MemoryReport wide = DistributedAdam(make_comm(b), small_model(), offloaded(o, 1.0, 1 << 20)).memory();
  if (world_rank() == 0) {
    EXPECT_GT(wide.offload_staging, 0);
  }
  EXPECT_LE(wide.offload_staging, 4 * 12 * ((widest + 255) / 256 * 256));
}

/// Bad input is a clear error on every rank, naming the option; a pinned allocation the
/// host refuses is Error(OutOfMemory) on every rank, and nothing of it stays allocated.
inline void case_offload_errors(Backend b) {
  const int rank = world_rank();
  DistributedAdamOptions o = base_options(DType::bf16);
  auto expect = [&](const DistributedAdamOptions& x, ErrorCode code, const std::string& part) {
    const auto e = error_of([&] { DistributedAdam opt(make_comm(b), small_model(), x); });
    ASSERT_TRUE(e.has_value()) << part;
    EXPECT_EQ(e->code(), code) << e->what();
    EXPECT_NE(std::string(e->what()).find(part), std::string::npos) << e->what();
  };
  for (double bad : {-0.25, 1.5, std::numeric_limits<double>::quiet_NaN()})
    expect(offloaded(o, bad), ErrorCode::InvalidArgument, "offload_fraction");
  expect(offloaded(o, 0.5, 100), ErrorCode::InvalidArgument, "offload_stage_numel");
  expect(offloaded(o, 0.5, 0), ErrorCode::InvalidArgument, "offload_stage_numel");
  {
    const auto e = error_of([&] { DistributedAdam opt(make_comm(b), mx_model(), offloaded(mx_options(), 0.5)); });
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code(), ErrorCode::Unsupported) << e->what();
    EXPECT_NE(std::string(e->what()).find("offload_fraction"), std::string::npos) << e->what();
  }
  // Rank 0 may pin half of what its offloaded state needs (a model whose state dwarfs the
  // optimizer's other pinned slots): every rank refuses, rank 0 naming the bytes.
  const std::vector<ParamSpec> big{ParamSpec::tensor("big", {1024, 1024}, DType::bf16, "decay"),
                                   ParamSpec::tensor("bias", {1024}, DType::bf16, "no_decay")};
  std::int64_t needed = 0;
  {
    DistributedAdam fine(make_comm(b), big, offloaded(o, 1.0));
    needed = fine.memory().offloaded;
    EXPECT_EQ(needed, 12 * fine.layout().total_numel() / world_size());
  }
  const std::size_t before = detail::pinned_bytes();
  if (rank == 0) detail::set_pinned_limit(before + static_cast<std::size_t>(needed / 2));
  const auto e = error_of([&] { DistributedAdam opt(make_comm(b), big, offloaded(o, 1.0)); });
  detail::set_pinned_limit(std::nullopt);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::OutOfMemory) << e->what();
  const std::string what = e->what();
  EXPECT_NE(what.find("offload_fraction"), std::string::npos) << what;
  EXPECT_NE(what.find(rank == 0 ? "keeps " + std::to_string(needed) + " bytes of this rank's optimizer state"
                                : "rank 0 could not pin"),
            std::string::npos)
      << what;
  EXPECT_EQ(detail::pinned_bytes(), before) << "a refused offload leaves nothing pinned";
}

}  // namespace shardopt::test
