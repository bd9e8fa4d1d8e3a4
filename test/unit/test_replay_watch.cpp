// The step watchdog's replay watch without a GPU (detail::ReplayWatch::watch_for_test
// puts a callable where a CUDA replay has its event): a replay not done by its deadline
// fails the communicator with Error(Timeout) from the watch's own thread within the
// deadline + 20%, finished replays are never flagged, and a replay beyond the in-flight
// bound waits for the oldest, or raises the timeout itself.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "comm/comm_impl.hpp"
#include "common/error_of.hpp"
#include "optimizer/replay_watch.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

long long ms_since(Clock::time_point t0) {
  return static_cast<long long>(std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count());
}

// Waits (at most `limit_ms`) until `comm` has failed; returns the time waited.
long long wait_failed(const Communicator& comm, Clock::time_point t0, long long limit_ms) {
  while (!comm.failed() && ms_since(t0) < limit_ms) std::this_thread::sleep_for(milliseconds(1));
  return ms_since(t0);
}

TEST(ReplayWatch, ALateReplayFailsTheCommunicatorWithinItsDeadline) {
  Communicator comm = Communicator::self(Backend::Host);
  detail::ReplayWatch watch(comm, "TestOptimizer");
  const Clock::time_point t0 = Clock::now();
  watch.watch_for_test([] { return false; }, milliseconds(300));
  const long long took = wait_failed(comm, t0, 3000);
  ASSERT_TRUE(comm.failed()) << "a replay that never finished was not flagged";
  EXPECT_GE(took, 300);
  EXPECT_LE(took, 360) << "flagged " << took << " ms after the replay (deadline 300 ms + 20%)";
  const auto e = error_of([&] { watch.before_replay(); });
  ASSERT_TRUE(e.has_value()) << "a replay after the timeout was not refused";
  EXPECT_EQ(e->code(), ErrorCode::Timeout) << e->what();
  const std::string what = e->what();
  EXPECT_NE(what.find("refused"), std::string::npos) << what;
  EXPECT_NE(what.find("iteration #1 of TestOptimizer"), std::string::npos) << what;
  EXPECT_NE(what.find("step_timeout of 300 ms"), std::string::npos) << what;
}

TEST(ReplayWatch, FinishedReplaysAreNeverFlagged) {
  Communicator comm = Communicator::self(Backend::Host);
  detail::ReplayWatch watch(comm, "TestOptimizer");
  std::atomic<bool> late_done{false};
  for (int i = 0; i < 5; ++i) watch.watch_for_test([] { return true; }, milliseconds(100));
  // One that finishes after 150 ms, well within its 300 ms.
  watch.watch_for_test([&] { return late_done.load(); }, milliseconds(300));
  std::this_thread::sleep_for(milliseconds(150));
  late_done = true;
  std::this_thread::sleep_for(milliseconds(400));  // past every deadline
  EXPECT_FALSE(comm.failed()) << comm.watchdog().step_timeout.count();
  EXPECT_NO_THROW(watch.before_replay());
}

TEST(ReplayWatch, AReplayBeyondTheBoundWaitsForTheOldest) {
  Communicator comm = Communicator::self(Backend::Host);
  detail::ReplayWatch watch(comm, "TestOptimizer");
  std::atomic<bool> release{false};
  for (std::size_t i = 0; i < detail::ReplayWatch::kMaxInFlight; ++i)
    watch.watch_for_test([&] { return release.load(); }, milliseconds(5000));
  std::thread releaser([&] {
    std::this_thread::sleep_for(milliseconds(200));
    release = true;
  });
  const Clock::time_point t0 = Clock::now();
  watch.before_replay();  // waits until the oldest finishes
  const long long took = ms_since(t0);
  releaser.join();
  EXPECT_GE(took, 190) << "the ninth replay did not wait for the oldest";
  EXPECT_FALSE(comm.failed());
}

TEST(ReplayWatch, AReplayWaitingBeyondTheBoundRaisesTheTimeout) {
  Communicator comm = Communicator::self(Backend::Host);
  detail::ReplayWatch watch(comm, "TestOptimizer");
  for (std::size_t i = 0; i < detail::ReplayWatch::kMaxInFlight; ++i)
    watch.watch_for_test([] { return false; }, milliseconds(250));
  const Clock::time_point t0 = Clock::now();
  const auto e = error_of([&] { watch.before_replay(); });
  const long long took = ms_since(t0);
  ASSERT_TRUE(e.has_value()) << "before_replay returned while every replay in flight was stuck";
  EXPECT_EQ(e->code(), ErrorCode::Timeout) << e->what();
  EXPECT_GE(took, 240);
  EXPECT_LE(took, 300) << "raised " << took << " ms after the replays (deadline 250 ms + 20%)";
  EXPECT_TRUE(comm.failed());
}

}  // namespace
