// The watchdog on a GPU (NCCL, under mpirun; one rank on the device machine): a replayed
// step whose stream is stuck behind a kernel that never finishes (it spins on a host
// flag) becomes Error(Timeout) within step_timeout + 20%, the NCCL communicator is
// aborted, later calls are refused with Error(Timeout), and once the flag releases the
// kernel the process goes on and exits cleanly. A blocking wait on a stuck stream is
// bounded by wait_timeout the same way, and healthy replays far beyond the in-flight
// bound are never flagged.
#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "comm/comm_impl.hpp"
#include "core/check.hpp"
#include "common/error_of.hpp"
#include "common/dist_adam_cases.hpp"
#include "gpu/comm_test_kernels.hpp"
#include "shardopt/step_graph.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kSpinBoundNs = 60ull * 1000 * 1000 * 1000;  // a failing test still ends

long long ms_since(Clock::time_point t0) {
  return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
}

cudaStream_t cuda(Stream s) { return reinterpret_cast<cudaStream_t>(s); }

// Waits (at most 20 s) until NCCL's communicator behind `comm` has been aborted.
bool released_within(const Communicator& comm, int seconds) {
  const Clock::time_point t0 = Clock::now();
  while (!detail::CommAccess::require(comm).backend_released()) {
    if (ms_since(t0) > seconds * 1000) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

void expect_refused(const std::function<void()>& call, const std::string& what) {
  const std::optional<Error> e = error_of(call);
  ASSERT_TRUE(e.has_value()) << what << " after the timeout did not throw";
  EXPECT_EQ(e->code(), ErrorCode::Timeout) << e->what();
  EXPECT_NE(std::string(e->what()).find("refused"), std::string::npos) << e->what();
}

TEST(WatchdogGpu, StuckReplayTimesOutAndAbortsTheCommunicator) {
  Communicator comm = make_comm(Backend::Cuda);
  TestStream ts(Backend::Cuda);
  const Stream s = ts.get();
  DistributedAdamOptions o = base_options(DType::f32);
  o.watchdog = WatchdogOptions{std::chrono::milliseconds(0), std::chrono::milliseconds(2000)};  // no wait_timeout
  DistributedAdam opt(comm, small_model(), o);
  init_params(opt, s);
  StepGraph graph(opt, [](Stream, bool) {});
  graph.capture(s);
  graph.replay(s);  // a healthy replay first
  opt.synchronize(s);

  HostFlag flag;
  spin_until_flag(cuda(s), flag.device(), kSpinBoundNs);
  const Clock::time_point t0 = Clock::now();
  graph.replay(s);  // queued behind the kernel that never finishes
  const std::optional<Error> e = error_of([&] { opt.synchronize(s); });
  const long long took = ms_since(t0);
  flag.set();  // let the stream drain whatever happened
  ASSERT_TRUE(e.has_value()) << "synchronize returned on a stream stuck behind a spinning kernel";
  EXPECT_EQ(e->code(), ErrorCode::Timeout) << e->what();
  EXPECT_GE(took, 2000);
  EXPECT_LE(took, 2400) << "the timeout came " << took << " ms after the replay (step_timeout 2000 ms + 20%)";
  const std::string what = e->what();
  EXPECT_NE(what.find("iteration #2 of DistributedAdam"), std::string::npos) << what;
  EXPECT_NE(what.find("step_timeout of 2000 ms"), std::string::npos) << what;
  std::printf("stuck replay: Error(Timeout) after %lld ms: %s\n", took, what.c_str());

  EXPECT_TRUE(comm.failed());
  EXPECT_TRUE(released_within(comm, 20)) << "the NCCL communicator was not aborted";
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(cuda(s)));
  expect_refused([&] { graph.replay(s); }, "replay");
  expect_refused([&] { (void)opt.read_scalars(s); }, "read_scalars");
  expect_refused([&] { opt.step(s); }, "step");
}

TEST(WatchdogGpu, BlockingWaitOnAStuckStreamIsBounded) {
  Communicator comm = make_comm(Backend::Cuda);
  TestStream ts(Backend::Cuda);
  const Stream s = ts.get();
  DistributedAdamOptions o = base_options(DType::f32);
  o.watchdog = WatchdogOptions{std::chrono::milliseconds(1000), std::chrono::minutes(5)};
  DistributedAdam opt(comm, small_model(), o);
  init_params(opt, s);
  opt.synchronize(s);

  HostFlag flag;
  spin_until_flag(cuda(s), flag.device(), kSpinBoundNs);
  const Clock::time_point t0 = Clock::now();
  const std::optional<Error> e = error_of([&] { (void)opt.read_scalars(s); });
  const long long took = ms_since(t0);
  flag.set();
  ASSERT_TRUE(e.has_value()) << "read_scalars returned on a stuck stream";
  EXPECT_EQ(e->code(), ErrorCode::Timeout) << e->what();
  EXPECT_GE(took, 1000);
  EXPECT_LE(took, 1200) << "the timeout came after " << took << " ms (wait_timeout 1000 ms + 20%)";
  EXPECT_NE(std::string(e->what()).find("read_scalars"), std::string::npos) << e->what();
  EXPECT_NE(std::string(e->what()).find("wait_timeout of 1000 ms"), std::string::npos) << e->what();
  std::printf("stuck wait: Error(Timeout) after %lld ms: %s\n", took, e->what());
  EXPECT_TRUE(released_within(comm, 20)) << "the NCCL communicator was not aborted";
  SHARDOPT_CUDA_CHECK(cudaStreamSynchronize(cuda(s)));
  expect_refused([&] { opt.step(s); }, "step");
}

TEST(WatchdogGpu, HealthyReplaysAreNeverFlagged) {
  Communicator comm = make_comm(Backend::Cuda);
  TestStream ts(Backend::Cuda);
  const Stream s = ts.get();
  DistributedAdamOptions o = base_options(DType::f32);
  o.watchdog = WatchdogOptions{std::chrono::milliseconds(2000), std::chrono::milliseconds(2000)};
  DistributedAdam opt(comm, small_model(), o);
  init_params(opt, s);
  StepGraph graph(opt, [](Stream, bool) {});
  graph.capture(s);
  // Far more replays than may be in flight, each behind a short delay, without a wait.
  for (int i = 0; i < 40; ++i) {
    spin(cuda(s), 2'000'000);  // 2 ms
    graph.replay(s);
  }
  opt.synchronize(s);
  EXPECT_FALSE(comm.failed());
  EXPECT_EQ(opt.read_scalars(s).step, 40 + 1);  // the capture's warm-up iteration trained too
}

}  // namespace
