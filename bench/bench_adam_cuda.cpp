// bench_adam_cuda.cpp - bench_adam's device half (bench_adam.hpp): each configuration's
// captured step timed on the GPU against the copy bandwidth measured in the same process;
// bench_adam.cpp's header comment says what each row is. Compiled only in a CUDA build.
#include "bench_adam.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "cuda_bench.hpp"
#include "results.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/numerics.hpp"
#include "shardopt/presets.hpp"

namespace shardopt::bench_adam {

int run_device(const Options& o) {
  const std::string device = bench::device_name();
  std::string peer_text;
  if (!o.peer_json.empty()) peer_text = read_file(o.peer_json);

  cudaStream_t stream;
  SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Stream st = reinterpret_cast<Stream>(stream);
  const int iters = std::max(o.iters, 20);
  constexpr int kWarmup = 5;

  // Device-to-device copy bandwidth (bytes read + written), 2 GiB each way.
  const double copy_gbps = bench::measure_copy(std::size_t{2} << 30, st, iters, kWarmup).gbps;
  std::printf("device-to-device copy: %.1f GB/s (read + write) on %s\n", copy_gbps, device.c_str());

  for (const Config& c : configs()) {
    if (c.name.find(o.only) == std::string::npos) continue;
    const bool q8 = c.adam.moment_dtype == DType::q8_block;
    const Layout layout = one_bucket_layout(false, q8);
    const auto table = shard_chunks(layout, 0, 0);
    const std::int64_t n = layout.buffers()[0].shard_numel;
    const std::int64_t params = chunk_elements(table);
    const std::size_t un = static_cast<std::size_t>(n);
    DeviceBuffer d_table(Backend::Cuda, table.size() * sizeof(ShardChunk));
    SHARDOPT_CUDA_CHECK(
        cudaMemcpy(d_table.data(), table.data(), table.size() * sizeof(ShardChunk), cudaMemcpyHostToDevice));
    SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());  // a pageable copy may return before its DMA lands
    DeviceBuffer scales(Backend::Cuda, q8 ? 2 * un / kMomentBlock * sizeof(float) : 0);
    if (q8) SHARDOPT_CUDA_CHECK(cudaMemsetAsync(scales.data(), 0, scales.bytes(), stream));
    const bool rem = c.adam.master_storage == MasterStorage::bf16_remainder;
    const std::size_t msize = size_of(c.adam.moment_dtype);
    DeviceBuffer grads(Backend::Cuda, un * size_of(c.adam.grad_dtype)), master(Backend::Cuda, rem ? 0 : un * 4),
        remainders(Backend::Cuda, rem ? un * 2 : 0), m(Backend::Cuda, un * msize), v(Backend::Cuda, un * msize),
        scal(Backend::Cuda, sizeof(StepScalars));
    DeviceBuffer out(Backend::Cuda, c.adam.write_params ? un * size_of(c.adam.param_dtype) : 0);
    // Gradients uniform in [-1e-3, 1e-3], different in every element, so that the 8-bit
    // moments of a block spread over their codes (the encode does its whole search, as it
    // does in training); small finite values elsewhere (0x3C3C3C3C = 0.0115).
    bench::fill_random(grads.data(), c.adam.grad_dtype, n, 7, 1e-3f, st);
    if (rem) {  // the master is the bf16 param 0x3C3C plus a zero remainder
      SHARDOPT_CUDA_CHECK(cudaMemsetAsync(out.data(), 0x3C, out.bytes(), stream));
      SHARDOPT_CUDA_CHECK(cudaMemsetAsync(remainders.data(), 0, remainders.bytes(), stream));
    } else {
      SHARDOPT_CUDA_CHECK(cudaMemsetAsync(master.data(), 0x3C, master.bytes(), stream));
    }
    SHARDOPT_CUDA_CHECK(cudaMemsetAsync(m.data(), 0, m.bytes(), stream));
    SHARDOPT_CUDA_CHECK(cudaMemsetAsync(v.data(), 0, v.bytes(), stream));
    StepScalars s;
    s.lr = 1e-4f;
    SHARDOPT_CUDA_CHECK(cudaMemcpyAsync(scal.data(), &s, sizeof s, cudaMemcpyHostToDevice, stream));
    SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(stream));
    ShardPointers sp;
    sp.chunks = d_table.as<ShardChunk>();
    sp.num_chunks = static_cast<std::int64_t>(table.size());
    sp.shard_numel = n;
    sp.grads = grads.data();
    sp.params = out.data();
    sp.master = rem ? nullptr : master.as<float>();
    sp.remainders = rem ? remainders.as<std::uint16_t>() : nullptr;
    sp.exp_avg = m.data();
    sp.exp_avg_sq = v.data();
    sp.exp_avg_scales = q8 ? scales.as<float>() : nullptr;
    sp.exp_avg_sq_scales = q8 ? scales.as<float>() + un / kMomentBlock : nullptr;
    double ms = 0;
    {
      const bench::CapturedGraph g(st, [&] { fused_adam_step(c.adam, sp, scal.as<StepScalars>(), Backend::Cuda, st); });
      ms = bench::time_ms(st, kWarmup, iters, [&] { g.launch(st); });
    }
    StepScalars after;
    SHARDOPT_CUDA_CHECK(cudaMemcpy(&after, scal.data(), sizeof after, cudaMemcpyDeviceToHost));

    const double bytes = c.bytes_per_param * static_cast<double>(params);
    bench::Result r;
    r.bench = "adam_step";
    r.config = c.name;
    r.device = device;
    r.ours_ms = ms;
    r.limit_ms = bytes / (copy_gbps * 1e9) * 1e3;
    if (!peer_text.empty() && !c.peer_key.empty() && json_number(peer_text, c.peer_key)) {
      r.peer = c.peer_desc;
      r.peer_ms = json_number(peer_text, c.peer_key);
      if (auto pc = json_number(peer_text, "copy_gbps")) r.numbers["peer_copy_gbps"] = *pc;
    }
    r.numbers["gbps"] = bytes / (ms * 1e-3) / 1e9;
    r.numbers["copy_gbps"] = copy_gbps;
    r.numbers["bytes_per_param"] = c.bytes_per_param;
    r.numbers["params"] = static_cast<double>(params);
    r.numbers["tensors"] = static_cast<double>(layout.params().size());
    r.numbers["chunks"] = static_cast<double>(table.size());
    r.numbers["steps_run"] = static_cast<double>(after.step);
    r.command = o.command;
    bench::write(r, o.results);
  }
  SHARDOPT_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace shardopt::bench_adam
