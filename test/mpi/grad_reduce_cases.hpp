// grad_reduce_cases.hpp - GradReducePrecision::F32Accumulate below the optimizers, written
// once for both backends (host backend: test/mpi/test_grad_reduce.cpp; CUDA + NCCL:
// test/gpu/test_grad_reduce_gpu.cpp): the all-to-all, the rank-ordered piece sum, and the
// BucketStore's deterministic reduce-scatter.
//
// The oracles are written in the tests: a plain fp32 loop in rank order (the promised
// bits) and the exact mean in double, over gradients whose exact mean is known
// (common/known_grads.hpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "buffers/piece_reduce.hpp"
#include "common/known_grads.hpp"
#include "kernels/common/piece_sum.hpp"
#include "mpi/bucket_store_cases.hpp"
#include "shardopt/watchdog.hpp"

namespace shardopt::test {

// ------------------------------------------------------------------ all-to-all

/// Piece r of every rank's send buffer lands in piece `sender` of rank r's receive
/// buffer, in every dtype size; the one-rank group copies; overlapping buffers are
/// refused (on a one-rank group, whose failure harms no other test).
inline void all_to_all_delivers_every_piece(Backend be) {
  Communicator& comm = world(be);
  const int n = comm.size(), me = comm.rank();
  TestStream s(be);
  for (DType t : {DType::f32, DType::bf16, DType::e4m3}) {
    const std::int64_t count = 37;
    const std::size_t es = size_of(t);
    Bytes send(static_cast<std::size_t>(count * n) * es);
    for (std::size_t i = 0; i < send.size(); ++i)
      send[i] = static_cast<std::uint8_t>(me * 53 + static_cast<int>(i / (static_cast<std::size_t>(count) * es)) * 7 +
                                          static_cast<int>(i % (static_cast<std::size_t>(count) * es)));
    DeviceBuffer dsend = to_device(be, send);
    DeviceBuffer drecv(be, send.size());
    comm.all_to_all(dsend.data(), drecv.data(), count, t, s.get());
    s.sync();
    const Bytes got = download(be, drecv.data(), send.size());
    int bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const int sender = static_cast<int>(i / (static_cast<std::size_t>(count) * es));
      bad += got[i] != static_cast<std::uint8_t>(sender * 53 + me * 7 +
                                                 static_cast<int>(i % (static_cast<std::size_t>(count) * es)));
    }
    EXPECT_EQ(bad, 0) << to_string(t) << " rank " << me;
  }
  Communicator one = Communicator::self(be);
  const Bytes x = {1, 2, 3, 4, 5, 6, 7, 8};
  DeviceBuffer a = to_device(be, x), c(be, x.size());
  one.all_to_all(a.data(), c.data(), 4, DType::bf16, s.get());
  s.sync();
  EXPECT_EQ(download(be, c.data(), x.size()), x);
  const auto e = error_of([&] { one.all_to_all(a.data(), static_cast<char*>(a.data()) + 2, 2, DType::bf16, s.get()); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::InvalidArgument);
  EXPECT_TRUE(contains(e->what(), "send and recv overlap")) << e->what();
}

/// all_to_all_peers delivers every other rank's piece as all_to_all does and leaves this
/// rank's piece of the receive buffer as it was (on a one-rank group: all of it).
inline void all_to_all_peers_leaves_the_own_piece(Backend be) {
  Communicator& comm = world(be);
  const int n = comm.size(), me = comm.rank();
  TestStream s(be);
  const std::int64_t count = 1031;  // bf16 elements per piece
  const std::size_t piece = static_cast<std::size_t>(count) * 2;
  Bytes send(piece * static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < send.size(); ++i)
    send[i] = static_cast<std::uint8_t>(me * 53 + static_cast<int>(i / piece) * 7 + static_cast<int>(i % piece % 251));
  const Bytes sentinel(send.size(), 0xAB);
  DeviceBuffer dsend = to_device(be, send), drecv = to_device(be, sentinel);
  comm.all_to_all_peers(dsend.data(), drecv.data(), count, DType::bf16, s.get());
  s.sync();
  const Bytes got = download(be, drecv.data(), send.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const int sender = static_cast<int>(i / piece);
    const auto want = sender == me ? std::uint8_t{0xAB}
                                   : static_cast<std::uint8_t>(sender * 53 + me * 7 + static_cast<int>(i % piece % 251));
    bad += got[i] != want;
  }
  EXPECT_EQ(bad, 0) << "rank " << me;
  Communicator one = Communicator::self(be);
  DeviceBuffer a = to_device(be, Bytes(8, 1)), c = to_device(be, Bytes(8, 2));
  one.all_to_all_peers(a.data(), c.data(), 4, DType::bf16, s.get());
  s.sync();
  EXPECT_EQ(download(be, c.data(), 8), Bytes(8, 2));
}

/// all_to_all_peers with strides: piece r of the send buffer at r * send_stride (the gaps
/// between are not sent), piece r of the receive buffer at r * recv_stride; the gaps and
/// this rank's own piece keep their bytes. A stride shorter than a piece is refused (on
/// a one-rank group).
inline void all_to_all_peers_with_strides(Backend be) {
  Communicator& comm = world(be);
  const int n = comm.size(), me = comm.rank();
  TestStream s(be);
  const std::int64_t count = 301, ss = 301 + 13, rs = 301 + 7;  // bf16 elements
  Bytes send(static_cast<std::size_t>(ss * n) * 2);
  for (std::size_t i = 0; i < send.size(); ++i) {
    const auto e = static_cast<std::int64_t>(i / 2);
    send[i] = e % ss >= count ? std::uint8_t{0xEE}  // a gap: must not arrive anywhere
                              : static_cast<std::uint8_t>(me * 53 + static_cast<int>(e / ss) * 7 +
                                                          static_cast<int>((e % ss) * 2 + static_cast<std::int64_t>(i % 2)) % 251);
  }
  const Bytes sentinel(static_cast<std::size_t>(rs * n) * 2, 0xAB);
  DeviceBuffer dsend = to_device(be, send), drecv = to_device(be, sentinel);
  comm.all_to_all_peers(dsend.data(), ss, drecv.data(), rs, count, DType::bf16, s.get());
  s.sync();
  const Bytes got = download(be, drecv.data(), sentinel.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto e = static_cast<std::int64_t>(i / 2);
    const int sender = static_cast<int>(e / rs);
    const std::int64_t at = e % rs;
    const auto want = sender == me || at >= count
                          ? std::uint8_t{0xAB}
                          : static_cast<std::uint8_t>(sender * 53 + me * 7 +
                                                      static_cast<int>(at * 2 + static_cast<std::int64_t>(i % 2)) % 251);
    bad += got[i] != want;
  }
  EXPECT_EQ(bad, 0) << "rank " << me;
  Communicator one = Communicator::self(be);
  DeviceBuffer a = to_device(be, Bytes(64, 1)), c = to_device(be, Bytes(64, 2));
  const auto e = error_of([&] { one.all_to_all_peers(a.data(), 8, c.data(), 4, 8, DType::bf16, s.get()); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::InvalidArgument);
  EXPECT_TRUE(contains(e->what(), "must be at least")) << e->what();
}

// ------------------------------------------------------------------ the piece sum

/// The arguments of a sum of `n` pieces of `count` `in` values at `pieces` into `out`.
inline kernels::PieceSum sum_args(const void* pieces, DType in, int n, std::int64_t count, bool average, void* out,
                                  DType out_dtype) {
  kernels::PieceSum a;
  a.pieces = pieces;
  a.piece_dtype = in;
  a.n = n;
  a.count = count;
  a.average = average;
  a.out = out;
  a.out_dtype = out_dtype;
  return a;
}

/// The oracle: element i of the n pieces (host bytes) summed by the plain rank-order loop.
inline float rank_order_element(DType in, const Bytes& pieces, int n, std::int64_t count, std::int64_t i,
                                bool average) {
  // One buffer per thread, reused: this runs once per element of every case, and an
  // allocation per call made the sanitized run (whose malloc unwinds the whole stack)
  // spend a minute here at 8 ranks.
  thread_local std::vector<float> x;
  x.clear();
  for (int r = 0; r < n; ++r) x.push_back(static_cast<float>(element(in, pieces, static_cast<std::size_t>(r * count + i))));
  return rank_order_sum(x, average);
}

/// One length of piece_sum_equals_rank_order_loop.
inline void piece_sum_case(Backend be, TestStream& s, std::int64_t count) {
  for (int n = 1; n <= 8; ++n) {
    for (DType in : {DType::bf16, DType::f32, DType::f16}) {
      const Bytes pieces = random_floats(in, static_cast<std::size_t>(count * n), seed_of(91, n, static_cast<int>(in)));
      for (DType out : {DType::f32, DType::bf16}) {
        for (int flags = 0; flags < 4; ++flags) {
          const bool average = flags & 1, accumulate = flags & 2;
          const Bytes before = random_floats(out, static_cast<std::size_t>(count), seed_of(92, n, flags));
          DeviceBuffer dp = to_device(be, pieces), dout = to_device(be, before);
          kernels::PieceSum a = sum_args(dp.data(), in, n, count, average, dout.data(), out);
          a.accumulate = accumulate;
          kernels::piece_sum(a, be, s.get());
          s.sync();
          const Bytes got = download(be, dout.data(), before.size());
          Bytes want(before.size());
          for (std::int64_t i = 0; i < count; ++i) {
            float v = rank_order_element(in, pieces, n, count, i, average);
            if (accumulate) v = static_cast<float>(element(out, before, static_cast<std::size_t>(i))) + v;
            set_element(out, want, static_cast<std::size_t>(i), v);
          }
          EXPECT_EQ(got, want) << "count=" << count << " n=" << n << " in=" << to_string(in) << " out=" << to_string(out)
                               << " average=" << average << " accumulate=" << accumulate;
        }
      }
    }
  }
}

/// The sum with piece `k` read from `own` (the store's use: this rank's piece where it
/// lies, the output written over it) gives the bits of the rank-order loop over the true
/// pieces; the receive buffer's slot k holds NaNs, which must not be read. In place
/// (out = own, same dtype) and into a separate fp32 output (bench_comm's use); an odd
/// length and a multiple of 8. An own_index outside [0, n) is refused.
inline void piece_sum_reads_the_own_piece_where_it_lies(Backend be) {
  TestStream s(be);
  for (const std::int64_t count : {1031, 1024}) {
    for (int n = 1; n <= 8; ++n) {
      for (DType in : {DType::bf16, DType::f32}) {
        const Bytes pieces = random_floats(in, static_cast<std::size_t>(count * n), seed_of(93, n, static_cast<int>(in)));
        for (const int k : {0, n / 2, n - 1}) {
          for (const bool in_place : {true, false}) {
            const DType out = in_place ? in : DType::f32;
            const std::size_t es = size_of(in), piece = static_cast<std::size_t>(count) * es;
            Bytes received = pieces;  // the own slot poisoned
            for (std::size_t i = 0; i < static_cast<std::size_t>(count); ++i)
              set_element(in, received, static_cast<std::size_t>(k) * static_cast<std::size_t>(count) + i, NAN);
            const Bytes own(pieces.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(k) * piece),
                            pieces.begin() + static_cast<std::ptrdiff_t>((static_cast<std::size_t>(k) + 1) * piece));
            DeviceBuffer dp = to_device(be, received), down = to_device(be, own);
            DeviceBuffer dout(be, static_cast<std::size_t>(count) * size_of(out));
            kernels::PieceSum a = sum_args(dp.data(), in, n, count, true, in_place ? down.data() : dout.data(), out);
            a.own = down.data();
            a.own_index = k;
            kernels::piece_sum(a, be, s.get());
            s.sync();
            const Bytes got = download(be, a.out, static_cast<std::size_t>(count) * size_of(out));
            Bytes want(got.size());
            for (std::int64_t i = 0; i < count; ++i)
              set_element(out, want, static_cast<std::size_t>(i), rank_order_element(in, pieces, n, count, i, true));
            EXPECT_EQ(got, want) << "count=" << count << " n=" << n << " in=" << to_string(in) << " own=" << k
                                 << (in_place ? " in place" : " into fp32");
          }
        }
      }
    }
  }
  DeviceBuffer p(be, 64), o(be, 16);
  kernels::PieceSum bad = sum_args(p.data(), DType::bf16, 2, 8, false, o.data(), DType::bf16);
  bad.own = o.data();
  bad.own_index = 2;
  const auto e = error_of([&] { kernels::piece_sum(bad, be, s.get()); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::InvalidArgument);
  EXPECT_TRUE(contains(e->what(), "own_index 2")) << e->what();
}

/// The kernel (CUDA) and its host twin give the bits of the plain rank-order loop, for
/// 1 to 8 pieces of random values (not exact: roundings everywhere), every input and
/// output dtype, with and without Average and accumulation; an odd length (the
/// element-wise kernel) and a multiple of 8 (CUDA's 16-byte loads of bf16 pieces).
inline void piece_sum_equals_rank_order_loop(Backend be) {
  TestStream s(be);
  for (const std::int64_t count : {1031, 1024}) piece_sum_case(be, s, count);
}

// ------------------------------------------------------------------ the bucket store

/// A store over the bucket-store test layout with F32Accumulate or Native.
inline BucketStore precision_store(const Communicator& comm, DType t, GradReducePrecision p,
                                   ReduceOp op = ReduceOp::Average, int chunks = 0) {
  BucketStoreOptions o;
  o.grad_dtype = t;
  o.grad_reduce = op;
  o.grad_reduce_precision = p;
  o.grad_reduce_chunks = chunks;
  return BucketStore(comm, store_layout(comm.size()), o);
}

/// Rank r's known gradient image of every buffer of L (padding included: the reduction
/// is element-wise).
inline std::vector<Bytes> known_images(const Layout& L, DType t, int r) {
  std::vector<Bytes> img;
  for (std::size_t b = 0; b < L.buffers().size(); ++b) {
    const auto numel = static_cast<std::size_t>(L.buffers()[b].numel);
    Bytes v(numel * size_of(t));
    for (std::size_t j = 0; j < numel; ++j)
      set_element(t, v, j, known_grad(r, static_cast<std::int64_t>(b), static_cast<std::int64_t>(j)));
    img.push_back(std::move(v));
  }
  return img;
}

/// Sum over this rank's slices of |result - exact mean|, and the count of elements whose
/// bits differ from the rank-order oracle or whose error exceeds one rounding to `t`.
struct ReduceCheck {
  double total_error = 0;
  int not_oracle = 0;
  int beyond_one_rounding = 0;
  int other_slices_changed = 0;
};

/// Uploads the known images, starts every bucket (one by one, or as one range), waits,
/// and checks this rank's slices against the oracles.
inline ReduceCheck reduce_known(BucketStore& st, TestStream& s, bool range) {
  const Layout& L = st.layout();
  const Communicator& comm = st.comm();
  const Backend be = comm.backend();
  const int n = comm.size(), me = comm.rank();
  const DType t = st.options().grad_dtype;
  const bool average = st.options().grad_reduce == ReduceOp::Average;
  const std::vector<Bytes> mine = known_images(L, t, me);
  upload_all(be, mine, [&](int b) { return st.grad_buffer(b); });
  const int nb = static_cast<int>(L.buckets().size());
  if (range) {
    st.start_grad_reduces(0, nb, s.get());
  } else {
    for (int b = nb - 1; b >= 0; --b) st.start_grad_reduce(b, s.get());
  }
  for (int b = 0; b < nb; ++b) st.wait_grad_reduce(b, s.get());
  s.sync();
  const std::vector<Bytes> got = download_grads(st, t);
  const double u = unit_roundoff(t);
  ReduceCheck c;
  for (int b = 0; b < nb; ++b) {
    const Bucket& bk = L.buckets()[static_cast<std::size_t>(b)];
    const auto buf = static_cast<std::size_t>(bk.buffer);
    for (std::int64_t j = bk.range.begin; j < bk.range.end; ++j) {
      const auto at = static_cast<std::size_t>(j);
      const Range own = L.shard_range(b, me);
      if (j < own.begin || j >= own.end) {
        c.other_slices_changed += element(t, got[buf], at) != element(t, mine[buf], at);
        continue;
      }
      std::vector<float> x;
      double exact = 0;
      for (int r = 0; r < n; ++r) {
        x.push_back(known_grad(r, bk.buffer, j));
        exact += x.back();
      }
      if (average) exact /= n;
      Bytes want(size_of(t));
      set_element(t, want, 0, rank_order_sum(x, average));
      const double v = element(t, got[buf], at);
      c.not_oracle += std::memcmp(want.data(), got[buf].data() + at * size_of(t), size_of(t)) != 0;
      c.beyond_one_rounding += !within_one_rounding(v, exact, u);
      c.total_error += std::fabs(v - exact);
    }
  }
  return c;
}

/// F32Accumulate's reduce-scatter of known gradients equals the rank-order fp32 oracle
/// rounded once to grad_dtype, bitwise, on every rank count; its error against the exact
/// mean is at most one rounding; the other slices keep their values; single starts and
/// range starts agree. Native bf16 on the same data is worse from 3 ranks on (its partial
/// sums are rounded to bf16) and the same at 2 ranks (one rounded sum, halved exactly).
inline void store_f32_accumulate_is_the_oracle(Backend be, DType t) {
  Communicator& comm = world(be);
  TestStream s(be);
  BucketStore st = precision_store(comm, t, GradReducePrecision::F32Accumulate);
  EXPECT_EQ(st.reduce_scratch_bytes() > 0, comm.size() > 1);
  for (bool range : {false, true}) {
    SCOPED_TRACE(range ? "range starts" : "single starts");
    const ReduceCheck f = reduce_known(st, s, range);
    EXPECT_EQ(f.not_oracle, 0) << "rank " << comm.rank();
    EXPECT_EQ(f.beyond_one_rounding, 0) << "rank " << comm.rank();
    EXPECT_EQ(f.other_slices_changed, 0) << "rank " << comm.rank();
    if (t != DType::bf16) continue;
    BucketStore native = precision_store(comm, t, GradReducePrecision::Native);
    EXPECT_EQ(native.reduce_scratch_bytes(), 0u);
    const ReduceCheck g = reduce_known(native, s, range);
    // Every rank's total, so that every rank asserts the same.
    const std::vector<std::uint64_t> worse = comm.all_gather_value(g.total_error > f.total_error ? 1 : 0);
    const std::vector<std::uint64_t> equal = comm.all_gather_value(g.total_error == f.total_error ? 1 : 0);
    for (int r = 0; r < comm.size(); ++r) {
      if (comm.size() >= 3) {
        EXPECT_EQ(worse[static_cast<std::size_t>(r)], 1u) << "Native bf16 not worse on rank " << r;
      } else {
        EXPECT_EQ(equal[static_cast<std::size_t>(r)], 1u) << "2 ranks: Native should equal F32Accumulate, rank " << r;
      }
    }
    if (comm.size() >= 3) {
      EXPECT_GT(g.beyond_one_rounding, 0) << "Native bf16 within one rounding everywhere";
    }
  }
}

/// F32Accumulate with Sum: the rank-order sum, no division.
inline void store_f32_accumulate_sum(Backend be) {
  Communicator& comm = world(be);
  TestStream s(be);
  BucketStore st = precision_store(comm, DType::bf16, GradReducePrecision::F32Accumulate, ReduceOp::Sum);
  const ReduceCheck f = reduce_known(st, s, true);
  EXPECT_EQ(f.not_oracle, 0);
  EXPECT_EQ(f.beyond_one_rounding, 0);
}

/// A captured step (grad_ready starts each bucket; waits; gathers) replays with the
/// bytes of the eager step, which is the oracle's.
inline void store_f32_accumulate_graph_equals_eager(Backend be, int chunks = 0) {
  Communicator& comm = world(be);
  const int me = comm.rank();
  TestStream s(be);
  BucketStore st = precision_store(comm, DType::bf16, GradReducePrecision::F32Accumulate, ReduceOp::Average, chunks);
  const Layout& L = st.layout();
  const int nb = static_cast<int>(L.buckets().size());
  const int np = static_cast<int>(L.params().size());
  const PristineInputs pristine(be, known_images(L, DType::bf16, me), param_images(L, me));
  const StoreImages eager = expect_replays_like_eager(st, s, [&] {
    pristine.restore(st, s.get());
    for (int p = np - 1; p >= 0; --p) st.grad_ready(p, s.get());
    st.start_grad_reduces(0, nb, s.get());  // none left: grad_ready started them all
    for (int b = nb - 1; b >= 0; --b) st.wait_grad_reduce(b, s.get());
    for (int b = 0; b < nb; ++b) st.start_param_gather(b, s.get());
    for (int b = 0; b < nb; ++b) st.wait_param_gather(b, s.get());
  }, "F32Accumulate grad_ready step");
  expect_gathered(L, eager.params, "F32Accumulate step, rank " + std::to_string(me));
  int bad = 0;
  for (int b = 0; b < nb; ++b) {
    const Bucket& bk = L.buckets()[static_cast<std::size_t>(b)];
    const Range own = L.shard_range(b, me);
    for (std::int64_t j = own.begin; j < own.end; ++j) {
      std::vector<float> x;
      for (int r = 0; r < comm.size(); ++r) x.push_back(known_grad(r, bk.buffer, j));
      Bytes want(2);
      set_element(DType::bf16, want, 0, rank_order_sum(x, true));
      bad += std::memcmp(want.data(), eager.grads[static_cast<std::size_t>(bk.buffer)].data() + 2 * j, 2) != 0;
    }
  }
  EXPECT_EQ(bad, 0) << "rank " << me;
}

/// The elements of rank `me`'s slices in `got` (bf16 gradient buffers after an Average
/// reduce) whose bits differ from the oracle: every rank's `images` value summed in fp32
/// in rank order, divided by n, rounded once to bf16.
inline std::int64_t off_mean_oracle(const Layout& L, const std::vector<std::vector<Bytes>>& images,
                                    const std::vector<Bytes>& got, int me) {
  const int n = static_cast<int>(images.size());
  std::int64_t bad = 0;
  std::vector<float> x;
  for (int b = 0; b < static_cast<int>(L.buckets().size()); ++b) {
    const auto buf = static_cast<std::size_t>(L.buckets()[static_cast<std::size_t>(b)].buffer);
    const Range own = L.shard_range(b, me);
    for (std::int64_t j = own.begin; j < own.end; ++j) {
      x.clear();
      for (int r = 0; r < n; ++r)
        x.push_back(static_cast<float>(element(DType::bf16, images[static_cast<std::size_t>(r)][buf], static_cast<std::size_t>(j))));
      Bytes want(2);
      set_element(DType::bf16, want, 0, rank_order_sum(x, true));
      bad += std::memcmp(want.data(), got[buf].data() + 2 * j, 2) != 0;
    }
  }
  return bad;
}

/// Random (inexact) gradients: every partial sum rounds, so only the promised order gives
/// the oracle's bits. Two stores, twice each: every run equals the rank-order fp32 loop
/// over every rank's image, rounded once to bf16, bitwise (whatever NCCL_ALGO says).
inline void store_random_data_is_the_oracle_every_run(Backend be) {
  Communicator& comm = world(be);
  const int n = comm.size(), me = comm.rank();
  TestStream s(be);
  const Layout L = store_layout(n);
  std::vector<std::vector<Bytes>> images;
  for (int r = 0; r < n; ++r) images.push_back(grad_images(L, DType::bf16, r, false, 31));
  const int nb = static_cast<int>(L.buckets().size());
  for (int store = 0; store < 2; ++store) {
    BucketStore st = precision_store(comm, DType::bf16, GradReducePrecision::F32Accumulate);
    for (int run = 0; run < 2; ++run) {
      upload_all(be, images[static_cast<std::size_t>(me)], [&](int b) { return st.grad_buffer(b); });
      st.start_grad_reduces(0, nb, s.get());
      for (int b = 0; b < nb; ++b) st.wait_grad_reduce(b, s.get());
      s.sync();
      const std::int64_t bad = off_mean_oracle(L, images, download_grads(st, DType::bf16), me);
      EXPECT_EQ(bad, 0) << "store " << store << " run " << run << " rank " << me;
    }
  }
}

/// A fresh group over all ranks whose waits give up after 60 s (Error(Timeout)), for the
/// cases at benchmark scale: a stall fails the test instead of hanging it.
inline Communicator world_with_deadline(Backend be) {
  Communicator comm = make_world(be);
  WatchdogOptions deadline;
  deadline.wait_timeout = std::chrono::seconds(60);
  comm.set_watchdog(deadline);
  return comm;
}

/// Benchmark-scale buckets (issue 31): a registered F32Accumulate store of `buckets` bf16
/// parameters of about `bucket_numel` elements, a bucket each (odd sizes: the buckets are
/// padded), reduces random gradients to the rank-order fp32 oracle, bitwise, bucket by
/// bucket and as one range. The shared cases' 700-element buckets never reach the sizes
/// at which the benchmarks hung on NCCL (docs/grad_reduce.md, "The benchmark hang"). A
/// fresh group with a wait_timeout bounds the waits; an alarm ends the process if the
/// construction's warm-up (which waits without a deadline) hangs. Without parameters
/// (`with_params` false, as bench_comm built its store, and as stores whose quantized
/// parameters stage their gathers through the gradient buffer run), the gradient buffer
/// serves the all-to-all and also the warm-up's in-place all-gathers. `chunks`:
/// BucketStoreOptions::grad_reduce_chunks (0: automatic, 4 for 16 MiB pieces).
inline void store_large_buckets_are_the_oracle(Backend be, int buckets, std::int64_t bucket_numel,
                                               bool with_params = true, int chunks = 0) {
  const Watchdog alarm(150);  // below the suite's test timeout (device_suite.sh: 900 s x 0.25)
  Communicator comm = world_with_deadline(be);
  const int n = comm.size(), me = comm.rank();
  TestStream s(be);
  LayoutOptions lo;
  lo.bucket_numel = bucket_numel;
  std::vector<ParamSpec> specs;
  for (int p = 0; p < buckets; ++p) {
    std::string name = "w";
    name += std::to_string(p);  // (not "w" + ...: GCC 12 warns falsely about that)
    specs.push_back(ParamSpec::tensor(std::move(name), {bucket_numel - 3 - p}));
  }
  const Layout L(specs, n, lo);
  BucketStoreOptions o;
  o.grad_dtype = DType::bf16;
  o.grad_reduce = ReduceOp::Average;
  o.grad_reduce_precision = GradReducePrecision::F32Accumulate;
  o.nccl_registered = true;
  o.with_params = with_params;
  o.grad_reduce_chunks = chunks;
  BucketStore st(comm, L, o);
  const int nb = static_cast<int>(L.buckets().size());
  ASSERT_EQ(nb, buckets);
  std::vector<std::vector<Bytes>> images;
  for (int r = 0; r < n; ++r) images.push_back(grad_images(L, DType::bf16, r, false, 41));
  for (const bool range : {false, true}) {
    upload_all(be, images[static_cast<std::size_t>(me)], [&](int b) { return st.grad_buffer(b); });
    if (range) {
      st.start_grad_reduces(0, nb, s.get());
    } else {
      for (int b = nb - 1; b >= 0; --b) st.start_grad_reduce(b, s.get());
    }
    for (int b = 0; b < nb; ++b) st.wait_grad_reduce(b, s.get());
    comm.synchronize(s.get());
    const std::int64_t bad = off_mean_oracle(L, images, download_grads(st, DType::bf16), me);
    EXPECT_EQ(bad, 0) << (range ? "range starts" : "single starts") << ", rank " << me << ", " << nb << " buckets";
  }
}

/// One registered buffer that first sends its pieces (an all-to-all into another
/// registered buffer) and then serves collectives in place (an all-gather, then a
/// reduce-scatter), as the gradient buffer of a parameterless F32Accumulate store does,
/// all within the group's wait_timeout and every result exact. `count` bf16 elements per
/// piece: on NCCL at 4 Mi (8 MiB pieces, far past the LL threshold) the send/recv take
/// the registered zero-copy path; bench_comm's parameterless store stalled in its warm-up
/// at that scale while the optimizers' stores (gradients in send/recv only) did not
/// (docs/grad_reduce.md, "The bench_comm stall").
inline void registered_buffer_serves_send_recv_then_collectives(Backend be, std::int64_t count) {
  const Watchdog alarm(150);
  Communicator comm = world_with_deadline(be);
  const int n = comm.size(), me = comm.rank();
  TestStream s(be);
  const auto total = static_cast<std::size_t>(count) * static_cast<std::size_t>(n);
  // Small integers (at most 7, sums at most 8 x 7): every value and sum is exact in bf16.
  auto code = [](int sender, int piece, std::size_t i) {
    return num::f32_to_bf16(static_cast<float>((sender + 3 * piece + static_cast<int>(i % 5)) % 8));
  };
  Bytes mine(total * 2);
  for (std::size_t k = 0; k < total; ++k) {
    const std::uint16_t c = code(me, static_cast<int>(k / static_cast<std::size_t>(count)), k % static_cast<std::size_t>(count));
    std::memcpy(mine.data() + 2 * k, &c, 2);
  }
  DeviceBuffer x(be, mine.size(), MemoryKind::NcclDevice), y(be, mine.size(), MemoryKind::NcclDevice);
  const BufferRegistration rx = comm.register_buffer(x.data(), mine.size());
  const BufferRegistration ry = comm.register_buffer(y.data(), mine.size());
  upload(be, x.data(), mine);
  comm.all_to_all(x.data(), y.data(), count, DType::bf16, s.get());
  comm.all_gather(x.data(), count, DType::bf16, s.get());  // slice r <- rank r's piece r
  comm.synchronize(s.get());
  const Bytes pieces = download(be, y.data(), mine.size());
  const Bytes gathered = download(be, x.data(), mine.size());
  comm.reduce_scatter(x.data(), count, DType::bf16, ReduceOp::Sum, s.get());  // every rank holds `gathered`
  comm.synchronize(s.get());
  const Bytes reduced = download(be, x.data(), mine.size());
  std::int64_t bad_pieces = 0, bad_gathered = 0, bad_reduced = 0;
  for (std::size_t k = 0; k < total; ++k) {
    const int slot = static_cast<int>(k / static_cast<std::size_t>(count));
    const std::size_t i = k % static_cast<std::size_t>(count);
    std::uint16_t got = 0;
    std::memcpy(&got, pieces.data() + 2 * k, 2);
    bad_pieces += got != code(slot, me, i);  // slot p: rank p's piece for me
    std::memcpy(&got, gathered.data() + 2 * k, 2);
    bad_gathered += got != code(slot, slot, i);
    if (slot != me) continue;
    std::memcpy(&got, reduced.data() + 2 * k, 2);
    bad_reduced += got != num::f32_to_bf16(static_cast<float>(n) * num::bf16_to_f32(code(me, me, i)));
  }
  EXPECT_EQ(bad_pieces, 0) << "all-to-all, rank " << me;
  EXPECT_EQ(bad_gathered, 0) << "all-gather after the all-to-all, rank " << me;
  EXPECT_EQ(bad_reduced, 0) << "reduce-scatter after both, rank " << me;
}

// ------------------------------------------------------------------ chunks

/// The chunks a piece of `count` elements is cut into when `asked` are asked for, by the
/// documented rule (written here from the words, not from the code): chunks of
/// ceil(count / asked) elements rounded up to a multiple of 256, the last one shorter.
inline int expected_chunks(std::int64_t count, int asked) {
  const std::int64_t even = (count + asked - 1) / asked;
  const std::int64_t size = (even + 255) / 256 * 256;
  return static_cast<int>((count + size - 1) / size);
}

/// A layout whose buckets' pieces are long and not a multiple of 256 or of any chunk count
/// asked below (the last chunk is short), a bucket whose piece is shorter than one chunk
/// (tiny), and one in between.
inline Layout chunk_layout(int n) {
  LayoutOptions lo;
  lo.bucket_numel = 600;
  std::vector<ParamSpec> specs;
  specs.push_back(ParamSpec::tensor("long", {1300 * n + 5}));
  specs.push_back(ParamSpec::tensor("tiny", {3}));
  specs.push_back(ParamSpec::tensor("middle", {517 * n}));
  return Layout(specs, n, lo);
}

/// F32Accumulate in chunks (BucketStoreOptions::grad_reduce_chunks: 1, 2, 3, 16): every
/// bucket's reduce equals the rank-order fp32 oracle bitwise, for known gradients (bf16
/// and f32, also within one rounding of the exact mean) and random bf16 gradients, single
/// and range starts; each bucket is cut as documented (fewer chunks where its piece is
/// short: the tiny bucket has one).
inline void store_chunks_are_the_oracle(Backend be) {
  Communicator& comm = world(be);
  const int n = comm.size(), me = comm.rank();
  TestStream s(be);
  const Layout L = chunk_layout(n);
  const int nb = static_cast<int>(L.buckets().size());
  std::vector<std::vector<Bytes>> images;
  for (int r = 0; r < n; ++r) images.push_back(grad_images(L, DType::bf16, r, false, 37));
  for (const int k : {1, 2, 3, 16}) {
    for (const DType t : {DType::bf16, DType::f32}) {
      SCOPED_TRACE(std::to_string(k) + " chunks, " + to_string(t));
      BucketStoreOptions o;
      o.grad_dtype = t;
      o.grad_reduce_precision = GradReducePrecision::F32Accumulate;
      o.grad_reduce_chunks = k;
      BucketStore st(comm, L, o);
      int most = 0, least = 1 << 30;
      for (int b = 0; b < nb; ++b) {
        const std::int64_t per_rank = L.buckets()[static_cast<std::size_t>(b)].range.size() / n;
        const int want = n == 1 ? 1 : expected_chunks(per_rank, k);
        EXPECT_EQ(st.grad_reduce_chunks(b), want) << "bucket " << b << " of " << per_rank << " per rank";
        most = std::max(most, want);
        least = std::min(least, want);
      }
      if (n > 1 && k > 1) {
        EXPECT_GT(most, 1) << "no bucket was cut";
      }
      EXPECT_EQ(least, 1) << "the tiny bucket has one chunk";
      for (const bool range : {false, true}) {
        const ReduceCheck c = reduce_known(st, s, range);
        EXPECT_EQ(c.not_oracle, 0) << "rank " << me << (range ? " range" : " single");
        EXPECT_EQ(c.beyond_one_rounding, 0) << "rank " << me;
        EXPECT_EQ(c.other_slices_changed, 0) << "rank " << me;
      }
      if (t != DType::bf16) continue;
      upload_all(be, images[static_cast<std::size_t>(me)], [&](int b) { return st.grad_buffer(b); });
      st.start_grad_reduces(0, nb, s.get());
      for (int b = 0; b < nb; ++b) st.wait_grad_reduce(b, s.get());
      s.sync();
      EXPECT_EQ(off_mean_oracle(L, images, download_grads(st, DType::bf16), me), 0) << "random data, rank " << me;
    }
  }
}

/// The pipelined reduce (detail::PieceReducer) gives every chunk its own receive region
/// (chunk k's pieces back to back at n * k * chunk size), so that the next chunk's
/// all-to-all never writes where a sum may still read: after a reduce in 3 chunks, the
/// scratch holds every chunk's pieces from every other rank, in place, and the own slots
/// are untouched; the output is the rank-order sum.
inline void piece_reducer_keeps_every_chunk_apart(Backend be) {
  Communicator& comm = world(be);
  const int n = comm.size(), me = comm.rank();
  if (n < 2) return;
  TestStream s(be);
  const std::int64_t count = 1344;  // chunks of 512, 512, 320 when 3 are asked for
  auto value = [](int rank, std::int64_t j) { return static_cast<float>((rank * 7 + j) % 13 - 6); };  // exact
  Bytes data(static_cast<std::size_t>(count * n) * 2);
  for (std::int64_t j = 0; j < count * n; ++j) set_element(DType::bf16, data, static_cast<std::size_t>(j), value(me, j));
  const Bytes sentinel(data.size(), 0xAB);
  DeviceBuffer ddata = to_device(be, data), dpieces = to_device(be, sentinel);
  DeviceBuffer dout(be, static_cast<std::size_t>(count) * 4);
  detail::PieceReducer reducer(be, 3);
  detail::PieceReduce r;
  r.data = ddata.data();
  r.pieces = dpieces.data();
  r.count = count;
  r.dtype = DType::bf16;
  r.out = dout.data();
  r.out_dtype = DType::f32;
  reducer.run(comm, r, 3, s.get());
  s.sync();
  const Bytes scratch = download(be, dpieces.data(), sentinel.size());
  const Bytes out = download(be, dout.data(), dout.bytes());
  const std::int64_t size = 512;
  std::int64_t misplaced = 0, own_touched = 0, wrong_sum = 0;
  for (std::int64_t at = 0; at < count; at += size) {
    const std::int64_t len = std::min(size, count - at);
    for (int p = 0; p < n; ++p) {
      for (std::int64_t i = 0; i < len; ++i) {
        const auto k = static_cast<std::size_t>(n * at + p * len + i);
        if (p == me) {
          own_touched += scratch[2 * k] != 0xAB || scratch[2 * k + 1] != 0xAB;
        } else {
          misplaced += element(DType::bf16, scratch, k) != value(p, me * count + at + i);
        }
      }
    }
  }
  for (std::int64_t i = 0; i < count; ++i) {
    float acc = 0.0f;
    for (int p = 0; p < n; ++p) acc += value(p, me * count + i);
    wrong_sum += element(DType::f32, out, static_cast<std::size_t>(i)) != acc;
  }
  EXPECT_EQ(misplaced, 0) << "rank " << me;
  EXPECT_EQ(own_touched, 0) << "rank " << me;
  EXPECT_EQ(wrong_sum, 0) << "rank " << me;
}

/// grad_reduce_chunks outside [0, 16] is refused on every rank, naming the value; ranks
/// that pass different chunk counts are refused on every rank (LayoutMismatch), naming
/// both; 0 chooses one chunk per 4 MiB of a piece, 1 to 4 (the test layout's pieces are
/// small: one each), and Native reports one chunk.
inline void store_chunk_options(Backend be) {
  Communicator& comm = world(be);
  for (const int bad : {-1, 17}) {
    const auto e = error_of([&] {
      BucketStore st = precision_store(comm, DType::bf16, GradReducePrecision::F32Accumulate, ReduceOp::Average, bad);
    });
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code(), ErrorCode::InvalidArgument);
    EXPECT_TRUE(contains(e->what(), "grad_reduce_chunks " + std::to_string(bad))) << e->what();
  }
  BucketStore automatic = precision_store(comm, DType::bf16, GradReducePrecision::F32Accumulate);
  BucketStore native = precision_store(comm, DType::bf16, GradReducePrecision::Native, ReduceOp::Average, 3);
  for (int b = 0; b < static_cast<int>(automatic.layout().buckets().size()); ++b) {
    EXPECT_EQ(automatic.grad_reduce_chunks(b), 1);
    EXPECT_EQ(native.grad_reduce_chunks(b), 1);
  }
  if (comm.size() < 2) return;
  const bool last = comm.rank() == comm.size() - 1;
  const auto e = error_of([&] {
    BucketStore st = precision_store(comm, DType::bf16, GradReducePrecision::F32Accumulate, ReduceOp::Average,
                                     last ? 2 : 3);
  });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::LayoutMismatch);
  EXPECT_TRUE(contains(e->what(), "grad_reduce_chunks=2")) << e->what();
  EXPECT_TRUE(contains(e->what(), "grad_reduce_chunks=3")) << e->what();
}

/// Ranks that pass different precisions are refused on every rank, naming it.
inline void store_precision_disagreement(Backend be) {
  Communicator& comm = world(be);
  const bool last = comm.rank() == comm.size() - 1;
  if (comm.size() < 2) return;
  const auto e = error_of([&] {
    BucketStore st = precision_store(comm, DType::bf16,
                                     last ? GradReducePrecision::F32Accumulate : GradReducePrecision::Native);
  });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::LayoutMismatch);
  EXPECT_TRUE(contains(e->what(), "grad_reduce_precision=F32Accumulate")) << e->what();
  EXPECT_TRUE(contains(e->what(), "grad_reduce_precision=Native")) << e->what();
}

#define SHARDOPT_GRAD_REDUCE_CASES(Suite, backend)                                                            \
  TEST(Suite, AllToAllDeliversEveryPiece) { all_to_all_delivers_every_piece(backend); }                       \
  TEST(Suite, AllToAllPeersLeavesTheOwnPiece) { all_to_all_peers_leaves_the_own_piece(backend); }             \
  TEST(Suite, AllToAllPeersWithStrides) { all_to_all_peers_with_strides(backend); }                           \
  TEST(Suite, PieceSumReadsTheOwnPieceWhereItLies) { piece_sum_reads_the_own_piece_where_it_lies(backend); }  \
  TEST(Suite, PieceSumEqualsRankOrderLoop) { piece_sum_equals_rank_order_loop(backend); }                     \
  TEST(Suite, StoreBf16IsTheOracleAndBeatsNative) { store_f32_accumulate_is_the_oracle(backend, DType::bf16); } \
  TEST(Suite, StoreF32IsTheOracle) { store_f32_accumulate_is_the_oracle(backend, DType::f32); }               \
  TEST(Suite, StoreSumIsTheOracle) { store_f32_accumulate_sum(backend); }                                     \
  TEST(Suite, StoreGraphEqualsEager) { store_f32_accumulate_graph_equals_eager(backend); }                    \
  TEST(Suite, StoreChunkedGraphEqualsEager) { store_f32_accumulate_graph_equals_eager(backend, 3); }          \
  TEST(Suite, StoreChunksAreTheOracle) { store_chunks_are_the_oracle(backend); }                              \
  TEST(Suite, StoreChunkOptions) { store_chunk_options(backend); }                                            \
  TEST(Suite, PieceReducerKeepsEveryChunkApart) { piece_reducer_keeps_every_chunk_apart(backend); }           \
  TEST(Suite, StoreRandomDataIsTheOracleEveryRun) { store_random_data_is_the_oracle_every_run(backend); }     \
  TEST(Suite, StorePrecisionDisagreementIsRefused) { store_precision_disagreement(backend); }

}  // namespace shardopt::test
