// Issue 29, the pipelined tail's hang at four groups (helper c2, docs/tuning.md): with
// DistributedAdam's pipelined tail, `mpirun -n 2 bench_dist_adam` hung at the default
// gather_pipeline = 4 (5 runs of 5) and finished at 8; main finished at both. Both ranks
// waited in the BucketStore warm-up of a later optimizer (Communicator::synchronize in
// BucketStoreImpl's constructor): the benchmark's full_step builds optimizers one after
// another (unpipelined bf16, bf16, MXFP8 and NVFP4 steps captured and replayed, then the
// three formats' whole iterations as one-graph StepGraphs, then one more bf16 optimizer),
// and the GPU work of a construction never completed.
//
// This suite runs that sequence at the benchmark's shapes (Llama-3.2-1B, 147 tensors, 34
// or 35 buckets at 2 ranks) and counts. The promise: every construction, eager step and
// replay of the sequence completes on every rank within its deadline, and each optimizer
// applied exactly the steps launched on it (the device's step count: the eager steps plus
// the replays). Every wait is bounded: the optimizers' wait_timeout (60 s: constructions'
// warm-ups, synchronize, read_scalars) and step_timeout (60 s: StepGraph replays), so a
// hang fails the case with Error(Timeout) naming the wait instead of hanging the suite;
// a process alarm covers the few waits that have no deadline (a destructor's). Each case
// uses a communicator of its own, so one that times out does not spoil the next.
//
// The cases differ in one thing each, so that one device run says which matters:
//   FourGroups                  the benchmark's default (gather_pipeline 4);
//   EightGroups                 gather_pipeline 8 (the benchmark finished with it);
//   FourGroupsUnregistered      4 groups, nccl_registered = false (cudaMalloc buffers: NCCL
//                               registers nothing, locally or for a graph);
//   FourGroupsFreshCommunicator 4 groups, a new communicator for each optimizer (no NCCL
//                               state survives from one optimizer to the next).
// Each stage prints a line on every rank (stderr, flushed) before it starts, so that a
// stop is located even where the process alarm ends the job.
//
// Issue 29 (helper d1): the MXFP8 optimizers' captured steps now all-gather into their
// storage (NCCL-registered like the store's buffers, or cudaMalloc'ed when unregistered).
// Each graph is destroyed before its optimizer, which frees that storage, and the next
// optimizers allocate again (possibly at the same addresses) and capture again: the
// sequence a stale graph registration of freed storage would break (docs/decisions.md).
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

#include "core/check.hpp"
#include "mpi/comm_test_support.hpp"
#include "shardopt/distributed_adam.hpp"
#include "shardopt/presets.hpp"
#include "shardopt/step_graph.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

constexpr auto kDeadline = std::chrono::seconds(60);
constexpr int kReplays = 33;  // bench::time_ms's 3 warm-up and 30 timed launches

cudaStream_t cu(Stream s) { return reinterpret_cast<cudaStream_t>(s); }

// What one case varies (see the header).
struct Variant {
  int gather_pipeline = 4;
  bool registered = true;
  bool fresh_comm = false;
};

// bench_dist_adam's step_options(), with the case's pipeline depth and registration and
// the deadlines above.
DistributedAdamOptions options_of(const Variant& v, ParamFormat format, int gather_pipeline) {
  DistributedAdamOptions o;
  o.grad_dtype = DType::bf16;
  if (format == ParamFormat::Native) o.param_dtype = DType::bf16;  // quantized: the 1-D params stay f32
  o.param_format = format;
  o.clip_max_norm = 1.0f;
  o.overlap_grad_reduce = false;
  o.groups["decay"] = AdamGroup{0.1, 1.0};
  o.groups["no_decay"] = AdamGroup{0.0, 1.0};
  o.gather_pipeline = gather_pipeline;
  o.nccl_registered = v.registered;
  WatchdogOptions w;
  w.wait_timeout = kDeadline;
  w.step_timeout = kDeadline;
  o.watchdog = w;
  return o;
}

// Every parameter (native: its view; quantized: this rank's master piece) and every
// gradient set to the bytes 0x3c (bf16 and f32 values near 0.0115), then published.
void fill(DistributedAdam& opt, Stream s) {
  auto set = [&](void* p, std::size_t bytes) {
    if (bytes > 0) SHARDOPT_CUDA_CHECK(cudaMemsetAsync(p, 0x3c, bytes, cu(s)));
  };
  const bool quantized = opt.options().param_format != ParamFormat::Native;
  for (int i = 0; i < opt.num_params(); ++i) {
    if (quantized) {
      set(opt.shard_master(i).data, opt.shard_master(i).bytes());
    } else {
      set(opt.param(i).data, opt.param(i).bytes());
    }
  }
  if (quantized) {
    opt.init_from_master(s);  // NVFP4 zeroes the gradient regions it staged through; MXFP8 gathers in place
  } else {
    opt.init_master(s);
  }
  for (int i = 0; i < opt.num_params(); ++i) set(opt.grad(i).data, opt.grad(i).bytes());
}

// The rank's progress line (every rank: a stop on one rank only shows there).
void stage(const Communicator& comm, const std::string& what) {
  std::fprintf(stderr, "[rank %d] optimizer sequence: %s\n", comm.rank(), what.c_str());
  std::fflush(stderr);
}

// bench_dist_adam's step_ms: an eager step, then the step captured (a plain stream
// capture of step()) and replayed; destroyed graph first, then the optimizer.
void step_round(const Communicator& comm, TestStream& s, const DistributedAdamOptions& o,
                const std::string& name) {
  SCOPED_TRACE(name);
  stage(comm, name + ": construction");
  DistributedAdam opt(comm, presets::transformer(presets::kLlama32_1B, DType::bf16), o);
  fill(opt, s.get());
  stage(comm, name + ": eager step");
  opt.step(s.get());
  opt.synchronize(s.get());
  {
    stage(comm, name + ": capture and replays");
    Graph g;
    s.begin_capture();
    opt.step(s.get());
    s.end_capture(g);
    for (int r = 0; r < kReplays; ++r) g.replay(Backend::Cuda, s.get());
    opt.synchronize(s.get());
  }
  EXPECT_EQ(opt.read_scalars(s.get()).step, 1 + kReplays) << name << ": steps applied";
  stage(comm, name + ": destruction");
}

// bench_dist_adam's iteration_ms: the whole iteration (reduce-scatters, step, zero_grad)
// as one StepGraph, captured after its eager warm-up iterations and replayed.
void iteration_round(const Communicator& comm, const TestStream& s, const DistributedAdamOptions& o,
                     const std::string& name) {
  SCOPED_TRACE(name);
  stage(comm, name + ": construction");
  DistributedAdam opt(comm, presets::transformer(presets::kLlama32_1B, DType::bf16), o);
  fill(opt, s.get());
  StepGraphOptions go;
  go.one_graph = true;
  {
    StepGraph g(opt, [](Stream, bool) {}, go);
    stage(comm, name + ": capture (after the eager warm-up) and replays");
    g.capture(s.get());
    for (int r = 0; r < kReplays; ++r) g.replay(s.get());
    opt.synchronize(s.get());
  }
  EXPECT_EQ(opt.read_scalars(s.get()).step, go.warmup_iterations + kReplays) << name << ": steps applied";
  stage(comm, name + ": destruction");
}

// bench_dist_adam's full_step, in its order: the unpipelined bf16 step, the bf16, MXFP8
// and NVFP4 steps, the three formats' iterations, then one more bf16 optimizer (where
// the benchmark times the NCCL limit) with one eager step.
void bench_sequence(const Variant& v) {
  const Watchdog alarm(600);  // below the suite's 900 s: the waits without a deadline
  Communicator shared = make_world(Backend::Cuda);
  TestStream s(Backend::Cuda);
  // Each stage's communicator: the case's own, or (fresh_comm) a new one per optimizer.
  auto comm = [&]() -> Communicator { return v.fresh_comm ? make_world(Backend::Cuda) : shared; };
  const int g = v.gather_pipeline;
  step_round(comm(), s, options_of(v, ParamFormat::Native, 1), "bf16 step, gather_pipeline 1");
  step_round(comm(), s, options_of(v, ParamFormat::Native, g), "bf16 step");
  step_round(comm(), s, options_of(v, ParamFormat::Mxfp8, g), "MXFP8 step");
  step_round(comm(), s, options_of(v, ParamFormat::Nvfp4, g), "NVFP4 step");
  iteration_round(comm(), s, options_of(v, ParamFormat::Native, g), "bf16 iteration");
  iteration_round(comm(), s, options_of(v, ParamFormat::Mxfp8, g), "MXFP8 iteration");
  iteration_round(comm(), s, options_of(v, ParamFormat::Nvfp4, g), "NVFP4 iteration");
  const Communicator last_comm = comm();
  stage(last_comm, "last bf16 optimizer: construction");
  DistributedAdam last(last_comm, presets::transformer(presets::kLlama32_1B, DType::bf16),
                       options_of(v, ParamFormat::Native, g));
  fill(last, s.get());
  stage(last_comm, "last bf16 optimizer: eager step");
  last.step(s.get());
  last.synchronize(s.get());
  EXPECT_EQ(last.read_scalars(s.get()).step, 1);
  stage(last_comm, "done");
}

TEST(OptimizerSequenceGpu, FourGroups) { bench_sequence(Variant{4, true, false}); }
TEST(OptimizerSequenceGpu, EightGroups) { bench_sequence(Variant{8, true, false}); }
TEST(OptimizerSequenceGpu, FourGroupsUnregistered) { bench_sequence(Variant{4, false, false}); }
TEST(OptimizerSequenceGpu, FourGroupsFreshCommunicator) { bench_sequence(Variant{4, true, true}); }

}  // namespace
