// MXFP8 on the GPU: the element math against the host twin for every input, the host
// suite's cases against the oracle, kernel == host twin bitwise on large tensors
// (Llama shapes, grouped, odd shapes, misaligned pointers), grouped == discrete with
// the member table and the skip flag, the sharded protocol simulated on the device
// (both schemes, world sizes 1-8), CUDA graph capture/replay with the skip flag toggled
// between replays, a captured sharded pipeline, and dequantize.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/mxfp8/mxfp8_shard_calls.hpp"
#include "core/check.hpp"
#include "core/memory.hpp"
#include "shardopt/mxfp8.hpp"
#include "test_mxfp8_convert.hpp"
#include "unit/test_mxfp8_common.hpp"

namespace {
using namespace shardopt;
using namespace mxfp8_test;
namespace ref = mxfp8_ref;

constexpr Backend kCuda = Backend::Cuda;
constexpr Backend kHost = Backend::Host;

std::string name_of(const Mxfp8Shape& s) {
  return std::to_string(s.members) + "x" + std::to_string(s.rows) + "x" + std::to_string(s.cols);
}

void expect_same(const ref::Quantized& got, const ref::Quantized& want, const std::string& what) {
  EXPECT_TRUE(got.data_row == want.data_row) << what << ": data_row differs";
  EXPECT_TRUE(got.scale_row == want.scale_row) << what << ": scale_row differs";
  EXPECT_TRUE(got.data_col == want.data_col) << what << ": data_col differs";
  EXPECT_TRUE(got.scale_col == want.scale_col) << what << ": scale_col differs";
}

void set_flag(const DeviceBuffer& flag, std::int32_t value) { test::bytes_to_device(kCuda, flag.data(), &value, sizeof value); }

// ------------------------------------------------------------------ element math

TEST(Mxfp8Gpu, EncodeEqualsHostTwinForEveryBf16AndScale) {
  std::string report;
  EXPECT_EQ(encode_mismatches(&report), 0) << report;
}

TEST(Mxfp8Gpu, ScaleInverseAndDecodeEqualHostTwin) {
  std::string report;
  EXPECT_EQ(scale_and_decode_mismatches(&report), 0) << report;
}

// ------------------------------------------------------------------ the host suite's cases

TEST(Mxfp8Gpu, RandomShapesMatchReference) {
  const std::vector<Mxfp8Shape> shapes = {{1, 64, 128}, {1, 32, 32}, {1, 40, 72}, {1, 33, 31}, {1, 3, 5},
                                          {1, 1, 1},    {2, 40, 72}, {1, 96, 1000}, {4, 17, 130}, {1, 7, 300},
                                          {3, 64, 256}, {1, 130, 136}};
  std::uint32_t seed = 1;
  for (const auto& s : shapes) {
    const auto x = random_bf16(s.numel(), s.cols, seed++);
    expect_same(quantize_on(kCuda, s, x), reference(s, x), name_of(s));
    const auto raw = random_bf16(s.numel(), s.cols, seed++, 0, 0, 1.0);  // raw bit patterns
    expect_same(quantize_on(kCuda, s, raw), reference(s, raw), name_of(s) + " raw patterns");
  }
}

TEST(Mxfp8Gpu, SpecialValuesMatchReference) {
  const Mxfp8Shape s{2, 64, 160};
  std::mt19937 rng(2);
  // Zeros and signed zeros.
  std::vector<std::uint16_t> x(static_cast<std::size_t>(s.numel()));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0) ? 0x8000 : 0;
  expect_same(quantize_on(kCuda, s, x), reference(s, x), "zeros");
  // Subnormals (and a tiny normal in some blocks).
  for (auto& v : x) v = static_cast<std::uint16_t>((rng() & 0x8000) | (rng() % 0x80));
  for (std::size_t i = 0; i < x.size(); i += 97) x[i] = static_cast<std::uint16_t>(1 + rng() % 9) << 7;
  expect_same(quantize_on(kCuda, s, x), reference(s, x), "subnormals");
  // NaN and Inf blocks, huge and tiny values together.
  x = random_bf16(s.numel(), s.cols, 3, -130, 127, 0.05);
  for (std::size_t i = 0; i < x.size(); i += 331) x[i] = (rng() & 1) ? 0x7FC0 : 0xFFFF;
  for (std::size_t i = 17; i < x.size(); i += 251) x[i] = (rng() & 1) ? 0x7F80 : 0xFF80;
  x[100] = 0x7F7F;  // the largest finite bf16
  expect_same(quantize_on(kCuda, s, x), reference(s, x), "NaN / Inf");
  // Amax at 1.75 * 2^k and one ulp around it, every normal exponent.
  std::vector<std::uint16_t> amaxes;
  for (int e = 1; e <= 254; ++e)
    for (int man : {0x5F, 0x60, 0x61}) amaxes.push_back(static_cast<std::uint16_t>((e << 7) | man));
  const Mxfp8Shape sb{1, static_cast<std::int64_t>(amaxes.size()), 40};
  std::vector<std::uint16_t> y(static_cast<std::size_t>(sb.numel()));
  for (std::int64_t r = 0; r < sb.rows; ++r) {
    const std::uint16_t a = amaxes[static_cast<std::size_t>(r)];
    for (std::int64_t c = 0; c < sb.cols; ++c)
      y[static_cast<std::size_t>(r * sb.cols + c)] = static_cast<std::uint16_t>((a & 0x7F80) | (rng() % 0x5F) | ((rng() & 1) << 15));
    y[static_cast<std::size_t>(r * sb.cols + r % 32)] = a;
    y[static_cast<std::size_t>(r * sb.cols + 32 + r % 8)] = static_cast<std::uint16_t>(a | 0x8000);
  }
  expect_same(quantize_on(kCuda, sb, y), reference(sb, y), "scale boundaries");
  // Every finite bf16 amax once (plus Inf and NaN rows).
  const Mxfp8Shape se{1, 0x7F80 + 2, 32};
  std::vector<std::uint16_t> z(static_cast<std::size_t>(se.numel()), 0);
  for (std::int64_t k = 0; k < se.rows; ++k)
    z[static_cast<std::size_t>(k * 32 + k % 32)] = k < 0x7F80 ? static_cast<std::uint16_t>(k) : (k == 0x7F80 ? 0x7F80 : 0xFFC1);
  expect_same(quantize_on(kCuda, se, z), reference(se, z), "every amax");
}

// ------------------------------------------------------------------ kernel == host twin, large

TEST(Mxfp8Gpu, LargeTensorsKernelEqualsHostTwinBitwise) {
  const std::vector<Mxfp8Shape> shapes = {{1, 8192, 2048},  // Llama-3.2-1B MLP gate/up
                                          {1, 2048, 8192},  // MLP down
                                          {1, 512, 2048},   // k / v
                                          {8, 1408, 2048},  // MoE experts as one grouped tensor
                                          {1, 1000, 1000},  // nothing a multiple of 32 or 128
                                          {3, 333, 4100},
                                          {1, 4099, 136}};
  std::uint64_t seed = 100;
  for (const auto& s : shapes) {
    const auto x = fast_random_bf16(s.numel(), s.cols, seed++, 0.001);
    const auto gpu = quantize_on(kCuda, s, x);
    const auto host = quantize_on(kHost, s, x);
    expect_same(gpu, host, name_of(s));
  }
}

TEST(Mxfp8Gpu, MisalignedPointersAndOddWidthsUseTheScalarPaths) {
  // Source shifted by 1..7 elements and outputs by 1 byte: no 16-byte access is legal.
  const Mxfp8Shape s{2, 70, 264};
  const auto x = fast_random_bf16(s.numel(), s.cols, 7, 0.01);
  const auto want = reference(s, x);
  for (int shift : {1, 3, 8}) {
    std::vector<std::uint16_t> padded(static_cast<std::size_t>(s.numel() + shift), 0);
    std::copy(x.begin(), x.end(), padded.begin() + shift);
    const DeviceBuffer src = upload(kCuda, padded);
    DeviceBuffer drow(kCuda, static_cast<std::size_t>(s.numel()) + 1), dcol(kCuda, static_cast<std::size_t>(s.numel()) + 1);
    DeviceBuffer srow(kCuda, static_cast<std::size_t>(s.scale_row_numel())), scol(kCuda, static_cast<std::size_t>(s.scale_col_numel()));
    const Mxfp8Planes out{drow.as<std::uint8_t>() + 1, srow.as<std::uint8_t>(), dcol.as<std::uint8_t>() + 1, scol.as<std::uint8_t>()};
    quantize_mxfp8(s, src.as<std::uint16_t>() + shift, out, nullptr, kCuda, nullptr);
    const auto r = download<std::uint8_t>(kCuda, drow, static_cast<std::size_t>(s.numel()) + 1);
    const auto c = download<std::uint8_t>(kCuda, dcol, static_cast<std::size_t>(s.numel()) + 1);
    EXPECT_TRUE(std::equal(want.data_row.begin(), want.data_row.end(), r.begin() + 1)) << "shift " << shift;
    EXPECT_TRUE(std::equal(want.data_col.begin(), want.data_col.end(), c.begin() + 1)) << "shift " << shift;
    EXPECT_EQ(download<std::uint8_t>(kCuda, srow, want.scale_row.size()), want.scale_row);
    EXPECT_EQ(download<std::uint8_t>(kCuda, scol, want.scale_col.size()), want.scale_col);
  }
}

// ------------------------------------------------------------------ grouped, member table, skip flag

TEST(Mxfp8Gpu, GroupedEqualsDiscreteAndHonoursTheSkipFlag) {
  const Mxfp8Shape s{4, 40, 136};
  const Mxfp8Shape m{1, s.rows, s.cols};
  const auto x = fast_random_bf16(s.numel(), s.cols, 8, 0.01);
  const auto want = reference(s, x);
  const DeviceBuffer src = upload(kCuda, x);
  const DeviceBuffer table = upload(kCuda, mxfp8_contiguous_members(s));
  const DeviceBuffer flag(kCuda, sizeof(std::int32_t));
  for (std::int32_t f : {1, 0}) {
    set_flag(flag, f);
    DevicePlanes single(kCuda, s), grouped(kCuda, s), discrete(kCuda, s);
    quantize_mxfp8(s, src.as<std::uint16_t>(), single.planes(), flag.as<std::int32_t>(), kCuda, nullptr);
    quantize_mxfp8(s, src.as<std::uint16_t>(), grouped.planes(), flag.as<std::int32_t>(), kCuda, nullptr,
                   table.as<Mxfp8Member>());
    const Mxfp8Planes d = discrete.planes();
    for (std::int64_t g = 0; g < s.members; ++g)
      quantize_mxfp8(m, src.as<std::uint16_t>() + g * m.numel(),
                     Mxfp8Planes{d.data_row + g * m.numel(), d.scale_row + g * m.scale_row_numel(),
                                 d.data_col + g * m.numel(), d.scale_col + g * m.scale_col_numel()},
                     flag.as<std::int32_t>(), kCuda, nullptr);
    const auto expected = f ? poisoned(s) : want;
    expect_same(single.get(kCuda, s), expected, "single, flag " + std::to_string(f));
    expect_same(grouped.get(kCuda, s), expected, "member table, flag " + std::to_string(f));
    expect_same(discrete.get(kCuda, s), expected, "discrete, flag " + std::to_string(f));
  }
}

TEST(Mxfp8Gpu, MemberTableWithScatteredMembers) {
  const Mxfp8Shape s{3, 33, 72};
  const Mxfp8Shape m{1, s.rows, s.cols};
  const auto x = fast_random_bf16(s.numel(), s.cols, 9, 0.01);
  const auto want = reference(s, x);
  // Members in reverse order at 64-aligned offsets plus 8, scales with gaps.
  std::vector<Mxfp8Member> table(3);
  std::int64_t e = 0, sr = 0, sc = 0;
  for (int g = 2; g >= 0; --g) {
    e = (e + 63) / 64 * 64 + 8;
    table[static_cast<std::size_t>(g)] = {e, sr + 3, sc + 5};
    e += m.numel();
    sr += 3 + m.scale_row_numel();
    sc += 5 + m.scale_col_numel();
  }
  std::vector<std::uint16_t> src(static_cast<std::size_t>(e), 0x7FC0);
  for (int g = 0; g < 3; ++g) std::copy(x.begin() + g * m.numel(), x.begin() + (g + 1) * m.numel(), src.begin() + table[g].element_offset);
  const DeviceBuffer dsrc = upload(kCuda, src), dtable = upload(kCuda, table);
  const DeviceBuffer drow = upload(kCuda, std::vector<std::uint8_t>(src.size(), kPoison));
  const DeviceBuffer dcol = upload(kCuda, std::vector<std::uint8_t>(src.size(), kPoison));
  const DeviceBuffer srow = upload(kCuda, std::vector<std::uint8_t>(static_cast<std::size_t>(sr), kPoison));
  const DeviceBuffer scol = upload(kCuda, std::vector<std::uint8_t>(static_cast<std::size_t>(sc), kPoison));
  quantize_mxfp8(s, dsrc.as<std::uint16_t>(),
                 Mxfp8Planes{drow.as<std::uint8_t>(), srow.as<std::uint8_t>(), dcol.as<std::uint8_t>(), scol.as<std::uint8_t>()},
                 nullptr, kCuda, nullptr, dtable.as<Mxfp8Member>());
  const auto r = download<std::uint8_t>(kCuda, drow, src.size()), c = download<std::uint8_t>(kCuda, dcol, src.size());
  const auto rs = download<std::uint8_t>(kCuda, srow, static_cast<std::size_t>(sr));
  const auto cs = download<std::uint8_t>(kCuda, scol, static_cast<std::size_t>(sc));
  std::vector<std::uint8_t> er(src.size(), kPoison), ec(src.size(), kPoison), ers(rs.size(), kPoison), ecs(cs.size(), kPoison);
  for (int g = 0; g < 3; ++g) {
    std::copy(want.data_row.begin() + g * m.numel(), want.data_row.begin() + (g + 1) * m.numel(), er.begin() + table[g].element_offset);
    std::copy(want.data_col.begin() + g * m.numel(), want.data_col.begin() + (g + 1) * m.numel(), ec.begin() + table[g].element_offset);
    std::copy(want.scale_row.begin() + g * m.scale_row_numel(), want.scale_row.begin() + (g + 1) * m.scale_row_numel(),
              ers.begin() + table[g].scale_row_offset);
    std::copy(want.scale_col.begin() + g * m.scale_col_numel(), want.scale_col.begin() + (g + 1) * m.scale_col_numel(),
              ecs.begin() + table[g].scale_col_offset);
  }
  EXPECT_EQ(r, er);
  EXPECT_EQ(c, ec);
  EXPECT_EQ(rs, ers);
  EXPECT_EQ(cs, ecs);
}

TEST(Mxfp8Gpu, GraphReplayWritesOnlyWhileTheSkipFlagIsClear) {
  // One captured graph quantizes a single weight and a grouped weight (member table);
  // the flag is toggled between replays, never re-captured (seed 000).
  const Mxfp8Shape s{1, 256, 384}, sg{4, 40, 136};
  auto x = fast_random_bf16(s.numel(), s.cols, 10, 0.001);
  auto xg = fast_random_bf16(sg.numel(), sg.cols, 11, 0.001);
  const DeviceBuffer src = upload(kCuda, x), srcg = upload(kCuda, xg);
  const DeviceBuffer table = upload(kCuda, mxfp8_contiguous_members(sg));
  const DeviceBuffer flag(kCuda, sizeof(std::int32_t));
  DevicePlanes out(kCuda, s), outg(kCuda, sg);
  set_flag(flag, 1);  // the value at capture time must not matter
  cudaStream_t stream;
  SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  SHARDOPT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  quantize_mxfp8(s, src.as<std::uint16_t>(), out.planes(), flag.as<std::int32_t>(), kCuda, reinterpret_cast<Stream>(stream));
  quantize_mxfp8(sg, srcg.as<std::uint16_t>(), outg.planes(), flag.as<std::int32_t>(), kCuda, reinterpret_cast<Stream>(stream),
                 table.as<Mxfp8Member>());
  SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  SHARDOPT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  auto replay = [&] {
    SHARDOPT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(stream));
  };
  replay();  // flag 1: nothing
  expect_same(out.get(kCuda, s), poisoned(s), "flag set");
  expect_same(outg.get(kCuda, sg), poisoned(sg), "grouped, flag set");
  set_flag(flag, 0);
  replay();
  expect_same(out.get(kCuda, s), reference(s, x), "flag clear");
  expect_same(outg.get(kCuda, sg), reference(sg, xg), "grouped, flag clear");
  const auto first = reference(s, x), firstg = reference(sg, xg);
  x = fast_random_bf16(s.numel(), s.cols, 12, 0.001);  // new weights in the same buffers
  xg = fast_random_bf16(sg.numel(), sg.cols, 13, 0.001);
  test::bytes_to_device(kCuda, src.data(), x.data(), x.size() * 2);
  test::bytes_to_device(kCuda, srcg.data(), xg.data(), xg.size() * 2);
  set_flag(flag, 1);
  replay();  // a later microbatch: keep the old quantization
  expect_same(out.get(kCuda, s), first, "flag set again");
  expect_same(outg.get(kCuda, sg), firstg, "grouped, flag set again");
  set_flag(flag, 0);
  replay();
  expect_same(out.get(kCuda, s), reference(s, x), "flag clear again");
  expect_same(outg.get(kCuda, sg), reference(sg, xg), "grouped, flag clear again");
  SHARDOPT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SHARDOPT_CUDA_CHECK(cudaGraphDestroy(graph));
  SHARDOPT_CUDA_CHECK(cudaStreamDestroy(stream));
}

// ------------------------------------------------------------------ the sharded protocol

TEST(Mxfp8Gpu, ShardedTwoRanksBoundaryAtEveryElement) {
  const Mxfp8Shape s{2, 37, 45};
  const auto master = random_master(s.numel(), s.cols, 2, 0.05);
  const auto want = reference(s, to_bf16(master));
  for (std::int64_t b = 0; b <= s.numel(); ++b)
    if (!check_sharding(kCuda, s, master, want, {0, b, s.numel()})) return;
}

TEST(Mxfp8Gpu, ShardedWorldSizes1To8) {
  const std::vector<Mxfp8Shape> shapes = {{1, 64, 256}, {3, 40, 136}, {1, 33, 200}, {2, 70, 33}};
  std::mt19937 rng(4);
  std::uint32_t seed = 10;
  for (const auto& s : shapes) {
    const auto master = random_master(s.numel(), s.cols, seed++, 0.02);
    const auto want = reference(s, to_bf16(master));
    for (int world = 1; world <= 8; ++world) {
      for (std::int64_t shift = -33; shift <= 33; shift += 11)
        if (!check_sharding(kCuda, s, master, want, even_bounds(s.numel(), world, shift))) return;
      for (int t = 0; t < 3; ++t)
        if (!check_sharding(kCuda, s, master, want, random_bounds(s.numel(), world, rng))) return;
    }
  }
}

TEST(Mxfp8Gpu, ShardedLlamaMlpWeightAtWorld4EqualsWholeTensor) {
  // Large: the vector paths of the shard kernels, boundaries aligned and not.
  const Mxfp8Shape s{1, 8192, 2048};
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> master(static_cast<std::size_t>(s.numel()));
  for (auto& v : master) v = normal(rng);
  for (std::size_t i = 12345; i < master.size(); i += 1000003) master[i] = 3.0f;  // a few outliers
  const auto x = to_bf16(master);
  const auto whole = quantize_on(kCuda, s, x);
  expect_same(whole, quantize_on(kHost, s, x), "whole tensor");
  const std::int64_t q = s.numel() / 4;
  for (const auto& bounds : {std::vector<std::int64_t>{0, q, 2 * q, 3 * q, s.numel()},
                             std::vector<std::int64_t>{0, q + 17, 2 * q - 5, 3 * q + 1000, s.numel()}}) {
    for (Scheme scheme : {Scheme::ScaleMax, Scheme::AmaxMax}) {
      std::string problems;
      const auto got = simulate(kCuda, scheme, s, master, bounds, &problems);
      EXPECT_TRUE(problems.empty()) << problems;
      expect_same(got, whole, std::string("sharded ") + to_string(scheme));
    }
  }
}

TEST(Mxfp8Gpu, CapturedShardedPipelineEqualsEager) {
  // World 1 (the rank owns the whole tensor, so no reduction is needed): phase 1 and
  // phase 2 of both schemes, memsets included, captured once and replayed after the
  // master changes.
  const Mxfp8Shape s{2, 96, 264};
  const Range all{0, s.numel()};
  auto master = random_master(s.numel(), s.cols, 20, 0.01);
  const DeviceBuffer dmaster = upload(kCuda, master);
  DevicePlanes a(kCuda, s), b(kCuda, s);
  DeviceBuffer amax_row(kCuda, static_cast<std::size_t>(s.scale_row_numel()) * 4);
  DeviceBuffer amax_col(kCuda, static_cast<std::size_t>(s.scale_col_numel()) * 4);
  cudaStream_t stream;
  SHARDOPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Stream st = reinterpret_cast<Stream>(stream);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  SHARDOPT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  mxfp8_partial_scales(s, all, dmaster.as<float>(), a.scale_row.as<std::uint8_t>(), a.scale_col.as<std::uint8_t>(), kCuda, st);
  quantize_mxfp8_shard_data(s, all, dmaster.as<float>(), a.scale_row.as<std::uint8_t>(), a.scale_col.as<std::uint8_t>(),
                            a.data_row.as<std::uint8_t>(), a.data_col.as<std::uint8_t>(), kCuda, st);
  mxfp8_partial_amax(s, all, dmaster.as<float>(), amax_row.as<std::uint32_t>(), amax_col.as<std::uint32_t>(), kCuda, st);
  quantize_mxfp8_shard(s, all, dmaster.as<float>(), amax_row.as<std::uint32_t>(), amax_col.as<std::uint32_t>(), b.planes(),
                       kCuda, st);
  SHARDOPT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  SHARDOPT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (std::uint32_t step = 0; step < 3; ++step) {
    master = random_master(s.numel(), s.cols, 30 + step, 0.01);
    test::bytes_to_device(kCuda, dmaster.data(), master.data(), master.size() * 4);
    SHARDOPT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto want = reference(s, to_bf16(master));
    expect_same(a.get(kCuda, s), want, "scheme A replay " + std::to_string(step));
    expect_same(b.get(kCuda, s), want, "scheme B replay " + std::to_string(step));
  }
  SHARDOPT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SHARDOPT_CUDA_CHECK(cudaGraphDestroy(graph));
  SHARDOPT_CUDA_CHECK(cudaStreamDestroy(stream));
}

// ------------------------------------------------------------------ dequantize

TEST(Mxfp8Gpu, DequantizeEqualsHostTwin) {
  const Mxfp8Shape s{2, 300, 520};
  const auto x = fast_random_bf16(s.numel(), s.cols, 40, 0.01);
  const auto q = quantize_on(kHost, s, x);
  for (Mxfp8Plane plane : {Mxfp8Plane::Rowwise, Mxfp8Plane::Columnwise}) {
    const bool row = plane == Mxfp8Plane::Rowwise;
    const auto& data = row ? q.data_row : q.data_col;
    const auto& scale = row ? q.scale_row : q.scale_col;
    const DeviceBuffer dd = upload(kCuda, data), ds = upload(kCuda, scale);
    DeviceBuffer dout(kCuda, data.size() * 4);
    dequantize_mxfp8(s, plane, dd.as<std::uint8_t>(), ds.as<std::uint8_t>(), dout.as<float>(), kCuda, nullptr);
    const auto gpu = download<float>(kCuda, dout, data.size());
    std::vector<float> host(data.size());
    dequantize_mxfp8(s, plane, data.data(), scale.data(), host.data(), kHost, nullptr);
    for (std::size_t i = 0; i < host.size(); ++i)
      ASSERT_TRUE(bits_of(gpu[i]) == bits_of(host[i]) || (std::isnan(gpu[i]) && std::isnan(host[i]))) << i;
  }
}

}  // namespace
