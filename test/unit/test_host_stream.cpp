// The host backend's stream capture: recorded work does not run until replay, and
// replays use the arguments recorded, reading memory when they run.
#include <gtest/gtest.h>

#include <vector>

#include "core/memory.hpp"
#include "shardopt/backend.hpp"
#include "shardopt/error.hpp"
#include "shardopt/host_stream.hpp"

namespace {
using namespace shardopt;

TEST(HostStream, ImmediateWhenNotCapturing) {
  HostStream s;
  int x = 0;
  host_enqueue(s.handle(), [&] { x = 1; });
  EXPECT_EQ(x, 1);
  host_enqueue(nullptr, [&] { x = 2; });
  EXPECT_EQ(x, 2);
  EXPECT_FALSE(is_capturing(Backend::Host, s.handle()));
}

TEST(HostStream, CaptureRecordsAndReplays) {
  HostStream s;
  std::vector<int> log;
  int counter = 0;
  s.begin_capture();
  EXPECT_TRUE(is_capturing(Backend::Host, s.handle()));
  host_enqueue(s.handle(), [&] { log.push_back(++counter); });
  host_enqueue(s.handle(), [&] { log.push_back(counter * 10); });
  EXPECT_TRUE(log.empty()) << "captured work must not run at capture time";
  HostGraph g = s.end_capture();
  EXPECT_EQ(g.size(), 2u);
  g.replay();
  g.replay();
  EXPECT_EQ(log, (std::vector<int>{1, 10, 2, 20}));
  EXPECT_NO_THROW(synchronize(Backend::Host, s.handle())) << "not capturing any more";
}

TEST(HostStream, CaptureErrorsAndForeignHandles) {
  HostStream s;
  const auto code_of = [](const auto& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    ADD_FAILURE() << "no error";
    return ErrorCode::Internal;
  };
  EXPECT_EQ(code_of([&] { (void)s.end_capture(); }), ErrorCode::InvalidState);
  s.begin_capture();
  EXPECT_EQ(code_of([&] { s.begin_capture(); }), ErrorCode::InvalidState);
  EXPECT_EQ(code_of([&] { synchronize(Backend::Host, s.handle()); }), ErrorCode::InvalidState)
      << "synchronize() while capturing";
  (void)s.end_capture();
  int dummy = 0;
  const Stream foreign = reinterpret_cast<Stream>(&dummy);
  try {
    host_enqueue(foreign, [] {});
    FAIL() << "a foreign handle must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
  }
}

TEST(HostMemory, AlignedFillAndCopyFollowTheStream) {
  DeviceBuffer a(Backend::Host, 1000), b(Backend::Host, 1000);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % 256, 0u);
  for (int i = 0; i < 250; ++i) a.as<float>()[i] = static_cast<float>(i);
  HostStream s;
  s.begin_capture();
  copy_async(Backend::Host, b.data(), a.data(), 1000, s.handle());
  fill_zero_async(Backend::Host, a.data(), 1000, s.handle());
  HostGraph g = s.end_capture();
  EXPECT_EQ(a.as<float>()[7], 7.0f);
  g.replay();
  EXPECT_EQ(b.as<float>()[7], 7.0f);
  EXPECT_EQ(a.as<float>()[7], 0.0f);
  DeviceBuffer moved = std::move(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(moved.as<float>()[9], 9.0f);
}

TEST(Backend, DefaultAndNames) {
  EXPECT_STREQ(to_string(Backend::Host), "host");
  EXPECT_STREQ(to_string(ErrorCode::CaptureRefused), "capture_refused");
  if (cuda_device_count() == 0) {
    EXPECT_EQ(default_backend(), Backend::Host);
  }
  setenv("SHARDOPT_BACKEND", "host", 1);
  EXPECT_EQ(default_backend(), Backend::Host);
  setenv("SHARDOPT_BACKEND", "bogus", 1);
  EXPECT_THROW(default_backend(), Error);
  unsetenv("SHARDOPT_BACKEND");
}

}  // namespace
