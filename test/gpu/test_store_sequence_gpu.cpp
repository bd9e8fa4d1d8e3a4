// Stores built one after another in one process, on CUDA + NCCL (issue 31, the hang of
// bench_dist_adam --grad-reduce-precision, docs/grad_reduce.md): the benchmark builds a
// Native optimizer, times it, destroys it, then builds an F32Accumulate one of the same
// shapes, whose store's warm-up never finished on 2 x H200. Each case runs under the
// group's wait_timeout (world_with_deadline), so a stall fails the test with
// Error(Timeout) instead of hanging the suite.
#include "mpi/grad_reduce_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

// A Native store of `buckets` registered buckets of `bucket_numel` bf16 elements: one
// reduce-scatter and all-gather round, then destroyed (buffers deregistered and freed).
void native_store_round(int buckets, std::int64_t bucket_numel) {
  Communicator comm = world_with_deadline(Backend::Cuda);
  TestStream s(Backend::Cuda);
  LayoutOptions lo;
  lo.bucket_numel = bucket_numel;
  std::vector<ParamSpec> specs;
  for (int p = 0; p < buckets; ++p) {
    std::string name = "w";
    name += std::to_string(p);
    specs.push_back(ParamSpec::tensor(std::move(name), {bucket_numel - 3 - p}));
  }
  const Layout L(specs, comm.size(), lo);
  BucketStoreOptions o;
  o.grad_dtype = DType::bf16;
  o.grad_reduce = ReduceOp::Average;
  o.nccl_registered = true;
  BucketStore st(comm, L, o);
  const int nb = static_cast<int>(L.buckets().size());
  st.start_grad_reduces(0, nb, s.get());
  for (int b = 0; b < nb; ++b) st.wait_grad_reduce(b, s.get());
  st.start_param_gathers(0, nb, s.get());
  for (int b = 0; b < nb; ++b) st.wait_param_gather(b, s.get());
  comm.synchronize(s.get());
}

// The benchmark's order at benchmark scale: a Native store, then an F32Accumulate store
// of the same layout (3 buckets of 64 MiB; pieces of 32 MiB at 2 ranks), oracle-exact.
TEST(StoreSequenceGpu, F32AccumulateStoreAfterANativeStore) {
  native_store_round(3, std::int64_t{1} << 25);
  store_large_buckets_are_the_oracle(Backend::Cuda, 3, std::int64_t{1} << 25);
}

// Two F32Accumulate stores one after another (bench_comm's sizes loop did this).
TEST(StoreSequenceGpu, TwoF32AccumulateStoresInARow) {
  store_large_buckets_are_the_oracle(Backend::Cuda, 2, std::int64_t{1} << 22);
  store_large_buckets_are_the_oracle(Backend::Cuda, 3, std::int64_t{1} << 25);
}

}  // namespace
