// bench_fsdp.hpp - what bench_fsdp's two halves share: its arguments, the synthetic
// model (16 units of an MLP block pair) and its options, and the device half
// (bench_fsdp_cuda.cpp in a CUDA build; in a build without CUDA,
// common/device_halves_none.cpp, which refuses). The host half (bench_fsdp.cpp) parses,
// runs the host smoke iteration and calls run_device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mpi_bench.hpp"
#include "shardopt/fsdp.hpp"

namespace shardopt::bench_fsdp {

constexpr int kUnits = 16;
constexpr std::int64_t kHidden = 2048, kMlp = 8192;

// --results DIR, --peer FILE, --peer-megatron FILE, --iters N (default 20), --tokens T
// and --params.
struct Args : bench::RunArgs {
  std::int64_t tokens = 4096;
  bool mxfp8 = false;
  std::string peer_megatron;  ///< the Megatron-FSDP peer's timings ("" = none)
};

/// The arguments above, from the command line (bench::parse_run_args).
Args parse(int argc, char** argv);

/// The model's parameters: per unit an up (mlp x hidden) and a down (hidden x mlp) matrix.
std::vector<ParamSpec> model_specs(std::int64_t hidden, std::int64_t mlp);
/// One FsdpUnit per unit, two parameters each.
std::vector<FsdpUnit> model_units();
/// The options of every optimizer measured: clipping at 1, weight decay 0.1, a constant
/// learning rate, `prefetch`, MXFP8 parameters when `mxfp8`.
FsdpOptions options(bool prefetch, bool mxfp8);

/// The CUDA measurements: the iteration with prefetch on and off, its pieces alone, and
/// the rows against the peers' files. `command` is recorded in each row.
void run_device(const Args& a, bench::MpiBench& mb, const std::string& command);

}  // namespace shardopt::bench_fsdp
