// cuda_bench.hpp - timing and data helpers shared by the CUDA benchmarks.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardopt/backend.hpp"
#include "shardopt/dtype.hpp"

namespace shardopt::bench {

/// Device name of the current CUDA device (cudaGetDeviceProperties).
std::string device_name();

/// Median milliseconds of `iters` runs of `work` on `stream`, each bracketed by CUDA
/// events, after `warmup` untimed runs.
double time_ms(Stream stream, int warmup, int iters, const std::function<void()>& work);

/// Median device-to-device copy time (ms) of `bytes` and the bandwidth it implies in
/// GB/s counting bytes read plus bytes written.
struct CopyBandwidth {
  double ms = 0;
  double gbps = 0;
};
CopyBandwidth measure_copy(std::size_t bytes, Stream stream, int iters = 20);

/// Fills n elements of a float storage type with values uniform in [-scale, scale]
/// from a hash of (seed, index): random-looking, reproducible, never all zero.
void fill_random(void* data, DType dtype, std::int64_t n, std::uint64_t seed, float scale, Stream stream);

}  // namespace shardopt::bench
