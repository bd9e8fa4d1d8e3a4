// The bf16-output MXFP8 decode on the GPU: the kernel equals its host twin bitwise for
// every code under every scale byte in both planes, on Llama-sized and grouped planes,
// odd widths and unaligned pointers (both the 8-wide and the one-element kernel), under
// CUDA graph capture; and it equals the GPU's f32 decode followed by the bf16 cast
// except for NaNs, which it writes as one NaN. The batched decode (dequantize_mxfp8_batch)
// equals the host twin over mixed lists longer than one launch, and runs at graph launch.
// Exits 77 (skipped) without a GPU.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "kernels/common/convert.hpp"
#include "shardopt/mxfp8.hpp"
#include "unit/test_mxfp8_common.hpp"
#include "unit/test_mxfp8_decode_common.hpp"

namespace {
using namespace shardopt;
using mxfp8_test::download;
using mxfp8_test::upload;

constexpr Backend kCuda = Backend::Cuda;
constexpr Backend kHost = Backend::Host;

std::string name_of(const Mxfp8Shape& s, Mxfp8Plane plane) {
  return std::to_string(s.members) + "x" + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
         (plane == Mxfp8Plane::Rowwise ? " rowwise" : " columnwise");
}

std::vector<std::uint16_t> host_decode(const Mxfp8Shape& s, Mxfp8Plane plane, const std::vector<std::uint8_t>& data,
                                       const std::vector<std::uint8_t>& scale) {
  std::vector<std::uint16_t> out(data.size(), 0xDEAD);
  dequantize_mxfp8(s, plane, data.data(), scale.data(), out.data(), kHost, nullptr);
  return out;
}

// The GPU decode with each pointer `*_off` bytes (out: elements) past a 256-byte
// boundary, into a poisoned output; the bytes around the output must stay poisoned.
std::vector<std::uint16_t> gpu_decode(const Mxfp8Shape& s, Mxfp8Plane plane, const std::vector<std::uint8_t>& data,
                                      const std::vector<std::uint8_t>& scale, int data_off = 0, int scale_off = 0,
                                      int out_off = 0) {
  std::vector<std::uint8_t> d(data.size() + static_cast<std::size_t>(data_off)), sc(scale.size() + scale_off);
  std::copy(data.begin(), data.end(), d.begin() + data_off);
  std::copy(scale.begin(), scale.end(), sc.begin() + scale_off);
  const DeviceBuffer dd = upload(kCuda, d), ds = upload(kCuda, sc);
  const std::size_t n = data.size(), guard = 8;
  const DeviceBuffer dout = upload(kCuda, std::vector<std::uint16_t>(n + out_off + guard, 0xDEAD));
  dequantize_mxfp8(s, plane, dd.as<std::uint8_t>() + data_off, ds.as<std::uint8_t>() + scale_off,
                   dout.as<std::uint16_t>() + out_off, kCuda, nullptr);
  const auto all = download<std::uint16_t>(kCuda, dout, n + out_off + guard);
  for (std::size_t i = 0; i < static_cast<std::size_t>(out_off); ++i) EXPECT_EQ(all[i], 0xDEAD) << "before the output";
  for (std::size_t i = n + out_off; i < all.size(); ++i) EXPECT_EQ(all[i], 0xDEAD) << "after the output";
  return {all.begin() + out_off, all.begin() + out_off + static_cast<std::ptrdiff_t>(n)};
}

using mxfp8_decode_test::random_plane;

void expect_equal(const std::vector<std::uint16_t>& got, const std::vector<std::uint16_t>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << what << " at element " << i;
}

TEST(Mxfp8DecodeBf16Gpu, EveryCodeUnderEveryScaleKernelEqualsHostTwin) {
  const Mxfp8Shape s = mxfp8_decode_test::all_pairs_shape();
  for (Mxfp8Plane plane : {Mxfp8Plane::Rowwise, Mxfp8Plane::Columnwise}) {
    const auto p = mxfp8_decode_test::all_pairs(plane);
    const auto want = host_decode(s, plane, p.data, p.scale);
    expect_equal(gpu_decode(s, plane, p.data, p.scale), want, "8-wide, " + name_of(s, plane));
    expect_equal(gpu_decode(s, plane, p.data, p.scale, 1), want, "one element, " + name_of(s, plane));
  }
}

// Shapes: Llama MLP planes (whole blocks), grouped members with a partial columnwise
// block, widths of 8 (vector) and of 70 / 100 (one element per thread). Offsets: data
// 1 byte, scale 1 byte (columnwise needs 8-byte scales for the 8-wide kernel), output
// 4 elements (8 bytes, not 16): each sends the call to the one-element kernel.
TEST(Mxfp8DecodeBf16Gpu, ShapesAndAlignmentsKernelEqualsHostTwin) {
  struct Offsets {
    int data, scale, out;
  };
  const std::vector<Mxfp8Shape> shapes{{1, 2048, 8192}, {1, 8192, 2048}, {4, 96, 256}, {3, 45, 70},
                                       {1, 33, 8},      {2, 64, 100},    {1, 1, 8}};
  const std::vector<Offsets> offsets{{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {0, 0, 4}, {0, 0, 8}};
  unsigned seed = 1;
  for (const Mxfp8Shape& s : shapes)
    for (Mxfp8Plane plane : {Mxfp8Plane::Rowwise, Mxfp8Plane::Columnwise}) {
      const auto p = random_plane(s, plane, seed++);
      const auto want = host_decode(s, plane, p.data, p.scale);
      const bool big = s.numel() > (1 << 20);
      for (const Offsets& o : offsets) {
        if (big && o.data + o.scale + o.out != 0 && o.out != 4) continue;  // big planes: aligned and one misaligned
        expect_equal(gpu_decode(s, plane, p.data, p.scale, o.data, o.scale, o.out), want,
                     name_of(s, plane) + " offsets " + std::to_string(o.data) + "/" + std::to_string(o.scale) + "/" +
                         std::to_string(o.out));
      }
    }
}

// Today's two-pass path on the GPU (the f32 decode, then the bf16 cast) gives the same
// bits wherever the value is not NaN; NaNs come out as the one NaN 0x7FC0.
TEST(Mxfp8DecodeBf16Gpu, EqualsTheGpuF32DecodeThenTheBf16CastExceptNaNs) {
  const Mxfp8Shape s{1, 2048, 8192};
  for (Mxfp8Plane plane : {Mxfp8Plane::Rowwise, Mxfp8Plane::Columnwise}) {
    const auto p = random_plane(s, plane, 99);
    const DeviceBuffer dd = upload(kCuda, p.data), ds = upload(kCuda, p.scale);
    DeviceBuffer f32(kCuda, p.data.size() * 4), cast(kCuda, p.data.size() * 2), one(kCuda, p.data.size() * 2);
    dequantize_mxfp8(s, plane, dd.as<std::uint8_t>(), ds.as<std::uint8_t>(), f32.as<float>(), kCuda, nullptr);
    kernels::convert(f32.data(), DType::f32, cast.data(), DType::bf16, s.numel(), kCuda, nullptr);
    dequantize_mxfp8(s, plane, dd.as<std::uint8_t>(), ds.as<std::uint8_t>(), one.as<std::uint16_t>(), kCuda, nullptr);
    const auto two_pass = download<std::uint16_t>(kCuda, cast, p.data.size());
    const auto one_pass = download<std::uint16_t>(kCuda, one, p.data.size());
    std::size_t nans = 0;
    for (std::size_t i = 0; i < one_pass.size(); ++i) {
      const bool nan = (two_pass[i] & 0x7FFF) > 0x7F80;
      nans += nan;
      ASSERT_EQ(one_pass[i], nan ? 0x7FC0 : two_pass[i]) << name_of(s, plane) << " at element " << i;
    }
    EXPECT_GT(nans, 0u) << "the case lost its NaNs";
  }
}

// Captured into a CUDA graph, the decode runs at each launch on the data of that time.
TEST(Mxfp8DecodeBf16Gpu, CapturedDecodeRunsAtLaunchOnLaunchTimeData) {
  const Mxfp8Shape s{2, 96, 256};
  const auto p = random_plane(s, Mxfp8Plane::Columnwise, 7);
  const DeviceBuffer dd = upload(kCuda, p.data), ds = upload(kCuda, p.scale);
  const DeviceBuffer out = upload(kCuda, std::vector<std::uint16_t>(p.data.size(), 0xDEAD));
  cudaStream_t st = nullptr;
  SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  SHARDOPT_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  dequantize_mxfp8(s, Mxfp8Plane::Columnwise, dd.as<std::uint8_t>(), ds.as<std::uint8_t>(), out.as<std::uint16_t>(),
                   kCuda, reinterpret_cast<Stream>(st));
  SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  SHARDOPT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  EXPECT_EQ(download<std::uint16_t>(kCuda, out, 1)[0], 0xDEAD) << "nothing runs at capture";
  const auto q = random_plane(s, Mxfp8Plane::Columnwise, 8);  // the next step's planes
  shardopt::test::from_host(kCuda, dd.data(), q.data);
  shardopt::test::from_host(kCuda, ds.data(), q.scale);
  SHARDOPT_CUDA_CHECK(cudaGraphLaunch(exec, st));
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(st));
  expect_equal(download<std::uint16_t>(kCuda, out, q.data.size()), host_decode(s, Mxfp8Plane::Columnwise, q.data, q.scale),
               "graph launch");
  SHARDOPT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SHARDOPT_CUDA_CHECK(cudaGraphDestroy(graph));
  SHARDOPT_CUDA_CHECK(cudaStreamDestroy(st));
}

// The batch on the device equals the batch on the host (= one host decode per tensor and
// the reference: the host suite), both paths of its kernel, over two launches' worth of
// tensors, with nothing written outside the outputs.
TEST(Mxfp8DecodeBf16Gpu, BatchEqualsHostTwin) {
  const std::vector<mxfp8_decode_test::BatchCase> cases = mxfp8_decode_test::batch_cases(40);
  ASSERT_GT(cases.size(), kMxfp8DecodeLaunch);
  const auto gpu = mxfp8_decode_test::batch_decode(kCuda, cases);
  const auto host = mxfp8_decode_test::batch_decode(kHost, cases);
  for (std::size_t t = 0; t < cases.size(); ++t) {
    const auto& c = cases[t];
    expect_equal(gpu[t], host[t], "tensor " + std::to_string(t) + " " + name_of(c.shape, c.plane));
    expect_equal(gpu[t], mxfp8_decode_test::guarded(c, host_decode(c.shape, c.plane, c.bytes.data, c.bytes.scale)),
                 "tensor " + std::to_string(t) + " vs one host decode");
  }
}

// Captured into a CUDA graph, the batch runs at each launch on the data of that time.
TEST(Mxfp8DecodeBf16Gpu, CapturedBatchRunsAtLaunch) {
  const Mxfp8Shape s{2, 96, 256};
  const auto p = random_plane(s, Mxfp8Plane::Rowwise, 17), q = random_plane(s, Mxfp8Plane::Columnwise, 18);
  const DeviceBuffer pd = upload(kCuda, p.data), ps = upload(kCuda, p.scale), qd = upload(kCuda, q.data),
                     qs = upload(kCuda, q.scale);
  const DeviceBuffer out = upload(kCuda, std::vector<std::uint16_t>(2 * p.data.size(), 0xDEAD));
  const std::vector<Mxfp8Decode> list = {
      {s, Mxfp8Plane::Rowwise, pd.as<std::uint8_t>(), ps.as<std::uint8_t>(), out.as<std::uint16_t>()},
      {s, Mxfp8Plane::Columnwise, qd.as<std::uint8_t>(), qs.as<std::uint8_t>(), out.as<std::uint16_t>() + p.data.size()}};
  cudaStream_t st = nullptr;
  SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  SHARDOPT_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  dequantize_mxfp8_batch(list, kCuda, reinterpret_cast<Stream>(st));
  SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  SHARDOPT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  EXPECT_EQ(download<std::uint16_t>(kCuda, out, 1)[0], 0xDEAD) << "nothing runs at capture";
  SHARDOPT_CUDA_CHECK(cudaGraphLaunch(exec, st));
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(st));
  auto want = host_decode(s, Mxfp8Plane::Rowwise, p.data, p.scale);
  const auto second = host_decode(s, Mxfp8Plane::Columnwise, q.data, q.scale);
  want.insert(want.end(), second.begin(), second.end());
  expect_equal(download<std::uint16_t>(kCuda, out, want.size()), want, "graph launch");
  SHARDOPT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SHARDOPT_CUDA_CHECK(cudaGraphDestroy(graph));
  SHARDOPT_CUDA_CHECK(cudaStreamDestroy(st));
}

}  // namespace
