// bench_mxfp8 - MXFP8 quantization bandwidth against a device-to-device copy measured
// in the same process (bench "mxfp8_quantize").
//
// Configs:
//   llama3.2-1b/2d-weights  all 114 matrices of Llama-3.2-1B, bf16 -> both e4m3 planes +
//                           scales, one captured graph of 114 launches (quantize_mxfp8);
//                           no_pdl_ms: the same graph captured with ordinary launches
//   llama3.2-1b/2d-weights/batched   the same matrices and bytes in ONE launch
//                           (quantize_mxfp8_batch, captured in a graph); the line also
//                           carries the per-tensor graph's time of the same run and the
//                           eager (uncaptured) time of the single launch
//   mlp-8192x2048, embed-128256x2048, attn-q-2048x2048, attn-k-512x2048   single
//                           matrices, one quantize_mxfp8 call each: the time per call of
//                           the 16 layers' tensors of the role (embed: the one) called
//                           back to back in one graph (bench/common/per_call.hpp: what a
//                           step sees); the line also carries the same calls eager
//                           (burst_ms), one call synchronised after each
//                           (eager_single_ms: the rows' metric before 2026-11-27, launch
//                           latency included) and the floor of each way (floor_*: the same
//                           calls with the skip flag set, so the kernel only starts and
//                           ends); the kernel is a programmatic dependent launch
//                           (kernels/common/dependent_launch.cuh), and the line carries
//                           no_pdl_ms and pdl_speedup (no_pdl_ms / ours_ms) from
//   <single>/no-pdl         the same calls, same process, with ordinary launches
//                           (kernels::set_dependent_launch(false)), all the same numbers
//   shard-w4/scale-max, shard-w4/amax-max   the sharded path of rank 1 of 4 (Layout
//                           segments, fp32 master shard): phase 1 + phase 2 of each
//                           scheme for every segment, without the all-reduce
//   shard-w4/batched        scheme (A) for all those segments through one
//                           Mxfp8ShardBatch: one memset + two launches
// Bytes: whole tensor = 2 (read bf16) + 2 (two e4m3 planes) + 1/16 (scales) per element;
// the sharded rows count what their kernels and memsets move (below). limit_ms =
// bytes / copy bandwidth (copy bandwidth = (read + written bytes) / time of a 1 GiB
// cudaMemcpyAsync). Medians of 30 timed runs after 5 warm-ups, CUDA events around the work
// (bench/common/cuda_bench: BandwidthBench, time_ms, measure_copy, CapturedGraph).
//
// Usage: bench_mxfp8 [--results DIR] [--peer-json FILE]
//   --peer-json: JSON lines {"config": ..., "peer": ..., "peer_ms": ...} from a peer script;
//   a line whose config matches fills the peer fields.
#include <cuda_runtime.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "kernels/mxfp8/mxfp8_shard_calls.hpp"
#include "core/check.hpp"
#include "core/memory.hpp"
#include "cuda_bench.hpp"
#include "per_call.hpp"
#include "results.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/mxfp8.hpp"
#include "shardopt/presets.hpp"

namespace {
using namespace shardopt;

constexpr int kWarmup = 5;
constexpr int kIters = 30;

struct Peer {
  std::string name;
  double ms = 0;
};

std::map<std::string, Peer> read_peers(const std::string& path) {
  std::map<std::string, Peer> out;
  if (path.empty()) return out;
  std::ifstream in(path);
  std::string line;
  auto field = [](const std::string& l, const std::string& key) -> std::string {
    const std::string k = "\"" + key + "\":";
    auto p = l.find(k);
    if (p == std::string::npos) return "";
    p += k.size();
    while (p < l.size() && l[p] == ' ') ++p;
    if (p < l.size() && l[p] == '"') {
      const auto e = l.find('"', p + 1);
      return l.substr(p + 1, e - p - 1);
    }
    auto e = l.find_first_of(",}", p);
    return l.substr(p, e - p);
  };
  while (std::getline(in, line)) {
    const std::string config = field(line, "config"), ms = field(line, "peer_ms");
    if (!config.empty() && !ms.empty() && ms != "null") out[config] = Peer{field(line, "peer"), std::stod(ms)};
  }
  return out;
}

std::int64_t round_up(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }

}  // namespace

int main(int argc, char** argv) {
  std::string results_dir, peer_json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--results" && i + 1 < argc) results_dir = argv[++i];
    else if (a == "--peer-json" && i + 1 < argc) peer_json = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--results DIR] [--peer-json FILE]\n", argv[0]);
      return 2;
    }
  }
  if (!results_dir.empty()) std::filesystem::create_directories(results_dir);
  if (cuda_device_count() == 0) {
    std::printf("bench_mxfp8: no CUDA device, nothing to measure\n");
    return 0;
  }
  const auto peers = read_peers(peer_json);
  const bench::BandwidthBench frame("mxfp8_quantize", argc, argv, kWarmup, kIters);
  const Stream st = frame.stream();
  constexpr Backend kCuda = Backend::Cuda;

  std::map<std::string, double> extra;  // more numbers for the next report
  auto report = [&](const std::string& config, double ours_ms, double bytes, std::int64_t elements,
                    const std::string& what) {
    bench::Result r = frame.result(config, ours_ms, bytes, elements);
    if (auto it = peers.find(config); it != peers.end()) {
      r.peer = it->second.name;
      r.peer_ms = it->second.ms;
    }
    for (const auto& [k, v] : extra) r.numbers[k] = v;
    r.notes["what"] = what;
    bench::write(r, results_dir);
  };

  // ------------------------------------------------------------ whole-tensor quantize
  std::vector<Mxfp8Shape> shapes;
  std::vector<std::int64_t> offsets;  // element offset of each matrix in the buffers
  std::vector<std::int64_t> srow_off, scol_off;
  std::int64_t total = 0, srows = 0, scols = 0, elements = 0;
  const auto specs = presets::transformer(presets::kLlama32_1B);
  std::vector<ParamSpec> specs2d;
  for (const ParamSpec& p : specs) {
    if (p.shape.size() < 2) continue;
    specs2d.push_back(p);
    const Mxfp8Shape s = Mxfp8Shape::of(p);
    shapes.push_back(s);
    offsets.push_back(total);
    srow_off.push_back(srows);
    scol_off.push_back(scols);
    total = round_up(total + s.numel(), 64);
    srows = round_up(srows + s.scale_row_numel(), 16);
    scols = round_up(scols + s.scale_col_numel(), 16);
    elements += s.numel();
  }
  DeviceBuffer src(kCuda, static_cast<std::size_t>(total) * 2);
  DeviceBuffer drow(kCuda, static_cast<std::size_t>(total)), dcol(kCuda, static_cast<std::size_t>(total));
  DeviceBuffer srow(kCuda, static_cast<std::size_t>(srows)), scol(kCuda, static_cast<std::size_t>(scols));
  bench::fill_normal(src.data(), src.bytes(), false, 1);
  auto planes = [&](std::size_t i) {
    return Mxfp8Planes{drow.as<std::uint8_t>() + offsets[i], srow.as<std::uint8_t>() + srow_off[i],
                       dcol.as<std::uint8_t>() + offsets[i], scol.as<std::uint8_t>() + scol_off[i]};
  };
  auto quantize = [&](std::size_t i) {
    quantize_mxfp8(shapes[i], src.as<std::uint16_t>() + offsets[i], planes(i), nullptr, kCuda, st);
  };
  auto whole_bytes = [](const Mxfp8Shape& s) {
    return 4.0 * static_cast<double>(s.numel()) + static_cast<double>(s.scale_row_numel() + s.scale_col_numel());
  };
  double all_bytes = 0;
  for (const auto& s : shapes) all_bytes += whole_bytes(s);
  for (std::size_t i = 0; i < shapes.size(); ++i) quantize(i);  // warm-up outside any capture
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(st)));
  double per_tensor_ms = 0;
  {
    const bench::CapturedGraph g(st, [&] {
      for (std::size_t i = 0; i < shapes.size(); ++i) quantize(i);
    });
    per_tensor_ms = frame.time_ms([&] { g.launch(st); });
    extra["no_pdl_ms"] = bench::graph_ms_without_pdl(frame, st, [&] {
      for (std::size_t i = 0; i < shapes.size(); ++i) quantize(i);
    });
    extra["pdl_speedup"] = extra["no_pdl_ms"] / per_tensor_ms;
    report("llama3.2-1b/2d-weights", per_tensor_ms, all_bytes, elements,
           std::to_string(shapes.size()) + " matrices bf16 -> rowwise+columnwise e4m3 + e8m0 scales, one graph of " +
               std::to_string(shapes.size()) + " launches");
    extra.clear();
  }
  {
    std::vector<Mxfp8Tensor> tensors;
    for (std::size_t i = 0; i < shapes.size(); ++i)
      tensors.push_back({shapes[i], src.as<std::uint16_t>() + offsets[i], planes(i), nullptr});
    const Mxfp8Batch batch(tensors, kCuda);
    const double eager_ms = frame.time_ms([&] { quantize_mxfp8_batch(batch, nullptr, kCuda, st); });
    const bench::CapturedGraph g(st, [&] { quantize_mxfp8_batch(batch, nullptr, kCuda, st); });
    const double ms = frame.time_ms([&] { g.launch(st); });
    extra["per_tensor_graph_ms"] = per_tensor_ms;
    extra["speedup_vs_per_tensor_graph"] = per_tensor_ms / ms;
    extra["eager_ms"] = eager_ms;
    extra["launches"] = 1;
    extra["grid_blocks"] = batch.grid();
    extra["tiles"] = static_cast<double>(batch.tiles());
    report("llama3.2-1b/2d-weights/batched", ms, all_bytes, elements,
           std::to_string(shapes.size()) + " matrices bf16 -> rowwise+columnwise e4m3 + e8m0 scales, one "
           "quantize_mxfp8_batch launch (persistent grid over all tiles) in a graph");
    extra.clear();
  }
  // Single tensors: every layer's tensor of the role (layers.0. -> layers.L.), one call
  // each, back to back (bench/common/per_call.hpp); the same calls with the skip flag set
  // time the launches alone (the floor of a call: the kernel starts, reads the flag, ends).
  DeviceBuffer skip(kCuda, sizeof(std::int32_t));
  const std::int32_t one = 1;
  SHARDOPT_CUDA_CHECK(cudaMemcpy(skip.data(), &one, sizeof one, cudaMemcpyHostToDevice));
  for (const auto& [config, name] : {std::pair<std::string, std::string>{"mlp-8192x2048", "layers.0.mlp.gate.weight"},
                                     std::pair<std::string, std::string>{"embed-128256x2048", "embed.weight"},
                                     std::pair<std::string, std::string>{"attn-q-2048x2048", "layers.0.attn.q.weight"},
                                     std::pair<std::string, std::string>{"attn-k-512x2048", "layers.0.attn.k.weight"}}) {
    const std::vector<std::size_t> tensors = bench::same_role(specs2d, name);
    const Mxfp8Shape& s = shapes[tensors.front()];
    const int n = static_cast<int>(tensors.size());
    auto call = [&](const std::int32_t* flag) {
      return [&, flag](int k) {
        const std::size_t i = tensors[static_cast<std::size_t>(k)];
        quantize_mxfp8(shapes[i], src.as<std::uint16_t>() + offsets[i], planes(i), flag, kCuda, st);
      };
    };
    const bench::PerCall t = bench::time_per_call(frame, n, call(nullptr));
    const bench::PerCall idle = bench::time_per_call(frame, n, call(skip.as<std::int32_t>()));
    const bench::PerCall t_off = bench::time_per_call_without_pdl(frame, n, call(nullptr));
    const bench::PerCall idle_off = bench::time_per_call_without_pdl(frame, n, call(skip.as<std::int32_t>()));
    const std::string what = specs2d[tensors.front()].name + " bf16 -> both planes + scales; per call of " +
                             std::to_string(n) + " calls (one per layer) in one graph";
    bench::add_per_call_numbers(extra, n, 1, t, idle);
    extra["no_pdl_ms"] = t_off.graph_ms;
    extra["pdl_speedup"] = t_off.graph_ms / t.graph_ms;
    report(config, t.graph_ms, whole_bytes(s), s.numel(), what + " (programmatic dependent launches)");
    extra.clear();
    bench::add_per_call_numbers(extra, n, 1, t_off, idle_off);
    report(config + "/no-pdl", t_off.graph_ms, whole_bytes(s), s.numel(),
           what + " (ordinary launches: kernels::set_dependent_launch(false))");
    extra.clear();
  }

  // ------------------------------------------------------------ sharded path, rank 1 of 4
  {
    const int world = 4, rank = 1;
    const Layout layout(specs2d, world);
    std::int64_t shard_numel = 0;
    for (const auto& b : layout.buffers()) shard_numel = std::max(shard_numel, b.shard_numel);
    DeviceBuffer master(kCuda, static_cast<std::size_t>(shard_numel) * 4);
    bench::fill_normal(master.data(), master.bytes(), true, 2);
    const auto segments = layout.segments(0, rank);
    std::int64_t shard_elems = 0, full_blocks = 0;
    for (const Segment& g : segments) {
      shard_elems += g.length;
      full_blocks += shapes[static_cast<std::size_t>(g.param)].scale_row_numel() +
                     shapes[static_cast<std::size_t>(g.param)].scale_col_numel();
    }
    // u32 amax buffers of every touched param, side by side.
    DeviceBuffer amax_all(kCuda, static_cast<std::size_t>(full_blocks) * 4);
    for (int scheme = 0; scheme < 2; ++scheme) {
      const bench::CapturedGraph g(st, [&] {
        std::int64_t a_off = 0;
        for (const Segment& sg : segments) {
          const auto p = static_cast<std::size_t>(sg.param);
          const Mxfp8Shape& s = shapes[p];
          const Range range{sg.param_offset, sg.param_offset + sg.length};
          const float* m = master.as<float>() + sg.shard_offset;
          const Mxfp8Planes out = planes(p);
          if (scheme == 0) {
            mxfp8_partial_scales(s, range, m, out.scale_row, out.scale_col, kCuda, st);
            quantize_mxfp8_shard_data(s, range, m, out.scale_row, out.scale_col, out.data_row, out.data_col, kCuda, st);
          } else {
            std::uint32_t* ar = amax_all.as<std::uint32_t>() + a_off;
            std::uint32_t* ac = ar + s.scale_row_numel();
            mxfp8_partial_amax(s, range, m, ar, ac, kCuda, st);
            quantize_mxfp8_shard(s, range, m, ar, ac, out, kCuda, st);
            a_off += s.scale_row_numel() + s.scale_col_numel();
          }
        }
      });
      const double ms = frame.time_ms([&] { g.launch(st); });
      // Bytes moved: phase 1 reads the shard's masters (4 B) and zero-fills the full
      // exchange buffers; phase 2 reads the masters again (4 B) and writes both planes
      // (2 B); scale / amax traffic of the touched tiles ~ 1/16 (2/8 for u32) per element.
      const double shard = static_cast<double>(shard_elems), blocks = static_cast<double>(full_blocks);
      const double bytes = scheme == 0 ? shard * (4 + 4 + 2) + blocks /*memset*/ + shard / 16 * 2 /*write, read*/
                                       : shard * (4 + 4 + 2) + 4 * blocks /*memset*/ + shard / 4 /*amax write*/ +
                                             4 * blocks + blocks /*scales from amax*/ + shard / 16 /*scale read*/;
      report(scheme == 0 ? "shard-w4/scale-max" : "shard-w4/amax-max", ms, bytes, shard_elems,
             "rank 1 of 4: " + std::to_string(segments.size()) + " segments, fp32 master -> phase 1 + phase 2 (" +
                 (scheme == 0 ? "partial scales, shard data" : "partial u32 amax, scales of all blocks + shard data") +
                 "), all-reduce excluded; exchange bytes per rank " +
                 std::to_string(static_cast<long long>(scheme == 0 ? full_blocks : 4 * full_blocks)));
    }
    // Scheme (A) through one Mxfp8ShardBatch (the optimizer's path): the scales of the
    // touched params back to back (one memset), phase 1 and phase 2 one launch each.
    {
      DeviceBuffer scales(kCuda, static_cast<std::size_t>(full_blocks));
      std::vector<Mxfp8ShardTensor> tensors;
      std::int64_t s_off = 0;
      for (const Segment& sg : segments) {
        const auto p = static_cast<std::size_t>(sg.param);
        const Mxfp8Shape& s = shapes[p];
        Mxfp8ShardTensor t;
        t.shape = s;
        t.range = Range{sg.param_offset, sg.param_offset + sg.length};
        t.master = master.as<float>() + sg.shard_offset;
        t.out = planes(p);
        t.out.scale_row = scales.as<std::uint8_t>() + s_off;
        t.out.scale_col = t.out.scale_row + s.scale_row_numel();
        s_off += s.scale_row_numel() + s.scale_col_numel();
        tensors.push_back(t);
      }
      const Mxfp8ShardBatch batch(tensors, kCuda);
      const bench::CapturedGraph g(st, [&] {
        mxfp8_partial_scales_batch(batch, kCuda, st);
        quantize_mxfp8_shard_data_batch(batch, kCuda, st);
      });
      const double ms = frame.time_ms([&] { g.launch(st); });
      const double shard = static_cast<double>(shard_elems), blocks = static_cast<double>(full_blocks);
      extra["grid_blocks"] = batch.grid();
      extra["tiles"] = static_cast<double>(batch.tiles());
      extra["memsets"] = static_cast<double>(batch.scale_spans());
      report("shard-w4/batched", ms, shard * (4 + 4 + 2) + blocks + shard / 16 * 2, shard_elems,
             "rank 1 of 4: " + std::to_string(segments.size()) +
                 " segments in one Mxfp8ShardBatch, fp32 master -> mxfp8_partial_scales_batch + "
                 "quantize_mxfp8_shard_data_batch (scheme A, bytes as shard-w4/scale-max), all-reduce excluded");
      extra.clear();
    }
  }
  return 0;
}
