// GradReducePrecision::F32Accumulate below the optimizers on CUDA + NCCL, one GPU per rank
// (test/gpu/run_mpi.sh, 2 ranks; registered once plain and once per NCCL_ALGO=Ring / Tree):
// the cases shared with the host suite (mpi/grad_reduce_cases.hpp). Every result is
// compared bitwise with the rank-order fp32 oracle computed on the host, so the CUDA
// kernel equals its host twin and no NCCL algorithm changes a bit.
#include "mpi/grad_reduce_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

// Benchmark scale on NCCL (issue 31), and first in this binary on purpose: 64 MiB of
// bf16 gradients in 2 registered buckets (pieces of 16 MiB at 2 ranks), the size where
// the benchmarks hung. Both ranks blocked in the launch of the first piece sum of the
// store's warm-up (CUDA loaded the kernel lazily behind the all-to-all's spinning NCCL
// kernels), and the store sent registered gradients into an unregistered receive buffer.
// Only a process whose first sum comes after such an all-to-all shows the lazy load,
// hence its place before the shared cases, which launch every sum kernel.
TEST(GradReduceGpu, StoreLargeBucketsAreTheOracle) { store_large_buckets_are_the_oracle(Backend::Cuda, 2, 1 << 24); }

// The bench_comm stall (docs/grad_reduce.md): its F32Accumulate store had no parameters,
// so its registered gradient buffer served the warm-up's all-to-alls and then in-place
// all-gathers; the optimizers' stores (which completed) use it for send/recv only. The
// store at that scale (16 MiB buckets, pieces of 8 MiB), and the same use of one
// registered buffer through the Communicator alone; both under a 60 s wait_timeout.
// A parameterless F32Accumulate store at benchmark scale (16 MiB buckets): it stalled in
// NCCL 2.28.3 while its registered gradient buffer served both the all-to-all and the
// in-place all-gathers (2 x H200, 2026-11-27); such a store now registers nothing.
TEST(GradReduceGpu, StoreWithoutParamsLargeBucketsAreTheOracle) {
  store_large_buckets_are_the_oracle(Backend::Cuda, 2, 1 << 23, /*with_params=*/false);
}

// The pipelined reduce at scale: 3 chunks of pieces of about 2 Mi elements (the last
// chunk shorter), each sum beside the next chunk's all-to-all on another stream.
// (StoreLargeBucketsAreTheOracle above runs the automatic 4 chunks of 16 MiB pieces.)
TEST(GradReduceGpu, StoreLargeBucketsInThreeChunksAreTheOracle) {
  store_large_buckets_are_the_oracle(Backend::Cuda, 2, (1 << 22) + 4096, /*with_params=*/true, /*chunks=*/3);
}

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

// A registered send buffer paired with an unregistered receive buffer, or the reverse,
// is refused on every rank before NCCL sees it (NCCL leaves the mix undefined), naming the fix;
// with both registered, an all-to-all of 1 MiB pieces delivers every piece. Each case
// on a fresh group: a refused call fails its group.
TEST(GradReduceGpu, AllToAllNeedsBothBuffersRegisteredOrNeither) {
  const Watchdog alarm(120);
  const std::int64_t count = 1 << 19;  // bf16 elements per piece: 1 MiB
  for (const bool send_registered : {true, false}) {
    Communicator comm = make_world(Backend::Cuda);
    TestStream s(Backend::Cuda);
    const std::size_t bytes = static_cast<std::size_t>(count) * 2 * static_cast<std::size_t>(comm.size());
    DeviceBuffer send(Backend::Cuda, bytes, MemoryKind::NcclDevice), recv(Backend::Cuda, bytes, MemoryKind::NcclDevice);
    const BufferRegistration one = comm.register_buffer((send_registered ? send : recv).data(), bytes);
    ASSERT_TRUE(one);
    const auto e = error_of([&] { comm.all_to_all(send.data(), recv.data(), count, DType::bf16, s.get()); });
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code(), ErrorCode::InvalidArgument);
    EXPECT_TRUE(contains(e->what(), send_registered ? "the send buffer is registered" : "the receive buffer is registered"))
        << e->what();
    EXPECT_TRUE(comm.failed());
  }
  Communicator comm = make_world(Backend::Cuda);
  WatchdogOptions deadline;
  deadline.wait_timeout = std::chrono::seconds(60);
  comm.set_watchdog(deadline);
  const int n = comm.size(), me = comm.rank();
  TestStream s(Backend::Cuda);
  const std::size_t piece = static_cast<std::size_t>(count) * 2;
  Bytes mine(piece * static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < mine.size(); ++i)
    mine[i] = static_cast<std::uint8_t>(me * 53 + static_cast<int>(i / piece) * 7 + static_cast<int>(i % piece % 251));
  DeviceBuffer send(Backend::Cuda, mine.size(), MemoryKind::NcclDevice), recv(Backend::Cuda, mine.size(), MemoryKind::NcclDevice);
  const BufferRegistration rs = comm.register_buffer(send.data(), mine.size());
  const BufferRegistration rr = comm.register_buffer(recv.data(), mine.size());
  ASSERT_TRUE(rs && rr);
  upload(Backend::Cuda, send.data(), mine);
  comm.all_to_all(send.data(), recv.data(), count, DType::bf16, s.get());
  comm.synchronize(s.get());
  const Bytes got = download(Backend::Cuda, recv.data(), mine.size());
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const int sender = static_cast<int>(i / piece);
    bad += got[i] != static_cast<std::uint8_t>(sender * 53 + me * 7 + static_cast<int>(i % piece % 251));
  }
  EXPECT_EQ(bad, 0) << "rank " << me;
}
}  // namespace
