// NVFP4 on the GPU: the CUDA kernels equal the host twin bitwise (and so the oracle) on
// the host suite's cases: ties and tiny blocks, every bf16 block amax, random data from
// 1e-30 to 1e30, subnormals, the NaN / Inf refusal, large and odd shapes, the batch, the
// tiled kernels' cases (partial tiles, many tiles, unaligned buffers, sharded and
// batched tiled tensors),
// dequantize to f32 and bf16, the sharded protocol simulated on the device (world
// sizes 1-8, boundaries at every element of a block), Nvfp4ShardBatch (against the
// per-tensor calls on the device and the oracle), and the skip flag read on the device
// (eagerly and in a captured CUDA graph whose flag changes between replays); the batched
// bf16 decode (dequantize_nvfp4_batch) against the host twin, the per-tensor decode and
// the oracle (mixed and tiled shapes, unaligned codes and outputs, a list longer than one
// launch, the skip flag in a captured graph).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <random>
#include <vector>

#include "core/check.hpp"
#include "core/memory.hpp"
#include "shardopt/nvfp4.hpp"
#include "unit/test_nvfp4_common.hpp"
#include "unit/test_nvfp4_decode_common.hpp"
#include "unit/test_nvfp4_shard_batch_common.hpp"

namespace {
using namespace shardopt;
using namespace nvfp4_test;
namespace ref = nvfp4_ref;

constexpr Backend kCuda = Backend::Cuda;
constexpr Backend kHost = Backend::Host;

std::string name_of(const Nvfp4Shape& s) { return std::to_string(s.rows) + "x" + std::to_string(s.cols); }

// SHARDOPT_SANITIZER_CASES=1 (scripts/device_suite.sh sets it for racecheck and
// synccheck, which run the kernels 100x slower): the tiled tests take a sanitizer-sized
// case list that still reaches every kernel path - whole and partial tiles across and
// down, a grid-stride walk longer than one wave, vector and scalar loads and stores,
// both phases of the sharded protocol at boundaries inside and at the edges of a block
// row, the batch and the shard batch over 1, 3 and 8 ranks - and drops the repeats
// (every boundary of a block row, three draws per world size, the offset grid).
bool sanitizer_cases() {
  const char* v = std::getenv("SHARDOPT_SANITIZER_CASES");
  return v != nullptr && std::string(v) == "1";
}

// CUDA == host twin == oracle, whole tensor and dequantize.
void expect_twins(const Nvfp4Shape& s, const std::vector<std::uint16_t>& x, const std::string& what) {
  const ref::Quantized cuda = quantize_on(kCuda, s, x), host = quantize_on(kHost, s, x);
  EXPECT_TRUE(cuda == host) << what << ": CUDA differs from the host twin";
  const ref::Quantized want = reference(s, x);
  EXPECT_TRUE(host.data == want.data) << what << ": host twin data differs from the oracle: "
                                      << first_diff(host.data, want.data);
  EXPECT_TRUE(host.scale == want.scale) << what << ": host twin scales differ from the oracle: "
                                        << first_diff(host.scale, want.scale);
  EXPECT_EQ(host.amax, want.amax) << what << ": amax bits (twin, oracle)";
  EXPECT_EQ(host.decode_scale, want.decode_scale) << what << ": decode scale bits (twin, oracle)";
  if (!(host == want) && x.size() <= 4)
    for (std::uint16_t h : x) ADD_FAILURE() << what << ": input bf16 0x" << std::hex << h;
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

// The tiled kernels (cols % 16 == 0): tiles partial across (fewer than 8 blocks) and
// down (rows % 16 != 0), many blocks per row, more tiles than one wave of resident
// blocks takes in runs (and more amax chunks than blocks), a refusal that only one
// block of threads sees.
TEST(Nvfp4Gpu, TiledShapes) {
  const std::vector<Nvfp4Shape> shapes = {{1, 16},    {2, 32},     {16, 128},  {17, 48},   {33, 144},
                                          {15, 2064}, {100, 2048}, {31, 1040}, {300, 272}, {1000, 1040}};
  std::uint32_t seed = 300;
  const bool small = sanitizer_cases();
  for (const auto& s : shapes) {
    expect_twins(s, mxfp8_test::random_bf16(s.numel(), s.cols, seed++, -40, 40), name_of(s) + " tiled wide");
    if (!small)
      expect_twins(s, mxfp8_test::random_bf16(s.numel(), s.cols, seed++, -2, 2), name_of(s) + " tiled narrow");
  }
  const Nvfp4Shape s = small ? Nvfp4Shape{100, 2048} : Nvfp4Shape{1000, 1040};
  auto x = mxfp8_test::random_bf16(s.numel(), s.cols, 320, -5, 5);
  for (std::uint16_t special : {std::uint16_t{0x7FC0}, std::uint16_t{0xFF80}}) {
    auto y = x;
    y[small ? 77777 : 777777] = special;
    expect_twins(s, y, "tiled refused");
  }
  // 8192 x 2304: 9216 tiles (more than 132 SMs x 4 blocks x runs of 16), 1152 chunks.
  // Sanitizer-sized: 4096 x 2304, 2304 tiles, still more than one wave of warps (132
  // SMs x 2 blocks x 8 warps = 2112), so the grid-stride walk takes a second turn.
  const Nvfp4Shape big = small ? Nvfp4Shape{4096, 2304} : Nvfp4Shape{8192, 2304};
  const auto xb = mxfp8_test::fast_random_bf16(big.numel(), big.cols, 321);
  const ref::Quantized cuda = quantize_on(kCuda, big, xb), host = quantize_on(kHost, big, xb);
  EXPECT_TRUE(cuda.data == host.data) << name_of(big) << " data: " << first_diff(cuda.data, host.data);
  EXPECT_TRUE(cuda.scale == host.scale) << name_of(big) << " scales: " << first_diff(cuda.scale, host.scale);
  EXPECT_EQ(cuda.amax, host.amax);
  EXPECT_EQ(cuda.decode_scale, host.decode_scale);
}

// Whole-tensor quantize with the source `src_off` elements and the data `data_off`
// bytes past an allocation's start (no 16-byte loads / 4-byte stores); the bytes before
// the data must stay poisoned.
ref::Quantized quantize_offset(const Nvfp4Shape& s, const std::vector<std::uint16_t>& x, int src_off,
                               int data_off) {
  std::vector<std::uint16_t> padded(static_cast<std::size_t>(src_off), 0x7FC0);  // NaN: must not be read
  padded.insert(padded.end(), x.begin(), x.end());
  const DeviceBuffer src = upload(kCuda, padded);
  DevicePlanes out(kCuda, s);
  const DeviceBuffer data =
      upload(kCuda, std::vector<std::uint8_t>(static_cast<std::size_t>(data_off + s.data_bytes()), kPoison));
  Nvfp4Planes planes = out.planes();
  planes.data = data.as<std::uint8_t>() + data_off;
  quantize_nvfp4(s, src.as<std::uint16_t>() + src_off, planes, nullptr, kCuda, nullptr);
  ref::Quantized q = out.get(kCuda, s);
  const auto all = download<std::uint8_t>(kCuda, data, static_cast<std::size_t>(data_off + s.data_bytes()));
  for (int k = 0; k < data_off; ++k) EXPECT_EQ(all[static_cast<std::size_t>(k)], kPoison) << "byte before the data";
  q.data.assign(all.begin() + data_off, all.end());
  return q;
}

TEST(Nvfp4Gpu, TiledUnalignedBuffers) {
  for (const Nvfp4Shape& s : {Nvfp4Shape{40, 272}, Nvfp4Shape{17, 48}, Nvfp4Shape{37, 45}}) {
    const auto x = mxfp8_test::random_bf16(s.numel(), s.cols, 330, -6, 6);
    const ref::Quantized want = quantize_on(kHost, s, x);
    for (int src_off : {0, 1, 3, 4})
      for (int data_off : {0, 1, 2}) {
        if (sanitizer_cases() && (src_off > 1 || data_off > 1)) continue;  // keeps vector and scalar paths
        EXPECT_TRUE(quantize_offset(s, x, src_off, data_off) == want)
            << name_of(s) << " source +" << src_off << " elements, data +" << data_off << " bytes";
      }
  }
}

// The sharded protocol (as simulate) with every rank's master `master_off` floats and
// its data span `data_off` bytes past an allocation's start.
ref::Quantized simulate_offset(const Nvfp4Shape& s, const std::vector<float>& master,
                               const std::vector<std::int64_t>& bounds, int master_off, int data_off) {
  const int world = static_cast<int>(bounds.size()) - 1;
  const auto na = static_cast<std::size_t>(s.amax_numel());
  std::vector<float> padded(static_cast<std::size_t>(master_off), 0.0f);
  padded.insert(padded.end(), master.begin(), master.end());
  const DeviceBuffer master_dev = upload(kCuda, padded);
  auto range_of = [&](int r) {
    return Range{bounds[static_cast<std::size_t>(r)], bounds[static_cast<std::size_t>(r) + 1]};
  };
  auto shard_of = [&](int r) { return master_dev.as<float>() + master_off + bounds[static_cast<std::size_t>(r)]; };
  std::vector<std::vector<std::uint32_t>> partial;
  for (int r = 0; r < world; ++r) {
    const DeviceBuffer amax = upload(kCuda, std::vector<std::uint32_t>(na, kPoisonWord));
    nvfp4_partial_amax(s, range_of(r), shard_of(r), amax.as<std::uint32_t>(), kCuda, nullptr);
    partial.push_back(download<std::uint32_t>(kCuda, amax, na));
  }
  const DeviceBuffer combined = upload(kCuda, mxfp8_test::all_reduce_max(partial));
  ref::Quantized out;
  out.data.assign(static_cast<std::size_t>(s.data_bytes()), 0);
  for (int r = 0; r < world; ++r) {
    const Range range = range_of(r), span = nvfp4_shard_bytes(range);
    DevicePlanes p(kCuda, s);
    const auto n = static_cast<std::size_t>(data_off + span.size());
    const DeviceBuffer data = upload(kCuda, std::vector<std::uint8_t>(n + 4, kPoison));
    Nvfp4Planes planes = p.planes();
    planes.data = range.size() > 0 ? data.as<std::uint8_t>() + data_off : nullptr;
    quantize_nvfp4_shard(s, range, shard_of(r), combined.as<std::uint32_t>(), planes, kCuda, nullptr);
    const ref::Quantized q = p.get(kCuda, s);
    out.scale = q.scale;
    out.amax = q.amax;
    out.decode_scale = q.decode_scale;
    const auto got = download<std::uint8_t>(kCuda, data, n + 4);
    for (std::size_t k = 0; k < got.size(); ++k) {
      const auto kk = static_cast<std::int64_t>(k) - data_off;
      if (kk >= 0 && kk < span.size()) {
        out.data[static_cast<std::size_t>(span.begin + kk)] |= got[k];
      } else {
        EXPECT_EQ(got[k], kPoison) << "rank " << r << " wrote outside its span";
      }
    }
  }
  return out;
}

// Sharded tiled tensors: larger shapes, partial tiles, world sizes 1-8, boundaries at
// every element of the first block row (and one past), unaligned masters and spans.
TEST(Nvfp4Gpu, TiledShardedProtocol) {
  std::mt19937 rng(40);
  std::uint32_t seed = 400;
  const bool small = sanitizer_cases();
  for (const Nvfp4Shape& s : {Nvfp4Shape{40, 272}, Nvfp4Shape{300, 2048}, Nvfp4Shape{33, 144}}) {
    const auto master = mxfp8_test::random_master(s.numel(), s.cols, seed++, 0.02, false);
    const ref::Quantized want = reference(s, mxfp8_test::to_bf16(master));
    auto check = [&](const std::vector<std::int64_t>& bounds, const std::string& what) {
      std::string problems;
      const bool ok = simulate(kCuda, s, master, bounds, &problems) == want && problems.empty();
      EXPECT_TRUE(ok) << name_of(s) << " " << what << ": " << problems;
      return ok;
    };
    if (s.numel() < 20000 && !small)
      for (std::int64_t b = 0; b <= 16 * s.cols + 16; ++b)
        if (!check({0, b, s.numel()}, "boundary " + std::to_string(b))) return;
    if (small)  // a boundary inside a chunk, a block, a tile, and at the block row's edges
      for (std::int64_t b : {std::int64_t{0}, std::int64_t{3}, std::int64_t{8}, std::int64_t{17}, std::int64_t{129},
                             s.cols + 5, 16 * s.cols - 1, 16 * s.cols, 16 * s.cols + 16})
        if (!check({0, b, s.numel()}, "boundary " + std::to_string(b))) return;
    for (int world = 1; world <= 8; ++world)
      for (int t = 0; t < (small ? 1 : 3); ++t)
        if (!small || world == 1 || world == 3 || world == 8)
          if (!check(mxfp8_test::random_bounds(s.numel(), world, rng), "world " + std::to_string(world))) return;
    for (int master_off : {0, 1, 2})
      for (int data_off : {0, 1, 3})
        for (int world : {1, 3, 4}) {
          if (small && (master_off > 1 || data_off > 1 || world == 1)) continue;
          const auto bounds = world == 4 ? mxfp8_test::even_bounds(s.numel(), 4, 0)
                                         : mxfp8_test::random_bounds(s.numel(), world, rng);
          EXPECT_TRUE(simulate_offset(s, master, bounds, master_off, data_off) == want)
              << name_of(s) << " master +" << master_off << " data +" << data_off << " world " << world;
        }
  }
}

// Tensors of `shapes` with random bf16 values (magnitudes 2^-k..2^k, seeds from
// `seed`; tensor `refused`, if any, holds a NaN) in device memory, and their poisoned
// outputs: the list of an Nvfp4Batch.
struct CudaTensors {
  std::vector<Nvfp4Shape> shapes;
  std::vector<std::vector<std::uint16_t>> xs;
  std::vector<DeviceBuffer> srcs;
  std::vector<std::unique_ptr<DevicePlanes>> outs;
  std::vector<Nvfp4Tensor> tensors;
  CudaTensors(std::vector<Nvfp4Shape> list, std::uint32_t seed, int k, std::size_t refused)
      : shapes(std::move(list)) {
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      xs.push_back(mxfp8_test::random_bf16(shapes[t].numel(), shapes[t].cols, seed + static_cast<std::uint32_t>(t), -k, k));
      if (t == refused) xs.back()[0] = 0x7FC0;
      srcs.push_back(upload(kCuda, xs.back()));
      outs.push_back(std::make_unique<DevicePlanes>(kCuda, shapes[t]));
      tensors.push_back({shapes[t], srcs.back().as<std::uint16_t>(), outs.back()->planes()});
    }
  }
};

TEST(Nvfp4Gpu, BatchEqualsHostBatch) {
  const CudaTensors c({{16, 16}, {17, 33}, {1, 1}, {640, 48}, {3, 301}}, 20, 40, 2);
  const auto& shapes = c.shapes;
  const auto& xs = c.xs;
  const auto& outs = c.outs;
  const Nvfp4Batch batch(c.tensors, kCuda);
  quantize_nvfp4_batch(batch, nullptr, kCuda, nullptr);
  for (std::size_t t = 0; t < shapes.size(); ++t)
    EXPECT_TRUE(outs[t]->get(kCuda, shapes[t]) == quantize_on(kHost, shapes[t], xs[t])) << "tensor " << t;
}

// A batch mixing tiled and per-unit tensors, several tiles each (runs of the walk end
// mid-tensor), a refused tiled tensor, and one tensor that needs many blocks.
TEST(Nvfp4Gpu, TiledBatchEqualsHostBatch) {
  const CudaTensors c({{16, 16}, {17, 33}, {40, 272}, {1, 1}, {300, 512}, {3, 301}, {2048, 1024}, {1, 4096},
                       {64, 80}, {5, 48}},
                      500, 12, 8);
  const Nvfp4Batch batch(c.tensors, kCuda);
  quantize_nvfp4_batch(batch, nullptr, kCuda, nullptr);
  for (std::size_t t = 0; t < c.shapes.size(); ++t)
    EXPECT_TRUE(c.outs[t]->get(kCuda, c.shapes[t]) == quantize_on(kHost, c.shapes[t], c.xs[t]))
        << "tensor " << t << " " << name_of(c.shapes[t]);
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

// Nvfp4ShardBatch of `shapes` over each world size: even bounds (shifted by
// t * shift - 17) for even t, random ones for odd t; the batch against the per-tensor
// calls on the device (simulate_batch) and the assembled tensors against the oracle.
void expect_shard_batches(const std::vector<Nvfp4Shape>& shapes, const std::vector<int>& worlds, std::uint32_t rng_seed,
                          std::uint32_t seed, std::int64_t shift) {
  std::mt19937 rng(rng_seed);
  for (int world : worlds) {
    std::vector<ShardCase> cases;
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      const Nvfp4Shape& s = shapes[t];
      cases.push_back({s, mxfp8_test::random_master(s.numel(), s.cols, seed++, 0.02, false),
                       t % 2 == 0 ? mxfp8_test::even_bounds(s.numel(), world, static_cast<std::int64_t>(t) * shift - 17)
                                  : mxfp8_test::random_bounds(s.numel(), world, rng)});
    }
    std::string problems;
    const auto got = simulate_batch(kCuda, cases, &problems);
    for (std::size_t t = 0; t < cases.size(); ++t)
      if (!(got[t] == reference(cases[t].shape, mxfp8_test::to_bf16(cases[t].master))))
        problems += "tensor " + std::to_string(t) + " differs from the oracle; ";
    ASSERT_TRUE(problems.empty()) << "world " << world << ": " << problems;
  }
}

TEST(Nvfp4Gpu, ShardBatchEqualsPerTensorCallsAndOracle) {
  expect_shard_batches({{37, 45}, {16, 16}, {1, 301}, {301, 1}, {640, 48}, {3, 5}}, {1, 2, 3, 4, 5, 6, 7, 8}, 12, 200, 7);
}

// Nvfp4ShardBatch of larger tiled tensors next to per-unit ones.
TEST(Nvfp4Gpu, TiledShardBatchEqualsPerTensorCallsAndOracle) {
  const std::vector<int> worlds = sanitizer_cases() ? std::vector<int>{1, 3, 8} : std::vector<int>{1, 2, 3, 4, 8};
  expect_shard_batches({{300, 2048}, {17, 33}, {40, 272}, {1, 4096}, {2048, 512}, {33, 144}}, worlds, 13, 600, 5);
}

TEST(Nvfp4Gpu, SkipFlagReadOnTheDevice) {
  const CudaTensors c({{16, 16}, {17, 33}, {130, 129}, {100, 2048}}, 60, 9, SIZE_MAX);
  const auto& shapes = c.shapes;
  const auto& xs = c.xs;
  const auto& outs = c.outs;
  const Nvfp4Batch batch(c.tensors, kCuda);
  const Nvfp4Shape one_shape{24, 48};  // tiled
  const auto one_x = mxfp8_test::random_bf16(one_shape.numel(), one_shape.cols, 70, -5, 5);
  const DeviceBuffer one_src = upload(kCuda, one_x);
  DevicePlanes one(kCuda, one_shape);
  const DeviceBuffer flag = upload(kCuda, std::vector<std::int32_t>{1});
  auto set_flag = [&](std::int32_t v) { shardopt::test::bytes_to_device(kCuda, flag.data(), &v, sizeof v); };
  auto untouched = [](const Nvfp4Shape& s) {
    return ref::Quantized{std::vector<std::uint8_t>(static_cast<std::size_t>(s.data_bytes()), kPoison),
                          std::vector<std::uint8_t>(static_cast<std::size_t>(s.scale_numel()), kPoison), kPoisonWord,
                          kPoisonWord};
  };
  auto expect_all = [&](bool written, const char* what) {
    for (std::size_t t = 0; t < shapes.size(); ++t)
      EXPECT_TRUE(outs[t]->get(kCuda, shapes[t]) ==
                  (written ? quantize_on(kHost, shapes[t], xs[t]) : untouched(shapes[t])))
          << what << ": tensor " << t;
    EXPECT_TRUE(one.get(kCuda, one_shape) == (written ? quantize_on(kHost, one_shape, one_x) : untouched(one_shape)))
        << what << ": one tensor";
  };
  // Captured once with the flag set; each replay reads it on the device.
  cudaStream_t stream = nullptr;
  SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  SHARDOPT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  quantize_nvfp4_batch(batch, flag.as<std::int32_t>(), kCuda, reinterpret_cast<Stream>(stream));
  quantize_nvfp4(one_shape, one_src.as<std::uint16_t>(), one.planes(), flag.as<std::int32_t>(), kCuda,
                 reinterpret_cast<Stream>(stream));
  cudaGraph_t graph = nullptr;
  SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  SHARDOPT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  SHARDOPT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(stream));
  expect_all(false, "replay with the flag set");
  set_flag(0);
  SHARDOPT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(stream));
  expect_all(true, "replay with the flag clear");
  SHARDOPT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SHARDOPT_CUDA_CHECK(cudaGraphDestroy(graph));
  SHARDOPT_CUDA_CHECK(cudaStreamDestroy(stream));
  // Eagerly: set writes nothing over fresh poison.
  DevicePlanes fresh(kCuda, one_shape);
  set_flag(7);
  quantize_nvfp4(one_shape, one_src.as<std::uint16_t>(), fresh.planes(), flag.as<std::int32_t>(), kCuda, nullptr);
  EXPECT_TRUE(fresh.get(kCuda, one_shape) == untouched(one_shape)) << "eager, flag set";
}

// A CUDA graph captured once from `enqueue(stream)` on a stream of its own (RAII);
// replay() launches it and waits.
class CapturedGraph {
 public:
  template <class F>
  explicit CapturedGraph(F&& enqueue) {
    SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    SHARDOPT_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
    enqueue(reinterpret_cast<Stream>(stream_));
    SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph_));
    SHARDOPT_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  ~CapturedGraph() {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
    cudaStreamDestroy(stream_);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void replay() {
    SHARDOPT_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
    SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

TEST(Nvfp4Gpu, Bf16DequantizeSkipFlagReadOnTheDevice) {
  const Nvfp4Shape s{130, 129};
  const auto x = mxfp8_test::random_bf16(s.numel(), s.cols, 71, -9, 9);
  const ref::Quantized q = quantize_on(kHost, s, x);
  const std::vector<std::uint32_t> want = dequantize_on(kHost, s, q, /*bf16=*/true);
  const SkippableDecode d(kCuda, s, q);
  const DeviceBuffer flag = upload(kCuda, std::vector<std::int32_t>{1});
  // Captured once with the flag set; each replay reads it on the device.
  CapturedGraph g([&](Stream stream) { d.run(kCuda, flag.as<std::int32_t>(), stream); });
  g.replay();
  EXPECT_EQ(d.out(kCuda), d.untouched()) << "replay with the flag set";
  const std::int32_t clear = 0;
  shardopt::test::bytes_to_device(kCuda, flag.data(), &clear, sizeof clear);
  g.replay();
  EXPECT_EQ(d.out(kCuda), want) << "replay with the flag clear: the host twin's bf16";
}

// ------------------------------------------------------------------ batched bf16 decode

// Quantized (on the host) tensors of `shapes`, tensor `refused` with a NaN.
std::vector<ref::Quantized> decode_inputs(const std::vector<Nvfp4Shape>& shapes, std::uint32_t seed, int refused) {
  std::vector<ref::Quantized> q;
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    auto x = mxfp8_test::random_bf16(shapes[t].numel(), shapes[t].cols, seed + static_cast<std::uint32_t>(t), -40, 40);
    if (static_cast<int>(t) == refused) x[0] = 0x7FC0;
    q.push_back(quantize_on(kHost, shapes[t], x));
  }
  return q;
}

// The batch on the device == the batch on the host == the per-tensor CUDA decode == the
// oracle, margins untouched.
void expect_batch_decode(const std::vector<Nvfp4Shape>& shapes, bool misalign, const std::string& what) {
  const std::vector<ref::Quantized> q = decode_inputs(shapes, 500, static_cast<int>(shapes.size()) / 2);
  const DecodeList cuda(kCuda, shapes, q, misalign), host(kHost, shapes, q, misalign);
  dequantize_nvfp4_batch(cuda.list, nullptr, kCuda, nullptr);
  dequantize_nvfp4_batch(host.list, nullptr, kHost, nullptr);
  SHARDOPT_CUDA_CHECK(cudaDeviceSynchronize());
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    const std::string at = what + " tensor " + std::to_string(t) + " " + name_of(shapes[t]);
    const std::vector<std::uint16_t> want = reference_bf16(shapes[t], q[t]);
    EXPECT_EQ(cuda.buffer(kCuda, t), host.buffer(kHost, t)) << at << ": CUDA batch vs host twin";
    EXPECT_EQ(cuda.buffer(kCuda, t), cuda.expected(t, want)) << at << ": CUDA batch vs oracle";
    EXPECT_EQ(decode_one(kCuda, shapes[t], q[t]), want) << at << ": CUDA per-tensor decode vs oracle";
  }
}

TEST(Nvfp4Gpu, BatchDecodeEqualsHostTwinAndOracle) {
  const std::vector<Nvfp4Shape> mixed = {{16, 16}, {17, 33}, {1, 1}, {1, 7}, {64, 48}, {3, 301}, {130, 129}, {40, 256}};
  for (const bool misalign : {false, true}) expect_batch_decode(mixed, misalign, misalign ? "misaligned" : "aligned");
  // A grid-stride walk longer than one wave over tensors of many thousand groups (left
  // out of the sanitizer-sized run: the kernel has no shared memory and no barrier).
  if (sanitizer_cases()) return;
  expect_batch_decode({{512, 2048}, {1024, 1040}, {7, 4096}}, false, "large");
}

TEST(Nvfp4Gpu, BatchDecodeListLongerThanOneLaunch) {
  std::vector<Nvfp4Shape> shapes;
  for (std::size_t t = 0; t < 2 * kNvfp4DecodeLaunch + 3; ++t)
    shapes.push_back({static_cast<std::int64_t>(1 + t % 7), static_cast<std::int64_t>(8 + 5 * (t % 6))});
  expect_batch_decode(shapes, true, "long list");
}

TEST(Nvfp4Gpu, BatchDecodeSkipFlagReadOnTheDevice) {
  const std::vector<Nvfp4Shape> shapes = {{33, 64}, {16, 17}};
  const std::vector<ref::Quantized> q = decode_inputs(shapes, 600, -1);
  const DecodeList d(kCuda, shapes, q, false);
  const DeviceBuffer flag = upload(kCuda, std::vector<std::int32_t>{1});
  CapturedGraph g([&](Stream stream) { dequantize_nvfp4_batch(d.list, flag.as<std::int32_t>(), kCuda, stream); });
  g.replay();
  for (std::size_t t = 0; t < shapes.size(); ++t)
    EXPECT_EQ(d.buffer(kCuda, t), d.expected(t, {})) << "replay with the flag set, tensor " << t;
  const std::int32_t clear = 0;
  shardopt::test::bytes_to_device(kCuda, flag.data(), &clear, sizeof clear);
  g.replay();
  for (std::size_t t = 0; t < shapes.size(); ++t)
    EXPECT_EQ(d.buffer(kCuda, t), d.expected(t, reference_bf16(shapes[t], q[t]))) << "flag clear, tensor " << t;
}

}  // namespace
