// bench_nvfp4 - NVFP4 quantization bandwidth against a device-to-device copy measured
// in the same process (bench "nvfp4_quantize"), through the public API of
// shardopt/nvfp4.hpp, on the 114 matrices of Llama-3.2-1B (presets::kLlama32_1B).
//
// Configs:
//   llama3.2-1b/2d-weights  all matrices, bf16 -> E2M1 data + E4M3 block scales + amax and
//                           decode scale, one captured graph of one quantize_nvfp4 call each;
//                           no_pdl_ms: the same graph captured with ordinary launches
//   llama3.2-1b/2d-weights/batched   the same matrices and bytes in one quantize_nvfp4_batch
//                           call (an Nvfp4Batch, captured in a graph); the line also carries
//                           the per-tensor graph's time of the same run and the eager
//                           (uncaptured) time of the batch call
//   embed-128256x2048 (the largest), mlp-8192x2048, attn-q-2048x2048, attn-k-512x2048
//                           single matrices, one quantize_nvfp4 call each: the time per
//                           call of the 16 layers' tensors of the role (embed: the one)
//                           called back to back in one graph (bench/common/per_call.hpp:
//                           what a step sees); the line also carries the same calls eager
//                           (burst_ms), one call synchronised after each (eager_single_ms:
//                           the rows' metric before 2026-11-27) and the floor of each way
//                           (floor_*: the same calls with the skip flag set); the three
//                           kernels are programmatic dependent launches
//                           (kernels/common/dependent_launch.cuh), and the line carries
//                           no_pdl_ms and pdl_speedup (no_pdl_ms / ours_ms) from
//   <single>/no-pdl         the same calls, same process, with ordinary launches
//                           (kernels::set_dependent_launch(false)), all the same numbers
//   shard-w4/per-tensor     the sharded path of rank 1 of 4 (Layout segments, fp32 master
//                           shard): nvfp4_partial_amax + quantize_nvfp4_shard for every
//                           segment, in one graph, without the all-reduce
//   shard-w4/batched        the same segments through one Nvfp4ShardBatch, in one graph:
//                           nvfp4_partial_amax_batch, the amax all-reduce (u32 Max, one call
//                           over the amax buffers laid back to back) on a one-rank NCCL
//                           group (Communicator::self without NCCL), quantize_nvfp4_shard_batch
//   shard-w1/batched        as shard-w4/batched for a world of one: every matrix from its
//                           fp32 master
// A one-rank all-reduce moves no data: the batched rows time the call, not an exchange
// (exchange bytes per rank, 4 per amax entry, are in the line as exchange_bytes).
//
// Bytes: the least traffic each algorithm needs. Whole tensor: no element can be encoded
// before the tensor's amax is known, so the bf16 input is read twice (amax pass, encode
// pass) = 2 * 2 B + 1/2 B (data) per element + 1 B per 16 x 16 block (scale) + 8 B per
// tensor (amax, decode scale); bytes_one_read and fraction_one_read count one read of
// the input instead, as bench_mxfp8's whole-tensor rows do. Sharded: phase 1 zeroes the
// u32 amax buffers of the touched tensors (4 B per entry) and reads the master (4 B),
// writing the touched blocks' amaxes (4 B per 256 elements); phase 2 reads the amax
// buffers (4 B per entry), writes every scale (1 B per block) and the two fp32 values,
// reads the master again (4 B) and the scales (1 B per 256 elements) and writes the data
// span (1/2 B per element). limit_ms = bytes / copy bandwidth (copy bandwidth = (read +
// written bytes) / time of a 1 GiB cudaMemcpyAsync); fraction_of_limit = limit_ms /
// ours_ms, target >= 0.85. The batched shard rows also time each phase alone, eagerly
// (phase1_ms, phase2_ms; phase1_fraction, phase2_fraction: the phase's bytes over its
// time on the copy bandwidth). Medians of 30 timed runs after 5 warm-ups, CUDA events around
// the work (bench/common/cuda_bench: BandwidthBench, time_ms, measure_copy, CapturedGraph).
//
// Usage: bench_nvfp4 [--results DIR] [--only TEXT]
//   --results DIR: also upsert the JSON lines into DIR/nvfp4_quantize.jsonl (created if
//                  missing); without it the lines are only printed.
//   --only TEXT:   run only the configs whose name holds TEXT (e.g. shard-w1, to profile
//                  one config's kernels with ncu).
// Without a CUDA device it prints why and exits 77 (skipped).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "core/device_guard.hpp"
#include "core/memory.hpp"
#include "cuda_bench.hpp"
#include "per_call.hpp"
#include "results.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/nvfp4.hpp"
#include "shardopt/presets.hpp"
#include "shardopt_config.h"

namespace {
using namespace shardopt;

constexpr int kWarmup = 5;
constexpr int kIters = 30;
constexpr Backend kCuda = Backend::Cuda;

std::int64_t round_up(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }

// The 2-D matrices of the model, their bf16 sources and their whole-tensor outputs, each
// tensor's memory at a 64-byte-aligned offset of one buffer per plane.
struct Matrices {
  std::vector<ParamSpec> specs;
  std::vector<Nvfp4Shape> shapes;
  std::vector<std::int64_t> src_off, data_off, scale_off;  // elements, bytes, bytes
  std::int64_t elements = 0;
  DeviceBuffer src, data, scale, f32;  // f32: amax of tensor i at [i], decode scale at [size + i]

  explicit Matrices(const std::vector<ParamSpec>& all) {
    std::int64_t src_n = 0, data_n = 0, scale_n = 0;
    for (const ParamSpec& p : all) {
      if (p.shape.size() < 2) continue;
      const Nvfp4Shape s = Nvfp4Shape::of(p.shape);
      specs.push_back(p);
      shapes.push_back(s);
      src_off.push_back(src_n);
      data_off.push_back(data_n);
      scale_off.push_back(scale_n);
      src_n = round_up(src_n + s.numel(), 32);
      data_n = round_up(data_n + s.data_bytes(), 64);
      scale_n = round_up(scale_n + s.scale_numel(), 64);
      elements += s.numel();
    }
    src = DeviceBuffer(kCuda, static_cast<std::size_t>(src_n) * 2);
    data = DeviceBuffer(kCuda, static_cast<std::size_t>(data_n));
    scale = DeviceBuffer(kCuda, static_cast<std::size_t>(scale_n));
    f32 = DeviceBuffer(kCuda, 2 * shapes.size() * sizeof(float));
    bench::fill_normal(src.data(), src.bytes(), false, 1);
  }
  std::size_t size() const { return shapes.size(); }
  Nvfp4Planes planes(std::size_t i) const {
    return Nvfp4Planes{data.as<std::uint8_t>() + data_off[i], scale.as<std::uint8_t>() + scale_off[i],
                       f32.as<float>() + i, f32.as<float>() + size() + i};
  }
  const std::uint16_t* source(std::size_t i) const { return src.as<std::uint16_t>() + src_off[i]; }
};

// Least bytes of a whole-tensor quantize of `s`, reading its bf16 input `reads` times.
double whole_bytes(const Nvfp4Shape& s, int reads) {
  return 2.0 * reads * static_cast<double>(s.numel()) + static_cast<double>(s.data_bytes() + s.scale_numel()) + 8;
}

// One rank's share of the sharded quantization: the tensors of its Layout segments (of
// buffer 0, as bench_mxfp8), its fp32 master shard and the u32 amax buffers of the
// touched tensors back to back. Data spans, scales and fp32 values land in the
// whole-tensor planes of `m`.
struct RankShard {
  std::vector<Nvfp4ShardTensor> tensors;
  DeviceBuffer master, amax;
  std::int64_t elements = 0, amax_entries = 0, scale_bytes = 0, data_bytes = 0;

  RankShard(const Matrices& m, int world, int rank) {
    const Layout layout(m.specs, world);
    std::int64_t shard_numel = 0;
    for (const auto& b : layout.buffers()) shard_numel = std::max(shard_numel, b.shard_numel);
    master = DeviceBuffer(kCuda, static_cast<std::size_t>(shard_numel) * 4);
    bench::fill_normal(master.data(), master.bytes(), true, 2);
    const auto segments = layout.segments(0, rank);
    for (const Segment& g : segments) amax_entries += m.shapes[static_cast<std::size_t>(g.param)].amax_numel();
    amax = DeviceBuffer(kCuda, static_cast<std::size_t>(amax_entries) * 4);
    std::int64_t a_off = 0;
    for (const Segment& g : segments) {
      const auto p = static_cast<std::size_t>(g.param);
      Nvfp4ShardTensor t;
      t.shape = m.shapes[p];
      t.range = Range{g.param_offset, g.param_offset + g.length};
      t.master = master.as<float>() + g.shard_offset;
      t.amax = amax.as<std::uint32_t>() + a_off;
      t.out = m.planes(p);
      t.out.data += nvfp4_shard_bytes(t.range).begin;  // the span's first byte
      tensors.push_back(t);
      a_off += t.shape.amax_numel();
      elements += g.length;
      scale_bytes += t.shape.scale_numel();
      data_bytes += nvfp4_shard_bytes(t.range).size();
    }
  }
  // Least bytes of each phase and of both (header comment), the all-reduce excluded.
  double phase1_bytes() const {
    const auto n = static_cast<double>(elements);
    return 4.0 * static_cast<double>(amax_entries) + n * 4 + n / 64;
  }
  double phase2_bytes() const {
    const auto n = static_cast<double>(elements);
    return 4.0 * static_cast<double>(amax_entries) + static_cast<double>(scale_bytes) +
           8.0 * static_cast<double>(tensors.size()) + n * 4 + n / 256 + static_cast<double>(data_bytes);
  }
  double bytes() const { return phase1_bytes() + phase2_bytes(); }
};

// The amax all-reduce's group: one rank of NCCL where the build has it.
Communicator one_rank_group(std::string& kind) {
#if SHARDOPT_HAVE_NCCL
  kind = "one-rank NCCL group";
  return Communicator::from_unique_id(UniqueId::create(), 0, 1, detail::current_device());
#else
  kind = "Communicator::self (no NCCL in this build)";
  return Communicator::self(kCuda);
#endif
}

int run(int argc, char** argv, const std::string& results_dir, const std::string& only) {
  const bench::BandwidthBench frame("nvfp4_quantize", argc, argv, kWarmup, kIters);
  const Stream st = frame.stream();
  const double copy_gbps = frame.copy_gbps();
  std::map<std::string, double> extra;  // more numbers for the next report
  auto report = [&](const std::string& config, double ours_ms, double bytes, std::int64_t elements,
                    const std::string& what) {
    bench::Result r = frame.result(config, ours_ms, bytes, elements);
    for (const auto& [k, v] : extra) r.numbers[k] = v;
    r.notes["what"] = what;
    bench::write(r, results_dir);
    extra.clear();
  };
  // Whether a config runs (--only: those whose name holds the text).
  auto wanted = [&](const std::string& config) { return only.empty() || config.find(only) != std::string::npos; };
  // Whole-tensor rows: also the one-read byte count (header comment).
  auto one_read = [&](double bytes_one_read, double ms) {
    extra["bytes_one_read"] = bytes_one_read;
    extra["fraction_one_read"] = bytes_one_read / (copy_gbps * 1e6) / ms;
  };

  // ------------------------------------------------------------ whole-tensor quantize
  const Matrices m(presets::transformer(presets::kLlama32_1B));
  const std::string count = std::to_string(m.size());
  double all_bytes = 0, all_bytes_one_read = 0;
  for (const auto& s : m.shapes) {
    all_bytes += whole_bytes(s, 2);
    all_bytes_one_read += whole_bytes(s, 1);
  }
  auto quantize = [&](std::size_t i) { quantize_nvfp4(m.shapes[i], m.source(i), m.planes(i), nullptr, kCuda, st); };
  double per_tensor_ms = 0;
  if (wanted("llama3.2-1b/2d-weights")) {
    for (std::size_t i = 0; i < m.size(); ++i) quantize(i);  // warm-up outside any capture
    SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(st)));
    const bench::CapturedGraph g(st, [&] {
      for (std::size_t i = 0; i < m.size(); ++i) quantize(i);
    });
    per_tensor_ms = frame.time_ms([&] { g.launch(st); });
    extra["no_pdl_ms"] = bench::graph_ms_without_pdl(frame, st, [&] {
      for (std::size_t i = 0; i < m.size(); ++i) quantize(i);
    });
    extra["pdl_speedup"] = extra["no_pdl_ms"] / per_tensor_ms;
    one_read(all_bytes_one_read, per_tensor_ms);
    report("llama3.2-1b/2d-weights", per_tensor_ms, all_bytes, m.elements,
           count + " matrices bf16 -> E2M1 data + E4M3 block scales + amax, decode scale; one graph of " + count +
               " quantize_nvfp4 calls");
  }
  if (wanted("llama3.2-1b/2d-weights/batched")) {
    std::vector<Nvfp4Tensor> tensors;
    for (std::size_t i = 0; i < m.size(); ++i) tensors.push_back({m.shapes[i], m.source(i), m.planes(i)});
    const Nvfp4Batch batch(tensors, kCuda);
    const double eager_ms = frame.time_ms([&] { quantize_nvfp4_batch(batch, nullptr, kCuda, st); });
    const bench::CapturedGraph g(st, [&] { quantize_nvfp4_batch(batch, nullptr, kCuda, st); });
    const double ms = frame.time_ms([&] { g.launch(st); });
    if (per_tensor_ms > 0) {
      extra["per_tensor_graph_ms"] = per_tensor_ms;
      extra["speedup_vs_per_tensor_graph"] = per_tensor_ms / ms;
    }
    extra["eager_ms"] = eager_ms;
    one_read(all_bytes_one_read, ms);
    report("llama3.2-1b/2d-weights/batched", ms, all_bytes, m.elements,
           count + " matrices bf16 -> E2M1 data + E4M3 block scales + amax, decode scale; one quantize_nvfp4_batch "
           "call (Nvfp4Batch) in a graph");
  }
  // Single tensors: every layer's tensor of the role, one call each, back to back
  // (bench/common/per_call.hpp); the same calls with the skip flag set time the launches
  // alone (the floor of a call: three kernels that start, read the flag and end).
  DeviceBuffer skip(kCuda, sizeof(std::int32_t));
  const std::int32_t set = 1;
  SHARDOPT_CUDA_CHECK(cudaMemcpy(skip.data(), &set, sizeof set, cudaMemcpyHostToDevice));
  for (const auto& [config, name] : {std::pair<std::string, std::string>{"embed-128256x2048", "embed.weight"},
                                     std::pair<std::string, std::string>{"mlp-8192x2048", "layers.0.mlp.gate.weight"},
                                     std::pair<std::string, std::string>{"attn-q-2048x2048", "layers.0.attn.q.weight"},
                                     std::pair<std::string, std::string>{"attn-k-512x2048", "layers.0.attn.k.weight"}}) {
    if (!wanted(config)) continue;
    const std::vector<std::size_t> tensors = bench::same_role(m.specs, name);
    const Nvfp4Shape& s = m.shapes[tensors.front()];
    const int n = static_cast<int>(tensors.size());
    auto call = [&](const std::int32_t* flag) {
      return [&, flag](int k) {
        const std::size_t i = tensors[static_cast<std::size_t>(k)];
        quantize_nvfp4(m.shapes[i], m.source(i), m.planes(i), flag, kCuda, st);
      };
    };
    const bench::PerCall t = bench::time_per_call(frame, n, call(nullptr));
    const bench::PerCall idle = bench::time_per_call(frame, n, call(skip.as<std::int32_t>()));
    const bench::PerCall t_off = bench::time_per_call_without_pdl(frame, n, call(nullptr));
    const bench::PerCall idle_off = bench::time_per_call_without_pdl(frame, n, call(skip.as<std::int32_t>()));
    const std::string what = m.specs[tensors.front()].name +
                             " bf16 -> E2M1 data + E4M3 block scales + amax, decode scale; per call of " +
                             std::to_string(n) + " quantize_nvfp4 calls (one per layer) in one graph";
    bench::add_per_call_numbers(extra, n, 3, t, idle);
    extra["no_pdl_ms"] = t_off.graph_ms;
    extra["pdl_speedup"] = t_off.graph_ms / t.graph_ms;
    one_read(whole_bytes(s, 1), t.graph_ms);
    report(config, t.graph_ms, whole_bytes(s, 2), s.numel(), what + " (programmatic dependent launches)");
    bench::add_per_call_numbers(extra, n, 3, t_off, idle_off);
    one_read(whole_bytes(s, 1), t_off.graph_ms);
    report(config + "/no-pdl", t_off.graph_ms, whole_bytes(s, 2), s.numel(),
           what + " (ordinary launches: kernels::set_dependent_launch(false))");
  }

  // ------------------------------------------------------------ sharded path
  std::string group_kind;
  const Communicator group = one_rank_group(group_kind);
  for (const auto& [world, rank] : {std::pair{4, 1}, std::pair{1, 0}}) {
    const std::string prefix = "shard-w" + std::to_string(world);
    if (!wanted(prefix + "/per-tensor") && !wanted(prefix + "/batched")) continue;
    const RankShard shard(m, world, rank);
    const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(world) + ": " +
                            std::to_string(shard.tensors.size()) + " segments, fp32 master -> ";
    if (world > 1 && wanted(prefix + "/per-tensor")) {
      const bench::CapturedGraph g(st, [&] {
        for (const Nvfp4ShardTensor& t : shard.tensors) {
          nvfp4_partial_amax(t.shape, t.range, t.master, t.amax, kCuda, st);
          quantize_nvfp4_shard(t.shape, t.range, t.master, t.amax, t.out, kCuda, st);
        }
      });
      const double ms = frame.time_ms([&] { g.launch(st); });
      report(prefix + "/per-tensor", ms, shard.bytes(), shard.elements,
             who + "nvfp4_partial_amax + quantize_nvfp4_shard per segment in one graph, all-reduce excluded");
    }
    if (!wanted(prefix + "/batched")) continue;
    const Nvfp4ShardBatch batch(shard.tensors, kCuda);
    auto both_phases = [&] {
      nvfp4_partial_amax_batch(batch, kCuda, st);
      group.all_reduce(shard.amax.data(), shard.amax_entries, DType::u32, ReduceOp::Max, st);
      quantize_nvfp4_shard_batch(batch, kCuda, st);
    };
    const double eager_ms = frame.time_ms(both_phases);
    const bench::CapturedGraph g(st, both_phases);
    const double ms = frame.time_ms([&] { g.launch(st); });
    // Each phase alone, eagerly (phase 2 again reads the amaxes the runs above left).
    const double phase1_ms = frame.time_ms([&] { nvfp4_partial_amax_batch(batch, kCuda, st); });
    const double phase2_ms = frame.time_ms([&] { quantize_nvfp4_shard_batch(batch, kCuda, st); });
    extra["phase1_ms"] = phase1_ms;
    extra["phase1_fraction"] = shard.phase1_bytes() / (copy_gbps * 1e6) / phase1_ms;
    extra["phase2_ms"] = phase2_ms;
    extra["phase2_fraction"] = shard.phase2_bytes() / (copy_gbps * 1e6) / phase2_ms;
    extra["eager_ms"] = eager_ms;
    extra["exchange_bytes"] = 4.0 * static_cast<double>(shard.amax_entries);
    report(prefix + "/batched", ms, shard.bytes(), shard.elements,
           who + "one Nvfp4ShardBatch in a graph: nvfp4_partial_amax_batch, u32 Max all-reduce of the amax "
                 "buffers (" + group_kind + ", no data moved), quantize_nvfp4_shard_batch");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string results_dir, only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--results" && i + 1 < argc) {
      results_dir = argv[++i];
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--results DIR] [--only TEXT]\n", argv[0]);
      return 2;
    }
  }
  if (cuda_device_count() == 0) {
    std::printf("bench_nvfp4: no CUDA device, nothing to measure (skipped)\n");
    return 77;
  }
  try {
    if (!results_dir.empty()) std::filesystem::create_directories(results_dir);
    return run(argc, argv, results_dir, only);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_nvfp4: %s\n", e.what());
    return 1;
  }
}
