// bench_dist_adam.hpp - what bench_dist_adam's two halves share: its arguments, the step's
// options, and the device half (bench_dist_adam_cuda.cpp in a CUDA build; in a build
// without CUDA, common/device_halves_none.cpp, which refuses). The host half
// (bench_dist_adam.cpp) parses, runs the host smoke configuration and calls run_device.
#pragma once

#include <string>
#include <vector>

#include "mpi_bench.hpp"
#include "shardopt/distributed_adam.hpp"

namespace shardopt::bench_dist_adam {

// --results DIR, --peer FILE, --iters N (default 30), --host-cpu-only, --phases,
// --grad-reduce-precision, --gather-pipeline N, --offload F[,F...], --offload-stage N and
// --capacity.
struct Args : bench::RunArgs {
  bool host_cpu_only = false;  // --host-cpu-only: skip the full-step rows
  bool phases = false;         // --phases: the phase breakdown instead of the host CPU sweep
  bool grad_reduce = false;    // --grad-reduce-precision: only the F32Accumulate vs Native row
  std::vector<double> offload; // --offload F[,F...]: only the offloaded-state rows, one per fraction
  bool capacity = false;       // --capacity: only the capacity rows (the largest model that steps)
  std::int64_t offload_stage = 0;  // --offload-stage N: AdamOptions::offload_stage_numel of the --offload rows (0: default)
};

/// The arguments above, from the command line (bench::parse_run_args; exits on bad ones).
Args parse(int argc, char** argv);

/// The options of every step measured: bf16 grads and params, clipping at 1, two groups,
/// per-bucket overlap off, --gather-pipeline's value where given.
DistributedAdamOptions step_options();

/// The CUDA measurements: --grad-reduce-precision's row alone, or the full-step rows and
/// then the phase breakdown (--phases) or the host CPU sweep. `command` is recorded in
/// each row.
void run_device(const Args& a, bench::MpiBench& mb, const std::string& command);

}  // namespace shardopt::bench_dist_adam
