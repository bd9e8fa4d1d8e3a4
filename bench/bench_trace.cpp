// bench_trace: what the NVTX ranges (src/core/trace.hpp) cost the host when no tool is
// attached. One process, one rank (Communicator::self): host time to enqueue one eager
// iteration (step + zero_grad) and one StepGraph::replay of the captured iteration, for
// 1, 100 and 1000 bf16 tensors (16M elements in all; 1M on the host backend), median and p90 over --iters samples
// (the stream is synchronized between samples, outside the timed call).
//
//   bench_trace [--backend cuda|host] [--iters N] [--results DIR]
//
// The row's config names whether this build has the ranges ("nvtx=on": -Dnvtx=enabled or
// auto with CUDA; "nvtx=off": -Dnvtx=disabled), so the two builds' rows sit side by side
// in bench/results/trace_cost.jsonl (docs/profiling.md gives the commands). A replay runs
// no range of the captured work (those were recorded at capture): its one range is
// "shardopt/replay" itself.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "core/streams.hpp"
#include "cuda_bench.hpp"
#include "results.hpp"
#include "shardopt/backend.hpp"
#include "shardopt/distributed_adam.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/step_graph.hpp"
#include "shardopt_trace_config.h"

namespace {
using namespace shardopt;
using Clock = std::chrono::steady_clock;

struct Times {
  double median = 0, p90 = 0;
};

template <class Fn>
Times host_us(Backend be, Stream s, int iters, Fn&& call) {
  std::vector<double> t;
  for (int it = 0; it < iters; ++it) {
    synchronize(be, s);
    const auto t0 = Clock::now();
    call();
    const auto t1 = Clock::now();
    t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  synchronize(be, s);
  Times r;
  r.median = bench::median(t);
  std::sort(t.begin(), t.end());
  r.p90 = t[static_cast<std::size_t>(0.9 * static_cast<double>(t.size() - 1))];
  return r;
}

int usage(const char* why) {
  std::fprintf(stderr, "bench_trace: %s\nusage: bench_trace [--backend cuda|host] [--iters N] [--results DIR]\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Backend be = cuda_device_count() > 0 ? Backend::Cuda : Backend::Host;
  int iters = 2000;
  std::string results;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--backend" && i + 1 < argc) {
      const std::string v = argv[++i];
      if (v != "cuda" && v != "host") return usage("--backend takes cuda or host");
      be = v == "cuda" ? Backend::Cuda : Backend::Host;
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
      if (iters < 1) return usage("--iters takes a positive count");
    } else if (a == "--results" && i + 1 < argc) {
      results = argv[++i];
    } else {
      return usage(("unknown argument '" + a + "'").c_str());
    }
  }
  std::string device = "host";
  Stream s = nullptr;
  HostStream host_stream;
  std::optional<SideStream> cuda_stream;
  if (be == Backend::Cuda) {
    if (!cuda_compiled()) return usage("this build has no CUDA backend");
    device = bench::device_name();
    try {
      cuda_stream.emplace(be);
    } catch (const Error&) {
      return usage("cannot create a stream");
    }
    s = cuda_stream->get();
  }
  if (be == Backend::Host) s = host_stream.handle();
  // The host backend runs the step's arithmetic in the timed call: a smoke size there.
  const std::int64_t total = be == Backend::Cuda ? std::int64_t{16} << 20 : std::int64_t{1} << 20;
  for (int k : {1, 100, 1000}) {
    std::vector<ParamSpec> specs;
    for (int i = 0; i < k; ++i) {
      std::string name = "t";  // appended in place: GCC 12's -Wrestrict misfires on "t" + to_string(i)
      name += std::to_string(i);
      specs.push_back(ParamSpec::tensor(name, {total / k}, DType::bf16));
    }
    DistributedAdamOptions o;
    o.persistent_grad_copies = true;
    DistributedAdam opt(Communicator::self(be), specs, o);
    opt.init_master(s);
    auto iteration = [&] {
      opt.step(s);
      opt.zero_grad(s);
    };
    iteration();  // warm-up: lazy loads, first registrations
    const Times eager = host_us(be, s, iters, iteration);
    StepGraph g(opt, [](Stream, bool) {}, StepGraphOptions{1, true});
    g.capture(s);
    g.replay(s);
    const Times replay = host_us(be, s, iters, [&] { g.replay(s); });
    bench::Result r;
    r.bench = "trace_cost";
    r.config = "tensors=" + std::to_string(k) + (be == Backend::Cuda ? "/16M/" : "/1M/") + (SHARDOPT_HAVE_NVTX ? "nvtx=on" : "nvtx=off") +
               (be == Backend::Host ? "/host-backend" : "");
    r.device = device;
    r.numbers["eager_host_us"] = eager.median;
    r.numbers["eager_host_us_p90"] = eager.p90;
    r.numbers["replay_host_us"] = replay.median;
    r.numbers["replay_host_us_p90"] = replay.p90;
    r.numbers["samples"] = iters;
    r.numbers["buckets"] = static_cast<double>(opt.layout().buckets().size());
    r.notes["what"] =
        "host time to enqueue one eager iteration (step + zero_grad) and one StepGraph::replay, no profiler "
        "attached; compare the nvtx=on and nvtx=off rows of one device";
    r.command = bench::command_line(argc, argv);
    bench::write(r, results);
  }
  return 0;
}
