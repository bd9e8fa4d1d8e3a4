// The BucketStore on the host backend (MPI), run under mpiexec with 2 and 4 ranks: the
// cases shared with the GPU suite (bucket_store_cases.hpp, test/gpu/test_bucket_store_gpu.cpp).
#include "mpi/bucket_store_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

SHARDOPT_BUCKET_STORE_CASES(BucketStoreHost, Backend::Host, false)

TEST(BucketStoreHost, OneRankStoreIsIdentity) { one_rank_store_is_identity(Communicator::self(Backend::Host)); }

// A start recorded by a capture cannot be waited for outside it (CUDA would refuse the
// capture as unjoined; the host backend says so at the wait).
TEST(BucketStoreHost, CapturedStartIsWaitedInItsCapture) {
  Communicator& comm = world(Backend::Host);
  BucketStore st(comm, store_layout(comm.size()));
  HostStream s;
  s.begin_capture();
  st.start_grad_reduce(1, s.handle());
  HostGraph g = s.end_capture();
  const auto e = error_of([&] { st.wait_grad_reduce(1, s.handle()); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::InvalidState);
  EXPECT_TRUE(contains(e->what(), "started inside a capture but is waited for outside any capture")) << e->what();
  s.begin_capture();
  st.wait_grad_reduce(1, s.handle());  // the same HostStream capturing again
  (void)s.end_capture();
  EXPECT_FALSE(st.grad_reduce_pending(1));
}
}  // namespace
