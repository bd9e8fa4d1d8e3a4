// bench_dist_adam: the distributed-Adam step (reduce-scatter, norm/clip, Adam on the
// shard, all-gather) for the Llama-3.2-1B-shaped set with bf16 grads, with bf16 params,
// with MXFP8 params (ParamFormat::Mxfp8: quantize from the master, e8m0 scale
// all-reduce, all-gather of both e4m3 planes in place into the storage: issue 29)
// and with NVFP4 params (ParamFormat::Nvfp4: partial u32 amaxes, one Max all-reduce,
// shard quantize, all-gather of the E2M1 bytes through the grad buffer, landing with the
// shared bytes ORed, zeroing).
//
//   mpirun -n 4 bench_dist_adam [--results DIR] [--peer FILE] [--iters N] [--phases]
//                                [--grad-reduce-precision] [--gather-pipeline N]
//                                [--offload F[,F...]] [--offload-stage N] [--capacity]
//
// --offload F[,F...] runs only the rows "dist_adam_offload" (issue 47, docs/offload.md):
// per fraction F (in [0, 1], AdamOptions::offload_fraction) and state mode (fp32 master
// and moments; remainders + 8-bit moments), the captured step with that share of the
// state in pinned host memory, against its limit measured in this process: the larger of
// the same step with everything on the GPU and a duplex copy of the offloaded bytes (up
// to the device and back, at once, on two streams, in the step's stage sizes) between
// pinned host memory and the device. The rows give the duplex bandwidth measured
// (GB/s each way) and the pinned bytes. --peer FILE gives the fully offloaded fp32 row its
// peers, both recorded, the faster one as the row's peer: bench/peers/offload_peer.py
// (FSDP2 with CPUOffloadPolicy, its optimizer step on the CPU) and
// deepspeed_offload_peer.py (DeepSpeed ZeRO-Offload, its CPU Adam), appended to one file.
// --offload-stage N sets AdamOptions::offload_stage_numel of those rows (default: the
// option's default); the rows record it ("offload_stage_numel"), so write them to a
// results folder of their own when comparing (the configs' names stay).
//
// --capacity runs only the rows "dist_adam_capacity" (issue 47, docs/offload.md): per
// state mode (fp32 master and moments; remainders + 8-bit moments), the largest model of
// Llama-3-8B's widths (layers as many as fit) whose captured step builds, steps and
// replays on this GPU, with all state on the GPU and with the state offloaded (all of it,
// or the share that 0.8 of the host's available memory holds, pinned). The layer count is
// predicted from two small builds' MemoryReport and proven by building: the row's model
// stepped, and one layer more was refused with Error(OutOfMemory).
//
// --gather-pipeline N sets DistributedAdamOptions::gather_pipeline (at least 1) of every
// step measured (default: the option's default); the rows record it ("gather_pipeline"),
// so write them to a results folder of their own when comparing (the configs' names stay).
//
// --grad-reduce-precision runs only the row "dist_adam_grad_reduce" (issue 31): the
// captured bf16 step with GradReducePrecision::F32Accumulate against the same step with
// Native, in this process, and the phase breakdown of both ("dist_adam_phases" rows
// ".../native" and ".../f32acc", as --phases measures them; the F32Accumulate one also
// gives the local HBM bytes of its reduce and their limit, reduce_local_*).
//
// Per run it measures, in the same process:
//  * ours: the captured step graph, replayed (CUDA events, median), for bf16 params
//    ("bf16p-bf16g/1.5B/147/nN"), MXFP8 params ("mxfp8p-bf16g/1.5B/147/nN") and NVFP4
//    params ("nvfp4p-bf16g/1.5B/147/nN"), with
//    the bytes each rank all-gathers and all-reduces and its memory (MemoryReport);
//  * the limit: one NCCL reduce-scatter of the whole grad buffer + one all-gather of the
//    whole param buffer + our Adam on the shard, each timed alone (median), summed;
//  * host CPU time per step, eager step() vs graph replay, for 1, 10, 100, 1000 tensors;
//  * the whole iteration per format ("dist_adam_iteration" rows): reduce-scatters, step
//    and zero_grad replayed as one StepGraph, with the ratio to bf16's iteration;
//  * the PyTorch peer's median, read from the file bench/peers/dist_adam_peer.py wrote;
//  * with --phases (instead of the host CPU sweep): where the time of each format's step
//    goes ("dist_adam_phases" rows). CUDA events at the step's phase marks
//    (quantized/phase_probe.hpp) of eager steps queued behind a 40 ms host wait, so that
//    the device runs them back to back as a replay would; per phase the median over
//    steps of the summed time between its marks and the next, and its bandwidth limit
//    (the bytes it must move at the measured device copy bandwidth).
// On the host backend (no GPU) it runs a tiny smoke configuration and writes nothing.
#include "bench_dist_adam.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mpi_bench.hpp"
#include "results.hpp"
#include "shardopt/distributed_adam.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/presets.hpp"
#include "shardopt/step_graph.hpp"

namespace shardopt::bench_dist_adam {
namespace {
// --gather-pipeline N (0: the option's default), read by step_options().
int gather_pipeline = 0;
}  // namespace

Args parse(int argc, char** argv) {
  Args a;
  a.iters = 30;
  bench::parse_run_args(argc, argv, a, [&](bench::ArgReader& r) {
    if (r.arg() == "--phases") {
      a.phases = true;
      return true;
    }
    if (r.arg() == "--offload-stage") {
      a.offload_stage = std::atoll(r.value().c_str());
      return true;
    }
    if (r.arg() == "--capacity") {
      a.capacity = true;
      return true;
    }
    if (r.arg() == "--grad-reduce-precision") {
      a.grad_reduce = true;
      return true;
    }
    if (r.arg() == "--offload") {
      const std::string v = r.value();
      for (std::size_t at = 0; at <= v.size();) {
        const std::size_t end = std::min(v.find(',', at), v.size());
        a.offload.push_back(std::atof(v.substr(at, end - at).c_str()));
        at = end + 1;
      }
      return true;
    }
    if (r.arg() == "--gather-pipeline") {
      gather_pipeline = std::max(1, std::atoi(r.value().c_str()));
      return true;
    }
    if (r.arg() != "--host-cpu-only") return false;
    a.host_cpu_only = true;
    return true;
  });
  return a;
}

DistributedAdamOptions step_options() {
  DistributedAdamOptions o;
  o.grad_dtype = DType::bf16;
  o.param_dtype = DType::bf16;
  o.clip_max_norm = 1.0f;
  o.overlap_grad_reduce = false;
  o.groups["decay"] = AdamGroup{0.1f, 1.0f};
  o.groups["no_decay"] = AdamGroup{0.0f, 1.0f};
  if (gather_pipeline > 0) o.gather_pipeline = gather_pipeline;
  return o;
}

namespace {
using Clock = std::chrono::steady_clock;

void host_smoke(const Communicator& comm) {
  for (ParamFormat format : {ParamFormat::Native, ParamFormat::Mxfp8, ParamFormat::Nvfp4}) {
    HostStream hs;
    auto specs = presets::transformer({64, 2, 128, 32, 100}, DType::bf16);
    DistributedAdamOptions o = step_options();
    if (format != ParamFormat::Native) {
      o.param_dtype.reset();
      o.param_format = format;
    }
    DistributedAdam opt(comm, specs, o);
    if (format != ParamFormat::Native) {
      opt.init_from_master(hs.handle());
    } else {
      opt.init_master(hs.handle());
    }
    StepGraph g(opt, [](Stream, bool) {});
    g.capture(hs.handle());
    const auto t0 = Clock::now();
    for (int i = 0; i < 5; ++i) g.replay(hs.handle());
    const auto t1 = Clock::now();
    if (comm.rank() == 0)
      std::printf("host smoke (%s params): %d params, 5 replayed steps in %.3f ms, step count %lld\n",
                  format == ParamFormat::Mxfp8 ? "MXFP8" : format == ParamFormat::Nvfp4 ? "NVFP4" : "bf16",
                  opt.num_params(),
                  std::chrono::duration<double, std::milli>(t1 - t0).count(),
                  static_cast<long long>(opt.read_scalars(hs.handle()).step));
  }
}

}  // namespace
}  // namespace shardopt::bench_dist_adam

int main(int argc, char** argv) {
  using namespace shardopt;
  using namespace shardopt::bench_dist_adam;
  return bench::mpi_main(argc, argv, "bench_dist_adam", {}, [&] {
    const Args a = parse(argc, argv);
    bench::MpiBench mb(default_backend());
    if (mb.backend() == Backend::Host) {
      host_smoke(mb.comm());
      return 0;
    }
    run_device(a, mb, bench::command_line(argc, argv));
    return 0;
  });
}
