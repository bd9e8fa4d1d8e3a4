// The Communicator on CUDA + NCCL, one GPU per rank (run by test/gpu/run_mpi.sh with 2
// and 4 ranks; NVLink multicast off). The cases shared with the host suite run here on
// NCCL (the BucketStore's shared cases run in test_bucket_store_gpu.cpp); then what only
// CUDA has: graph capture of the raw collectives, capture as the first use of a fresh
// group and store, event ordering between the compute and the communication stream,
// streams of another device, from_unique_id.
#include <cuda_runtime.h>

#include "gpu/comm_test_kernels.hpp"
#include "gpu/cuda_check.hpp"
#include "mpi/bucket_store_cases.hpp"
#include "mpi/comm_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

constexpr Backend kCuda = Backend::Cuda;

SHARDOPT_COMM_CASES(CommNccl, kCuda)

cudaStream_t cuda(const TestStream& s) { return reinterpret_cast<cudaStream_t>(s.get()); }

std::uint32_t bits_of(float f) { return num::f32_bits(f); }

// Reduce-scatter, all-gather and all-reduce captured on one stream replay with the
// bytes of the eager calls.
TEST(CommNccl, CapturedCollectivesReplayLikeEager) {
  Communicator& comm = world(kCuda);
  const int n = comm.size(), me = comm.rank();
  const std::int64_t count = 3001;
  TestStream s(kCuda);
  DeviceBuffer pristine = to_device(kCuda, random_floats(DType::bf16, static_cast<std::size_t>(n * count), seed_of(3, me)));
  DeviceBuffer work(kCuda, pristine.bytes());
  // Exact data for the all-reduce: NCCL may pick another algorithm (ring, tree) when
  // capturing; with exact partial sums every order gives the same bits. The ring
  // reduce-scatter has one order, so its random data must match bitwise.
  DeviceBuffer small0 = to_device(kCuda, exact_floats(DType::f32, 8, seed_of(4, me)));
  DeviceBuffer small(kCuda, small0.bytes());
  auto step = [&] {
    copy_async(kCuda, work.data(), pristine.data(), pristine.bytes(), s.get());
    copy_async(kCuda, small.data(), small0.data(), small0.bytes(), s.get());
    comm.reduce_scatter(work.data(), count, DType::bf16, ReduceOp::Average, s.get());
    comm.all_gather(work.data(), count, DType::bf16, s.get());
    comm.all_reduce(small.data(), 8, DType::f32, ReduceOp::Sum, s.get());
  };
  step();
  s.sync();
  const Bytes eager = download(kCuda, work.data(), work.bytes());
  const Bytes eager_small = download(kCuda, small.data(), small.bytes());
  s.begin_capture();
  step();
  Graph g;
  s.end_capture(g);
  fill_zero_async(kCuda, work.data(), work.bytes(), s.get());
  s.sync();
  for (int k = 0; k < 10; ++k) {
    g.replay(kCuda, s.get());
    s.sync();
    EXPECT_EQ(download(kCuda, work.data(), work.bytes()), eager) << "replay " << k;
    EXPECT_EQ(download(kCuda, small.data(), small.bytes()), eager_small) << "replay " << k;
  }
}

// A fresh group and store whose very first bucket collectives are captured: the
// warm-up at construction makes this legal, and the replay reduces correctly.
TEST(CommNccl, CaptureAsFirstUseOfAFreshGroup) {
  Communicator comm = make_world(kCuda);
  const int n = comm.size(), me = comm.rank();
  BucketStoreOptions o;
  o.grad_dtype = DType::bf16;
  o.grad_reduce = ReduceOp::Sum;
  BucketStore st(comm, store_layout(n), o);
  const Layout& L = st.layout();
  std::vector<std::vector<Bytes>> in;
  for (int r = 0; r < n; ++r) in.push_back(grad_images(L, DType::bf16, r, true));
  upload_all(kCuda, in[static_cast<std::size_t>(me)], [&](int b) { return st.grad_buffer(b); });
  TestStream s(kCuda);
  const int nb = static_cast<int>(L.buckets().size());
  s.begin_capture();
  for (int b = 0; b < nb; ++b) st.start_grad_reduce(b, s.get());
  for (int b = 0; b < nb; ++b) st.wait_grad_reduce(b, s.get());
  Graph g;
  s.end_capture(g);
  g.replay(kCuda, s.get());
  s.sync();
  expect_reduced(L, DType::bf16, ReduceOp::Sum, true, me, in, download_grads(st, DType::bf16), "first use captured");
}

// Event ordering. (1) A bucket's collective starts only after the work queued on the
// caller's stream before start_*: a kernel that waits 200 ms before writing the
// buffers precedes the starts; had the comm stream not waited, it would reduce and
// gather the zeros. (2) The caller's stream sees a bucket only after wait_*: the comm
// stream is held up for 200 ms before the starts, and a copy queued on the compute
// stream right after the waits must still see the reduced / gathered values.
TEST(CommNccl, ComputeStreamSeesBucketsOnlyAfterTheirWait) {
  Communicator& comm = world(kCuda);
  const int n = comm.size(), me = comm.rank();
  BucketStoreOptions o;
  o.grad_dtype = DType::f32;
  o.grad_reduce = ReduceOp::Sum;
  BucketStore st(comm, store_layout(n), o);
  const Layout& L = st.layout();
  const int nb = static_cast<int>(L.buckets().size());
  const int nbuf = static_cast<int>(L.buffers().size());
  TestStream compute(kCuda);
  constexpr std::uint64_t kDelay = 200'000'000;  // ns

  auto fill = [&](std::uint64_t delay) {
    for (int b = 0; b < nbuf; ++b) {
      const auto& buf = L.buffers()[static_cast<std::size_t>(b)];
      spin_then_fill(cuda(compute), b == 0 ? delay : 0, st.grad_buffer(b), buf.numel, 4,
                     bits_of(static_cast<float>(me + 1)));
      const int pb = static_cast<int>(size_of(buf.dtype));
      const std::uint32_t p = pb == 4 ? bits_of(static_cast<float>(me + 1)) : bits_of(static_cast<float>(me + 1)) >> 16;
      spin_then_fill(cuda(compute), 0, st.param_buffer(b), buf.numel, pb, p);
    }
  };
  auto check = [&](const std::vector<Bytes>& grads, const std::vector<Bytes>& params, const char* what) {
    int bad_rs = 0, bad_ag = 0;
    for (int b = 0; b < nb; ++b) {
      const auto& bk = L.buckets()[static_cast<std::size_t>(b)];
      const auto buf = static_cast<std::size_t>(bk.buffer);
      const DType pd = L.buffers()[buf].dtype;
      const Range own = L.shard_range(b, me);
      for (std::int64_t i = own.begin; i < own.end; ++i)
        bad_rs += element(DType::f32, grads[buf], static_cast<std::size_t>(i)) != n * (n + 1) / 2.0;
      for (int r = 0; r < n; ++r) {
        const Range sl = L.shard_range(b, r);
        for (std::int64_t i = sl.begin; i < sl.end; ++i)
          bad_ag += element(pd, params[buf], static_cast<std::size_t>(i)) != r + 1.0;
      }
    }
    EXPECT_EQ(bad_rs, 0) << what << ": reduce-scatter, rank " << me;
    EXPECT_EQ(bad_ag, 0) << what << ": all-gather, rank " << me;
  };

  // (1) start after the queued (slow) writes.
  fill(kDelay);
  for (int b = 0; b < nb; ++b) {
    st.start_grad_reduce(b, compute.get());
    st.start_param_gather(b, compute.get());
  }
  for (int b = 0; b < nb; ++b) {
    st.wait_grad_reduce(b, compute.get());
    st.wait_param_gather(b, compute.get());
  }
  compute.sync();
  check(download_grads(st, DType::f32), download_params(st), "start after queued work");

  // (2) the copy after the waits sees the results although the comm stream is late.
  fill(0);
  compute.sync();
  std::vector<DeviceBuffer> gsnap, psnap;
  for (int b = 0; b < nbuf; ++b) {
    const auto& buf = L.buffers()[static_cast<std::size_t>(b)];
    gsnap.emplace_back(kCuda, static_cast<std::size_t>(buf.numel) * 4);
    psnap.emplace_back(kCuda, static_cast<std::size_t>(buf.numel) * size_of(buf.dtype));
  }
  spin(reinterpret_cast<cudaStream_t>(st.comm_stream()), kDelay);
  for (int b = 0; b < nb; ++b) {
    st.start_grad_reduce(b, compute.get());
    st.start_param_gather(b, compute.get());
  }
  for (int b = 0; b < nb; ++b) {
    st.wait_grad_reduce(b, compute.get());
    st.wait_param_gather(b, compute.get());
  }
  for (int b = 0; b < nbuf; ++b) {
    copy_async(kCuda, gsnap[static_cast<std::size_t>(b)].data(), st.grad_buffer(b), gsnap[static_cast<std::size_t>(b)].bytes(), compute.get());
    copy_async(kCuda, psnap[static_cast<std::size_t>(b)].data(), st.param_buffer(b), psnap[static_cast<std::size_t>(b)].bytes(), compute.get());
  }
  compute.sync();
  std::vector<Bytes> g, p;
  for (int b = 0; b < nbuf; ++b) {
    g.push_back(download(kCuda, gsnap[static_cast<std::size_t>(b)].data(), gsnap[static_cast<std::size_t>(b)].bytes()));
    p.push_back(download(kCuda, psnap[static_cast<std::size_t>(b)].data(), psnap[static_cast<std::size_t>(b)].bytes()));
  }
  check(g, p, "copy after wait");
}

// A stream of another GPU is refused by the communicator (which then counts as failed,
// like any failed call) and by the store (which stays usable).
TEST(CommNccl, StreamOfAnotherDeviceIsInvalidArgument) {
  const int devices = cuda_device_count();
  if (devices < 2) GTEST_SKIP() << "needs two visible GPUs";  // the same on every rank of one machine
  Communicator comm = make_world(kCuda);
  const int other = (comm.device() + 1) % devices;
  cudaStream_t foreign = nullptr;
  TEST_CUDA(cudaSetDevice(other));
  TEST_CUDA(cudaStreamCreateWithFlags(&foreign, cudaStreamNonBlocking));
  TEST_CUDA(cudaSetDevice(comm.device()));
  DeviceBuffer buf = to_device(kCuda, Bytes(64, 0));
  const auto e = error_of([&] { comm.all_reduce(buf.data(), 1, DType::f32, ReduceOp::Sum, reinterpret_cast<Stream>(foreign)); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::InvalidArgument);
  EXPECT_TRUE(contains(e->what(), "belongs to CUDA device " + std::to_string(other))) << e->what();
  EXPECT_TRUE(comm.failed());

  Communicator& w = world(kCuda);
  BucketStore st(w, store_layout(w.size()));
  const auto e2 = error_of([&] { st.start_grad_reduce(0, reinterpret_cast<Stream>(foreign)); });
  ASSERT_TRUE(e2.has_value());
  EXPECT_EQ(e2->code(), ErrorCode::InvalidArgument);
  EXPECT_FALSE(st.grad_reduce_pending(0));
  EXPECT_FALSE(w.failed());
  TEST_CUDA(cudaSetDevice(other));
  TEST_CUDA(cudaStreamDestroy(foreign));
  TEST_CUDA(cudaSetDevice(comm.device()));
}

// A trainer with its own launcher: rank 0's UniqueId travels by other means (MPI here).
TEST(CommNccl, FromUniqueIdWithOwnLauncher) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  UniqueId id;
  if (rank == 0) id = UniqueId::create();
  MPI_Bcast(id.bytes.data(), static_cast<int>(id.bytes.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
  const int device = world(kCuda).device();
  Communicator comm = Communicator::from_unique_id(id, rank, size, device);
  EXPECT_EQ(comm.rank(), rank);
  EXPECT_EQ(comm.size(), size);
  EXPECT_EQ(comm.device(), device);
  EXPECT_EQ(comm.backend(), kCuda);
  TestStream s(kCuda);
  Bytes one(4);
  const std::uint32_t v = 1;
  std::memcpy(one.data(), &v, 4);
  DeviceBuffer buf = to_device(kCuda, one);
  comm.all_reduce(buf.data(), 1, DType::u32, ReduceOp::Sum, s.get());
  s.sync();
  std::uint32_t got = 0;
  std::memcpy(&got, download(kCuda, buf.data(), 4).data(), 4);
  EXPECT_EQ(got, static_cast<std::uint32_t>(size));
}

}  // namespace
