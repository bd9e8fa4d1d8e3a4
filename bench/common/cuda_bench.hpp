// cuda_bench.hpp - timing, graph and data helpers shared by the CUDA benchmarks
// (bench_adam, bench_mxfp8, bench_nvfp4, bench_dist_adam, bench_fsdp, bench_comm,
// bench_trace, mpi_bench): the benchmarks' Host/CUDA seam. Defined by cuda_bench.cu in a
// CUDA build and by cuda_bench_none.cpp without CUDA, where every call throws
// Error(Unsupported) (a host-backend run never makes one), so that no benchmark file
// switches on the build's CUDA.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "results.hpp"
#include "shardopt/backend.hpp"
#include "shardopt/dtype.hpp"

namespace shardopt::bench {

/// Device name of the current CUDA device (cudaGetDeviceProperties).
std::string device_name();
/// Device name of CUDA device `device`.
std::string device_name(int device);

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

/// The frame of a benchmark measured against copy bandwidth (bench_mxfp8, bench_nvfp4):
/// a non-blocking stream, the copy bandwidth of a 1 GiB device-to-device copy measured on
/// it (printed), the device name and the command line for its results.
class BandwidthBench {
 public:
  /// Creates the stream and measures the copy (`iters` timed copies after `warmup`);
  /// time_ms uses the same counts.
  BandwidthBench(std::string bench, int argc, char** argv, int warmup, int iters);
  ~BandwidthBench();
  BandwidthBench(const BandwidthBench&) = delete;
  BandwidthBench& operator=(const BandwidthBench&) = delete;

  Stream stream() const { return stream_; }
  /// Copy bandwidth, GB/s of bytes read plus bytes written.
  double copy_gbps() const { return copy_gbps_; }
  /// Median milliseconds of `work` on the stream (bench::time_ms).
  double time_ms(const std::function<void()>& work) const;
  /// bandwidth_result of this bench on the copy bandwidth, with device and command set.
  Result result(const std::string& config, double ours_ms, double bytes, std::int64_t elements) const;

 private:
  std::string bench_, device_, command_;
  int warmup_ = 0, iters_ = 0;
  Stream stream_ = nullptr;
  double copy_gbps_ = 0;
};

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

/// Median milliseconds of copying `bytes` of pinned host memory up to the device and the
/// same bytes back down at once (two streams: the copy engines of both directions), in
/// pieces of `piece` bytes through a device ring of four pieces: the PCIe limit of an
/// offloaded step's bytes (docs/offload.md), `iters` timed runs after 2 untimed.
double duplex_copy_ms(Stream stream, int iters, std::size_t bytes, std::size_t piece);

/// `count` CUDA events, recorded by index on a stream, and the milliseconds between two
/// of them once both have completed (destroyed with the object).
class EventMarks {
 public:
  explicit EventMarks(int count);
  ~EventMarks();
  EventMarks(const EventMarks&) = delete;
  EventMarks& operator=(const EventMarks&) = delete;
  /// Records event `i` on `stream`.
  void record(int i, Stream stream);
  /// Milliseconds from event `from` to event `to` (both recorded and completed).
  double ms(int from, int to) const;

 private:
  std::vector<void*> events_;  // cudaEvent_t
};

/// Fills n elements of a float storage type with values uniform in [-scale, scale]
/// from a hash of (seed, index): random-looking, reproducible, never all zero.
void fill_random(void* data, DType dtype, std::int64_t n, std::uint64_t seed, float scale, Stream stream);

/// Fills `bytes` of device memory with a repeated pattern of normal(0, 0.02) values
/// (weight-like magnitudes, unlike fill_random's uniform ones): f32 masters when `f32`,
/// else bf16 weights. Synchronous (cudaMemcpy from a host pattern of at most 64 MiB).
void fill_normal(void* dst, std::size_t bytes, bool f32, std::uint32_t seed);

}  // namespace shardopt::bench
