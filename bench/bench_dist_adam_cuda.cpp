// bench_dist_adam_cuda.cpp - bench_dist_adam's device half (bench_dist_adam.hpp): every
// CUDA measurement of the program; the header comment of bench_dist_adam.cpp says what
// each row is. Compiled only in a CUDA build.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench_dist_adam.hpp"
#include "core/check.hpp"
#include "core/memory.hpp"
#include "core/streams.hpp"
#include "cuda_bench.hpp"
#include "mpi_bench.hpp"
#include "quantized/nvfp4_params.hpp"
#include "quantized/phase_probe.hpp"
#include "results.hpp"
#include "shardopt/distributed_adam.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/presets.hpp"
#include "shardopt/step_graph.hpp"

namespace shardopt::bench_dist_adam {
namespace {
using Clock = std::chrono::steady_clock;

void fill_model(DistributedAdam& opt, Stream s) {
  if (opt.options().param_format != ParamFormat::Native) {  // no param views: seed the master
    for (int i = 0; i < opt.num_params(); ++i) {
      const ShardView m = opt.shard_master(i);
      const GradView g = opt.grad(i);
      if (m.numel() > 0) bench::fill_random(m.data, DType::f32, m.numel(), 100 + static_cast<std::uint64_t>(i), 0.05f, s);
      bench::fill_random(g.data, g.dtype, g.numel(), 7000 + static_cast<std::uint64_t>(i), 1e-3f, s);
    }
    opt.init_from_master(s);
    // init_from_master zeroed the quantized gradient regions it staged through: refill.
    for (int i = 0; i < opt.num_params(); ++i) {
      const GradView g = opt.grad(i);
      bench::fill_random(g.data, g.dtype, g.numel(), 7000 + static_cast<std::uint64_t>(i), 1e-3f, s);
    }
    return;
  }
  for (int i = 0; i < opt.num_params(); ++i) {
    const ParamView p = opt.param(i);
    const GradView g = opt.grad(i);
    bench::fill_random(p.data, p.dtype, p.numel(), 100 + static_cast<std::uint64_t>(i), 0.05f, s);
    bench::fill_random(g.data, g.dtype, g.numel(), 7000 + static_cast<std::uint64_t>(i), 1e-3f, s);
  }
  opt.init_master(s);
}

// Base of layout buffer 0 of a view kind: the view of the param placed at offset 0.
template <class View>
void* buffer_base(const DistributedAdam& opt, View (DistributedAdam::*get)(int) const) {
  const auto& L = opt.layout();
  for (int p : L.buffers()[0].params)
    if (L.params()[static_cast<std::size_t>(p)].offset == 0) return (opt.*get)(p).data;
  return nullptr;
}

// Host microseconds of `iters` calls of `launch`, each followed (untimed) by a
// synchronize of `s`, so that every call finds the device idle: the median and the 90th
// percentile (host timings are noisy: other processes, frequency changes).
struct HostTimes {
  double median = 0, p90 = 0;
};
template <class Fn>
HostTimes host_us(Stream s, int iters, Fn&& launch) {
  std::vector<double> t;
  for (int it = 0; it < iters; ++it) {
    const auto t0 = Clock::now();
    launch();
    const auto t1 = Clock::now();
    SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s)));
    t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  HostTimes h;
  h.median = bench::median(t);
  std::sort(t.begin(), t.end());
  h.p90 = t[static_cast<std::size_t>(0.9 * static_cast<double>(t.size() - 1))];
  return h;
}

// Node count of a captured graph by kind, into r.numbers["nodes_<kind>"].
void add_node_counts(bench::Result& r, cudaGraph_t graph) {
  std::size_t n = 0;
  SHARDOPT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  SHARDOPT_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  std::map<std::string, double> count;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t{};
    SHARDOPT_CUDA_CHECK(cudaGraphNodeGetType(node, &t));
    switch (t) {
      case cudaGraphNodeTypeKernel: count["kernel"] += 1; break;
      case cudaGraphNodeTypeMemcpy: count["memcpy"] += 1; break;
      case cudaGraphNodeTypeMemset: count["memset"] += 1; break;
      case cudaGraphNodeTypeHost: count["host"] += 1; break;
      case cudaGraphNodeTypeEmpty: count["empty"] += 1; break;
      case cudaGraphNodeTypeWaitEvent: count["event_wait"] += 1; break;
      case cudaGraphNodeTypeEventRecord: count["event_record"] += 1; break;
      default: count["other"] += 1; break;
    }
  }
  r.numbers["nodes_total"] = static_cast<double>(n);
  for (const auto& [kind, c] : count) r.numbers["nodes_" + kind] = c;
}

void host_cpu_sweep(const Communicator& comm, Stream s, const Args& a, const std::string& device,
                    const std::string& cmd) {
  // Floors measured in the same process: a graph of one 4-byte all-reduce (what any
  // graph launch with NCCL in it costs here) and a graph of 16 4-byte memsets.
  DeviceBuffer one(Backend::Cuda, 4);
  SHARDOPT_CUDA_CHECK(cudaMemsetAsync(one.data(), 0, 4, reinterpret_cast<cudaStream_t>(s)));
  comm.all_reduce(one.data(), 1, DType::f32, ReduceOp::Sum, s);
  bench::CapturedGraph nccl_one(s, [&] { comm.all_reduce(one.data(), 1, DType::f32, ReduceOp::Sum, s); });
  nccl_one.launch(s);
  const int host_iters = std::max(a.iters, 300);  // host timings are cheap and noisy
  const double nccl_floor = host_us(s, host_iters, [&] { nccl_one.launch(s); }).median;
  bench::CapturedGraph empties(s, [&] {
    for (int i = 0; i < 16; ++i) SHARDOPT_CUDA_CHECK(cudaMemsetAsync(one.data(), 0, 4, reinterpret_cast<cudaStream_t>(s)));
  });
  empties.launch(s);
  const double memset_floor = host_us(s, host_iters, [&] { empties.launch(s); }).median;
  const char* mixing = std::getenv("NCCL_GRAPH_MIXING_SUPPORT");
  const bool mixing_off = mixing != nullptr && std::string(mixing) == "0";
  const std::int64_t total = 64LL << 20;
  for (int k : {1, 10, 100, 1000}) {
    for (int pipeline : {4, 1}) {
      std::vector<ParamSpec> specs;
      for (int i = 0; i < k; ++i)
        specs.push_back(ParamSpec::tensor("t" + std::to_string(i), {total / k}, DType::bf16, "decay"));
      DistributedAdamOptions o = step_options();
      o.groups.erase("no_decay");  // these tensors are all in "decay"
      o.gather_pipeline = pipeline;
      DistributedAdam opt(comm, specs, o);
      fill_model(opt, s);
      opt.step(s);  // warm-up: lazy module loads, NCCL connections of every collective
      SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s)));
      const HostTimes eager = host_us(s, host_iters, [&] { opt.step(s); });
      bench::CapturedGraph g(s, [&] { opt.step(s); });
      g.launch(s);
      SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s)));
      const HostTimes replay = host_us(s, host_iters, [&] { g.launch(s); });
      // The same iteration through StepGraph::replay (one graph: reduce, step, zero_grad),
      // with the step watchdog on (the default step_timeout) and off, in this process.
      StepGraph sg(opt, [](Stream, bool) {}, StepGraphOptions{1, true});
      sg.capture(s);
      sg.replay(s);
      SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s)));
      // On and off alternate sample by sample (the switch is outside the timed call), so
      // that a drift of the machine's speed falls on both sides alike.
      const WatchdogOptions watchdog_on = comm.watchdog();
      WatchdogOptions off = watchdog_on;
      off.step_timeout = std::chrono::milliseconds(0);
      std::vector<double> on_us, off_us;
      for (int it = 0; it < 2 * host_iters; ++it) {
        const bool watch = it % 2 == 0;
        comm.set_watchdog(watch ? watchdog_on : off);
        (watch ? on_us : off_us).push_back(host_us(s, 1, [&] { sg.replay(s); }).median);
      }
      comm.set_watchdog(watchdog_on);
      const HostTimes watched{bench::median(on_us), 0.0}, unwatched{bench::median(off_us), 0.0};
      if (comm.rank() == 0) {
        bench::Result r;
        r.bench = "dist_adam_host_cpu";
        r.config = "tensors=" + std::to_string(k) + "/64M/n" + std::to_string(comm.size());
        if (pipeline == 1) r.config += "/pipeline1";
        if (mixing_off) r.config += "/nccl-mixing0";
        r.device = device;
        r.numbers["eager_host_us"] = eager.median;
        r.numbers["replay_host_us"] = replay.median;
        r.numbers["eager_host_us_p90"] = eager.p90;
        r.numbers["replay_host_us_p90"] = replay.p90;
        r.numbers["stepgraph_replay_host_us_watchdog_on"] = watched.median;
        r.numbers["stepgraph_replay_host_us_watchdog_off"] = unwatched.median;
        r.numbers["watchdog_step_timeout_ms"] = static_cast<double>(watchdog_on.step_timeout.count());
        r.numbers["host_samples"] = host_iters;
        r.notes["NCCL_GRAPH_MIXING_SUPPORT"] = mixing != nullptr ? mixing : "unset (NCCL default 1)";
        r.numbers["buckets"] = static_cast<double>(opt.layout().buckets().size());
        r.numbers["gather_pipeline"] = pipeline;
        r.numbers["floor_one_allreduce_graph_us"] = nccl_floor;
        r.numbers["floor_16_memset_graph_us"] = memset_floor;
        add_node_counts(r, static_cast<cudaGraph_t>(g.graph()));
        r.notes["what"] =
            "host CPU time to enqueue one step: eager step() vs cudaGraphLaunch of the captured step; "
            "StepGraph::replay of the whole iteration (one graph) with the step watchdog on and off";
        r.command = cmd;
        bench::write(r, a.results);
      }
    }
  }
}

// Median time of the captured step of an optimizer with the given options; `memory`
// receives the optimizer's MemoryReport.
double step_ms(const Communicator& comm, Stream s, const Args& a, const DistributedAdamOptions& o,
               MemoryReport* memory = nullptr) {
  DistributedAdam opt(comm, presets::transformer(presets::kLlama32_1B, DType::bf16), o);
  fill_model(opt, s);
  opt.step(s);
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s)));
  bench::CapturedGraph g(s, [&] { opt.step(s); });
  if (memory != nullptr) *memory = opt.memory();
  return bench::time_ms(s, 3, a.iters, [&] { g.launch(s); });
}

// Median time of one whole iteration of an optimizer with the given options, replayed
// through StepGraph as one graph: the reduce-scatters, the step and zero_grad (no
// backward: the gradients are what the last replay left). A bf16 trainer must zero its
// gradients every iteration, and so must an MXFP8 one (its step gathers into the storage
// and leaves the gradients alone); NVFP4's landing already zeroed its gradient regions,
// and the zero_grad behind the step skips them (issue 29).
double iteration_ms(const Communicator& comm, Stream s, const Args& a, const DistributedAdamOptions& o) {
  DistributedAdam opt(comm, presets::transformer(presets::kLlama32_1B, DType::bf16), o);
  fill_model(opt, s);
  StepGraphOptions go;
  go.one_graph = true;
  StepGraph g(opt, [](Stream, bool) {}, go);
  g.capture(s);
  g.replay(s);
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s)));
  return bench::time_ms(s, 3, a.iters, [&] { g.replay(s); });
}

// Bytes one rank receives from the parameter all-gathers of a step (the gathered
// buffers: what NCCL's all-gather writes), and bytes of the quantized formats' exchange
// all-reduce (MXFP8: e8m0 scales; NVFP4: u32 block and tensor amaxes).
struct StepTraffic {
  double gathered = 0;
  double scales = 0;
};
StepTraffic traffic(const Layout& L, ParamFormat format) {
  StepTraffic t;
  std::vector<bool> quantized(L.buffers().size(), false);
  for (std::size_t b = 0; b < quantized.size(); ++b)
    quantized[b] = format != ParamFormat::Native && L.buffers()[b].dtype == DType::bf16;
  const std::vector<std::int64_t> nv = detail::nvfp4_staged_rank_bytes(L, quantized);
  for (std::size_t b = 0; b < L.buffers().size(); ++b) {
    const BufferLayout& buf = L.buffers()[b];
    if (!quantized[b]) {
      t.gathered += static_cast<double>(buf.numel) * static_cast<double>(size_of(buf.dtype));
      continue;
    }
    if (format == ParamFormat::Mxfp8) t.gathered += static_cast<double>(buf.numel) * 2.0;
    for (int k : buf.buckets)
      if (format == ParamFormat::Nvfp4) t.gathered += static_cast<double>(nv[static_cast<std::size_t>(k)] * L.world_size());
    for (int p : buf.params) {
      const ParamSpec& spec = L.specs()[static_cast<std::size_t>(p)];
      if (format == ParamFormat::Mxfp8) {
        const Mxfp8Shape sh = Mxfp8Shape::of(spec);
        t.scales += static_cast<double>(sh.scale_row_numel() + sh.scale_col_numel());
      } else {
        const Nvfp4Shape sh = Nvfp4Shape::of(spec.member_shapes.empty() ? spec.shape : spec.member_shapes.front());
        t.scales += 4.0 * static_cast<double>(spec.members() * sh.amax_numel());
      }
    }
  }
  return t;
}

void add_memory(bench::Result& r, const MemoryReport& m) {
  r.numbers["mem_params_bytes"] = static_cast<double>(m.params);
  r.numbers["mem_mxfp8_bytes"] = static_cast<double>(m.mxfp8);
  r.numbers["mem_nvfp4_bytes"] = static_cast<double>(m.nvfp4);
  r.numbers["mem_grads_bytes"] = static_cast<double>(m.grads);
  r.numbers["mem_master_bytes"] = static_cast<double>(m.master);
  r.numbers["mem_moments_bytes"] = static_cast<double>(m.moments);
  r.numbers["mem_remainders_bytes"] = static_cast<double>(m.remainders);
  r.numbers["mem_moment_scales_bytes"] = static_cast<double>(m.moment_scales);
  r.numbers["mem_total_bytes"] = static_cast<double>(m.total());
}

void full_step(const Communicator& comm, Stream s, const Args& a, const std::string& device, const std::string& cmd) {
  DistributedAdamOptions unpipelined = step_options();
  unpipelined.gather_pipeline = 1;
  const double plain = step_ms(comm, s, a, unpipelined);
  MemoryReport bf16_memory, mx_memory;
  const double ours = step_ms(comm, s, a, step_options(), &bf16_memory);
  DistributedAdamOptions mx_options = step_options();
  mx_options.param_dtype.reset();  // MXFP8: the 1-D params are f32
  mx_options.param_format = ParamFormat::Mxfp8;
  const double mx_ms = step_ms(comm, s, a, mx_options, &mx_memory);
  DistributedAdamOptions nv_options = mx_options;
  nv_options.param_format = ParamFormat::Nvfp4;
  MemoryReport nv_memory;
  const double nv_ms = step_ms(comm, s, a, nv_options, &nv_memory);
  const double bf16_it = iteration_ms(comm, s, a, step_options());
  const double mx_it = iteration_ms(comm, s, a, mx_options);
  const double nv_it = iteration_ms(comm, s, a, nv_options);
  const auto specs = presets::transformer(presets::kLlama32_1B, DType::bf16);
  DistributedAdam opt(comm, specs, step_options());
  fill_model(opt, s);

  // The limit: one reduce-scatter + one all-gather of the same bytes + Adam on the shard.
  const Layout& L = opt.layout();
  const std::int64_t n = L.buffers()[0].numel, shard = L.buffers()[0].shard_numel;
  void* grads = buffer_base<GradView>(opt, &DistributedAdam::grad);
  void* params = buffer_base<ParamView>(opt, &DistributedAdam::param);
  const double rs = bench::time_ms(s, 3, a.iters, [&] { comm.reduce_scatter(grads, n / comm.size(), DType::bf16, ReduceOp::Average, s); });
  const double ag = bench::time_ms(s, 3, a.iters, [&] { comm.all_gather(params, n / comm.size(), DType::bf16, s); });
  // NVFP4's limit gathers a quarter of the bf16 bytes (half a byte per element).
  const double ag_quarter =
      bench::time_ms(s, 3, a.iters, [&] { comm.all_gather(params, n / comm.size() / 4, DType::bf16, s); });
  const auto chunks = shard_chunks(L, 0, comm.rank());
  DeviceBuffer chunks_dev(Backend::Cuda, chunks.size() * sizeof(ShardChunk));
  SHARDOPT_CUDA_CHECK(cudaMemcpy(chunks_dev.data(), chunks.data(), chunks_dev.bytes(), cudaMemcpyHostToDevice));
  DeviceBuffer master(Backend::Cuda, static_cast<std::size_t>(shard) * 4), m(Backend::Cuda, static_cast<std::size_t>(shard) * 4),
      v(Backend::Cuda, static_cast<std::size_t>(shard) * 4), scal(Backend::Cuda, sizeof(StepScalars));
  bench::fill_random(master.data(), DType::f32, shard, 3, 0.05f, s);
  SHARDOPT_CUDA_CHECK(cudaMemsetAsync(m.data(), 0, m.bytes(), reinterpret_cast<cudaStream_t>(s)));
  SHARDOPT_CUDA_CHECK(cudaMemsetAsync(v.data(), 0, v.bytes(), reinterpret_cast<cudaStream_t>(s)));
  StepScalars sc{};
  sc.lr = 1e-4f;
  SHARDOPT_CUDA_CHECK(cudaMemcpy(scal.data(), &sc, sizeof sc, cudaMemcpyHostToDevice));
  SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());  // pageable copies may return before their DMA lands
  ShardPointers ptrs;
  ptrs.chunks = chunks_dev.as<ShardChunk>();
  ptrs.num_chunks = static_cast<std::int64_t>(chunks.size());
  ptrs.shard_numel = shard;
  ptrs.grads = grads;
  ptrs.params = params;
  ptrs.master = master.as<float>();
  ptrs.exp_avg = m.data();
  ptrs.exp_avg_sq = v.data();
  AdamConfig cfg;
  cfg.grad_dtype = DType::bf16;
  cfg.param_dtype = DType::bf16;
  cfg.groups = {AdamGroup{0.1f, 1.0f}, AdamGroup{0.0f, 1.0f}};
  adam_step_prologue(cfg, scal.as<StepScalars>(), Backend::Cuda, s);
  const double adam = bench::time_ms(s, 3, a.iters, [&] { adam_step_apply(cfg, ptrs, scal.as<StepScalars>(), Backend::Cuda, s); });
  // The state precision modes (docs/state_precision.md): the step, and our Adam alone on
  // the shard in the same mode for the limit.
  struct StateMode {
    const char* name;
    MasterStorage master;
    DType moments;
    double step_ms = 0, adam_ms = 0;
    MemoryReport memory{};
  };
  std::vector<StateMode> modes = {{"bf16p-bf16g-remainder", MasterStorage::bf16_remainder, DType::f32, 0, 0, {}},
                                  {"bf16p-bf16g-bf16moments", MasterStorage::fp32, DType::bf16, 0, 0, {}},
                                  {"bf16p-bf16g-remainder-bf16moments", MasterStorage::bf16_remainder, DType::bf16, 0, 0, {}},
                                  {"bf16p-bf16g-q8moments", MasterStorage::fp32, DType::q8_block, 0, 0, {}},
                                  {"bf16p-bf16g-remainder-q8moments", MasterStorage::bf16_remainder, DType::q8_block, 0, 0, {}}};
  for (StateMode& md : modes) {
    DistributedAdamOptions mo = step_options();
    mo.master_storage = md.master;
    mo.moment_dtype = md.moments;
    md.step_ms = step_ms(comm, s, a, mo, &md.memory);
    const bool rem = md.master == MasterStorage::bf16_remainder;
    const bool q8 = md.moments == DType::q8_block;
    // 8-bit moments have a layout of their own (parameters start on moment blocks): the
    // Adam-alone limit runs on an optimizer of that layout, over its own shard and buffers.
    std::optional<DistributedAdam> qopt;
    if (q8) qopt.emplace(comm, specs, mo);
    const Layout& ml = q8 ? qopt->layout() : L;
    const std::int64_t mshard = ml.buffers()[0].shard_numel;
    std::vector<ShardChunk> mchunks;  // the 8-bit layout's table (the others use `chunks_dev`)
    DeviceBuffer mchunks_dev;
    if (q8) {
      mchunks = shard_chunks(ml, 0, comm.rank());
      mchunks_dev = DeviceBuffer(Backend::Cuda, mchunks.size() * sizeof(ShardChunk));
      SHARDOPT_CUDA_CHECK(cudaMemcpy(mchunks_dev.data(), mchunks.data(), mchunks_dev.bytes(), cudaMemcpyHostToDevice));
      SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
    }
    const std::size_t us = static_cast<std::size_t>(mshard);
    const std::size_t msize = q8 ? 1 : size_of(md.moments);
    DeviceBuffer mm(Backend::Cuda, us * msize), mv(Backend::Cuda, us * msize), rr(Backend::Cuda, rem ? us * 2 : 0),
        mmaster(Backend::Cuda, q8 && !rem ? us * 4 : 0),
        scales(Backend::Cuda, q8 ? 2 * us / static_cast<std::size_t>(kMomentBlock) * 4 : 0);
    SHARDOPT_CUDA_CHECK(cudaMemsetAsync(mm.data(), 0, mm.bytes(), reinterpret_cast<cudaStream_t>(s)));
    SHARDOPT_CUDA_CHECK(cudaMemsetAsync(mv.data(), 0, mv.bytes(), reinterpret_cast<cudaStream_t>(s)));
    if (rem) SHARDOPT_CUDA_CHECK(cudaMemsetAsync(rr.data(), 0, rr.bytes(), reinterpret_cast<cudaStream_t>(s)));
    if (q8) SHARDOPT_CUDA_CHECK(cudaMemsetAsync(scales.data(), 0, scales.bytes(), reinterpret_cast<cudaStream_t>(s)));
    if (q8 && !rem) bench::fill_random(mmaster.data(), DType::f32, mshard, 3, 0.05f, s);
    ShardPointers mp = ptrs;
    if (q8) {
      mp.chunks = mchunks_dev.as<ShardChunk>();
      mp.num_chunks = static_cast<std::int64_t>(mchunks.size());
      mp.shard_numel = mshard;
      mp.grads = buffer_base<GradView>(*qopt, &DistributedAdam::grad);
      mp.params = buffer_base<ParamView>(*qopt, &DistributedAdam::param);
      bench::fill_random(const_cast<void*>(mp.grads), DType::bf16, ml.buffers()[0].numel, 5, 1e-3f, s);
      mp.exp_avg_scales = scales.as<float>();
      mp.exp_avg_sq_scales = scales.as<float>() + us / static_cast<std::size_t>(kMomentBlock);
    }
    mp.master = rem ? nullptr : (q8 ? mmaster.as<float>() : master.as<float>());
    mp.remainders = rem ? rr.as<std::uint16_t>() : nullptr;
    mp.exp_avg = mm.data();
    mp.exp_avg_sq = mv.data();
    AdamConfig mc = cfg;
    mc.master_storage = md.master;
    mc.moment_dtype = md.moments;
    md.adam_ms = bench::time_ms(s, 3, a.iters, [&] { adam_step_apply(mc, mp, scal.as<StepScalars>(), Backend::Cuda, s); });
  }

  if (comm.rank() != 0) return;
  for (const StateMode& md : modes) {
    bench::Result q;
    q.bench = "dist_adam_step";
    q.config = std::string(md.name) + "/1.5B/147/n" + std::to_string(comm.size());
    q.device = device;
    q.ours_ms = md.step_ms;
    q.limit_ms = rs + ag + md.adam_ms;
    q.numbers["reduce_scatter_ms"] = rs;
    q.numbers["all_gather_ms"] = ag;
    q.numbers["adam_shard_ms"] = md.adam_ms;
    q.numbers["fp32_state_step_ms"] = ours;
    q.numbers["fp32_state_adam_shard_ms"] = adam;
    q.numbers["params"] = static_cast<double>(L.param_numel());
    add_memory(q, md.memory);
    q.notes["limit"] = "one NCCL reduce-scatter + one all-gather of the whole bf16 buffers + our Adam on the shard in "
                       "this state mode";
    q.command = cmd;
    bench::write(q, a.results);
  }
  const std::string config = "bf16p-bf16g/1.5B/147/n" + std::to_string(comm.size());
  bench::Result r;
  r.bench = "dist_adam_step";
  r.config = config;
  r.device = device;
  r.ours_ms = ours;
  r.limit_ms = rs + ag + adam;
  bench::apply_peer(r, a.peer);
  r.numbers["unpipelined_ms"] = plain;
  r.numbers["gather_pipeline"] = step_options().gather_pipeline;
  r.numbers["reduce_scatter_ms"] = rs;
  r.numbers["all_gather_ms"] = ag;
  r.numbers["adam_shard_ms"] = adam;
  r.numbers["params"] = static_cast<double>(L.param_numel());
  r.notes["limit"] = "one NCCL reduce-scatter + one all-gather of the whole bf16 buffers + our Adam on the shard";
  const StepTraffic bf16_traffic = traffic(L, ParamFormat::Native);
  r.numbers["all_gather_bytes_per_rank"] = bf16_traffic.gathered;
  r.numbers["all_reduce_scale_bytes_per_rank"] = 0;
  add_memory(r, bf16_memory);
  r.command = cmd;
  bench::write(r, a.results);

  // MXFP8 params, next to it. The peer line (if the peer file has this config) is read
  // the same way; the limit is the bf16 row's: the same bytes cross the links (2 per
  // element gathered: rowwise + columnwise e4m3), quantization and the scale all-reduce
  // excluded. Like the bf16 step, it leaves its gradients to zero_grad (not timed here).
  const std::string mx_config = "mxfp8p-bf16g/1.5B/147/n" + std::to_string(comm.size());
  bench::Result x;
  x.bench = "dist_adam_step";
  x.config = mx_config;
  x.device = device;
  x.ours_ms = mx_ms;
  x.limit_ms = rs + ag + adam;
  bench::apply_peer(x, a.peer);
  // The traffic of the MXFP8 layout (1-D params in an f32 buffer of their own).
  std::vector<ParamSpec> mx_specs = presets::transformer(presets::kLlama32_1B, DType::bf16);
  for (auto& sp : mx_specs) sp.dtype = sp.shape.size() >= 2 ? DType::bf16 : DType::f32;
  const StepTraffic mx_traffic = traffic(Layout(mx_specs, comm.size()), ParamFormat::Mxfp8);
  x.numbers["all_gather_bytes_per_rank"] = mx_traffic.gathered;
  x.numbers["all_reduce_scale_bytes_per_rank"] = mx_traffic.scales;
  x.numbers["bf16_params_ms"] = ours;
  x.numbers["params"] = static_cast<double>(L.param_numel());
  add_memory(x, mx_memory);
  x.notes["limit"] = "the bf16 row's limit (same gathered bytes); excludes quantization and the e8m0 scale all-reduce";
  x.notes["what"] = "captured step with MXFP8 params: Adam (master only), partial scales, e8m0 Max all-reduce, "
                    "shard quantize into the storage's gather planes, all-gather in place there (no landing, no "
                    "zeroing)";
  x.command = cmd;
  bench::write(x, a.results);

  // NVFP4 params: the limit is the bf16 row's with an all-gather of a quarter of the bytes
  // (half a byte per element); quantization and the u32 amax all-reduce excluded.
  bench::Result y;
  y.bench = "dist_adam_step";
  y.config = "nvfp4p-bf16g/1.5B/147/n" + std::to_string(comm.size());
  y.device = device;
  y.ours_ms = nv_ms;
  y.limit_ms = rs + ag_quarter + adam;
  bench::apply_peer(y, a.peer);
  const StepTraffic nv_traffic = traffic(Layout(mx_specs, comm.size()), ParamFormat::Nvfp4);
  y.numbers["all_gather_bytes_per_rank"] = nv_traffic.gathered;
  y.numbers["all_reduce_amax_bytes_per_rank"] = nv_traffic.scales;
  y.numbers["bf16_params_ms"] = ours;
  y.numbers["mxfp8_params_ms"] = mx_ms;
  y.numbers["quarter_all_gather_ms"] = ag_quarter;
  y.numbers["params"] = static_cast<double>(L.param_numel());
  add_memory(y, nv_memory);
  y.notes["limit"] = "reduce-scatter + all-gather of a quarter of the bf16 bytes + Adam; excludes quantization and "
                     "the u32 amax all-reduce";
  y.notes["what"] = "captured step with NVFP4 params: Adam (master only), partial u32 amaxes, Max all-reduce, shard "
                    "quantize into the grad buffer, all-gather there, landing copy (shared bytes ORed), zeroing";
  y.command = cmd;
  bench::write(y, a.results);

  // The fair comparison (issue 29): the whole iteration of each format, reduce-scatters +
  // step + zero_grad in one replayed graph, in this process. The step rows above leave
  // out the bf16 and MXFP8 trainers' zero_grad, which NVFP4's step does in its landing.
  const std::pair<const char*, double> iterations[] = {
      {"bf16p-bf16g", bf16_it}, {"mxfp8p-bf16g", mx_it}, {"nvfp4p-bf16g", nv_it}};
  const double step_of[] = {ours, mx_ms, nv_ms};
  for (std::size_t k = 0; k < 3; ++k) {
    bench::Result it;
    it.bench = "dist_adam_iteration";
    it.config = std::string(iterations[k].first) + "/1.5B/147/n" + std::to_string(comm.size());
    it.device = device;
    it.ours_ms = iterations[k].second;
    it.numbers["step_ms"] = step_of[k];
    it.numbers["bf16_iteration_ms"] = bf16_it;
    it.numbers["over_bf16_iteration"] = iterations[k].second / bf16_it;
    it.numbers["step_over_bf16_step"] = step_of[k] / ours;
    it.notes["what"] = "StepGraph::replay of one graph: reduce-scatters, step, zero_grad (NVFP4's zero_grad skips "
                       "the gradient regions its landing zeroed; bf16's and MXFP8's zero every gradient); no backward";
    it.command = cmd;
    bench::write(it, a.results);
  }
}

// CUDA events at the phase marks of the steps between start() and stop() (a pool made
// once; more marks than events is an error of this benchmark).
class PhaseRecorder {
 public:
  PhaseRecorder() : events_(8192) {
    for (auto& e : events_) SHARDOPT_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~PhaseRecorder() {
    detail::set_phase_probe(nullptr, nullptr);
    for (auto e : events_) cudaEventDestroy(e);
  }
  PhaseRecorder(const PhaseRecorder&) = delete;
  PhaseRecorder& operator=(const PhaseRecorder&) = delete;
  void start() {
    labels_.clear();
    detail::set_phase_probe(&PhaseRecorder::probe, this);
  }
  void mark(const char* label, Stream s) {
    SHARDOPT_REQUIRE(labels_.size() < events_.size(), ErrorCode::Internal,
                     "bench_dist_adam --phases: more phase marks than events; enlarge the pool");
    SHARDOPT_CUDA_CHECK(cudaEventRecord(events_[labels_.size()], reinterpret_cast<cudaStream_t>(s)));
    labels_.push_back(label);
  }
  // Stops recording; per label, ms from each of its marks to the next mark.
  std::map<std::string, double> stop() {
    detail::set_phase_probe(nullptr, nullptr);
    std::map<std::string, double> ms;
    if (labels_.empty()) return ms;
    SHARDOPT_CUDA_CHECK(cudaEventSynchronize(events_[labels_.size() - 1]));
    for (std::size_t i = 0; i + 1 < labels_.size(); ++i) {
      float t = 0;
      SHARDOPT_CUDA_CHECK(cudaEventElapsedTime(&t, events_[i], events_[i + 1]));
      ms[labels_[i]] += static_cast<double>(t);
    }
    return ms;
  }

 private:
  static void probe(const char* phase, Stream s, void* self) { static_cast<PhaseRecorder*>(self)->mark(phase, s); }
  std::vector<cudaEvent_t> events_;
  std::vector<std::string> labels_;
};

// The phase breakdown of one format's step: `iters` eager steps, each queued behind a
// 40 ms host wait (so that the device finds the whole step queued and runs it back to
// back, as it runs a replay), with the graph replay's median (`graph_ms`) beside it.
void phase_rows(const Communicator& comm, Stream s, const Args& a, const std::string& device, const std::string& cmd,
                const std::string& config, const DistributedAdamOptions& o, double graph_ms, double copy_gbps) {
  DistributedAdamOptions eager = o;
  eager.overlap_param_gather = false;  // the eager step lands and zeroes as the captured one does
  DistributedAdam opt(comm, presets::transformer(presets::kLlama32_1B, DType::bf16), eager);
  fill_model(opt, s);
  opt.step(s);
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s)));
  PhaseRecorder rec;
  std::map<std::string, std::vector<double>> samples;
  const int iters = std::max(5, std::min(a.iters, 15));
  for (int it = 0; it < iters; ++it) {
    SHARDOPT_CUDA_CHECK(cudaLaunchHostFunc(
        reinterpret_cast<cudaStream_t>(s), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(40)); },
        nullptr));
    rec.start();
    rec.mark("reduce grads", s);  // the step's reduce_grads (and the wait for last step's gathers)
    opt.step(s);
    rec.mark("end", s);
    double total = 0;
    for (const auto& [label, ms] : rec.stop()) {
      samples[label].push_back(ms);
      total += ms;
    }
    samples["total"].push_back(total);
  }
  if (comm.rank() != 0) return;
  // Bytes each phase must move on this rank (read + written), from the layout: the shard's
  // elements (Adam, amax, quantize) and the whole quantized buffers (landing, zeroing).
  const Layout& L = opt.layout();
  double shard = 0, q_shard = 0, q_full = 0;
  for (const BufferLayout& b : L.buffers()) {
    shard += static_cast<double>(b.shard_numel);
    if (o.param_format != ParamFormat::Native && b.dtype == DType::bf16) {
      q_shard += static_cast<double>(b.shard_numel);
      q_full += static_cast<double>(b.numel);
    }
  }
  const bool nv = o.param_format == ParamFormat::Nvfp4;
  const double data_bytes = nv ? 0.5 : 2.0;  // per element, all planes
  std::map<std::string, double> bytes;
  // Adam: grad (2) + master, m, v read and written (24) (+ the bf16 param written: 2).
  // Adam: bf16 grad read, fp32 master read and written, bf16 param written, both moments
  // read and written (4 B each, or 1 B with 8-bit moments; their scales: 8 B per 256
  // elements); MXFP8 / NVFP4 write no bf16 param.
  const double moment_bytes = o.moment_dtype == DType::q8_block ? 4.0 + 16.0 / 256.0 : 16.0;
  bytes["adam"] = shard * (10.0 + moment_bytes + (o.param_format == ParamFormat::Native ? 2.0 : 0.0));
  bytes["amax"] = q_shard * 4.0;                      // NVFP4's amax pass: the master read
  bytes["quantize"] = q_shard * (4.0 + data_bytes);   // the master read, the data written (MXFP8: the owned pass)
  bytes["landing"] = q_full * 2.0 * data_bytes;       // staging read, storage written
  bytes["zeroing"] = q_full * 2.0;                    // the bf16 gradient regions written
  // F32Accumulate's local share of "reduce grads" (docs/grad_reduce.md, "Bytes"): per
  // bucket of n pieces of c bf16 elements, the n - 1 pieces received (written), then the
  // sum's n pieces read (the own one where it lies) and c outputs written over it.
  const double n_ranks = static_cast<double>(comm.size());
  const double f32acc_local = o.grad_reduce_precision == GradReducePrecision::F32Accumulate && comm.size() > 1
                                  ? 2.0 * shard * ((n_ranks - 1) + n_ranks + 1.0)
                                  : 0.0;
  bench::Result r;
  r.bench = "dist_adam_phases";
  r.config = config;
  r.device = device;
  r.ours_ms = bench::median(samples["total"]);
  r.numbers["graph_step_ms"] = graph_ms;
  r.numbers["copy_gbps"] = copy_gbps;
  r.numbers["eager_steps"] = iters;
  for (const auto& [label, v] : samples) {
    if (label == "total") continue;
    r.numbers[label + "_ms"] = bench::median(v);
    auto b = bytes.find(label);
    if (b != bytes.end()) r.numbers[label + "_limit_ms"] = b->second / (copy_gbps * 1e6);
  }
  if (f32acc_local > 0) {
    r.numbers["reduce_local_bytes"] = f32acc_local;
    r.numbers["reduce_local_limit_ms"] = f32acc_local / (copy_gbps * 1e6);
    r.notes["reduce_local"] = "F32Accumulate's HBM bytes inside reduce grads: the other ranks' pieces received, the "
                              "sum's pieces read and outputs written (2 B each); at the device copy bandwidth";
  }
  r.notes["what"] = "median per phase of eager steps queued behind a host wait: CUDA events at the step's phase marks, "
                    "each phase's time from its marks to the next; *_limit_ms: its bytes at the device copy bandwidth";
  r.notes["phases"] = "reduce grads (before norm), norm (norm, found-inf, clip, Adam prologue), adam, after adam "
                      "(between Adam passes: bf16 gather waits), amax (NVFP4), exchange, quantize (MXFP8: the owned pass, "
                      "phase 1 with the data of whole tile rows), quantize rest (MXFP8: the cut tile rows), after "
                      "quantize (next group's start), gather wait, landing, zeroing, after zeroing (to the step's end)";
  r.command = cmd;
  bench::write(r, a.results);
}

void phases(const Communicator& comm, Stream s, const Args& a, const std::string& device, const std::string& cmd) {
  const bench::CopyBandwidth copy = bench::measure_copy(std::size_t{1} << 30, s);
  DistributedAdamOptions mx = step_options();
  mx.param_dtype.reset();  // quantized: the 1-D params are f32
  mx.param_format = ParamFormat::Mxfp8;
  DistributedAdamOptions nv = mx;
  nv.param_format = ParamFormat::Nvfp4;
  DistributedAdamOptions q8 = step_options();  // the 8-bit moments' step (issue 46)
  q8.moment_dtype = DType::q8_block;
  const std::string n = "/1.5B/147/n" + std::to_string(comm.size());
  for (const auto& [name, o] : std::vector<std::pair<std::string, DistributedAdamOptions>>{
           {"bf16p-bf16g", step_options()}, {"mxfp8p-bf16g", mx}, {"nvfp4p-bf16g", nv}, {"bf16p-bf16g-q8moments", q8}}) {
    const double graph = step_ms(comm, s, a, o);
    phase_rows(comm, s, a, device, cmd, name + n, o, graph, copy.gbps);
  }
}

// The captured bf16 step with F32Accumulate against Native (both with the step's default
// per-bucket overlap off: every reduce runs in step()), in one process.
void grad_reduce_step(const Communicator& comm, Stream s, const Args& a, const std::string& device,
                      const std::string& cmd) {
  MemoryReport native_memory, f32_memory;
  const double native = step_ms(comm, s, a, step_options(), &native_memory);
  DistributedAdamOptions f32 = step_options();
  f32.grad_reduce_precision = GradReducePrecision::F32Accumulate;
  const double ours = step_ms(comm, s, a, f32, &f32_memory);
  // Where the difference goes: the phase breakdown of both steps in this process
  // ("dist_adam_phases" rows .../native and .../f32acc).
  const bench::CopyBandwidth copy = bench::measure_copy(std::size_t{1} << 30, s);
  const std::string base = "bf16p-bf16g/1.5B/147/n" + std::to_string(comm.size());
  phase_rows(comm, s, a, device, cmd, base + "/native", step_options(), native, copy.gbps);
  phase_rows(comm, s, a, device, cmd, base + "/f32acc", f32, ours, copy.gbps);
  if (comm.rank() != 0) return;
  bench::Result r;
  r.bench = "dist_adam_grad_reduce";
  r.config = "bf16p-bf16g/1.5B/147/n" + std::to_string(comm.size()) + "/f32acc";
  r.device = device;
  r.ours_ms = ours;
  r.peer_ms = native;
  r.peer = "the same captured step with GradReducePrecision::Native (NCCL bf16 reduce-scatter)";
  r.numbers["f32acc_over_native"] = ours / native;
  r.numbers["mem_grads_bytes_native"] = static_cast<double>(native_memory.grads);
  r.numbers["mem_grads_bytes_f32acc"] = static_cast<double>(f32_memory.grads);
  r.notes["what"] = "captured distributed-Adam step (reduce, norm/clip, Adam, gathers), Llama-3.2-1B shapes";
  r.command = cmd;
  bench::write(r, a.results);
}

// The peers of the fully offloaded fp32 row, from the --peer file: FSDP2 with
// CPUOffloadPolicy (bench/peers/offload_peer.py, under the row's config) and DeepSpeed
// ZeRO-Offload (deepspeed_offload_peer.py, the config + "/deepspeed"). Each is recorded
// (fsdp2_cpu_offload_ms, deepspeed_zero_offload_ms); the row's peer is the faster.
void apply_offload_peers(bench::Result& r, const std::string& path) {
  if (path.empty()) return;
  const auto peers = bench::read_peer_file(path);
  const std::pair<const char*, std::string> keys[] = {{"fsdp2_cpu_offload_ms", r.config},
                                                      {"deepspeed_zero_offload_ms", r.config + "/deepspeed"}};
  for (const auto& [number, key] : keys) {
    const auto it = peers.find(key);
    if (it == peers.end()) continue;
    r.numbers[number] = it->second.ms;
    if (!r.peer_ms || it->second.ms < *r.peer_ms) {
      r.peer = it->second.description;
      r.peer_ms = it->second.ms;
    }
  }
}

// The offloaded-state rows (--offload): per fraction and state mode, the captured step
// against max(the on-GPU step, the duplex copy of its offloaded bytes).
void offload_rows(const Communicator& comm, Stream s, const Args& a, const std::string& device, const std::string& cmd) {
  struct Mode {
    const char* name;
    MasterStorage master;
    DType moments;
  };
  for (const Mode& md : {Mode{"bf16p-bf16g", MasterStorage::fp32, DType::f32},
                         Mode{"bf16p-bf16g-remainder-q8moments", MasterStorage::bf16_remainder, DType::q8_block}}) {
    DistributedAdamOptions o = step_options();
    o.master_storage = md.master;
    o.moment_dtype = md.moments;
    MemoryReport gpu_memory;
    const double gpu_ms = step_ms(comm, s, a, o, &gpu_memory);
    for (double fraction : a.offload) {
      DistributedAdamOptions off = o;
      off.offload_fraction = fraction;
      if (a.offload_stage > 0) off.offload_stage_numel = a.offload_stage;
      MemoryReport memory;
      const auto t0 = Clock::now();
      const double ms = step_ms(comm, s, a, off, &memory);
      const double build_s = std::chrono::duration<double>(Clock::now() - t0).count();
      const auto bytes = static_cast<std::size_t>(memory.offloaded);
      const std::size_t piece = static_cast<std::size_t>(memory.offload_staging / 4);
      const double pcie_ms = bytes > 0 ? bench::duplex_copy_ms(s, a.iters, bytes, std::max<std::size_t>(piece, 1)) : 0.0;
      if (comm.rank() != 0) continue;
      bench::Result r;
      r.bench = "dist_adam_offload";
      char frac[32];
      std::snprintf(frac, sizeof frac, "%g", fraction);
      r.config = std::string(md.name) + "/offload" + frac + "/1.5B/147/n" + std::to_string(comm.size());
      r.device = device;
      r.ours_ms = ms;
      r.limit_ms = std::max(gpu_ms, pcie_ms);
      apply_offload_peers(r, a.peer);
      r.numbers["offload_fraction"] = fraction;
      r.numbers["offload_stage_numel"] = static_cast<double>(off.offload_stage_numel);
      r.numbers["on_gpu_step_ms"] = gpu_ms;
      r.numbers["pcie_duplex_ms"] = pcie_ms;
      r.numbers["pcie_gbps_each_way"] = pcie_ms > 0 ? static_cast<double>(bytes) / (pcie_ms * 1e6) : 0.0;
      r.numbers["offloaded_bytes"] = static_cast<double>(memory.offloaded);
      r.numbers["staging_bytes"] = static_cast<double>(memory.offload_staging);
      r.numbers["build_and_time_s"] = build_s;
      add_memory(r, memory);
      r.notes["limit"] = "max(the same step with all state on the GPU, a duplex copy of the offloaded bytes up and "
                         "down at once between pinned host memory and the device, in the step's stage sizes)";
      r.command = cmd;
      bench::write(r, a.results);
      std::printf("offload %-34s F=%-5g step %9.2f ms  on-GPU %7.2f ms  PCIe duplex %9.2f ms (%.1f GB/s each way)  "
                  "limit ratio %.3f\n",
                  md.name, fraction, ms, gpu_ms, pcie_ms, r.numbers["pcie_gbps_each_way"], std::max(gpu_ms, pcie_ms) / ms);
    }
  }
}

// --capacity: the largest Llama-shaped model whose captured step runs on this GPU.
// Llama-3-8B's widths (hidden 4096, MLP 14336, k/v 1024, vocabulary 128256) with as many
// layers as fit, per state mode, with all state on the GPU and with the state offloaded
// as far as the host allows (up to kHostShare of its available memory, pinned).

constexpr double kHostShare = 0.8;  // of MemAvailable at the start: the pinned bytes the rows may take

presets::TransformerShape capacity_shape(std::int64_t layers) { return {4096, layers, 14336, 1024, 128256}; }

// /proc/meminfo's value of `key` in bytes (0 when absent).
double meminfo_bytes(const char* key) {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char name[64];
  double kb = 0;
  double found = 0;
  while (std::fscanf(f, "%63[^:]: %lf kB\n", name, &kb) == 2)
    if (std::string(name) == key) found = kb * 1024.0;
  std::fclose(f);
  return found;
}

struct CapacityTry {
  bool fits = false;   // constructed, stepped eagerly, captured and replayed
  double ms = 0;       // median replay
  MemoryReport memory;
  std::int64_t params = 0;
};

// Builds the optimizer of `layers` layers with options `o`, steps it and times the captured
// step; an Error(OutOfMemory) anywhere on the way means it does not fit.
CapacityTry try_capacity(const Communicator& comm, Stream s, const Args& a, const DistributedAdamOptions& o,
                         std::int64_t layers) {
  CapacityTry t;
  try {
    DistributedAdam opt(comm, presets::transformer(capacity_shape(layers), DType::bf16), o);
    t.params = opt.layout().param_numel();
    t.memory = opt.memory();
    fill_model(opt, s);
    opt.step(s);
    SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s)));
    bench::CapturedGraph g(s, [&] { opt.step(s); });
    t.ms = bench::time_ms(s, 1, std::max(1, std::min(a.iters, 3)), [&] { g.launch(s); });
    t.fits = true;
  } catch (const Error& e) {
    if (e.code() != ErrorCode::OutOfMemory) throw;
    SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  return t;
}

// Device and state bytes of `layers` layers with all state on the GPU, without building:
// linear in the layers, fitted through two small builds (exact for the per-layer buffers;
// the bucket padding of a layer count between them may differ by a bucket's alignment).
struct CapacityModel {
  double base_device = 0, per_layer_device = 0;  // memory().total()
  double base_state = 0, per_layer_state = 0;    // master + remainders + moments + scales
  double device(std::int64_t l) const { return base_device + per_layer_device * static_cast<double>(l); }
  double state(std::int64_t l) const { return base_state + per_layer_state * static_cast<double>(l); }
};

CapacityModel fit_capacity(const Communicator& comm, const DistributedAdamOptions& o) {
  double dev[2], st[2];
  for (int i = 0; i < 2; ++i) {
    DistributedAdam opt(comm, presets::transformer(capacity_shape(1 + i), DType::bf16), o);
    const MemoryReport m = opt.memory();
    dev[i] = static_cast<double>(m.total());
    st[i] = static_cast<double>(m.master + m.remainders + m.moments + m.moment_scales);
  }
  return {dev[0] - (dev[1] - dev[0]), dev[1] - dev[0], st[0] - (st[1] - st[0]), st[1] - st[0]};
}

// The offload fraction of `layers` layers: all state when the host allowance holds it,
// else the share it holds (rounded down to a thousandth).
double capacity_fraction(const CapacityModel& cm, std::int64_t layers, double host_allowance) {
  const double f = std::min(1.0, host_allowance / cm.state(layers));
  return std::floor(f * 1000.0) / 1000.0;
}

void capacity_rows(const Communicator& comm, Stream s, const Args& a, const std::string& device,
                   const std::string& cmd) {
  const double host_total = meminfo_bytes("MemTotal"), host_available = meminfo_bytes("MemAvailable");
  const double allowance = kHostShare * host_available;
  std::size_t free_bytes = 0, total_bytes = 0;
  SHARDOPT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  struct Mode {
    const char* name;
    MasterStorage master;
    DType moments;
  };
  double fp32_on_gpu_params = 0;
  for (const Mode& md : {Mode{"fp32", MasterStorage::fp32, DType::f32},
                         Mode{"remainder-q8moments", MasterStorage::bf16_remainder, DType::q8_block}}) {
    DistributedAdamOptions o = step_options();
    o.master_storage = md.master;
    o.moment_dtype = md.moments;
    const CapacityModel cm = fit_capacity(comm, o);
    for (bool offload : {false, true}) {
      // The prediction: the most layers whose device bytes fit in the free memory (with the
      // offloaded share of the state in host memory), then proven by building: up while
      // the next fits, down while this one does not.
      const auto fraction_of = [&](std::int64_t l) { return offload ? capacity_fraction(cm, l, allowance) : 0.0; };
      const auto predicted_device = [&](std::int64_t l) { return cm.device(l) - fraction_of(l) * cm.state(l); };
      std::int64_t layers = 1;
      while (layers < 4096 && predicted_device(layers + 1) < static_cast<double>(free_bytes)) ++layers;
      const auto build = [&](std::int64_t l) {
        DistributedAdamOptions t = o;
        t.offload_fraction = fraction_of(l);
        return try_capacity(comm, s, a, t, l);
      };
      CapacityTry fit = build(layers);
      while (!fit.fits && layers > 1) fit = build(--layers);
      bool next_refused = false;
      while (fit.fits) {
        CapacityTry next = build(layers + 1);
        if (!next.fits) {
          next_refused = true;
          break;
        }
        fit = next;
        ++layers;
      }
      if (!fit.fits) continue;  // not even one layer
      if (!offload && md.master == MasterStorage::fp32) fp32_on_gpu_params = static_cast<double>(fit.params);
      if (comm.rank() != 0) continue;
      bench::Result r;
      r.bench = "dist_adam_capacity";
      r.config = std::string("llama3-8b-widths/") + md.name + (offload ? "/offload" : "/on-gpu") + "/n" +
                 std::to_string(comm.size());
      r.device = device;
      r.ours_ms = fit.ms;
      r.numbers["layers"] = static_cast<double>(layers);
      r.numbers["params"] = static_cast<double>(fit.params);
      r.numbers["offload_fraction"] = fraction_of(layers);
      r.numbers["device_bytes"] = static_cast<double>(fit.memory.total());
      r.numbers["pinned_bytes"] = static_cast<double>(fit.memory.offloaded);
      r.numbers["device_free_bytes_at_start"] = static_cast<double>(free_bytes);
      r.numbers["device_total_bytes"] = static_cast<double>(total_bytes);
      r.numbers["host_mem_total_bytes"] = host_total;
      r.numbers["host_mem_available_bytes"] = host_available;
      r.numbers["host_allowance_bytes"] = offload ? allowance : 0.0;
      r.numbers["next_layer_refused"] = next_refused ? 1.0 : 0.0;
      if (fp32_on_gpu_params > 0) r.numbers["params_over_fp32_on_gpu"] = static_cast<double>(fit.params) / fp32_on_gpu_params;
      add_memory(r, fit.memory);
      r.notes["what"] = "the largest model of Llama-3-8B's widths (hidden 4096, MLP 14336, k/v 1024, vocabulary 128256; "
                        "layers as many as fit) whose captured distributed-Adam step builds, steps and replays on this "
                        "device; next_layer_refused: one layer more was Error(OutOfMemory)";
      if (offload) {
        char share[32];
        std::snprintf(share, sizeof share, "%g", kHostShare);
        r.notes["offload"] = std::string("offload_fraction: the share of the state that the host allowance "
                                         "(host_allowance_bytes: ") +
                             share + " of MemAvailable at the start, pinned) holds, all of it when it can; the rest "
                                     "stays on the GPU";
      }
      r.command = cmd;
      bench::write(r, a.results);
      std::printf("capacity %-20s %-7s %3lld layers %6.2fB params  F=%.3f  device %.1f GB  pinned %.1f GB  step %.1f ms  "
                  "next layer %s\n",
                  md.name, offload ? "offload" : "on-gpu", static_cast<long long>(layers), fit.params / 1e9,
                  fraction_of(layers), fit.memory.total() / 1e9, fit.memory.offloaded / 1e9, fit.ms,
                  next_refused ? "refused" : "not tried");
    }
  }
}

}  // namespace

void run_device(const Args& a, bench::MpiBench& mb, const std::string& command) {
  const std::string device = mb.device();
  if (a.capacity) {
    capacity_rows(mb.comm(), mb.stream(), a, device, command);
    return;
  }
  if (!a.offload.empty()) {
    offload_rows(mb.comm(), mb.stream(), a, device, command);
    return;
  }
  if (a.grad_reduce) {
    grad_reduce_step(mb.comm(), mb.stream(), a, device, command);
    return;
  }
  if (!a.host_cpu_only) full_step(mb.comm(), mb.stream(), a, device, command);
  if (a.phases) {
    phases(mb.comm(), mb.stream(), a, device, command);
  } else {
    host_cpu_sweep(mb.comm(), mb.stream(), a, device, command);
  }
}

}  // namespace shardopt::bench_dist_adam
