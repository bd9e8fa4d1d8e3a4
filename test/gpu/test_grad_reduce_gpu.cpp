// GradReducePrecision::F32Accumulate below the optimizers on CUDA + NCCL, one GPU per rank
// (test/gpu/run_mpi.sh, 2 ranks; registered once plain and once per NCCL_ALGO=Ring / Tree):
// the cases shared with the host suite (mpi/grad_reduce_cases.hpp). Every result is
// compared bitwise with the rank-order fp32 oracle computed on the host, so the CUDA
// kernel equals its host twin and no NCCL algorithm changes a bit.
#include "mpi/grad_reduce_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

SHARDOPT_GRAD_REDUCE_CASES(GradReduceGpu, Backend::Cuda)

// Captured on CUDA: the all-to-all (an NCCL group of send / recv) and the sum kernel on
// the store's comm stream, forked from and joined to the captured stream.
TEST(GradReduceGpu, CapturedRangeStartsReplayLikeEager) {
  Communicator& comm = world(Backend::Cuda);
  const int me = comm.rank();
  TestStream s(Backend::Cuda);
  BucketStore st = precision_store(comm, DType::bf16, GradReducePrecision::F32Accumulate);
  const Layout& L = st.layout();
  const int nb = static_cast<int>(L.buckets().size());
  const PristineInputs pristine(Backend::Cuda, grad_images(L, DType::bf16, me, false, 5), param_images(L, me));
  (void)expect_replays_like_eager(st, s, [&] {
    pristine.restore(st, s.get());
    st.start_grad_reduces(0, nb, s.get());
    for (int b = 0; b < nb; ++b) st.wait_grad_reduce(b, s.get());
  }, "F32Accumulate range starts");
}
}  // namespace
