// bucket_store_cases.hpp - the BucketStore's tests, written once for both backends
// (host backend in test/mpi/test_bucket_store.cpp, CUDA + NCCL in
// test/gpu/test_bucket_store_gpu.cpp). Every case runs on any number of ranks, one included.
// Host images of whole buffers are built here from seeds; the oracle of a bucket's
// reduce-scatter is a double-precision sum over every rank's image.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "mpi/comm_cases.hpp"
#include "mpi/comm_test_support.hpp"
#include "shardopt/bucket_store.hpp"
#include "shardopt/layout.hpp"

namespace shardopt::test {

/// Odd shapes in two dtypes (two buffers), several buckets per buffer, padding in every
/// bucket, a grouped parameter.
inline std::vector<ParamSpec> store_specs() {
  return {ParamSpec::tensor("embed", {37, 11}),
          ParamSpec::tensor("norm", {129}, DType::f32, "no_decay"),
          ParamSpec::tensor("w1", {61, 7}),
          ParamSpec::tensor("w2", {1000}),
          ParamSpec::grouped("experts", 3, {5, 9}),
          ParamSpec::tensor("bias", {3}, DType::f32, "no_decay"),
          ParamSpec::tensor("head", {4099})};
}

inline Layout store_layout(int world) {
  LayoutOptions o;
  o.bucket_numel = 700;
  return Layout(store_specs(), world, o);
}

/// A store over the test layout with `t` grads reduced by `op` (collective).
inline BucketStore test_store(const Communicator& comm, DType t, ReduceOp op = ReduceOp::Average,
                              bool registered = true) {
  BucketStoreOptions o;
  o.grad_dtype = t;
  o.grad_reduce = op;
  o.nccl_registered = registered;
  return BucketStore(comm, store_layout(comm.size()), o);
}

/// The gradient image of every buffer on rank r: each param's elements from the seed,
/// padding zero (as after zero_grad).
inline std::vector<Bytes> grad_images(const Layout& L, DType t, int r, bool exact, std::uint64_t salt = 0) {
  std::vector<Bytes> img;
  for (const auto& buf : L.buffers()) img.emplace_back(static_cast<std::size_t>(buf.numel) * size_of(t), 0);
  for (std::size_t p = 0; p < L.params().size(); ++p) {
    const auto& pl = L.params()[p];
    const auto seed = seed_of(11 + salt, p, static_cast<std::uint64_t>(r), static_cast<std::uint64_t>(t));
    const Bytes v = exact ? exact_floats(t, static_cast<std::size_t>(pl.numel), seed)
                          : random_floats(t, static_cast<std::size_t>(pl.numel), seed);
    std::memcpy(img[static_cast<std::size_t>(pl.buffer)].data() + static_cast<std::size_t>(pl.offset) * size_of(t),
                v.data(), v.size());
  }
  return img;
}

/// Byte j of rank r's slice of bucket b (params image for the all-gather).
inline std::uint8_t gather_byte(int r, int b, std::size_t j) { return static_cast<std::uint8_t>(r * 61 + b * 17 + j * 3 + 5); }

/// The parameter image of every buffer on rank r: its own slice of every bucket filled
/// with gather_byte, the rest zero.
inline std::vector<Bytes> param_images(const Layout& L, int r) {
  std::vector<Bytes> img;
  for (const auto& buf : L.buffers()) img.emplace_back(static_cast<std::size_t>(buf.numel) * size_of(buf.dtype), 0);
  for (std::size_t b = 0; b < L.buckets().size(); ++b) {
    const auto& bk = L.buckets()[b];
    const std::size_t es = size_of(L.buffers()[static_cast<std::size_t>(bk.buffer)].dtype);
    const Range own = L.shard_range(static_cast<int>(b), r);
    for (std::size_t j = 0; j < static_cast<std::size_t>(own.size()) * es; ++j)
      img[static_cast<std::size_t>(bk.buffer)][static_cast<std::size_t>(own.begin) * es + j] =
          gather_byte(r, static_cast<int>(b), j);
  }
  return img;
}

/// Checks every bucket's own slice of the downloaded grads against the oracle (padding
/// must come out exactly zero) and the other slices against this rank's input.
inline void expect_reduced(const Layout& L, DType t, ReduceOp op, bool exact, int me,
                           const std::vector<std::vector<Bytes>>& in, const std::vector<Bytes>& out,
                           const std::string& what) {
  const int n = L.world_size();
  int bad = 0, changed = 0;
  std::string first;
  for (std::size_t b = 0; b < L.buckets().size(); ++b) {
    const auto& bk = L.buckets()[b];
    const auto buf = static_cast<std::size_t>(bk.buffer);
    const Range own = L.shard_range(static_cast<int>(b), me);
    for (std::int64_t pos = bk.range.begin; pos < bk.range.end; ++pos) {
      const auto i = static_cast<std::size_t>(pos);
      if (pos < own.begin || pos >= own.end) {
        changed += element(t, out[buf], i) != element(t, in[static_cast<std::size_t>(me)][buf], i);
        continue;
      }
      std::vector<double> x;
      for (int r = 0; r < n; ++r) x.push_back(element(t, in[static_cast<std::size_t>(r)][buf], i));
      const std::string why = check_reduced(t, op, exact, x, element(t, out[buf], i));
      if (!why.empty() && bad++ == 0) first = "bucket " + std::to_string(b) + " element " + std::to_string(pos) + ": " + why;
    }
  }
  EXPECT_EQ(bad, 0) << what << " rank " << me << ": " << first;
  EXPECT_EQ(changed, 0) << what << ": slices of other ranks changed on rank " << me;
}

inline std::vector<Bytes> download_grads(const BucketStore& st, DType t) {
  std::vector<Bytes> out;
  const Backend be = st.comm().backend();
  for (std::size_t b = 0; b < st.layout().buffers().size(); ++b)
    out.push_back(download(be, st.grad_buffer(static_cast<int>(b)),
                           static_cast<std::size_t>(st.layout().buffers()[b].numel) * size_of(t)));
  return out;
}

inline std::vector<Bytes> download_params(const BucketStore& st) {
  std::vector<Bytes> out;
  const Backend be = st.comm().backend();
  for (std::size_t b = 0; b < st.layout().buffers().size(); ++b)
    out.push_back(download(be, st.param_buffer(static_cast<int>(b)),
                           static_cast<std::size_t>(st.layout().buffers()[b].numel) *
                               size_of(st.layout().buffers()[b].dtype)));
  return out;
}

inline void upload_all(Backend be, const std::vector<Bytes>& images, const std::function<void*(int)>& dst) {
  for (std::size_t b = 0; b < images.size(); ++b) upload(be, dst(static_cast<int>(b)), images[b]);
}

/// Checks that the downloaded params hold every rank's slice of every bucket
/// (gather_byte), bitwise.
inline void expect_gathered(const Layout& L, const std::vector<Bytes>& params, const std::string& what) {
  int bad = 0;
  for (std::size_t b = 0; b < L.buckets().size(); ++b) {
    const auto& bk = L.buckets()[b];
    const std::size_t es = size_of(L.buffers()[static_cast<std::size_t>(bk.buffer)].dtype);
    for (int r = 0; r < L.world_size(); ++r) {
      const Range sl = L.shard_range(static_cast<int>(b), r);
      for (std::size_t j = 0; j < static_cast<std::size_t>(sl.size()) * es; ++j)
        bad += params[static_cast<std::size_t>(bk.buffer)][static_cast<std::size_t>(sl.begin) * es + j] !=
               gather_byte(r, static_cast<int>(b), j);
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

/// Device copies of a store's grad and param images (one per layout buffer): restore()
/// queues their copies into the store's buffers, so that every replay of a captured step
/// starts from the same inputs.
class PristineInputs {
 public:
  PristineInputs(Backend be, const std::vector<Bytes>& grads, const std::vector<Bytes>& params) : be_(be) {
    for (const Bytes& img : grads) grads_.push_back(to_device(be, img));
    for (const Bytes& img : params) params_.push_back(to_device(be, img));
  }
  void restore(const BucketStore& st, Stream s) const {
    for (std::size_t b = 0; b < grads_.size(); ++b) {
      copy_async(be_, st.grad_buffer(static_cast<int>(b)), grads_[b].data(), grads_[b].bytes(), s);
      copy_async(be_, st.param_buffer(static_cast<int>(b)), params_[b].data(), params_[b].bytes(), s);
    }
  }

 private:
  Backend be_;
  std::vector<DeviceBuffer> grads_, params_;
};

/// A store's buffers as downloaded (one image per layout buffer).
struct StoreImages {
  std::vector<Bytes> grads, params;
};

/// Runs `step` on `s` eagerly, captures it into one graph, zeroes the store's buffers
/// (replays must write everything themselves) and replays the graph 10 times: every
/// replay must leave the grads and params with the bytes of the eager step, which it
/// returns.
inline StoreImages expect_replays_like_eager(const BucketStore& st, TestStream& s, const std::function<void()>& step,
                                             const std::string& what) {
  const Backend be = st.comm().backend();
  const DType gt = st.options().grad_dtype;
  step();
  s.sync();
  const StoreImages eager{download_grads(st, gt), download_params(st)};
  s.begin_capture();
  step();
  Graph graph;
  s.end_capture(graph);
  for (std::size_t b = 0; b < eager.grads.size(); ++b) {
    fill_zero_async(be, st.grad_buffer(static_cast<int>(b)), eager.grads[b].size(), s.get());
    fill_zero_async(be, st.param_buffer(static_cast<int>(b)), eager.params[b].size(), s.get());
  }
  s.sync();
  for (int k = 0; k < 10; ++k) {
    graph.replay(be, s.get());
    s.sync();
    EXPECT_EQ(download_grads(st, gt), eager.grads) << what << ": replay " << k << " rank " << st.comm().rank();
    EXPECT_EQ(download_params(st), eager.params) << what << ": replay " << k << " rank " << st.comm().rank();
  }
  return eager;
}

// ------------------------------------------------------------------ construction

/// Buffers are zeroed, views point at the layout offsets, byte counts add up.
inline void store_buffers_follow_the_layout(Backend be, bool registered) {
  Communicator& comm = world(be);
  BucketStore st = test_store(comm, DType::bf16, ReduceOp::Average, registered);
  const Layout& L = st.layout();
  EXPECT_GE(L.buffers().size(), 2u);
  EXPECT_GE(L.buckets().size(), 4u) << "the test layout should have several buckets";
  std::size_t pbytes = 0, gbytes = 0;
  for (std::size_t b = 0; b < L.buffers().size(); ++b) {
    pbytes += static_cast<std::size_t>(L.buffers()[b].numel) * size_of(L.buffers()[b].dtype);
    gbytes += static_cast<std::size_t>(L.buffers()[b].numel) * 2;
  }
  EXPECT_EQ(st.param_bytes(), pbytes);
  EXPECT_EQ(st.grad_bytes(), gbytes);
  for (const Bytes& img : download_grads(st, DType::bf16)) EXPECT_EQ(img, Bytes(img.size(), 0)) << "grads not zeroed";
  for (const Bytes& img : download_params(st)) EXPECT_EQ(img, Bytes(img.size(), 0)) << "params not zeroed";
  for (std::size_t p = 0; p < L.params().size(); ++p) {
    const auto& pl = L.params()[p];
    const auto* pbase = static_cast<const char*>(st.param_buffer(pl.buffer));
    const auto* gbase = static_cast<const char*>(st.grad_buffer(pl.buffer));
    EXPECT_EQ(static_cast<const char*>(st.param_data(static_cast<int>(p))) - pbase,
              pl.offset * static_cast<std::int64_t>(size_of(L.buffers()[static_cast<std::size_t>(pl.buffer)].dtype)));
    EXPECT_EQ(static_cast<const char*>(st.grad_data(static_cast<int>(p))) - gbase, pl.offset * 2);
  }
  EXPECT_EQ(st.comm_stream() == nullptr, be == Backend::Host);
}

// ------------------------------------------------------------------ bucketed collectives

/// Bucketed reduce-scatter of every bucket equals the oracle (padding stays zero), for
/// f32 / bf16 / f16 grads with Average and Sum; random data within the order tolerance,
/// exact data bitwise.
inline void bucketed_reduce_scatter_matches_reference(Backend be, bool registered) {
  Communicator& comm = world(be);
  const int n = comm.size(), me = comm.rank();
  TestStream s(be);
  struct Variant {
    DType t;
    ReduceOp op;
  };
  for (Variant v : {Variant{DType::f32, ReduceOp::Average}, Variant{DType::bf16, ReduceOp::Sum},
                    Variant{DType::bf16, ReduceOp::Average}, Variant{DType::f16, ReduceOp::Average}})
    for (bool exact : {false, true}) {
      if (exact && v.op == ReduceOp::Average && !is_power_of_two(n)) continue;
      BucketStore st = test_store(comm, v.t, v.op, registered);
      std::vector<std::vector<Bytes>> in;
      for (int r = 0; r < n; ++r) in.push_back(grad_images(st.layout(), v.t, r, exact));
      upload_all(be, in[static_cast<std::size_t>(me)], [&](int b) { return st.grad_buffer(b); });
      const int nb = static_cast<int>(st.layout().buckets().size());
      for (int b = 0; b < nb; ++b) st.start_grad_reduce(b, s.get());
      for (int b = 0; b < nb; ++b) EXPECT_TRUE(st.grad_reduce_pending(b));
      for (int b = nb - 1; b >= 0; --b) st.wait_grad_reduce(b, s.get());
      for (int b = 0; b < nb; ++b) EXPECT_FALSE(st.grad_reduce_pending(b));
      s.sync();
      expect_reduced(st.layout(), v.t, v.op, exact, me, in, download_grads(st, v.t),
                     std::string(to_string(v.t)) + " " + name_of(v.op) + (exact ? " exact" : " random"));
    }
}

/// Bucketed all-gather: every rank ends with every rank's slices, bitwise.
inline void bucketed_all_gather_is_exact(Backend be, bool registered) {
  Communicator& comm = world(be);
  const int me = comm.rank();
  TestStream s(be);
  BucketStore st = test_store(comm, DType::f32, ReduceOp::Average, registered);
  const Layout& L = st.layout();
  upload_all(be, param_images(L, me), [&](int b) { return st.param_buffer(b); });
  const int nb = static_cast<int>(L.buckets().size());
  for (int b = 0; b < nb; ++b) st.start_param_gather(b, s.get());
  for (int b = 0; b < nb; ++b) EXPECT_TRUE(st.param_gather_pending(b));
  for (int b = 0; b < nb; ++b) st.wait_param_gather(b, s.get());
  s.sync();
  expect_gathered(L, download_params(st), "rank " + std::to_string(me));
}

/// grad_ready: a bucket's reduce-scatter starts exactly when its last parameter reports,
/// once per step, over several steps; the results equal the oracle bitwise.
inline void grad_ready_fires_each_bucket_once_per_step(Backend be) {
  Communicator& comm = world(be);
  const int n = comm.size(), me = comm.rank();
  TestStream s(be);
  BucketStore st = test_store(comm, DType::f32, ReduceOp::Sum);
  const Layout& L = st.layout();
  const int nb = static_cast<int>(L.buckets().size());
  const int np = static_cast<int>(L.params().size());
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<Bytes>> in;
    for (int r = 0; r < n; ++r) in.push_back(grad_images(L, DType::f32, r, true, static_cast<std::uint64_t>(step)));
    upload_all(be, in[static_cast<std::size_t>(me)], [&](int b) { return st.grad_buffer(b); });
    std::vector<int> left(static_cast<std::size_t>(nb));
    for (int b = 0; b < nb; ++b) left[static_cast<std::size_t>(b)] = static_cast<int>(L.buckets()[static_cast<std::size_t>(b)].params.size());
    int transitions = 0;
    for (int p = np - 1; p >= 0; --p) {  // backward order
      st.grad_ready(p, s.get());
      --left[static_cast<std::size_t>(L.params()[static_cast<std::size_t>(p)].bucket)];
      for (int b = 0; b < nb; ++b) {
        const bool want = left[static_cast<std::size_t>(b)] == 0;
        EXPECT_EQ(st.grad_reduce_pending(b), want) << "step " << step << " after param " << p << ", bucket " << b;
      }
      transitions += left[static_cast<std::size_t>(L.params()[static_cast<std::size_t>(p)].bucket)] == 0;
    }
    EXPECT_EQ(transitions, nb) << "every bucket must start exactly once per step";
    for (int b = 0; b < nb; ++b) st.wait_grad_reduce(b, s.get());
    s.sync();
    expect_reduced(L, DType::f32, ReduceOp::Sum, true, me, in, download_grads(st, DType::f32),
                   "grad_ready step " + std::to_string(step));
  }
}

/// Grouped starts: the buckets of a range that are not pending start together (one NCCL
/// group on CUDA) and reduce / gather exactly like single starts; bad ranges are errors.
inline void grouped_starts_match_single_starts(Backend be, bool registered) {
  Communicator& comm = world(be);
  const int n = comm.size(), me = comm.rank();
  TestStream s(be);
  BucketStore st = test_store(comm, DType::bf16, ReduceOp::Sum, registered);
  const Layout& L = st.layout();
  const int nb = static_cast<int>(L.buckets().size());
  std::vector<std::vector<Bytes>> in;
  for (int r = 0; r < n; ++r) in.push_back(grad_images(L, DType::bf16, r, true));
  upload_all(be, in[static_cast<std::size_t>(me)], [&](int b) { return st.grad_buffer(b); });
  upload_all(be, param_images(L, me), [&](int b) { return st.param_buffer(b); });

  st.start_grad_reduce(1, s.get());            // already running: the range skips it
  st.start_grad_reduces(0, nb, s.get());
  st.start_param_gathers(nb - 1, nb, s.get());  // a range of one
  st.start_param_gathers(0, nb, s.get());
  st.start_grad_reduces(2, 2, s.get());         // an empty range
  for (int b = 0; b < nb; ++b) {
    EXPECT_TRUE(st.grad_reduce_pending(b));
    EXPECT_TRUE(st.param_gather_pending(b));
  }
  for (int b = 0; b < nb; ++b) {
    st.wait_param_gather(b, s.get());
    st.wait_grad_reduce(b, s.get());
  }
  s.sync();
  expect_reduced(L, DType::bf16, ReduceOp::Sum, true, me, in, download_grads(st, DType::bf16), "grouped starts");
  expect_gathered(L, download_params(st), "grouped all-gathers, rank " + std::to_string(me));

  for (auto range : std::vector<std::pair<int, int>>{{-1, 2}, {2, 1}, {0, nb + 1}}) {
    const auto e = error_of([&] { st.start_grad_reduces(range.first, range.second, s.get()); });
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code(), ErrorCode::OutOfRange) << e->what();
  }
}

/// A store over one rank (Communicator::self or a one-rank NCCL group): every bucket
/// collective, single, grouped or fired by grad_ready, leaves the buffers as they are.
inline void one_rank_store_is_identity(const Communicator& comm) {
  const Backend be = comm.backend();
  TestStream s(be);
  BucketStore st = test_store(comm, DType::bf16);
  const Layout& L = st.layout();
  const int nb = static_cast<int>(L.buckets().size());
  const auto grads = grad_images(L, DType::bf16, 0, false);
  const auto params = param_images(L, 0);
  upload_all(be, grads, [&](int b) { return st.grad_buffer(b); });
  upload_all(be, params, [&](int b) { return st.param_buffer(b); });
  for (int p = static_cast<int>(L.params().size()) - 1; p >= 0; --p) st.grad_ready(p, s.get());
  for (int b = 0; b < nb; ++b) EXPECT_TRUE(st.grad_reduce_pending(b));
  st.start_param_gathers(0, nb, s.get());
  for (int b = 0; b < nb; ++b) {
    st.wait_grad_reduce(b, s.get());
    st.wait_param_gather(b, s.get());
  }
  s.sync();
  EXPECT_EQ(download_grads(st, DType::bf16), grads);
  EXPECT_EQ(download_params(st), params);
}

// ------------------------------------------------------------------ capture

/// All bucket reduce-scatters and all-gathers captured in one graph, replayed several
/// times, give the bytes of the eager calls.
inline void captured_buckets_replay_like_eager(Backend be, bool registered, bool grouped) {
  Communicator& comm = world(be);
  const int me = comm.rank();
  TestStream s(be);
  BucketStore st = test_store(comm, DType::bf16, ReduceOp::Average, registered);
  const Layout& L = st.layout();
  const int nb = static_cast<int>(L.buckets().size());
  const PristineInputs pristine(be, grad_images(L, DType::bf16, me, false), param_images(L, me));
  expect_replays_like_eager(st, s, [&] {
    pristine.restore(st, s.get());
    if (grouped) {
      st.start_grad_reduces(0, nb, s.get());
      st.start_param_gathers(0, nb, s.get());
    } else {
      for (int b = 0; b < nb; ++b) st.start_grad_reduce(b, s.get());
      for (int b = 0; b < nb; ++b) st.start_param_gather(b, s.get());
    }
    for (int b = 0; b < nb; ++b) {
      st.wait_grad_reduce(b, s.get());
      st.wait_param_gather(b, s.get());
    }
  }, grouped ? "grouped starts" : "single starts");
}

// ------------------------------------------------------------------ errors

inline void expect_code(const std::optional<Error>& e, ErrorCode code, const std::string& part = "") {
  ASSERT_TRUE(e.has_value()) << "expected an error " << to_string(code);
  EXPECT_EQ(e->code(), code) << e->what();
  if (!part.empty()) {
    EXPECT_TRUE(contains(e->what(), part)) << e->what();
  }
}

/// Indices out of range, starts without waits and waits without starts, double
/// reports, reports on two streams, a store without params, a moved-from store.
inline void store_misuse_is_a_clear_error(Backend be) {
  Communicator& comm = world(be);
  const int n = comm.size();
  TestStream s(be), other(be);
  BucketStore st(comm, store_layout(n));
  const Layout& L = st.layout();
  const int nb = static_cast<int>(L.buckets().size());
  const int np = static_cast<int>(L.params().size());
  expect_code(error_of([&] { st.start_grad_reduce(nb, s.get()); }), ErrorCode::OutOfRange, "bucket " + std::to_string(nb));
  expect_code(error_of([&] { st.start_param_gather(-1, s.get()); }), ErrorCode::OutOfRange);
  expect_code(error_of([&] { st.wait_grad_reduce(nb, s.get()); }), ErrorCode::OutOfRange);
  expect_code(error_of([&] { (void)st.grad_reduce_pending(nb); }), ErrorCode::OutOfRange);
  expect_code(error_of([&] { (void)st.param_gather_pending(-1); }), ErrorCode::OutOfRange);
  expect_code(error_of([&] { st.grad_ready(np, s.get()); }), ErrorCode::OutOfRange, "parameter " + std::to_string(np));
  expect_code(error_of([&] { (void)st.param_data(-1); }), ErrorCode::OutOfRange);
  expect_code(error_of([&] { (void)st.grad_buffer(static_cast<int>(L.buffers().size())); }), ErrorCode::OutOfRange);

  expect_code(error_of([&] { st.wait_grad_reduce(0, s.get()); }), ErrorCode::InvalidState, "no reduce-scatter");
  expect_code(error_of([&] { st.wait_param_gather(0, s.get()); }), ErrorCode::InvalidState, "no all-gather");
  st.start_grad_reduce(0, s.get());
  expect_code(error_of([&] { st.start_grad_reduce(0, s.get()); }), ErrorCode::InvalidState, "not waited");
  // A parameter of a running bucket can no longer report.
  const int p0 = L.buckets()[0].params.front();
  expect_code(error_of([&] { st.grad_ready(p0, s.get()); }), ErrorCode::InvalidState, "already running");
  st.wait_grad_reduce(0, s.get());
  expect_code(error_of([&] { st.wait_grad_reduce(0, s.get()); }), ErrorCode::InvalidState);

  // A start outside a capture cannot be waited for inside it (the graph cannot depend
  // on work outside it); waiting after the capture is fine.
  st.start_grad_reduce(0, s.get());
  s.begin_capture();
  expect_code(error_of([&] { st.wait_grad_reduce(0, s.get()); }), ErrorCode::InvalidState,
              "started outside any capture but is waited for inside a capture");
  s.end_capture_discard();
  EXPECT_TRUE(st.grad_reduce_pending(0));
  st.wait_grad_reduce(0, s.get());

  // Double report, and reports of one bucket on two streams.
  int multi = -1;
  for (int b = 0; b < nb && multi < 0; ++b)
    if (L.buckets()[static_cast<std::size_t>(b)].params.size() >= 2) multi = b;
  ASSERT_GE(multi, 0) << "the test layout needs a bucket with two params";
  const auto& mp = L.buckets()[static_cast<std::size_t>(multi)].params;
  st.grad_ready(mp[0], s.get());
  expect_code(error_of([&] { st.grad_ready(mp[0], s.get()); }), ErrorCode::InvalidState, "reported twice");
  expect_code(error_of([&] { st.grad_ready(mp[1], other.get()); }), ErrorCode::InvalidArgument, "one stream");
  for (std::size_t i = 1; i < mp.size(); ++i) st.grad_ready(mp[i], s.get());  // completes the bucket: starts it
  EXPECT_TRUE(st.grad_reduce_pending(multi));
  st.wait_grad_reduce(multi, s.get());
  s.sync();

  // No parameter buffers.
  BucketStoreOptions no_params;
  no_params.with_params = false;
  BucketStore gs(comm, store_layout(n), no_params);
  EXPECT_EQ(gs.param_buffer(0), nullptr);
  EXPECT_EQ(gs.param_data(0), nullptr);
  EXPECT_EQ(gs.param_bytes(), 0u);
  EXPECT_NE(gs.grad_buffer(0), nullptr);
  expect_code(error_of([&] { gs.start_param_gather(0, s.get()); }), ErrorCode::InvalidState, "with_params");

  // Moved from.
  BucketStore moved = std::move(gs);
  expect_code(error_of([&] { (void)gs.grad_buffer(0); }), ErrorCode::InvalidState, "moved from");
  EXPECT_NE(moved.grad_buffer(0), nullptr);
}

/// Every rank fails the same way when ranks pass different layouts or options to the
/// store, within a bounded time; a store on a failed group refuses to start.
inline void store_disagreement_and_failed_group(Backend be) {
  Watchdog dog(120);
  Communicator& comm = world(be);
  const int n = comm.size(), me = comm.rank();
  if (n > 1) {  // one rank cannot disagree with itself
    auto specs = store_specs();
    if (me == n - 1) specs[3].shape = {999};
    LayoutOptions o;
    o.bucket_numel = 700;
    expect_mismatch([&] { BucketStore st(comm, Layout(specs, n, o)); }, {"parameter #3", "'w2' [999]", "'w2' [1000]"});
    BucketStoreOptions so;
    if (me == 0) so.grad_dtype = DType::bf16;
    expect_mismatch([&] { BucketStore st(comm, store_layout(n), so); }, {"BucketStoreOptions", "grad_dtype=bf16", "grad_dtype=f32"});
  }
  {
    BucketStoreOptions o;
    o.grad_dtype = DType::e4m3;
    expect_code(error_of([&] { BucketStore st(comm, store_layout(n), o); }), ErrorCode::InvalidArgument, "grad_dtype e4m3");
  }
  {
    // A reduction that is not a gradient reduction (Max), on every rank, then on the
    // last rank only: every rank throws InvalidArgument (the others name another rank).
    BucketStoreOptions o;
    o.grad_reduce = ReduceOp::Max;
    expect_code(error_of([&] { BucketStore st(comm, store_layout(n), o); }), ErrorCode::InvalidArgument, "grad_reduce Max");
    BucketStoreOptions one;
    if (me == n - 1) one.grad_reduce = ReduceOp::Max;
    expect_code(error_of([&] { BucketStore st(comm, store_layout(n), one); }), ErrorCode::InvalidArgument,
                me == n - 1 ? "grad_reduce Max" : "invalid on another rank");
  }
  EXPECT_FALSE(comm.failed());
  {
    Communicator fresh = make_world(be);
    TestStream s(be);
    BucketStore st(fresh, store_layout(n));
    (void)error_of([&] { shardopt::detail::provoke_backend_error_for_test(fresh); });
    EXPECT_TRUE(fresh.failed());
    expect_code(error_of([&] { st.start_grad_reduce(0, s.get()); }), ErrorCode::InvalidState, "failed earlier");
    EXPECT_FALSE(st.grad_reduce_pending(0));
  }
}

}  // namespace shardopt::test

/// Instantiates every bucket-store case for `backend` (registered: NCCL registration).
#define SHARDOPT_BUCKET_STORE_CASES(Suite, backend, registered)                                                   \
  TEST(Suite, BuffersFollowTheLayout) { ::shardopt::test::store_buffers_follow_the_layout(backend, registered); }  \
  TEST(Suite, BucketedReduceScatterMatchesReference) {                                                            \
    ::shardopt::test::bucketed_reduce_scatter_matches_reference(backend, registered);                             \
  }                                                                                                               \
  TEST(Suite, BucketedAllGatherIsExact) { ::shardopt::test::bucketed_all_gather_is_exact(backend, registered); }  \
  TEST(Suite, GradReadyFiresEachBucketOncePerStep) {                                                              \
    ::shardopt::test::grad_ready_fires_each_bucket_once_per_step(backend);                                        \
  }                                                                                                               \
  TEST(Suite, GroupedStartsMatchSingleStarts) {                                                                   \
    ::shardopt::test::grouped_starts_match_single_starts(backend, registered);                                    \
  }                                                                                                               \
  TEST(Suite, CapturedBucketsReplayLikeEager) {                                                                   \
    ::shardopt::test::captured_buckets_replay_like_eager(backend, registered, false);                             \
  }                                                                                                               \
  TEST(Suite, CapturedGroupedBucketsReplayLikeEager) {                                                            \
    ::shardopt::test::captured_buckets_replay_like_eager(backend, registered, true);                              \
  }                                                                                                               \
  TEST(Suite, MisuseIsAClearError) { ::shardopt::test::store_misuse_is_a_clear_error(backend); }                  \
  TEST(Suite, DisagreementAndFailedGroup) { ::shardopt::test::store_disagreement_and_failed_group(backend); }
