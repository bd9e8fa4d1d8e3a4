// bench_trainer - tokens/s and iteration time of the example trainer (examples/trainer),
// graph off vs on, with the optimizer step's share of the iteration. One rank per GPU:
//
//   mpirun -n 4 build/examples/trainer/bench_trainer --results bench/results
//
// Configurations "<size>/<mode>/graph-off/n<ranks>" and ".../graph-on/n<ranks>" (with
// --params mxfp8 the mode reads "dist-adam-mxfp8": MXFP8 weights, decoded to bf16 once per
// step for the GEMMs; with --params nvfp4 "dist-adam-nvfp4": NVFP4 weights, likewise;
// --graphs on measures only the graph-on row):
//   ours_ms           median iteration (all microbatches, step, zero_grad), slowest rank;
//                     graph-on: the whole iteration replayed as one graph
//   step_ms           median optimizer step alone (step + zero_grad): eager for graph-off,
//                     the captured step graph (StepGraph::replay_step of a split capture)
//                     for graph-on. Alone it cannot overlap its reduce-scatters with a
//                     backward, so step_ms / ours_ms bounds the step's share from above.
//   tokens_per_s      tokens of an iteration over all ranks / ours_ms
// There is no peer (null) and no physical limit (null): the graph-on/graph-off ratio is
// the figure of merit (speedup_vs_graph_off). CUDA events on the trainer's stream; the
// host clock on the host backend (smoke runs).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <shardopt/mpi.hpp>

#include "mpi_bench.hpp"
#include "results.hpp"
#include "trainer.hpp"

namespace {

struct Args {
  std::string results;
  std::string size = "1b";
  std::string mode = "dist-adam";
  std::string backend = "auto";
  std::string params = "bf16";
  std::string graphs = "both";  // both | on | off
  int microbatches = 4;
  int warmup = 3;
  int iters = 20;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
      return argv[++i];
    };
    if (k == "--results") a.results = val();
    else if (k == "--size") a.size = val();
    else if (k == "--mode") a.mode = val();
    else if (k == "--backend") a.backend = val();
    else if (k == "--params") a.params = val();
    else if (k == "--graphs") a.graphs = val();
    else if (k == "--microbatches") a.microbatches = std::atoi(val().c_str());
    else if (k == "--warmup") a.warmup = std::atoi(val().c_str());
    else if (k == "--iters") a.iters = std::atoi(val().c_str());
    else throw std::invalid_argument("unknown option " + k);
  }
  if (a.graphs != "both" && a.graphs != "on" && a.graphs != "off")
    throw std::invalid_argument("--graphs takes both, on or off");
  return a;
}

/// The largest value over the ranks (the slowest rank sets the pace).
double max_over_ranks(const shardopt::Communicator& comm, double v) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  double worst = v;
  for (std::uint64_t b : comm.all_gather_value(bits)) {
    double x = 0;
    std::memcpy(&x, &b, sizeof x);
    worst = std::max(worst, x);
  }
  return worst;
}

struct Timing {
  double iteration_ms = 0;
  double step_ms = 0;
  trainer::MemoryUse memory;
  double loss = 0;
};

Timing measure(const Args& a, bool graph, bool one_graph, const shardopt::Communicator& comm) {
  trainer::TrainOptions o = trainer::parse_options(
      {"--size", a.size, "--mode", a.mode, "--backend", a.backend, "--params", a.params});
  o.microbatches = a.microbatches;
  o.steps = a.warmup + 2 * a.iters + 1;
  o.graph = graph;
  o.quiet = true;
  trainer::TrainerTestHooks h;
  h.one_graph = one_graph;
  trainer::Trainer t(o, comm, h);
  for (int i = 0; i < a.warmup; ++i) t.step();  // graph on: the first one captures
  t.synchronize();
  std::vector<double> it, st;
  for (int i = 0; i < a.iters; ++i) it.push_back(t.ops().time_ms([&] { t.step(); }));
  Timing r;
  r.loss = t.stats().loss;
  if (a.mode == "dist-adam" && (!graph || !one_graph))
    for (int i = 0; i < a.iters; ++i) st.push_back(t.ops().time_ms([&] { t.optimizer_step_only(); }));
  r.iteration_ms = max_over_ranks(comm, shardopt::bench::median(it));
  r.step_ms = st.empty() ? 0.0 : max_over_ranks(comm, shardopt::bench::median(st));
  r.memory = t.memory();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  shardopt::bench::MpiMainOptions main_options;
  main_options.serialized = true;
  main_options.abort_on_error = true;
  return shardopt::bench::mpi_main(argc, argv, "bench_trainer", main_options, [&] {
    const Args a = parse(argc, argv);
    trainer::TrainOptions probe = trainer::parse_options({"--size", a.size, "--backend", a.backend});
    shardopt::MpiBootstrapOptions mo;
    mo.backend = trainer::choose_backend(probe);
    shardopt::Communicator comm = shardopt::communicator_from_mpi(MPI_COMM_WORLD, mo);
    const bool root = comm.rank() == 0;
    const std::string n = "n" + std::to_string(comm.size());
    const std::int64_t tokens = probe.model.tokens * a.microbatches * comm.size();

    const bool want_off = a.graphs != "on", want_on = a.graphs != "off";
    const Timing off = want_off ? measure(a, false, true, comm) : Timing{};
    const Timing on = want_on ? measure(a, true, true, comm) : Timing{};
    Timing split;
    if (want_on && a.mode == "dist-adam") split = measure(a, true, false, comm);
    const std::string mode_name = a.mode + (a.params == "bf16" ? "" : "-" + a.params);
    std::string device;
    {
      auto ops = mo.backend == shardopt::Backend::Cuda ? trainer::make_cuda_ops()
                                                         : trainer::make_host_ops(trainer::Precision::Mixed);
      device = ops->device_name();
    }
    if (root) {
      for (const bool graph : {false, true}) {
        if (graph ? !want_on : !want_off) continue;
        const Timing& t = graph ? on : off;
        shardopt::bench::Result r;
        r.bench = "trainer";
        r.config = a.size + "/" + mode_name + "/" + (graph ? "graph-on" : "graph-off") + "/" + n;
        r.device = device;
        r.ours_ms = t.iteration_ms;
        r.command = shardopt::bench::command_line(argc, argv);
        r.numbers["tokens_per_s"] = static_cast<double>(tokens) * 1000.0 / t.iteration_ms;
        r.numbers["tokens_per_iteration"] = static_cast<double>(tokens);
        r.numbers["microbatches"] = a.microbatches;
        r.numbers["params"] = static_cast<double>(probe.model.param_count());
        const double step_ms = graph ? split.step_ms : t.step_ms;
        if (step_ms > 0) {
          r.numbers["step_ms"] = step_ms;
          r.numbers["step_share"] = step_ms / t.iteration_ms;
        }
        if (graph) {
          if (want_off) r.numbers["speedup_vs_graph_off"] = off.iteration_ms / on.iteration_ms;
          if (split.iteration_ms > 0) r.numbers["split_graph_iteration_ms"] = split.iteration_ms;
        }
        r.numbers["device_bytes_per_rank"] = static_cast<double>(t.memory.device);
        r.numbers["optimizer_bytes_per_rank"] = static_cast<double>(t.memory.optimizer);
        r.numbers["activation_bytes_per_rank"] = static_cast<double>(t.memory.activations);
        r.numbers["final_loss"] = t.loss;
        r.notes["param_format"] =
            a.params == "mxfp8"   ? "MXFP8 (E4M3, 32-element blocks) decoded to bf16 once per step for the GEMMs"
            : a.params == "nvfp4" ? "NVFP4 (E2M1, 16 x 16 E4M3 block scales) decoded to bf16 once per step"
                                  : "bf16";
        r.notes["step_ms_meaning"] = graph ? "replay_step of a split capture (step + zero_grad alone)"
                                           : "eager step + zero_grad alone";
        shardopt::bench::write(r, a.results);
      }
    }
    return 0;
  });
}
