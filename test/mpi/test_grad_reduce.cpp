// GradReducePrecision::F32Accumulate below the optimizers on the host backend (MPI), run
// under mpiexec with 2, 3, 4 and 8 ranks: the cases shared with the GPU suite
// (grad_reduce_cases.hpp, test/gpu/test_grad_reduce_gpu.cpp).
#include "buffers/piece_reduce.hpp"
#include "comm/registered_ranges.hpp"
#include "comm/registration_rule.hpp"
#include "mpi/grad_reduce_cases.hpp"

namespace {
using namespace shardopt;
using namespace shardopt::test;

SHARDOPT_GRAD_REDUCE_CASES(GradReduceHost, Backend::Host)

// The many-bucket case of the GPU suite at a host-friendly size (the hang it guards
// against is NCCL's; here it checks the same promise through MPI).
TEST(GradReduceHost, StoreLargeBucketsAreTheOracle) { store_large_buckets_are_the_oracle(Backend::Host, 4, 1 << 14); }
TEST(GradReduceHost, StoreLargeBucketsInThreeChunksAreTheOracle) {
  store_large_buckets_are_the_oracle(Backend::Host, 2, (1 << 14) + 512, /*with_params=*/true, /*chunks=*/3);
}
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

// The communicator's registration rule (Communicator::register_buffers): a buffer that
// serves both send/recv and collectives is never registered, and then neither are the
// send/recv buffers of the same set (both sides of a send/recv registered, or neither);
// collective-only buffers always are. The sets are the store's: Native; F32Accumulate
// with parameters; without parameters (what stalled NCCL 2.28.3); and with some layout
// buffers quantized (their gradients also carry the staged all-gathers).
TEST(GradReduceHost, RegistrationRuleKeepsSendRecvAwayFromCollectives) {
  using U = BufferUse;
  using detail::registration_plan;
  EXPECT_EQ(registration_plan({}), std::vector<bool>{});
  // Native: params and grads serve collectives.
  EXPECT_EQ(registration_plan({U::Collectives, U::Collectives}), (std::vector<bool>{true, true}));
  // F32Accumulate with parameters: params, grads (send), receive buffer: all registered.
  EXPECT_EQ(registration_plan({U::Collectives, U::SendRecv, U::SendRecv}), (std::vector<bool>{true, true, true}));
  // Without parameters: grads serve both; the receive buffer, their partner, follows.
  EXPECT_EQ(registration_plan({U::Collectives, U::Both, U::SendRecv}), (std::vector<bool>{true, false, false}));
  // Two layout buffers, the second quantized: its params are empty, its grads serve both;
  // the first's grads and the receive buffer go unregistered with them, params stay.
  EXPECT_EQ(registration_plan({U::Collectives, U::SendRecv, U::Collectives, U::Both, U::SendRecv}),
            (std::vector<bool>{true, false, true, false, false}));
  EXPECT_EQ(registration_plan({U::Both}), std::vector<bool>{false});
  // The host backend has no registration: one empty registration per buffer.
  Communicator one = Communicator::self(Backend::Host);
  std::vector<char> memory(256);
  const std::vector<BufferRegistration> r = one.register_buffers(
      {{memory.data(), 128, U::Collectives}, {memory.data() + 128, 128, U::SendRecv}, {nullptr, 0, U::SendRecv}});
  ASSERT_EQ(r.size(), 3u);
  for (const BufferRegistration& x : r) EXPECT_FALSE(x);
}

// How a piece is cut into chunks (piece_reduce.hpp), against the documented rule:
// ceil(count / K) rounded up to a multiple of 256 elements, the last chunk shorter; and
// the automatic K: one per 4 MiB of a piece, 1 to 4.
TEST(GradReduceHost, PieceChunksFollowTheRule) {
  using detail::piece_chunks;
  EXPECT_EQ(piece_chunks(0, 4).number, 0);
  EXPECT_EQ(piece_chunks(1, 1).number, 1);
  EXPECT_EQ(piece_chunks(1, 1).size, 256);
  EXPECT_EQ(piece_chunks(1344, 3).size, 512);  // ceil(1344 / 3) = 448 -> 512
  EXPECT_EQ(piece_chunks(1344, 3).number, 3);  // 512, 512, 320
  EXPECT_EQ(piece_chunks(1344, 4).number, 3);  // 336 -> 512: fewer than asked
  EXPECT_EQ(piece_chunks(1344, 16).size, 256);
  EXPECT_EQ(piece_chunks(1344, 16).number, 6);  // 5 x 256 + 64
  EXPECT_EQ(piece_chunks(1024, 4).number, 4);
  EXPECT_EQ(piece_chunks(100, 8).number, 1);  // shorter than one chunk
  const std::int64_t mi = 1 << 20;
  EXPECT_EQ(piece_chunks(8 * mi, 4).size, 2 * mi);
  EXPECT_EQ(detail::auto_piece_chunks(0), 1);
  EXPECT_EQ(detail::auto_piece_chunks((std::size_t{4} << 20) - 1), 1);
  EXPECT_EQ(detail::auto_piece_chunks(std::size_t{8} << 20), 2);
  EXPECT_EQ(detail::auto_piece_chunks(std::size_t{12} << 20), 3);
  EXPECT_EQ(detail::auto_piece_chunks(std::size_t{16} << 20), 4);
  EXPECT_EQ(detail::auto_piece_chunks(std::size_t{1} << 30), 4);
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
