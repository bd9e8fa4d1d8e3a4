// The Communicator on the host backend (MPI), run under mpiexec with 2 and 4 ranks:
// the cases shared with the GPU suite (comm_cases.hpp), plus what only the host has.
#include "mpi/comm_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

SHARDOPT_COMM_CASES(CommHost, Backend::Host)

// A HostStream capture records the MPI collectives instead of running them; every
// replay runs them again, on every rank, with the recorded arguments.
TEST(CommHost, CapturedCollectivesRunAtReplay) {
  Communicator& comm = world(Backend::Host);
  const int n = comm.size(), me = comm.rank();
  HostStream s;
  DeviceBuffer buf(Backend::Host, static_cast<std::size_t>(n) * 4);
  auto* x = buf.as<float>();
  for (int i = 0; i < n; ++i) x[i] = 1.0f;
  s.begin_capture();
  comm.reduce_scatter(buf.data(), 1, DType::f32, ReduceOp::Sum, s.handle());
  comm.all_gather(buf.data(), 1, DType::f32, s.handle());
  HostGraph g = s.end_capture();
  EXPECT_EQ(g.size(), 2u);
  for (int i = 0; i < n; ++i) EXPECT_EQ(x[i], 1.0f) << "nothing runs at capture time";
  g.replay();  // every element becomes n
  for (int i = 0; i < n; ++i) EXPECT_EQ(x[i], static_cast<float>(n));
  g.replay();  // and then n * n
  for (int i = 0; i < n; ++i) EXPECT_EQ(x[i], static_cast<float>(n * n)) << "rank " << me;
}

// A replay on a group that failed after the capture throws instead of communicating.
TEST(CommHost, ReplayAfterFailureThrows) {
  Communicator comm = make_world(Backend::Host);
  HostStream s;
  float v = 1.0f;
  s.begin_capture();
  comm.all_reduce(&v, 1, DType::f32, ReduceOp::Sum, s.handle());
  HostGraph g = s.end_capture();
  (void)error_of([&] { shardopt::detail::provoke_backend_error_for_test(comm); });
  const auto e = error_of([&] { g.replay(); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::InvalidState);
  EXPECT_EQ(v, 1.0f);
}

// A handle that is not a HostStream (e.g. a cudaStream_t) is refused.
TEST(CommHost, ForeignStreamIsInvalidArgument) {
  Communicator comm = make_world(Backend::Host);
  int dummy = 0;
  float v = 0.0f;
  const auto e = error_of([&] { comm.all_reduce(&v, 1, DType::f32, ReduceOp::Sum, reinterpret_cast<Stream>(&dummy)); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::InvalidArgument);
  EXPECT_TRUE(contains(e->what(), "HostStream")) << e->what();
}

// communicator_from_mpi duplicates the MPI communicator: traffic on it cannot match
// messages on MPI_COMM_WORLD, and the group's size and rank are the world's.
TEST(CommHost, BootstrapDuplicatesTheCommunicator) {
  Communicator comm = make_world(Backend::Host);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(comm.rank(), rank);
  EXPECT_EQ(comm.size(), size);
  EXPECT_EQ(comm.device(), -1);
  EXPECT_EQ(comm.backend(), Backend::Host);
  EXPECT_FALSE(comm.failed());
}

}  // namespace
