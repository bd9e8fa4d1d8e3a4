// The batched bf16 NVFP4 decode (dequantize_nvfp4_batch) on the host backend: every
// tensor of a list of mixed shapes (odd widths, one element, a refused tensor, unaligned
// codes and outputs) equals the per-tensor bf16 decode and the oracle's bf16 of e2m1 *
// (float(scale) * S_dec), with nothing written outside the outputs; a list longer than
// one launch; the skip flag read when the work runs (eagerly and in a captured
// HostStream); the errors, naming the tensor.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/nvfp4.hpp"
#include "unit/test_nvfp4_decode_common.hpp"

namespace {
using namespace shardopt;
using namespace nvfp4_test;
namespace ref = nvfp4_ref;

constexpr Backend kHost = Backend::Host;

// Quantized tensors of `shapes` (random bf16 from 1e-12 to 1e12; tensor `refused` gets a
// NaN, so the whole tensor decodes to NaN).
std::vector<ref::Quantized> quantized(const std::vector<Nvfp4Shape>& shapes, std::uint32_t seed, int refused = -1) {
  std::vector<ref::Quantized> q;
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    auto x = mxfp8_test::random_bf16(shapes[t].numel(), shapes[t].cols, seed + static_cast<std::uint32_t>(t), -40, 40);
    if (static_cast<int>(t) == refused) x[x.size() / 2] = 0x7FC0;
    q.push_back(quantize_on(kHost, shapes[t], x));
  }
  return q;
}

const std::vector<Nvfp4Shape> kMixed = {{16, 16}, {17, 33}, {1, 1}, {1, 7}, {64, 48}, {3, 301}, {33, 40}, {2, 8}};

void expect_decoded(const DecodeList& d, const std::vector<ref::Quantized>& q, const std::string& what) {
  for (std::size_t t = 0; t < q.size(); ++t) {
    const std::vector<std::uint16_t> want = reference_bf16(d.shapes[t], q[t]);
    EXPECT_EQ(decode_one(kHost, d.shapes[t], q[t]), want) << what << " tensor " << t << ": per-tensor decode vs oracle";
    EXPECT_EQ(d.buffer(kHost, t), d.expected(t, want)) << what << " tensor " << t << ": batch vs oracle (margins)";
  }
}

TEST(Nvfp4Decode, BatchEqualsPerTensorDecodeAndOracle) {
  for (const bool misalign : {false, true}) {
    const std::vector<ref::Quantized> q = quantized(kMixed, 40, /*refused=*/2);
    const DecodeList d(kHost, kMixed, q, misalign);
    dequantize_nvfp4_batch(d.list, nullptr, kHost, nullptr);
    expect_decoded(d, q, misalign ? "misaligned" : "aligned");
  }
}

TEST(Nvfp4Decode, RefusedTensorDecodesToNaN) {
  const std::vector<Nvfp4Shape> shapes = {{16, 32}};
  const std::vector<ref::Quantized> q = quantized(shapes, 60, /*refused=*/0);
  const DecodeList d(kHost, shapes, q, false);
  dequantize_nvfp4_batch(d.list, nullptr, kHost, nullptr);
  EXPECT_EQ(d.buffer(kHost, 0), d.expected(0, std::vector<std::uint16_t>(16 * 32, 0x7FC0)));
}

TEST(Nvfp4Decode, ListLongerThanOneLaunch) {
  std::vector<Nvfp4Shape> shapes;
  for (std::size_t t = 0; t < kNvfp4DecodeLaunch + 7; ++t)
    shapes.push_back({static_cast<std::int64_t>(1 + t % 5), static_cast<std::int64_t>(8 + 3 * (t % 4))});
  const std::vector<ref::Quantized> q = quantized(shapes, 70);
  const DecodeList d(kHost, shapes, q, true);
  dequantize_nvfp4_batch(d.list, nullptr, kHost, nullptr);
  expect_decoded(d, q, "long list");
}

TEST(Nvfp4Decode, SkipFlagReadWhenTheWorkRuns) {
  const std::vector<Nvfp4Shape> shapes = {{16, 16}, {5, 9}};
  const std::vector<ref::Quantized> q = quantized(shapes, 80);
  const DecodeList d(kHost, shapes, q, false);
  std::int32_t flag = 1;
  HostStream stream;
  stream.begin_capture();
  dequantize_nvfp4_batch(d.list, &flag, kHost, stream.handle());
  HostGraph graph = stream.end_capture();
  graph.replay();
  for (std::size_t t = 0; t < shapes.size(); ++t) EXPECT_EQ(d.buffer(kHost, t), d.expected(t, {})) << "flag set " << t;
  flag = 0;  // read by the replay, not frozen at capture
  graph.replay();
  expect_decoded(d, q, "flag clear");
  const DecodeList eager(kHost, shapes, q, false);
  flag = 1;
  dequantize_nvfp4_batch(eager.list, &flag, kHost, nullptr);
  for (std::size_t t = 0; t < shapes.size(); ++t) EXPECT_EQ(eager.buffer(kHost, t), eager.expected(t, {})) << t;
}

template <class F>
void expect_error(F&& f, const char* needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Nvfp4Decode, ErrorsNameTheTensor) {
  const std::vector<Nvfp4Shape> shapes = {{16, 16}, {4, 4}, {2, 2}};
  const std::vector<ref::Quantized> q = quantized(shapes, 90);
  const DecodeList d(kHost, shapes, q, false);
  expect_error([] { dequantize_nvfp4_batch({}, nullptr, kHost, nullptr); }, "empty");
  for (const char* what : {"data is null", "scale is null", "decode_scale is null", "out is null"}) {
    std::vector<Nvfp4Decode> list = d.list;
    const std::string w = what;
    if (w == "data is null") list[1].data = nullptr;
    if (w == "scale is null") list[1].scale = nullptr;
    if (w == "decode_scale is null") list[1].decode_scale = nullptr;
    if (w == "out is null") list[1].out = nullptr;
    expect_error([&] { dequantize_nvfp4_batch(list, nullptr, kHost, nullptr); }, ("tensor 1: " + w).c_str());
  }
  std::vector<Nvfp4Decode> bad = d.list;
  bad[2].shape = Nvfp4Shape{0, 2};
  expect_error([&] { dequantize_nvfp4_batch(bad, nullptr, kHost, nullptr); }, "tensor 2: ");
  // Nothing was written by the refused calls.
  for (std::size_t t = 0; t < shapes.size(); ++t) EXPECT_EQ(d.buffer(kHost, t), d.expected(t, {})) << t;
}

}  // namespace
