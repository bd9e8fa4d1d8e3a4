// NVFP4 on the GPU: the CUDA kernels equal the host twin bitwise (and so the oracle) on
// the host suite's cases: ties and tiny blocks, every bf16 block amax, random data from
// 1e-30 to 1e30, subnormals, the NaN / Inf refusal, large and odd shapes, the batch,
// dequantize to f32 and bf16, and the sharded protocol simulated on the device (world
// sizes 1-8, boundaries at every element of a block).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "shardopt/nvfp4.hpp"
#include "unit/test_nvfp4_common.hpp"

namespace {
using namespace shardopt;
using namespace nvfp4_test;
namespace ref = nvfp4_ref;

constexpr Backend kCuda = Backend::Cuda;
constexpr Backend kHost = Backend::Host;

std::string name_of(const Nvfp4Shape& s) { return std::to_string(s.rows) + "x" + std::to_string(s.cols); }

// CUDA == host twin == oracle, whole tensor and dequantize.
void expect_twins(const Nvfp4Shape& s, const std::vector<std::uint16_t>& x, const std::string& what) {
  const ref::Quantized cuda = quantize_on(kCuda, s, x), host = quantize_on(kHost, s, x);
  EXPECT_TRUE(cuda == host) << what << ": CUDA differs from the host twin";
  EXPECT_TRUE(host == reference(s, x)) << what << ": host twin differs from the oracle";
  for (bool bf16 : {false, true})
    EXPECT_TRUE(dequantize_on(kCuda, s, cuda, bf16) == dequantize_on(kHost, s, host, bf16))
        << what << ": dequantize (bf16 " << bf16 << ") differs";
}

TEST(Nvfp4Gpu, RandomShapesAndMagnitudes) {
  const std::vector<Nvfp4Shape> shapes = {{16, 16}, {17, 33}, {1, 1},    {3, 5},     {48, 200},
                                          {1, 31},  {31, 1},  {130, 129}, {512, 2048}, {1000, 999}};
  std::uint32_t seed = 1;
  for (const auto& s : shapes) {
    expect_twins(s, mxfp8_test::random_bf16(s.numel(), s.cols, seed++, -100, 100), name_of(s) + " wide");
    expect_twins(s, mxfp8_test::random_bf16(s.numel(), s.cols, seed++, -3, 3), name_of(s) + " narrow");
    expect_twins(s, mxfp8_test::random_bf16(s.numel(), s.cols, seed++, 0, 0, 1.0), name_of(s) + " raw");
  }
}

TEST(Nvfp4Gpu, SpecialValues) {
  const Nvfp4Shape s{64, 80};
  std::mt19937 rng(2);
  std::vector<std::uint16_t> x(static_cast<std::size_t>(s.numel()), 0);
  expect_twins(s, x, "zeros");
  for (auto& h : x) h = static_cast<std::uint16_t>(rng() & 0x807F);
  expect_twins(s, x, "subnormals");
  x = mxfp8_test::random_bf16(s.numel(), s.cols, 3, -3, 3);
  x[0] = mxfp8_ref::to_bf16(2688.0f);
  x[16] = mxfp8_ref::to_bf16(6.375f);                   // a block scale on an E4M3 tie
  x[32] = mxfp8_ref::to_bf16(std::ldexp(1.0f, -20));   // a block whose scale rounds to 0
  for (int j = 48; j < 64; ++j) x[static_cast<std::size_t>(j)] = 0;
  expect_twins(s, x, "anchors");
  for (std::uint16_t special : {std::uint16_t{0x7FC0}, std::uint16_t{0x7F80}, std::uint16_t{0xFF80}}) {
    auto y = x;
    y[1000] = special;
    expect_twins(s, y, "refused");
  }
}

TEST(Nvfp4Gpu, EveryBf16BlockAmax) {
  std::vector<std::uint16_t> amaxes;
  for (std::uint16_t h = mxfp8_ref::to_bf16(std::ldexp(1.0f, -30)); h <= mxfp8_ref::to_bf16(2688.0f); ++h)
    amaxes.push_back(h);
  const Nvfp4Shape s{16, 16 * static_cast<std::int64_t>(amaxes.size() + 1)};
  std::vector<std::uint16_t> x(static_cast<std::size_t>(s.numel()), 0);
  x[0] = mxfp8_ref::to_bf16(2688.0f);
  for (std::size_t b = 0; b < amaxes.size(); ++b) x[(b % 16) * static_cast<std::size_t>(s.cols) + 16 * (b + 1)] = amaxes[b];
  expect_twins(s, x, "every block amax");
}

TEST(Nvfp4Gpu, BatchEqualsHostBatch) {
  const std::vector<Nvfp4Shape> shapes = {{16, 16}, {17, 33}, {1, 1}, {640, 48}, {3, 301}};
  std::vector<std::vector<std::uint16_t>> xs;
  std::vector<DeviceBuffer> srcs;
  std::vector<std::unique_ptr<DevicePlanes>> outs;
  std::vector<Nvfp4Tensor> tensors;
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    xs.push_back(mxfp8_test::random_bf16(shapes[t].numel(), shapes[t].cols, 20 + static_cast<std::uint32_t>(t), -40, 40));
    if (t == 2) xs.back()[0] = 0x7FC0;
    srcs.push_back(upload(kCuda, xs.back()));
    outs.push_back(std::make_unique<DevicePlanes>(kCuda, shapes[t]));
    tensors.push_back({shapes[t], srcs.back().as<std::uint16_t>(), outs.back()->planes()});
  }
  const Nvfp4Batch batch(tensors, kCuda);
  quantize_nvfp4_batch(batch, nullptr, kCuda, nullptr);
  for (std::size_t t = 0; t < shapes.size(); ++t)
    EXPECT_TRUE(outs[t]->get(kCuda, shapes[t]) == quantize_on(kHost, shapes[t], xs[t])) << "tensor " << t;
}

TEST(Nvfp4Gpu, ShardedProtocolEqualsHost) {
  const std::vector<Nvfp4Shape> shapes = {{37, 45}, {64, 96}, {17, 17}, {1, 301}};
  std::mt19937 rng(4);
  std::uint32_t seed = 10;
  for (const auto& s : shapes) {
    const auto master = mxfp8_test::random_master(s.numel(), s.cols, seed++, 0.02, false);
    const ref::Quantized want = reference(s, mxfp8_test::to_bf16(master));
    auto check = [&](const std::vector<std::int64_t>& bounds) {
      std::string problems;
      const bool ok = simulate(kCuda, s, master, bounds, &problems) == want && problems.empty();
      EXPECT_TRUE(ok) << name_of(s) << ": " << problems;
      return ok;
    };
    for (std::int64_t b = 0; b <= std::min<std::int64_t>(s.numel(), 16 * s.cols + 16); ++b)
      if (!check({0, b, s.numel()})) return;
    for (int world = 1; world <= 8; ++world)
      for (int t = 0; t < 4; ++t)
        if (!check(mxfp8_test::random_bounds(s.numel(), world, rng))) return;
  }
}

}  // namespace
