// per_call.hpp - the time of one call of a per-tensor entry point as a caller's step sees
// it (the single-tensor rows of bench_mxfp8 and bench_nvfp4).
//
// One call, synchronised after each (the old single-tensor rows), times the host's launch
// work on an idle GPU as much as the kernel: the first event is stamped at once, the
// kernel only once the host has enqueued it. A step never waits for one quantize: its
// calls follow other work on the stream. So the rows time n calls back to back (each on a
// different tensor of the same shape, so that a call does not find its bytes in L2 from
// the call before) and divide by n. The quantize kernels are programmatic dependent
// launches by default (kernels/common/dependent_launch.cuh); time_per_call_without_pdl
// times the same calls with them off, for the "/no-pdl" rows.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cuda_bench.hpp"
#include "kernels/common/dependent_launch.hpp"
#include "shardopt/param_spec.hpp"

namespace shardopt::bench {

/// The indices in `specs` of the tensor `name` and, for a name of layer 0 (layers.0.*),
/// of the same tensor of every layer, in order.
inline std::vector<std::size_t> same_role(const std::vector<ParamSpec>& specs, const std::string& name) {
  std::vector<std::size_t> out;
  const std::string first = "layers.0.";
  const bool per_layer = name.rfind(first, 0) == 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const std::string& n = specs[i].name;
    const std::size_t dot = n.rfind("layers.", 0) == 0 ? n.find('.', 7) : std::string::npos;
    if (n == name || (per_layer && dot != std::string::npos && n.substr(dot) == name.substr(first.size() - 1)))
      out.push_back(i);
  }
  return out;
}

/// Milliseconds per call of the n calls call(0), ..., call(n - 1).
struct PerCall {
  double graph_ms = 0;   ///< one captured graph of the n calls, replayed, / n (a captured step)
  double burst_ms = 0;   ///< the n calls enqueued eagerly back to back, / n (an eager step)
  double single_ms = 0;  ///< call(0) alone, synchronised after each (launch latency included)
};

/// Times the three ways (medians of the frame's runs; the graph is captured after an
/// eager warm-up outside any capture).
inline PerCall time_per_call(const BandwidthBench& frame, int n, const std::function<void(int)>& call) {
  const Stream st = frame.stream();
  PerCall out;
  out.single_ms = frame.time_ms([&] { call(0); });
  out.burst_ms = frame.time_ms([&] {
    for (int i = 0; i < n; ++i) call(i);
  }) / n;
  const CapturedGraph g(st, [&] {
    for (int i = 0; i < n; ++i) call(i);
  });
  out.graph_ms = frame.time_ms([&] { g.launch(st); }) / n;
  return out;
}

/// time_per_call with programmatic dependent launches off (DependentLaunchOff).
inline PerCall time_per_call_without_pdl(const BandwidthBench& frame, int n, const std::function<void(int)>& call) {
  const kernels::DependentLaunchScope off(false);
  return time_per_call(frame, n, call);
}

/// One graph of `work` captured with programmatic dependent launches off and timed like
/// the default one (frame.time_ms of a launch): the whole-model rows' no_pdl_ms.
inline double graph_ms_without_pdl(const BandwidthBench& frame, Stream stream, const std::function<void()>& work) {
  const kernels::DependentLaunchScope off(false);
  const CapturedGraph graph(stream, work);
  return frame.time_ms([&] { graph.launch(stream); });
}

/// The numbers a single-tensor row carries besides ours_ms (t.graph_ms): calls, launches
/// per call, t's eager times and the floor's three (`idle`: the same calls with the skip flag set).
inline void add_per_call_numbers(std::map<std::string, double>& numbers, int calls, int launches, const PerCall& t,
                                 const PerCall& idle) {
  numbers["calls"] = calls;
  numbers["launches_per_call"] = launches;
  numbers["burst_ms"] = t.burst_ms;
  numbers["eager_single_ms"] = t.single_ms;
  numbers["floor_graph_ms"] = idle.graph_ms;
  numbers["floor_burst_ms"] = idle.burst_ms;
  numbers["floor_single_ms"] = idle.single_ms;
}

}  // namespace shardopt::bench
