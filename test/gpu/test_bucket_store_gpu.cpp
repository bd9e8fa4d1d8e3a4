// The BucketStore on CUDA + NCCL, one GPU per rank (run by test/gpu/run_mpi.sh with 1,
// 2 and 4 ranks; one rank is an NCCL group of size 1). The cases shared with the host
// suite (bucket_store_cases.hpp) run with registered (ncclMemAlloc + ncclCommRegister)
// and plain cudaMalloc buffers; then what only CUDA has: a whole step driven by
// grad_ready captured in a CUDA graph, and the capture rules of start / wait pairs.
#include "mpi/bucket_store_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

constexpr Backend kCuda = Backend::Cuda;

SHARDOPT_BUCKET_STORE_CASES(BucketStoreNcclRegistered, kCuda, true)
SHARDOPT_BUCKET_STORE_CASES(BucketStoreNcclCudaMalloc, kCuda, false)

// A training step captured whole: backward reports every parameter (grad_ready starts a
// bucket's reduce-scatter when its last parameter reports), every reduce-scatter is
// waited for, then every bucket's all-gather is started and waited for. Replays give the
// bytes of the eager step, which equals the oracle (exact data: any order, same bits).
TEST(BucketStoreGpu, CapturedGradReadyStepReplaysLikeEager) {
  Communicator& comm = world(kCuda);
  const int n = comm.size(), me = comm.rank();
  TestStream s(kCuda);
  BucketStore st = test_store(comm, DType::bf16, ReduceOp::Sum);
  const Layout& L = st.layout();
  const int nb = static_cast<int>(L.buckets().size());
  const int np = static_cast<int>(L.params().size());
  std::vector<std::vector<Bytes>> in;
  for (int r = 0; r < n; ++r) in.push_back(grad_images(L, DType::bf16, r, true));
  const PristineInputs pristine(kCuda, in[static_cast<std::size_t>(me)], param_images(L, me));
  const auto eager = expect_replays_like_eager(st, s, [&] {
    pristine.restore(st, s.get());
    for (int p = np - 1; p >= 0; --p) st.grad_ready(p, s.get());
    for (int b = nb - 1; b >= 0; --b) st.wait_grad_reduce(b, s.get());
    for (int b = 0; b < nb; ++b) st.start_param_gather(b, s.get());
    for (int b = 0; b < nb; ++b) st.wait_param_gather(b, s.get());
  }, "grad_ready step");
  expect_reduced(L, DType::bf16, ReduceOp::Sum, true, me, in, eager.grads, "grad_ready step");
  expect_gathered(L, eager.params, "grad_ready step, rank " + std::to_string(me));
}

// A start recorded by a capture is waited for in that capture only: a wait on a stream
// outside any capture, or in another capture, is refused before anything is enqueued
// (the graph would not join the comm stream back); the wait in the capture joins it,
// the capture ends valid and its graph replays.
TEST(BucketStoreGpu, CapturedStartIsWaitedInItsCapture) {
  Communicator& comm = world(kCuda);
  BucketStore st(comm, store_layout(comm.size()));
  TestStream s(kCuda), eager(kCuda), other(kCuda);
  s.begin_capture();
  st.start_grad_reduce(1, s.get());
  expect_code(error_of([&] { st.wait_grad_reduce(1, eager.get()); }), ErrorCode::InvalidState,
              "started inside a capture but is waited for outside any capture");
  other.begin_capture();
  expect_code(error_of([&] { st.wait_grad_reduce(1, other.get()); }), ErrorCode::InvalidState,
              "started inside a capture but is waited for inside another capture");
  other.end_capture_discard();
  EXPECT_TRUE(st.grad_reduce_pending(1));
  st.wait_grad_reduce(1, s.get());
  Graph g;
  s.end_capture(g);
  EXPECT_FALSE(st.grad_reduce_pending(1));
  g.replay(kCuda, s.get());
  s.sync();
}

}  // namespace
