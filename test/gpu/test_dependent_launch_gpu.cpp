// Programmatic dependent launches of the whole-tensor MXFP8 / NVFP4 quantize kernels
// (kernels/common/dependent_launch.cuh, issue 29): on a created stream, with the switch
// on (the default) and off, the bytes are the same and the host twin's; 16 back-to-back
// small calls of each format captured in one CUDA graph (two memsets among them: a
// dependent launch after a node that is not a kernel) give the eager bytes and the
// twin's, on every replay (new inputs between replays); a quantize behind a kernel that
// writes its input late (after letting dependents launch) sees the written values,
// eagerly and in a graph, and one behind a kernel that sets the skip flag late writes
// nothing. (The other GPU suites keep checking the kernels against the twin and the
// oracles with the switch on.)
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "dependent_launch_kernels.hpp"
#include "kernels/common/dependent_launch.hpp"
#include "shardopt/mxfp8.hpp"
#include "shardopt/nvfp4.hpp"
#include "unit/test_mxfp8_common.hpp"
#include "unit/test_nvfp4_common.hpp"

namespace {
using namespace shardopt;

constexpr Backend kCuda = Backend::Cuda;
constexpr Backend kHost = Backend::Host;

// A created (non-blocking) stream, as steps use (the other GPU suites quantize on the
// default stream).
struct TestStream {
  cudaStream_t s = nullptr;
  TestStream() { SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~TestStream() { cudaStreamDestroy(s); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  Stream st() const { return reinterpret_cast<Stream>(s); }
  void sync() const { SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(s)); }
};

// The work `enqueue` puts on the stream, captured in a graph.
struct Graph {
  cudaGraphExec_t exec = nullptr;
  Graph(const TestStream& stream, const std::function<void()>& enqueue) {
    cudaGraph_t graph = nullptr;
    SHARDOPT_CUDA_CHECK(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal));
    enqueue();
    SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(stream.s, &graph));
    SHARDOPT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    SHARDOPT_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  ~Graph() { cudaGraphExecDestroy(exec); }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void replay(const TestStream& stream) const {
    SHARDOPT_CUDA_CHECK(cudaGraphLaunch(exec, stream.s));
    stream.sync();
  }
};

// The work `enqueue` puts on the stream, run eagerly or captured in a graph and replayed.
void run(const TestStream& stream, bool captured, const std::function<void()>& enqueue) {
  if (captured) {
    const Graph graph(stream, enqueue);
    graph.replay(stream);
  } else {
    enqueue();
    stream.sync();
  }
}

// Synchronous uploads (test::from_host) may still be in flight for a non-blocking stream.
void device_sync() { SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize()); }

// The quantize entry point of each format, on the CUDA backend.
void quantize_on_stream(const Mxfp8Shape& s, const std::uint16_t* src, const Mxfp8Planes& out,
                        const std::int32_t* flag, Stream st) {
  quantize_mxfp8(s, src, out, flag, kCuda, st);
}
void quantize_on_stream(const Nvfp4Shape& s, const std::uint16_t* src, const Nvfp4Planes& out,
                        const std::int32_t* flag, Stream st) {
  quantize_nvfp4(s, src, out, flag, kCuda, st);
}

// One tensor of a format in device memory: its source and its (poisoned) outputs.
template <class Shape, class Planes, class Quantized>
struct Tensor {
  Shape shape;
  DeviceBuffer src;
  Planes out;
  Tensor(const Shape& s, const std::vector<std::uint16_t>& x)
      : shape(s), src(mxfp8_test::upload(kCuda, x)), out(kCuda, s) {}
  void quantize(Stream st, const std::int32_t* flag = nullptr) const {
    quantize_on_stream(shape, src.as<std::uint16_t>(), out.planes(), flag, st);
  }
  void poison() { out = Planes(kCuda, shape); }
  Quantized get() const { return out.get(kCuda, shape); }
};
using Mx = Tensor<Mxfp8Shape, mxfp8_test::DevicePlanes, mxfp8_ref::Quantized>;
using Nv = Tensor<Nvfp4Shape, nvfp4_test::DevicePlanes, nvfp4_ref::Quantized>;

// The host twin's bytes of each format.
mxfp8_ref::Quantized twin_of(const Mxfp8Shape& s, const std::vector<std::uint16_t>& x) {
  return mxfp8_test::quantize_on(kHost, s, x);
}
nvfp4_ref::Quantized twin_of(const Nvfp4Shape& s, const std::vector<std::uint16_t>& x) {
  return nvfp4_test::quantize_on(kHost, s, x);
}

// For each shape: the CUDA call with the switch on and off, each against the twin.
template <class T, class Shape>
void expect_same_bytes_either_way(const TestStream& stream, const std::vector<Shape>& shapes, std::uint32_t seed,
                                  const char* format) {
  for (const Shape& s : shapes) {
    const std::vector<std::uint16_t> x = mxfp8_test::random_bf16(s.numel(), s.cols, seed++, -20, 20);
    const auto twin = twin_of(s, x);
    for (bool on : {true, false}) {
      const kernels::DependentLaunchScope sw(on);
      T t(s, x);
      device_sync();
      t.quantize(stream.st());
      stream.sync();
      EXPECT_TRUE(t.get() == twin) << format << " " << s.numel() << " elements (" << s.rows << " x " << s.cols
                                   << " a member), switch " << on << ": differs from the host twin";
    }
  }
}

TEST(DependentLaunchGpu, SwitchOnAndOffGiveTheSameBytes) {
  EXPECT_TRUE(kernels::dependent_launch()) << "dependent launches are on by default";
  const TestStream stream;
  // Small tensors (the geometry of small calls: few tiles, split amax chunks, tile blocks
  // of 1-4 warps), a partial tile, members, an untiled NVFP4 shape, one large enough for
  // whole amax chunks and 8-warp tile blocks. NVFP4 on a GPU of 132 SMs (H100, H200):
  // 512 x 2048 takes amax parts of 1/8 chunk and tile blocks of 1 warp, 1001 x 2048
  // parts of 1/4 (a partial last chunk and block row) and blocks of 2 warps, 2048 x 2048
  // parts of 1/2 and blocks of 4, 4096 x 2048 whole chunks and blocks of 8.
  expect_same_bytes_either_way<Mx>(stream,
                                   std::vector<Mxfp8Shape>{{1, 512, 2048}, {1, 48, 200}, {3, 33, 130}, {1, 2048, 2048}},
                                   11, "MXFP8");
  expect_same_bytes_either_way<Nv>(
      stream,
      std::vector<Nvfp4Shape>{{512, 2048}, {48, 200}, {130, 129}, {17, 4096}, {1001, 2048}, {2048, 2048}, {4096, 2048}},
      21, "NVFP4");
}

// 16 calls of each format, interleaved (MXFP8 k, NVFP4 k), each on its own tensor.
// Captured once; replayed, then replayed again on new inputs.
TEST(DependentLaunchGpu, SixteenSmallCallsInOneGraph) {
  constexpr int kCalls = 16;
  const Mxfp8Shape ms{1, 512, 2048};
  const Nvfp4Shape ns{512, 2048};
  const TestStream stream;
  std::vector<std::vector<std::uint16_t>> x;
  std::vector<Mx> mx;
  std::vector<Nv> nv;
  mx.reserve(kCalls);
  nv.reserve(kCalls);
  for (int k = 0; k < kCalls; ++k) {
    x.push_back(mxfp8_test::random_bf16(ms.numel(), ms.cols, 100 + static_cast<std::uint32_t>(k), -10, 10));
    mx.emplace_back(ms, x.back());
    nv.emplace_back(ns, x.back());
  }
  device_sync();
  // Memsets of outputs before the first call and before the 9th: a dependent launch after
  // a node that is not a kernel, eagerly and captured (the calls overwrite the bytes).
  auto poison_async = [&](const DeviceBuffer& b) {
    SHARDOPT_CUDA_CHECK(cudaMemsetAsync(b.data(), mxfp8_test::kPoison, b.bytes(), stream.s));
  };
  auto enqueue = [&] {
    for (int k = 0; k < kCalls; ++k) {
      const auto i = static_cast<std::size_t>(k);
      if (k == 0) poison_async(mx[i].out.data_row);
      if (k == 8) poison_async(nv[i].out.data);
      mx[i].quantize(stream.st());
      nv[i].quantize(stream.st());
    }
  };
  enqueue();  // eager
  stream.sync();
  std::vector<mxfp8_ref::Quantized> eager_mx;
  std::vector<nvfp4_ref::Quantized> eager_nv;
  for (int k = 0; k < kCalls; ++k) {
    const auto i = static_cast<std::size_t>(k);
    eager_mx.push_back(mx[i].get());
    eager_nv.push_back(nv[i].get());
    EXPECT_TRUE(eager_mx[i] == twin_of(ms, x[i])) << "eager MXFP8 call " << k;
    EXPECT_TRUE(eager_nv[i] == twin_of(ns, x[i])) << "eager NVFP4 call " << k;
    mx[i].poison();
    nv[i].poison();
  }
  device_sync();
  const Graph graph(stream, enqueue);
  graph.replay(stream);
  for (int k = 0; k < kCalls; ++k) {
    const auto i = static_cast<std::size_t>(k);
    EXPECT_TRUE(mx[i].get() == eager_mx[i]) << "replayed MXFP8 call " << k << " differs from the eager one";
    EXPECT_TRUE(nv[i].get() == eager_nv[i]) << "replayed NVFP4 call " << k << " differs from the eager one";
  }
  // New inputs (other magnitudes, so other amaxes and scales), the same graph.
  for (int k = 0; k < kCalls; ++k) {
    const auto i = static_cast<std::size_t>(k);
    x[i] = mxfp8_test::random_bf16(ms.numel(), ms.cols, 500 + static_cast<std::uint32_t>(k), -25, 25);
    test::from_host(kCuda, mx[i].src.data(), x[i]);
    test::from_host(kCuda, nv[i].src.data(), x[i]);
  }
  device_sync();
  graph.replay(stream);
  for (int k = 0; k < kCalls; ++k) {
    const auto i = static_cast<std::size_t>(k);
    EXPECT_TRUE(mx[i].get() == twin_of(ms, x[i])) << "second replay, MXFP8 call " << k;
    EXPECT_TRUE(nv[i].get() == twin_of(ns, x[i])) << "second replay, NVFP4 call " << k;
  }
}

// A kernel that lets its dependents launch at once and writes the source only ~200 us
// later: a quantize that read its source before waiting would see the old values (zeros).
TEST(DependentLaunchGpu, QuantizeSeesTheSourceTheKernelBeforeWrote) {
  constexpr int kSpinUs = 200;
  const Mxfp8Shape ms{1, 512, 2048};
  const Nvfp4Shape ns{512, 2048};
  const TestStream stream;
  const std::vector<std::uint16_t> zeros(static_cast<std::size_t>(ms.numel()), 0);
  for (bool captured : {false, true}) {
    const std::vector<std::uint16_t> x =
        mxfp8_test::random_bf16(ms.numel(), ms.cols, captured ? 71u : 70u, -15, 15);
    const DeviceBuffer values = mxfp8_test::upload(kCuda, x);
    Mx m(ms, zeros);
    Nv n(ns, zeros);
    device_sync();
    // Each quantize follows the late writer of its own source.
    auto enqueue = [&] {
      dependent_launch_test::launch_late_copy(m.src.as<std::uint16_t>(), values.as<std::uint16_t>(), ms.numel(),
                                              kSpinUs, stream.s);
      m.quantize(stream.st());
      dependent_launch_test::launch_late_copy(n.src.as<std::uint16_t>(), values.as<std::uint16_t>(), ns.numel(),
                                              kSpinUs, stream.s);
      n.quantize(stream.st());
    };
    run(stream, captured, enqueue);
    EXPECT_TRUE(m.get() == twin_of(ms, x))
        << "MXFP8 (graph " << captured << "): not the twin's bytes of the written source";
    EXPECT_TRUE(n.get() == twin_of(ns, x))
        << "NVFP4 (graph " << captured << "): not the twin's bytes of the written source";
  }
}

// The skip flag set late by the kernel before: every quantize kernel must read it after
// the wait, so the call writes nothing (the poisoned outputs stay).
TEST(DependentLaunchGpu, QuantizeSeesTheSkipFlagTheKernelBeforeSet) {
  constexpr int kSpinUs = 200;
  const Mxfp8Shape ms{1, 512, 2048};
  const Nvfp4Shape ns{512, 2048};
  const TestStream stream;
  const std::vector<std::uint16_t> x = mxfp8_test::random_bf16(ms.numel(), ms.cols, 90, -15, 15);
  const DeviceBuffer one = mxfp8_test::upload(kCuda, std::vector<std::uint16_t>{1});
  for (bool captured : {false, true}) {
    const DeviceBuffer flag = mxfp8_test::upload(kCuda, std::vector<std::int32_t>{0});
    Mx m(ms, x);
    Nv n(ns, x);
    const mxfp8_ref::Quantized m_before = m.get();
    const nvfp4_ref::Quantized n_before = n.get();
    device_sync();
    auto enqueue = [&] {
      // The flag's low half (little-endian) becomes 1.
      dependent_launch_test::launch_late_copy(flag.as<std::uint16_t>(), one.as<std::uint16_t>(), 1, kSpinUs, stream.s);
      m.quantize(stream.st(), flag.as<std::int32_t>());
      n.quantize(stream.st(), flag.as<std::int32_t>());
    };
    run(stream, captured, enqueue);
    EXPECT_TRUE(m.get() == m_before) << "MXFP8 (graph " << captured << ") wrote with the flag set";
    EXPECT_TRUE(n.get() == n_before) << "NVFP4 (graph " << captured << ") wrote with the flag set";
  }
}

// Two NVFP4 calls on the same outputs, back to back: the second call's zeroing of the
// amax slot must wait for the first call's tile kernel, which reads it, and the second's
// tile kernel for its own amax pass. The result is the twin's of the second input (whose
// amax is smaller, so a stale amax from the first would give other scales).
TEST(DependentLaunchGpu, BackToBackCallsOnTheSameOutputs) {
  const Nvfp4Shape ns{512, 2048};
  const Mxfp8Shape ms{1, 512, 2048};
  const TestStream stream;
  // No raw bit patterns (raw_fraction 0): the amaxes differ by 2^20 or more.
  const std::vector<std::uint16_t> big = mxfp8_test::random_bf16(ns.numel(), ns.cols, 31, 20, 25, 0.0);
  const std::vector<std::uint16_t> small = mxfp8_test::random_bf16(ns.numel(), ns.cols, 32, -5, 0, 0.0);
  for (bool captured : {false, true}) {
    Nv first(ns, big);
    Nv second(ns, small);
    Mx mfirst(ms, big);
    Mx msecond(ms, small);
    device_sync();
    // second and msecond write into first's and mfirst's outputs.
    auto enqueue = [&] {
      for (int round = 0; round < 4; ++round) {
        first.quantize(stream.st());
        quantize_nvfp4(ns, second.src.as<std::uint16_t>(), first.out.planes(), nullptr, kCuda, stream.st());
        mfirst.quantize(stream.st());
        quantize_mxfp8(ms, msecond.src.as<std::uint16_t>(), mfirst.out.planes(), nullptr, kCuda, stream.st());
      }
    };
    run(stream, captured, enqueue);
    EXPECT_TRUE(first.get() == twin_of(ns, small)) << "NVFP4, graph " << captured;
    EXPECT_TRUE(mfirst.get() == twin_of(ms, small)) << "MXFP8, graph " << captured;
  }
}

}  // namespace
