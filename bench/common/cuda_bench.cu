#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "core/streams.hpp"
#include "cuda_bench.hpp"
#include "results.hpp"
#include "shardopt/numerics.hpp"

namespace shardopt::bench {
namespace {
__global__ void fill_kernel(void* data, DType dtype, std::int64_t n, std::uint64_t seed, float scale) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    const float u = static_cast<float>(x & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
    const float v = u * scale;
    switch (dtype) {
      case DType::f32: static_cast<float*>(data)[i] = v; break;
      case DType::bf16: static_cast<std::uint16_t*>(data)[i] = num::f32_to_bf16(v); break;
      case DType::f16: static_cast<std::uint16_t*>(data)[i] = num::f32_to_f16(v); break;
      default: break;
    }
  }
}
}  // namespace

std::string device_name() {
  int dev = 0;
  SHARDOPT_CUDA_CHECK(cudaGetDevice(&dev));
  return device_name(dev);
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  SHARDOPT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

double time_ms(Stream stream, int warmup, int iters, const std::function<void()>& work) {
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  for (int i = 0; i < warmup; ++i) work();
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  SHARDOPT_CUDA_CHECK(cudaEventCreate(&a));
  SHARDOPT_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    SHARDOPT_CUDA_CHECK(cudaEventRecord(a, s));
    work();
    SHARDOPT_CUDA_CHECK(cudaEventRecord(b, s));
    SHARDOPT_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    SHARDOPT_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  SHARDOPT_CUDA_CHECK(cudaEventDestroy(a));
  SHARDOPT_CUDA_CHECK(cudaEventDestroy(b));
  return median(ms);
}

CopyBandwidth measure_copy(std::size_t bytes, Stream stream, int iters, int warmup) {
  void *src = nullptr, *dst = nullptr;
  SHARDOPT_CUDA_CHECK(cudaMalloc(&src, bytes));
  SHARDOPT_CUDA_CHECK(cudaMalloc(&dst, bytes));
  fill_random(src, DType::f32, static_cast<std::int64_t>(bytes / 4), 1, 1.0f, stream);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  CopyBandwidth r;
  r.ms = time_ms(stream, warmup, iters, [&] { SHARDOPT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)); });
  r.gbps = 2.0 * static_cast<double>(bytes) / (r.ms * 1e6);
  SHARDOPT_CUDA_CHECK(cudaFree(src));
  SHARDOPT_CUDA_CHECK(cudaFree(dst));
  return r;
}

double duplex_copy_ms(Stream stream, int iters, std::size_t bytes, std::size_t piece) {
  DeviceBuffer host(Backend::Cuda, bytes, MemoryKind::Pinned);  // read up and written down, as a step's arrays are
  DeviceBuffer dev(Backend::Cuda, std::min(bytes, 4 * piece));  // a ring of four pieces, as the step's
  SideStream up(Backend::Cuda), down(Backend::Cuda);
  Event forked(Backend::Cuda), up_done(Backend::Cuda), down_done(Backend::Cuda);
  const std::size_t ring = dev.bytes();
  return time_ms(stream, 2, iters, [&] {
    forked.record(stream);
    forked.wait(up.get());
    forked.wait(down.get());
    for (std::size_t at = 0, k = 0; at < bytes; at += piece, ++k) {
      const std::size_t n = std::min(piece, bytes - at);
      const std::size_t slot = (k * piece) % ring;
      SHARDOPT_CUDA_CHECK(cudaMemcpyAsync(dev.as<char>() + slot, host.as<char>() + at, n, cudaMemcpyHostToDevice,
                                          reinterpret_cast<cudaStream_t>(up.get())));
      SHARDOPT_CUDA_CHECK(cudaMemcpyAsync(host.as<char>() + at, dev.as<char>() + (ring - n - slot) % ring, n,
                                          cudaMemcpyDeviceToHost, reinterpret_cast<cudaStream_t>(down.get())));
    }
    up_done.record(up.get());
    down_done.record(down.get());
    up_done.wait(stream);
    down_done.wait(stream);
  });
}

BandwidthBench::BandwidthBench(std::string bench, int argc, char** argv, int warmup, int iters)
    : bench_(std::move(bench)), device_(device_name()), command_(command_line(argc, argv)), warmup_(warmup),
      iters_(iters) {
  cudaStream_t s = nullptr;
  SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = reinterpret_cast<Stream>(s);
  copy_gbps_ = measure_copy(std::size_t{1} << 30, stream_, iters_, warmup_).gbps;
  std::printf("device-to-device copy: %.1f GB/s (read + write)\n", copy_gbps_);
}

BandwidthBench::~BandwidthBench() { (void)cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream_)); }

double BandwidthBench::time_ms(const std::function<void()>& work) const {
  return bench::time_ms(stream_, warmup_, iters_, work);
}

Result BandwidthBench::result(const std::string& config, double ours_ms, double bytes, std::int64_t elements) const {
  Result r = bandwidth_result(bench_, config, ours_ms, bytes, elements, copy_gbps_);
  r.device = device_;
  r.command = command_;
  return r;
}

CapturedGraph::CapturedGraph(Stream stream, const std::function<void()>& work) {
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  SHARDOPT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  work();
  SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  graph_ = graph;
  SHARDOPT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  exec_ = exec;
}

CapturedGraph::~CapturedGraph() {
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_ != nullptr) (void)cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

void CapturedGraph::launch(Stream stream) const {
  SHARDOPT_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), reinterpret_cast<cudaStream_t>(stream)));
}

EventMarks::EventMarks(int count) : events_(static_cast<std::size_t>(count), nullptr) {
  for (auto& e : events_) {
    cudaEvent_t ev = nullptr;
    SHARDOPT_CUDA_CHECK(cudaEventCreate(&ev));
    e = ev;
  }
}

EventMarks::~EventMarks() {
  for (void* e : events_)
    if (e != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

void EventMarks::record(int i, Stream stream) {
  SHARDOPT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(events_.at(static_cast<std::size_t>(i))),
                                      reinterpret_cast<cudaStream_t>(stream)));
}

double EventMarks::ms(int from, int to) const {
  float t = 0;
  SHARDOPT_CUDA_CHECK(cudaEventElapsedTime(&t, static_cast<cudaEvent_t>(events_.at(static_cast<std::size_t>(from))),
                                           static_cast<cudaEvent_t>(events_.at(static_cast<std::size_t>(to)))));
  return t;
}

void fill_random(void* data, DType dtype, std::int64_t n, std::uint64_t seed, float scale, Stream stream) {
  if (n == 0) return;
  const std::int64_t blocks = std::min<std::int64_t>((n + 255) / 256, 8192);
  fill_kernel<<<static_cast<unsigned>(blocks), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(data, dtype, n, seed,
                                                                                                 scale);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void fill_normal(void* dst, std::size_t bytes, bool f32, std::uint32_t seed) {
  const std::size_t chunk = std::min<std::size_t>(bytes, std::size_t{64} << 20);
  std::vector<unsigned char> host(chunk);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (std::size_t i = 0; i + 4 <= chunk; i += 4) {
    const float v = normal(rng);
    std::uint32_t u;
    std::memcpy(&u, &v, 4);
    if (!f32) u = (u >> 16) | (u & 0xFFFF0000u);  // two bf16 values (truncated: any bits will do)
    std::memcpy(host.data() + i, &u, 4);
  }
  for (std::size_t off = 0; off < bytes; off += chunk)
    SHARDOPT_CUDA_CHECK(cudaMemcpy(static_cast<char*>(dst) + off, host.data(), std::min(chunk, bytes - off),
                                   cudaMemcpyHostToDevice));
  SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());  // a pageable copy may return before its DMA lands
}

}  // namespace shardopt::bench
