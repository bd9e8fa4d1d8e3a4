// cuda_bench.hpp - timing, graph and data helpers shared by the CUDA benchmarks
// (bench_adam, bench_mxfp8, bench_dist_adam, bench_fsdp).
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
/// GB/s counting bytes read plus bytes written (time_ms of one cudaMemcpyAsync between
/// two fresh buffers, `warmup` untimed copies first).
struct CopyBandwidth {
  double ms = 0;
  double gbps = 0;
};
CopyBandwidth measure_copy(std::size_t bytes, Stream stream, int iters = 20, int warmup = 3);

/// A CUDA graph of the work one call issues on a stream (captured in thread-local mode
/// when constructed, destroyed with the object).
class CapturedGraph {
 public:
  /// Captures what `work` enqueues on `stream` and instantiates it.
  CapturedGraph(Stream stream, const std::function<void()>& work);
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  /// Enqueues one replay of the graph on `stream`.
  void launch(Stream stream) const;
  /// The captured graph (a cudaGraph_t), e.g. to count its nodes.
  void* graph() const { return graph_; }

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

/// Fills n elements of a float storage type with values uniform in [-scale, scale]
/// from a hash of (seed, index): random-looking, reproducible, never all zero.
void fill_random(void* data, DType dtype, std::int64_t n, std::uint64_t seed, float scale, Stream stream);

}  // namespace shardopt::bench
