// The device skip flag of quantize_nvfp4, quantize_nvfp4_batch and the bf16
// dequantize_nvfp4 on the host backend:
// set, nothing is written (poisoned outputs stay poisoned); clear or null, everything
// is, as the oracle says (its own quantize and decode); read when the work runs, so a
// graph captured once on a HostStream honours the flag's value at each replay.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardopt/host_stream.hpp"
#include "shardopt/nvfp4.hpp"
#include "unit/test_nvfp4_common.hpp"

namespace {
using namespace shardopt;
using namespace nvfp4_test;
namespace ref = nvfp4_ref;

constexpr Backend kHost = Backend::Host;

// The outputs of a shape that nothing wrote.
ref::Quantized untouched(const Nvfp4Shape& s) {
  return {std::vector<std::uint8_t>(static_cast<std::size_t>(s.data_bytes()), kPoison),
          std::vector<std::uint8_t>(static_cast<std::size_t>(s.scale_numel()), kPoison), kPoisonWord, kPoisonWord};
}

TEST(Nvfp4Skip, OneTensorWritesNothingWhenSetEverythingWhenClear) {
  const Nvfp4Shape s{33, 47};
  const auto x = mxfp8_test::random_bf16(s.numel(), s.cols, 1, -20, 20);
  std::int32_t flag = 1;
  DevicePlanes out(kHost, s);
  quantize_nvfp4(s, x.data(), out.planes(), &flag, kHost, nullptr);
  EXPECT_TRUE(out.get(kHost, s) == untouched(s)) << "flag set: something was written";
  flag = 0;
  quantize_nvfp4(s, x.data(), out.planes(), &flag, kHost, nullptr);
  EXPECT_TRUE(out.get(kHost, s) == reference(s, x)) << "flag clear";
  DevicePlanes no_flag(kHost, s);
  quantize_nvfp4(s, x.data(), no_flag.planes(), nullptr, kHost, nullptr);
  EXPECT_TRUE(no_flag.get(kHost, s) == reference(s, x)) << "no flag";
}

// A batch of mixed shapes (one refused) over its poisoned outputs, and the inputs.
struct BatchCase {
  std::vector<Nvfp4Shape> shapes = {{16, 16}, {17, 33}, {1, 1}, {40, 3}};
  std::vector<std::vector<std::uint16_t>> xs;
  std::vector<std::unique_ptr<DevicePlanes>> outs;
  std::vector<Nvfp4Tensor> tensors;
  BatchCase() {
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      xs.push_back(mxfp8_test::random_bf16(shapes[t].numel(), shapes[t].cols, 5 + static_cast<std::uint32_t>(t), -9, 9));
      if (t == 1) xs.back()[7] = 0x7F80;  // +Inf: refused
      outs.push_back(std::make_unique<DevicePlanes>(kHost, shapes[t]));
      tensors.push_back({shapes[t], xs.back().data(), outs.back()->planes()});
    }
  }
  // Every output untouched (written = false) or equal to the oracle (true).
  void expect(bool written, const std::string& what) const {
    for (std::size_t t = 0; t < shapes.size(); ++t)
      EXPECT_TRUE(outs[t]->get(kHost, shapes[t]) == (written ? reference(shapes[t], xs[t]) : untouched(shapes[t])))
          << what << ": tensor " << t;
  }
};

TEST(Nvfp4Skip, BatchWritesNothingWhenSetEverythingWhenClear) {
  BatchCase c;
  const Nvfp4Batch batch(c.tensors, kHost);
  std::int32_t flag = -1;  // any nonzero value skips
  quantize_nvfp4_batch(batch, &flag, kHost, nullptr);
  c.expect(false, "flag set");
  flag = 0;
  quantize_nvfp4_batch(batch, &flag, kHost, nullptr);
  c.expect(true, "flag clear");
}

TEST(Nvfp4Skip, CapturedGraphsReadTheFlagAtEachReplay) {
  BatchCase c;
  const Nvfp4Batch batch(c.tensors, kHost);
  const Nvfp4Shape s{24, 40};
  auto x = mxfp8_test::random_bf16(s.numel(), s.cols, 9, -5, 5);
  DevicePlanes one(kHost, s);
  std::int32_t flag = 0;  // clear while capturing: the value then must not matter
  HostStream stream;
  stream.begin_capture();
  quantize_nvfp4_batch(batch, &flag, kHost, stream.handle());
  quantize_nvfp4(s, x.data(), one.planes(), &flag, kHost, stream.handle());
  HostGraph graph = stream.end_capture();
  c.expect(false, "captured, not replayed");
  flag = 1;
  graph.replay();
  c.expect(false, "replay with the flag set");
  EXPECT_TRUE(one.get(kHost, s) == untouched(s)) << "replay with the flag set: one tensor";
  flag = 0;
  graph.replay();
  c.expect(true, "replay with the flag clear");
  EXPECT_TRUE(one.get(kHost, s) == reference(s, x)) << "replay with the flag clear: one tensor";
  const auto before = one.get(kHost, s);
  const auto y = mxfp8_test::random_bf16(s.numel(), s.cols, 10, -5, 5);
  std::copy(y.begin(), y.end(), x.begin());  // new values in the captured buffer
  flag = 1;
  graph.replay();
  EXPECT_TRUE(one.get(kHost, s) == before) << "set again: the previous outputs stay";
  flag = 0;
  graph.replay();
  EXPECT_TRUE(one.get(kHost, s) == reference(s, x)) << "clear again: the new values";
}

TEST(Nvfp4Skip, Bf16DequantizeWritesNothingWhenSetAtEachReplay) {
  const Nvfp4Shape s{33, 47};
  const auto x = mxfp8_test::random_bf16(s.numel(), s.cols, 11, -20, 20);
  const ref::Quantized q = reference(s, x);
  // The oracle's decode, rounded to bf16 (not the library's dequantize_nvfp4).
  std::vector<std::uint32_t> want(static_cast<std::size_t>(s.numel()));
  for (std::int64_t i = 0; i < s.numel(); ++i)
    want[static_cast<std::size_t>(i)] = mxfp8_ref::to_bf16(ref::dequantize(q, s.cols, i));
  SkippableDecode d(kHost, s, q);
  std::int32_t flag = 1;
  d.run(kHost, &flag, nullptr);
  EXPECT_EQ(d.out(kHost), d.untouched()) << "flag set: something was written";
  d.run(kHost, nullptr, nullptr);
  EXPECT_EQ(d.out(kHost), want) << "no flag";
  SkippableDecode g(kHost, s, q);
  flag = 0;  // clear while capturing: the value then must not matter
  HostStream stream;
  stream.begin_capture();
  g.run(kHost, &flag, stream.handle());
  HostGraph graph = stream.end_capture();
  flag = 1;
  graph.replay();
  EXPECT_EQ(g.out(kHost), g.untouched()) << "replay with the flag set";
  flag = 0;
  graph.replay();
  EXPECT_EQ(g.out(kHost), want) << "replay with the flag clear";
}

}  // namespace
