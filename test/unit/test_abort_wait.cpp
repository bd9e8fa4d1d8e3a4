// The count of running NCCL aborts and the exit handler that waits for them
// (src/comm/abort_wait.hpp): an exit must not tear the CUDA runtime down under an abort
// that still runs.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

#include "comm/abort_wait.hpp"

namespace {
using namespace shardopt::detail;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

long long ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
}

TEST(AbortWait, CountsEachAbortForItsLifetime) {
  const int before = running_aborts();
  {
    RunningAbort a;
    EXPECT_EQ(running_aborts(), before + 1);
    {
      RunningAbort b;
      EXPECT_EQ(running_aborts(), before + 2);
    }
    EXPECT_EQ(running_aborts(), before + 1);
  }
  EXPECT_EQ(running_aborts(), before);
  EXPECT_TRUE(wait_for_aborts(milliseconds(0)));
}

TEST(AbortWait, WaitsForAnAbortThatEnds) {
  auto running = std::make_unique<RunningAbort>();
  std::thread ends([&] {
    std::this_thread::sleep_for(milliseconds(200));
    running.reset();
  });
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(wait_for_aborts(milliseconds(5000)));
  EXPECT_GE(ms_since(t0), 150);
  ends.join();
}

TEST(AbortWait, GivesUpAtItsLimit) {
  RunningAbort stuck;
  const Clock::time_point t0 = Clock::now();
  EXPECT_FALSE(wait_for_aborts(milliseconds(100)));
  EXPECT_GE(ms_since(t0), 100);
  EXPECT_LT(ms_since(t0), 2000);
}

// exit() waits for an abort still running on another thread: the thread's last words
// (printed 300 ms after exit was called, just before its abort ends) reach stderr.
TEST(AbortWaitDeathTest, ExitWaitsForARunningAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto running = std::make_shared<RunningAbort>();
        std::thread([running]() mutable {
          std::this_thread::sleep_for(milliseconds(300));
          std::fprintf(stderr, "abort returned\n");
          std::fflush(stderr);
          running.reset();
        }).detach();
        running.reset();  // the thread holds the last count
        std::exit(0);
      },
      testing::ExitedWithCode(0), "abort returned");
}

}  // namespace
