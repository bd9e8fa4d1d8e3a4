// The watchdog's promises that hold on a healthy job (host backend under mpiexec; the
// faults themselves are in fault_main.cpp): deadlines are checked and shared by every
// copy of a Communicator, inherited by split groups, which fail together with their
// parent; with every deadline armed (MPI_Test polled against it) training computes
// bitwise what it computes without them, replays included; synchronize waits and then
// refuses a failed group.
#include <chrono>
#include <optional>
#include <string>

#include "comm/comm_impl.hpp"
#include "common/error_of.hpp"
#include "common/fsdp_cases.hpp"
#include "shardopt/step_graph.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;
using std::chrono::milliseconds;

TEST(WatchdogHost, OptionsAreCheckedSharedAndInherited) {
  const WatchdogOptions defaults;
  EXPECT_EQ(defaults.wait_timeout, milliseconds(0));
  EXPECT_EQ(defaults.step_timeout, std::chrono::minutes(5));

  Communicator comm = make_comm(Backend::Host);
  const Communicator copy = comm;
  comm.set_watchdog(WatchdogOptions{milliseconds(1234), milliseconds(5678)});
  EXPECT_EQ(copy.watchdog().wait_timeout, milliseconds(1234)) << "copies share one group";
  EXPECT_EQ(copy.watchdog().step_timeout, milliseconds(5678));
  const std::optional<Error> bad = error_of([&] { comm.set_watchdog(WatchdogOptions{milliseconds(-1), milliseconds(0)}); });
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->code(), ErrorCode::InvalidArgument);
  EXPECT_NE(std::string(bad->what()).find("must be >= 0"), std::string::npos) << bad->what();
  EXPECT_EQ(comm.watchdog().wait_timeout, milliseconds(1234)) << "a refused value changed the deadlines";

  const Communicator child = comm.split(comm.rank() % 2, comm.rank());
  EXPECT_EQ(child.watchdog().wait_timeout, milliseconds(1234));
  EXPECT_EQ(child.watchdog().step_timeout, milliseconds(5678));

  // The optimizers set AdamOptions::watchdog on their communicator.
  DistributedAdamOptions o = base_options(DType::f32);
  o.watchdog = WatchdogOptions{milliseconds(4321), milliseconds(8765)};
  DistributedAdam opt(comm, small_model(), o);
  EXPECT_EQ(comm.watchdog().wait_timeout, milliseconds(4321));
  EXPECT_EQ(comm.watchdog().step_timeout, milliseconds(8765));
  // Unset keeps the communicator's deadlines (here: those the first optimizer set).
  DistributedAdam second(comm, small_model(), base_options(DType::f32));
  EXPECT_EQ(comm.watchdog().wait_timeout, milliseconds(4321));
}

TEST(WatchdogHost, SplitGroupsFailTogether) {
  Communicator parent = make_comm(Backend::Host);
  // A failure of the child fails the parent ...
  const Communicator child = parent.split(0, parent.rank());
  (void)error_of([&] { shardopt::detail::provoke_backend_error_for_test(child); });
  EXPECT_TRUE(child.failed());
  EXPECT_TRUE(parent.failed()) << "the parent of a failed group is still usable";
  const std::optional<Error> refused = error_of([&] { parent.barrier(); });
  ASSERT_TRUE(refused.has_value());
  EXPECT_NE(std::string(refused->what()).find("a group it was split from, or split into, failed"), std::string::npos)
      << refused->what();
  // ... and a failure of the parent fails every child.
  Communicator other = make_comm(Backend::Host);
  const Communicator a = other.split(0, other.rank());
  const Communicator b = other.split(other.rank() % 2, other.rank());
  (void)error_of([&] { shardopt::detail::provoke_backend_error_for_test(other); });
  EXPECT_TRUE(a.failed());
  EXPECT_TRUE(b.failed());
}

TEST(WatchdogHost, SynchronizeWaitsThenRefusesAFailedGroup) {
  Communicator comm = make_comm(Backend::Host);
  HostStream hs;
  EXPECT_NO_THROW(comm.synchronize(hs.handle()));
  (void)error_of([&] { shardopt::detail::provoke_backend_error_for_test(comm); });
  const std::optional<Error> e = error_of([&] { comm.synchronize(hs.handle()); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::InvalidState) << "a failure other than a timeout keeps InvalidState";
}

// Trains two optimizers on separate groups, one with every deadline armed (the MPI_Test
// path, the step deadline of replays), one with none (MPI_Wait), eager steps then
// replays: the results are the same bits.
TEST(WatchdogHost, ArmedDeadlinesComputeTheSameBits) {
  const int rank = world_rank();
  DistributedAdamOptions on = base_options(DType::bf16);
  on.watchdog = WatchdogOptions{milliseconds(60000), milliseconds(60000)};
  DistributedAdamOptions off = base_options(DType::bf16);
  off.watchdog = WatchdogOptions{milliseconds(0), milliseconds(0)};
  DistributedAdam a(make_comm(Backend::Host), small_model(), on);
  DistributedAdam b(make_comm(Backend::Host), small_model(), off);
  TestStream sa(Backend::Host), sb(Backend::Host);
  init_params(a, sa.get());
  init_params(b, sb.get());
  auto fn = [rank](DistributedAdam& opt) { return random_grads_fn(opt, Backend::Host, rank); };
  StepGraph ga(a, fn(a)), gb(b, fn(b));
  for (int i = 0; i < 2; ++i) {
    ga.run_eager(sa.get());
    gb.run_eager(sb.get());
  }
  ga.capture(sa.get());
  gb.capture(sb.get());
  for (int i = 0; i < 3; ++i) {
    ga.replay(sa.get());
    gb.replay(sb.get());
  }
  a.synchronize(sa.get());
  b.synchronize(sb.get());
  EXPECT_EQ(a.read_scalars(sa.get()).step, 6);
  expect_same_state(a, b, sa.get(), sb.get());
}

TEST(WatchdogHost, FsdpSynchronizeAndSplitGroupsInherit) {
  Communicator comm = make_comm(Backend::Host);
  FsdpOptions o = fsdp_options(base_options(DType::f32));
  o.shard_group_size = comm.size() % 2 == 0 ? 2 : 0;  // hybrid where it can be: shard + replica groups
  o.watchdog = WatchdogOptions{milliseconds(60000), std::chrono::minutes(5)};
  HostStream hs;
  Fsdp f(comm, fsdp_model(), small_units(), o);
  init_fsdp(f, hs.handle());
  EXPECT_NO_THROW(f.synchronize(hs.handle()));
  EXPECT_EQ(f.read_scalars(hs.handle()).step, 0);
}

}  // namespace
