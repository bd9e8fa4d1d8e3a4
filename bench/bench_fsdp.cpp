// bench_fsdp: a whole FSDP training iteration of a synthetic model of 16 units, each a
// Llama-3.2-1B-sized MLP block pair of bf16 GEMMs (up 8192x2048, down 2048x8192; cuBLAS,
// fp32 accumulation), forward + backward + step, one CUDA graph per iteration.
//
//   mpirun -n 4 bench_fsdp [--results DIR] [--peer FILE] [--peer-megatron FILE] [--iters N] [--tokens T]
//                          [--params bf16|mxfp8]
//
// --params mxfp8: MXFP8 parameters (FsdpOptions::param_format, docs/mxfp8.md "FSDP"):
// each forward gathers the rowwise plane, each backward the columnwise plane, one byte
// per element; the GEMMs stay bf16 (Hopper has no MXFP8 GEMM): every unit's gathered
// plane is decoded straight to bf16 first, both weights of a unit in one launch
// (dequantize_mxfp8_batch; the data-gradient GEMM from the columnwise plane).
// Both modes report the bytes gathered per iteration and the persistent memory per rank.
//
// Measured in one process: the iteration with prefetch on and off (graph replay, CUDA
// events, median); its pieces alone — compute only (the same GEMMs on resident
// weights), communication only (every gather and reduce-scatter of an iteration back to
// back), the optimizer step alone; and the PyTorch FSDP2 peer's median read from the file
// bench/peers/fsdp_peer.py wrote (--peer). limit = max(compute, communication) + step:
// what a perfect overlap of communication with compute would give. --peer-megatron FILE
// (bench/peers/megatron_fsdp_peer.py's file) adds a second row of the same iteration
// against Megatron-FSDP, config "<config>/vs-megatron-fsdp".
#include "bench_fsdp.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "mpi_bench.hpp"
#include "results.hpp"
#include "shardopt/fsdp.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/mxfp8.hpp"
#include "shardopt/step_graph.hpp"

namespace shardopt::bench_fsdp {

Args parse(int argc, char** argv) {
  Args a;
  a.iters = 20;
  bench::parse_run_args(argc, argv, a, [&](bench::ArgReader& r) {
    if (r.arg() == "--tokens") {
      a.tokens = std::atoll(r.value().c_str());
      return true;
    }
    if (r.arg() == "--peer-megatron") {
      a.peer_megatron = r.value();
      return true;
    }
    if (r.arg() != "--params") return false;
    const std::string v = r.value();
    if (v != "bf16" && v != "mxfp8") throw std::invalid_argument("--params takes bf16 or mxfp8, not " + v);
    a.mxfp8 = v == "mxfp8";
    return true;
  });
  return a;
}

std::vector<ParamSpec> model_specs(std::int64_t hidden, std::int64_t mlp) {
  std::vector<ParamSpec> s;
  for (int u = 0; u < kUnits; ++u) {
    s.push_back(ParamSpec::tensor("unit" + std::to_string(u) + ".up", {mlp, hidden}));
    s.push_back(ParamSpec::tensor("unit" + std::to_string(u) + ".down", {hidden, mlp}));
  }
  return s;
}

std::vector<FsdpUnit> model_units() {
  std::vector<FsdpUnit> u;
  for (int i = 0; i < kUnits; ++i) u.push_back({"unit" + std::to_string(i), 2 * i, 2});
  return u;
}

FsdpOptions options(bool prefetch, bool mxfp8) {
  FsdpOptions o;
  o.clip_max_norm = 1.0f;
  o.groups["decay"] = AdamGroup{0.1, 1.0};
  o.lr_schedule = LrSchedule::constant(1e-4f);
  o.prefetch = prefetch;
  if (mxfp8) o.param_format = ParamFormat::Mxfp8;
  return o;
}

namespace {

void host_smoke(const Communicator& comm, bool mxfp8) {
  HostStream hs;
  const auto specs = model_specs(32, 64);
  Fsdp f(comm, specs, model_units(), options(true, mxfp8));
  if (mxfp8) {
    f.init_from_master(hs.handle());
  } else {
    f.init_master(hs.handle());
  }
  StepGraph g(f, [&](Stream st, bool) {
    for (int u = 0; u < kUnits; ++u) (void)f.wait_param(u, FsdpPass::Forward, st);
    for (int u = kUnits - 1; u >= 0; --u) {
      (void)f.wait_param(u, FsdpPass::Backward, st);
      (void)f.grad_slot(u, st);
      f.grad_ready(u, st);
    }
  });
  g.capture(hs.handle());
  for (int i = 0; i < 3; ++i) g.replay(hs.handle());
  if (comm.rank() == 0)
    std::printf("fsdp host smoke (%s): %d units, step count %lld, %lld bytes gathered\n", mxfp8 ? "mxfp8" : "bf16",
                f.num_units(), static_cast<long long>(f.read_scalars(hs.handle()).step),
                static_cast<long long>(f.gather_stats().forward_bytes + f.gather_stats().backward_bytes));
}

}  // namespace
}  // namespace shardopt::bench_fsdp

int main(int argc, char** argv) {
  using namespace shardopt;
  using namespace shardopt::bench_fsdp;
  return bench::mpi_main(argc, argv, "bench_fsdp", {}, [&] {
    const Args a = parse(argc, argv);
    bench::MpiBench mb(default_backend());
    const Communicator& comm = mb.comm();
    if (mb.backend() == Backend::Host) {
      host_smoke(comm, a.mxfp8);
      return 0;
    }
    run_device(a, mb, bench::command_line(argc, argv));
    return 0;
  });
}
