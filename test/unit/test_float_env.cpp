// The host twins give their IEEE bits in a process whose CPU flushes subnormals (FTZ /
// DAZ, what a shared library linked with -ffast-math turns on when it is loaded): the
// NVFP4 host twin on subnormal data equals the oracle computed with IEEE subnormals,
// eagerly and from a captured HostGraph, and the caller's modes come back.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/float_env.hpp"
#include "shardopt/host_stream.hpp"
#include "shardopt/nvfp4.hpp"
#include "unit/test_nvfp4_common.hpp"

namespace {
using namespace shardopt;

// Restores IEEE subnormals on this thread when a test ends, even when it fails.
struct FlushedForTest {
  FlushedForTest() { detail::set_subnormals_flushed_for_test(true); }
  ~FlushedForTest() { detail::set_subnormals_flushed_for_test(false); }
};

std::vector<std::uint16_t> subnormal_bf16(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint16_t> x(n);
  for (auto& h : x) h = static_cast<std::uint16_t>(rng() & 0x807F);  // bf16 subnormals and zeros
  return x;
}

TEST(FloatEnv, GuardClearsFlushModesAndRestoresThem) {
  if (!detail::float_modes_supported()) GTEST_SKIP() << "no FTZ / DAZ control on this architecture";
  ASSERT_FALSE(detail::subnormals_flushed());
  {
    FlushedForTest flushed;
    ASSERT_TRUE(detail::subnormals_flushed());
    {
      const detail::IeeeSubnormals ieee;
      EXPECT_FALSE(detail::subnormals_flushed());
    }
    EXPECT_TRUE(detail::subnormals_flushed()) << "the caller's modes were not restored";
  }
  EXPECT_FALSE(detail::subnormals_flushed());
}

TEST(FloatEnv, Nvfp4HostTwinKeepsSubnormalsUnderFlushToZero) {
  if (!detail::float_modes_supported()) GTEST_SKIP() << "no FTZ / DAZ control on this architecture";
  const Nvfp4Shape s{48, 64};
  const auto x = subnormal_bf16(static_cast<std::size_t>(s.numel()), 11);
  const nvfp4_ref::Quantized expected = nvfp4_test::reference(s, x);  // IEEE subnormals here
  FlushedForTest flushed;
  EXPECT_TRUE(nvfp4_test::quantize_on(Backend::Host, s, x) == expected) << "eager";
  // The same work recorded into a HostGraph and replayed.
  HostStream hs;
  const DeviceBuffer src = nvfp4_test::upload(Backend::Host, x);
  nvfp4_test::DevicePlanes out(Backend::Host, s);
  hs.begin_capture();
  quantize_nvfp4(s, src.as<std::uint16_t>(), out.planes(), nullptr, Backend::Host, hs.handle());
  const HostGraph g = hs.end_capture();
  g.replay();
  EXPECT_TRUE(out.get(Backend::Host, s) == expected) << "replayed";
  EXPECT_TRUE(detail::subnormals_flushed()) << "the caller's modes were not restored";
}

}  // namespace
