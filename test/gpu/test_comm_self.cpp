// One-process GPU tests of the communicator: the one-rank group on CUDA, a one-rank NCCL
// group made from a UniqueId (from_unique_id's path, argument checks, failure path), and
// a BucketStore on it (ncclMemAlloc + registration, capture and replay).
#include "gpu/cuda_check.hpp"
#include "mpi/bucket_store_cases.hpp"
#include "mpi/comm_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

constexpr Backend kCuda = Backend::Cuda;

int current_device() {
  int d = 0;
  TEST_CUDA(cudaGetDevice(&d));
  return d;
}

TEST(CommSelfCuda, SelfIsIdentity) {
  self_is_identity(kCuda);
  EXPECT_EQ(Communicator::self(kCuda).device(), current_device());
}

TEST(CommSelfCuda, OneRankNcclGroupIsIdentity) {
  Communicator c = Communicator::from_unique_id(UniqueId::create(), 0, 1, current_device());
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.backend(), kCuda);
  TestStream s(kCuda);
  const Bytes in = random_floats(DType::f16, 777, 17);
  DeviceBuffer buf = to_device(kCuda, in);
  c.reduce_scatter(buf.data(), 777, DType::f16, ReduceOp::Sum, s.get());
  c.all_gather(buf.data(), 777, DType::f16, s.get());
  c.all_reduce(buf.data(), 777, DType::f16, ReduceOp::Max, s.get());
  s.sync();
  EXPECT_EQ(download(kCuda, buf.data(), in.size()), in);
  c.barrier();
  EXPECT_EQ(c.all_gather_value(5), std::vector<std::uint64_t>{5});
  EXPECT_EQ(c.split(0, 0).size(), 1);
}

TEST(CommSelfCuda, FromUniqueIdRejectsBadArguments) {
  const auto empty = error_of([&] { (void)Communicator::from_unique_id(UniqueId{}, 0, 1, 0); });
  ASSERT_TRUE(empty.has_value());
  EXPECT_EQ(empty->code(), ErrorCode::InvalidArgument);
  EXPECT_TRUE(contains(empty->what(), "UniqueId is empty")) << empty->what();
  const UniqueId id = UniqueId::create();
  const auto rank = error_of([&] { (void)Communicator::from_unique_id(id, 1, 1, 0); });
  ASSERT_TRUE(rank.has_value());
  EXPECT_EQ(rank->code(), ErrorCode::InvalidArgument);
  const auto device = error_of([&] { (void)Communicator::from_unique_id(id, 0, 1, 999); });
  ASSERT_TRUE(device.has_value());
  EXPECT_EQ(device->code(), ErrorCode::InvalidArgument);
  EXPECT_TRUE(contains(device->what(), "device 999")) << device->what();
}

TEST(CommSelfCuda, NcclFailureAbortsAndPoisons) {
  Communicator c = Communicator::from_unique_id(UniqueId::create(), 0, 1, current_device());
  const auto e = error_of([&] { shardopt::detail::provoke_backend_error_for_test(c); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::Nccl) << e->what();
  EXPECT_TRUE(c.failed());
  TestStream s(kCuda);
  DeviceBuffer buf = to_device(kCuda, Bytes(16, 0));
  const auto later = error_of([&] { c.all_reduce(buf.data(), 1, DType::f32, ReduceOp::Sum, s.get()); });
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->code(), ErrorCode::InvalidState);
  EXPECT_TRUE(contains(later->what(), e->what())) << later->what();
}

TEST(CommSelfCuda, OneRankStoresAreIdentity) {
  one_rank_store_is_identity(Communicator::self(kCuda));
  one_rank_store_is_identity(Communicator::from_unique_id(UniqueId::create(), 0, 1, current_device()));
}

TEST(CommSelfCuda, StoreOnOneRankGroupCapturesAndReplays) {
  Communicator c = Communicator::from_unique_id(UniqueId::create(), 0, 1, current_device());
  for (bool registered : {true, false}) {
    BucketStoreOptions o;
    o.grad_dtype = DType::bf16;
    o.nccl_registered = registered;
    BucketStore st(c, store_layout(1), o);
    // ncclMemAlloc rounds each allocation up to the recommended granularity (2 MiB
    // typically) when NCCL uses cuMem, and falls back to cudaMalloc otherwise: the
    // overhead is anywhere from 0 to one granule per allocation (4 here), never more.
    std::printf("allocator overhead (%s): %zu bytes over %zu + %zu\n", registered ? "ncclMemAlloc" : "cudaMalloc",
                st.allocator_overhead_bytes(), st.param_bytes(), st.grad_bytes());
    EXPECT_LE(st.allocator_overhead_bytes(), std::size_t{4} * (64u << 20));
    const Layout& L = st.layout();
    const auto grads = grad_images(L, DType::bf16, 0, false);
    upload_all(kCuda, grads, [&](int b) { return st.grad_buffer(b); });
    TestStream s(kCuda);
    const int nb = static_cast<int>(L.buckets().size());
    s.begin_capture();
    for (int b = 0; b < nb; ++b) st.start_grad_reduce(b, s.get());
    for (int b = 0; b < nb; ++b) st.start_param_gather(b, s.get());
    for (int b = 0; b < nb; ++b) {
      st.wait_grad_reduce(b, s.get());
      st.wait_param_gather(b, s.get());
    }
    Graph g;
    s.end_capture(g);
    for (int k = 0; k < 3; ++k) g.replay(kCuda, s.get());
    s.sync();
    EXPECT_EQ(download_grads(st, DType::bf16), grads) << "the average over one rank is the identity";
  }
}

}  // namespace
