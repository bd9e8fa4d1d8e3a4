// GradReducePrecision::F32Accumulate below the optimizers on the host backend (MPI), run
// under mpiexec with 2, 3, 4 and 8 ranks: the cases shared with the GPU suite
// (grad_reduce_cases.hpp, test/gpu/test_grad_reduce_gpu.cpp).
#include "comm/registered_ranges.hpp"
#include "mpi/grad_reduce_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

SHARDOPT_GRAD_REDUCE_CASES(GradReduceHost, Backend::Host)

// The many-bucket case of the GPU suite at a host-friendly size (the hang it guards
// against is NCCL's; here it checks the same promise through MPI).
TEST(GradReduceHost, StoreLargeBucketsAreTheOracle) { store_large_buckets_are_the_oracle(Backend::Host, 4, 1 << 14); }
TEST(GradReduceHost, StoreWithoutParamsLargeBucketsAreTheOracle) {
  store_large_buckets_are_the_oracle(Backend::Host, 2, 1 << 14, /*with_params=*/false);
}
TEST(GradReduceHost, RegisteredBufferServesSendRecvThenCollectives) {
  registered_buffer_serves_send_recv_then_collectives(Backend::Host, 1 << 12);
}

// The NCCL all-to-all refuses a registered buffer paired with an unregistered one by
// asking these ranges (comm/registered_ranges.hpp): a range counts only when it lies
// inside one registration, and a removed registration no longer counts.
TEST(GradReduceHost, RegisteredRangesCoverOnlyWholeRegistrations) {
  detail::RegisteredRanges ranges;
  std::vector<char> memory(4096);
  char* a = memory.data();
  int first = 0, second = 0;  // stand-ins for the backend's handles
  EXPECT_FALSE(ranges.covers(a, 16));
  ranges.add(&first, a, 1024);
  ranges.add(&second, a + 2048, 1024);
  EXPECT_TRUE(ranges.covers(a, 1024));
  EXPECT_TRUE(ranges.covers(a + 100, 10));
  EXPECT_TRUE(ranges.covers(a + 2048, 1024));
  EXPECT_FALSE(ranges.covers(a + 1000, 100));  // runs past the end of the first
  EXPECT_FALSE(ranges.covers(a + 1024, 512));  // the gap
  EXPECT_FALSE(ranges.covers(a + 512, 2048));  // spans both and the gap
  EXPECT_FALSE(ranges.covers(a, 0));
  ranges.remove(&first);
  EXPECT_FALSE(ranges.covers(a, 16));
  EXPECT_TRUE(ranges.covers(a + 2048, 1024));
  ranges.remove(&first);  // unknown now: nothing
  ranges.remove(&second);
  EXPECT_FALSE(ranges.covers(a + 2048, 1024));
}

// One rank: no all-to-all, no scratch; the sum of one piece is the piece.
TEST(GradReduceHost, OneRankStoreKeepsTheGradients) {
  Communicator one = Communicator::self(Backend::Host);
  TestStream s(Backend::Host);
  BucketStore st = precision_store(one, DType::bf16, GradReducePrecision::F32Accumulate);
  EXPECT_EQ(st.reduce_scratch_bytes(), 0u);
  const ReduceCheck c = reduce_known(st, s, true);
  EXPECT_EQ(c.not_oracle, 0);
  EXPECT_EQ(c.beyond_one_rounding, 0);
}
}  // namespace
