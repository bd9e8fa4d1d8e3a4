// The tests' own Host/CUDA seam (test/common/cuda_ops.hpp and grad_stream.hpp): the host
// backend's helpers work in every build, and in a build without CUDA each CUDA call of the
// helpers refuses with Error(Unsupported) rather than doing nothing (in a CUDA build that
// case is skipped: the GPU suites make the real calls).
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <vector>

#include "common/device_util.hpp"
#include "common/error_of.hpp"
#include "common/grad_stream.hpp"
#include "shardopt/backend.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"

namespace {
using namespace shardopt;

template <class F>
void expect_unsupported(F&& f, const char* what) {
  const std::optional<Error> e = test::error_of(f);
  ASSERT_TRUE(e.has_value()) << what << " did not refuse";
  EXPECT_EQ(e->code(), ErrorCode::Unsupported) << what << ": " << e->what();
}

TEST(TestSupportSeam, CudaCallsRefuseWithoutCuda) {
  if (cuda_compiled()) GTEST_SKIP() << "this build has CUDA: the GPU suites make these calls";
  expect_unsupported([] { test::TestStream s(Backend::Cuda); }, "a CUDA TestStream");
  float from = 1.0f, to = 0.0f;
  expect_unsupported([&] { test::copy_bytes(Backend::Cuda, &to, &from, sizeof from); }, "a CUDA copy");
  EXPECT_EQ(to, 0.0f);
  std::vector<float> grad(4, 0.0f);
  const std::vector<test::GradTarget> targets{{grad.data(), 4, 0, DType::f32}};
  expect_unsupported([&] { test::add_grads(Backend::Cuda, nullptr, {}, targets); }, "the CUDA gradient writer");
  int fake = 0;  // a stream handle the refusal never reads
  expect_unsupported([&] { test::delay_stream(Backend::Cuda, reinterpret_cast<Stream>(&fake), 10); },
                     "the CUDA stream delay");
  EXPECT_EQ(grad, std::vector<float>(4, 0.0f));
}

TEST(TestSupportSeam, HostHelpersCopyCaptureAndReplay) {
  float from = 2.5f, to = 0.0f;
  test::copy_bytes(Backend::Host, &to, &from, sizeof from);
  EXPECT_EQ(to, 2.5f);
  test::TestStream s(Backend::Host);
  int runs = 0;
  s.begin_capture();
  host_enqueue(s.get(), [&] { ++runs; });
  test::Graph g;
  s.end_capture(g);
  EXPECT_EQ(runs, 0);  // recorded, not run
  g.replay(Backend::Host, s.get());
  g.replay(Backend::Host, s.get());
  s.sync();
  EXPECT_EQ(runs, 2);
  s.begin_capture();
  host_enqueue(s.get(), [&] { ++runs; });
  s.end_capture_discard();
  s.sync();
  EXPECT_EQ(runs, 2);  // the discarded capture never runs
}

TEST(TestSupportSeam, HostGradientWriterAddsTheStreamsValues) {
  std::vector<float> grad(8, 0.0f);
  const std::vector<test::GradTarget> targets{{grad.data(), 8, 3, DType::f32}};
  test::GradStreamParams p;  // grid values, step 0, microbatch 0, rank 0
  test::TestStream s(Backend::Host);
  test::add_grads(Backend::Host, s.get(), p, targets);
  s.sync();
  for (std::int64_t j = 0; j < 8; ++j)
    EXPECT_EQ(grad[static_cast<std::size_t>(j)], test::grad_value(p.kind, p.scale, 0, 0, 0, 3, j)) << j;
}

}  // namespace
