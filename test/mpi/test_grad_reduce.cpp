// GradReducePrecision::F32Accumulate below the optimizers on the host backend (MPI), run
// under mpiexec with 2, 3, 4 and 8 ranks: the cases shared with the GPU suite
// (grad_reduce_cases.hpp, test/gpu/test_grad_reduce_gpu.cpp).
#include "mpi/grad_reduce_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

SHARDOPT_GRAD_REDUCE_CASES(GradReduceHost, Backend::Host)

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
