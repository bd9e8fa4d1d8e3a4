// comm_cases.hpp - the Communicator's tests, written once for both backends.
// test/mpi/test_comm.cpp instantiates them on the host backend (MPI), the GPU suite on
// CUDA + NCCL. Every rank regenerates every rank's input from seeds, so the oracle (a
// plain double-precision reduction written here) needs no communication.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "mpi/comm_test_support.hpp"
#include "shardopt/layout.hpp"
#include "shardopt/param_spec.hpp"

namespace shardopt::test {

inline const char* name_of(ReduceOp op) {
  return op == ReduceOp::Sum ? "Sum" : op == ReduceOp::Average ? "Average" : "Max";
}

/// Expected result of reducing the doubles `x` with `op`.
inline double reduce_exact(const std::vector<double>& x, ReduceOp op) {
  if (op == ReduceOp::Max) return *std::max_element(x.begin(), x.end());
  double s = 0;
  for (double v : x) s += v;
  return op == ReduceOp::Average ? s / static_cast<double>(x.size()) : s;
}

/// The one result two ranks allow: a single combine, the fp32 sum rounded to nearest even
/// in the storage type (then halved for Average, exact barring subnormals; NCCL's
/// pre-multiplication by 1/2 gives the same).
inline double two_rank_result(DType t, ReduceOp op, double a, double b) {
  Bytes tmp(4);
  set_element(t, tmp, 0, static_cast<float>(a) + static_cast<float>(b));
  double s = element(t, tmp, 0);
  if (op == ReduceOp::Average) {
    set_element(t, tmp, 0, static_cast<float>(s) / 2.0f);
    s = element(t, tmp, 0);
  }
  return s;
}

/// Compares a reduced value with the oracle: bitwise-exact for Max, for exact data, and
/// for two ranks (one combine: its rounding is fixed); within reduction_tolerance
/// otherwise (more ranks: the order of the combines is the backend's).
/// Returns "" or a description of the mismatch.
inline std::string check_reduced(DType t, ReduceOp op, bool exact, const std::vector<double>& x, double got) {
  if (x.size() == 2 && !exact && op != ReduceOp::Max) {
    const double want = two_rank_result(t, op, x[0], x[1]);
    if (got == want) return "";
    return "got " + std::to_string(got) + ", want exactly " + std::to_string(want) + " (one rounded combine)";
  }
  const double want = reduce_exact(x, op);
  double abs_sum = 0;
  for (double v : x) abs_sum += std::fabs(v);
  if (op == ReduceOp::Average) abs_sum /= static_cast<double>(x.size());
  const double tol = (exact || op == ReduceOp::Max) ? 0.0 : reduction_tolerance(t, static_cast<int>(x.size()), abs_sum);
  if (std::fabs(got - want) <= tol) return "";
  return "got " + std::to_string(got) + ", want " + std::to_string(want) + " (tolerance " + std::to_string(tol) + ")";
}

// ------------------------------------------------------------------ reduce-scatter

/// In-place reduce-scatter equals the oracle for f32/bf16/f16, Sum/Average/Max and odd
/// sizes; the other slices keep their input.
inline void reduce_scatter_matches_reference(Backend be, bool exact) {
  Communicator& comm = world(be);
  const int n = comm.size(), me = comm.rank();
  TestStream s(be);
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average, ReduceOp::Max})
      for (std::int64_t count : {1, 3, 1000, 4097}) {
        if (exact && op == ReduceOp::Average && !is_power_of_two(n)) continue;
        const std::size_t total = static_cast<std::size_t>(n * count), es = size_of(t);
        std::vector<Bytes> in;
        for (int r = 0; r < n; ++r) {
          const auto seed = seed_of(static_cast<std::uint64_t>(t), static_cast<std::uint64_t>(op),
                                    static_cast<std::uint64_t>(count), static_cast<std::uint64_t>(r));
          in.push_back(exact ? exact_floats(t, total, seed) : random_floats(t, total, seed));
        }
        DeviceBuffer buf = to_device(be, in[static_cast<std::size_t>(me)]);
        comm.reduce_scatter(buf.data(), count, t, op, s.get());
        s.sync();
        const Bytes out = download(be, buf.data(), total * es);
        int bad = 0;
        std::string first;
        for (std::int64_t i = 0; i < count; ++i) {
          const auto pos = static_cast<std::size_t>(me * count + i);
          std::vector<double> x;
          for (int r = 0; r < n; ++r) x.push_back(element(t, in[static_cast<std::size_t>(r)], pos));
          const std::string why = check_reduced(t, op, exact, x, element(t, out, pos));
          if (!why.empty() && bad++ == 0) first = "element " + std::to_string(i) + ": " + why;
        }
        EXPECT_EQ(bad, 0) << to_string(t) << " " << name_of(op) << " count " << count << " rank " << me << ": "
                          << first;
        for (int r = 0; r < n; ++r) {
          if (r == me) continue;
          const std::size_t off = static_cast<std::size_t>(r * count) * es;
          EXPECT_EQ(0, std::memcmp(out.data() + off, in[static_cast<std::size_t>(me)].data() + off,
                                   static_cast<std::size_t>(count) * es))
              << "slice " << r << " of rank " << me << " changed (" << to_string(t) << " " << name_of(op) << ")";
        }
      }
}

// ------------------------------------------------------------------ all-gather

/// In-place all-gather moves every dtype's bytes exactly (fp8 and e8m0 included).
inline void all_gather_is_exact(Backend be) {
  Communicator& comm = world(be);
  const int n = comm.size(), me = comm.rank();
  TestStream s(be);
  auto pattern = [](int r, std::size_t j) { return static_cast<std::uint8_t>(r * 131 + j * 7 + 1); };
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::e4m3, DType::e5m2, DType::e8m0, DType::u32})
    for (std::int64_t count : {1, 5, 4097}) {
      const std::size_t slice = static_cast<std::size_t>(count) * size_of(t);
      Bytes host(slice * static_cast<std::size_t>(n), 0xEE);
      for (std::size_t j = 0; j < slice; ++j) host[static_cast<std::size_t>(me) * slice + j] = pattern(me, j);
      DeviceBuffer buf = to_device(be, host);
      comm.all_gather(buf.data(), count, t, s.get());
      s.sync();
      const Bytes out = download(be, buf.data(), host.size());
      int bad = 0;
      for (int r = 0; r < n; ++r)
        for (std::size_t j = 0; j < slice; ++j) bad += out[static_cast<std::size_t>(r) * slice + j] != pattern(r, j);
      EXPECT_EQ(bad, 0) << to_string(t) << " count " << count << " rank " << me;
    }
}

// ------------------------------------------------------------------ all-reduce

/// All-reduce of small buffers: floats (Sum/Average/Max) within the order tolerance,
/// u32 Sum exact, u32 Max of ordered bit patterns (NaN above Inf) exact.
inline void all_reduce_matches_reference(Backend be) {
  Communicator& comm = world(be);
  const int n = comm.size(), me = comm.rank();
  TestStream s(be);
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Average, ReduceOp::Max})
      for (std::int64_t count : {1, 2, 33}) {
        std::vector<Bytes> in;
        for (int r = 0; r < n; ++r)
          in.push_back(random_floats(t, static_cast<std::size_t>(count),
                                     seed_of(7, static_cast<std::uint64_t>(t), static_cast<std::uint64_t>(op) * 100 + count,
                                             static_cast<std::uint64_t>(r))));
        DeviceBuffer buf = to_device(be, in[static_cast<std::size_t>(me)]);
        comm.all_reduce(buf.data(), count, t, op, s.get());
        s.sync();
        const Bytes out = download(be, buf.data(), static_cast<std::size_t>(count) * size_of(t));
        for (std::int64_t i = 0; i < count; ++i) {
          std::vector<double> x;
          for (int r = 0; r < n; ++r) x.push_back(element(t, in[static_cast<std::size_t>(r)], static_cast<std::size_t>(i)));
          const std::string why = check_reduced(t, op, false, x, element(t, out, static_cast<std::size_t>(i)));
          EXPECT_TRUE(why.empty()) << to_string(t) << " " << name_of(op) << " element " << i << ": " << why;
        }
      }
  // u32: sums of values below 2^24 are exact; Max over ordered bit patterns of
  // non-negative floats: NaN (0x7FC00000) > Inf (0x7F800000) > 1.0 (0x3F800000).
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
    std::vector<std::vector<std::uint32_t>> in(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      std::mt19937 gen(static_cast<unsigned>(seed_of(9, static_cast<std::uint64_t>(op), static_cast<std::uint64_t>(r))));
      for (int i = 0; i < 17; ++i) in[static_cast<std::size_t>(r)].push_back(gen() & 0xFFFFFF);
      in[static_cast<std::size_t>(r)][0] = r == 0 ? 0x7FC00000u : r == 1 ? 0x7F800000u : 0x3F800000u;
    }
    Bytes host(17 * 4);
    std::memcpy(host.data(), in[static_cast<std::size_t>(me)].data(), host.size());
    DeviceBuffer buf = to_device(be, host);
    comm.all_reduce(buf.data(), 17, DType::u32, op, s.get());
    s.sync();
    const Bytes out = download(be, buf.data(), host.size());
    std::vector<std::uint32_t> got(17);
    std::memcpy(got.data(), out.data(), out.size());
    for (int i = 0; i < 17; ++i) {
      std::uint64_t want = 0;
      for (int r = 0; r < n; ++r) {
        const std::uint32_t v = in[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
        want = op == ReduceOp::Sum ? want + v : std::max<std::uint64_t>(want, v);
      }
      EXPECT_EQ(got[static_cast<std::size_t>(i)], static_cast<std::uint32_t>(want)) << "u32 " << name_of(op) << " element " << i;
    }
  }
}

// ------------------------------------------------------------------ groups

/// split: colors group ranks, keys order them; the sub-group's collectives stay inside it.
inline void split_forms_ordered_groups(Backend be) {
  Communicator& comm = world(be);
  const int n = comm.size(), me = comm.rank();
  Communicator sub = comm.split(me % 2, n - me);  // reverse order inside each color
  std::vector<std::uint64_t> members;
  for (int r = n - 1; r >= 0; --r)
    if (r % 2 == me % 2) members.push_back(static_cast<std::uint64_t>(r));
  EXPECT_EQ(sub.size(), static_cast<int>(members.size()));
  EXPECT_EQ(sub.rank(), static_cast<int>(std::find(members.begin(), members.end(), static_cast<std::uint64_t>(me)) -
                                         members.begin()));
  EXPECT_EQ(sub.backend(), be);
  EXPECT_EQ(sub.all_gather_value(static_cast<std::uint64_t>(me)), members);
  TestStream s(be);
  Bytes host(4);
  const std::uint32_t bit = 1u << me;
  std::memcpy(host.data(), &bit, 4);
  DeviceBuffer buf = to_device(be, host);
  sub.all_reduce(buf.data(), 1, DType::u32, ReduceOp::Sum, s.get());
  s.sync();
  std::uint32_t got = 0, want = 0;
  std::memcpy(&got, download(be, buf.data(), 4).data(), 4);
  for (auto r : members) want |= 1u << r;
  EXPECT_EQ(got, want);
  sub.barrier();
}

/// barrier and all_gather_value.
inline void barrier_and_values(Backend be) {
  Communicator& comm = world(be);
  comm.barrier();
  const auto v = comm.all_gather_value(static_cast<std::uint64_t>(comm.rank()) * 10 + 7);
  ASSERT_EQ(v.size(), static_cast<std::size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) EXPECT_EQ(v[static_cast<std::size_t>(r)], static_cast<std::uint64_t>(r) * 10 + 7);
  comm.barrier();
}

/// Communicator::self: one rank; every collective leaves the data as it is.
inline void self_is_identity(Backend be) {
  Communicator self = Communicator::self(be);
  EXPECT_EQ(self.size(), 1);
  EXPECT_EQ(self.rank(), 0);
  EXPECT_EQ(self.backend(), be);
  TestStream s(be);
  const Bytes in = random_floats(DType::bf16, 101, 5);
  DeviceBuffer buf = to_device(be, in);
  self.reduce_scatter(buf.data(), 101, DType::bf16, ReduceOp::Average, s.get());
  self.all_gather(buf.data(), 101, DType::bf16, s.get());
  self.all_reduce(buf.data(), 101, DType::bf16, ReduceOp::Sum, s.get());
  s.sync();
  EXPECT_EQ(download(be, buf.data(), in.size()), in);
  self.barrier();
  EXPECT_EQ(self.all_gather_value(42), std::vector<std::uint64_t>{42});
  EXPECT_EQ(self.split(3, 0).size(), 1);
  EXPECT_NO_THROW(check_layout(self, Layout({ParamSpec::tensor("w", {4, 4})}, 1)));
}

// ------------------------------------------------------------------ errors

/// A call that fails in the backend marks the group failed on every handle; later calls
/// throw InvalidState quoting the first failure.
inline void backend_failure_poisons_the_group(Backend be) {
  Communicator comm = make_world(be);
  const Communicator copy = comm;
  TestStream s(be);
  DeviceBuffer buf = to_device(be, Bytes(64, 0));
  const auto first = error_of([&] { shardopt::detail::provoke_backend_error_for_test(comm); });
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->code(), be == Backend::Host ? ErrorCode::Mpi : ErrorCode::Nccl) << first->what();
  EXPECT_TRUE(comm.failed());
  EXPECT_TRUE(copy.failed());
  const std::string original = first->what();
  for (auto call : std::vector<std::function<void()>>{
           [&] { copy.all_reduce(buf.data(), 1, DType::f32, ReduceOp::Sum, s.get()); },
           [&] { copy.reduce_scatter(buf.data(), 1, DType::f32, ReduceOp::Sum, s.get()); },
           [&] { copy.all_gather(buf.data(), 1, DType::f32, s.get()); },
           [&] { copy.barrier(); },
           [&] { (void)copy.split(0, 0); },
           [&] { (void)copy.all_gather_value(1); },
       }) {
    const auto e = error_of(call);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code(), ErrorCode::InvalidState);
    EXPECT_TRUE(contains(e->what(), "failed earlier")) << e->what();
    EXPECT_TRUE(contains(e->what(), original)) << e->what();
  }
}

/// Invalid arguments are InvalidArgument naming the problem, and (as any failed call)
/// leave the group failed. An empty handle is InvalidState.
inline void invalid_arguments_are_clear_errors(Backend be) {
  (void)world(be);  // selects this rank's device before the stream and buffer are made
  TestStream s(be);
  DeviceBuffer buf = to_device(be, Bytes(256, 0));
  struct Case {
    const char* expect;
    std::function<void(Communicator&)> call;
  };
  const std::vector<Case> cases = {
      {"cannot be reduced", [&](Communicator& c) { c.reduce_scatter(buf.data(), 4, DType::e4m3, ReduceOp::Sum, s.get()); }},
      {"not defined for u32", [&](Communicator& c) { c.all_reduce(buf.data(), 4, DType::u32, ReduceOp::Average, s.get()); }},
      {"negative", [&](Communicator& c) { c.all_gather(buf.data(), -1, DType::f32, s.get()); }},
      {"data is null", [&](Communicator& c) { c.all_reduce(nullptr, 4, DType::f32, ReduceOp::Sum, s.get()); }},
      {"colors must be >= 0", [&](Communicator& c) { (void)c.split(-1, 0); }},
  };
  for (const auto& k : cases) {
    Communicator c = make_world(be);
    const auto e = error_of([&] { k.call(c); });
    ASSERT_TRUE(e.has_value()) << k.expect;
    EXPECT_EQ(e->code(), ErrorCode::InvalidArgument) << e->what();
    EXPECT_TRUE(contains(e->what(), k.expect)) << e->what();
    EXPECT_TRUE(c.failed());
  }
  Communicator empty;
  EXPECT_FALSE(empty.valid());
  EXPECT_FALSE(empty.failed());
  const auto e = error_of([&] { (void)empty.rank(); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::InvalidState);
  const auto e2 = error_of([&] { empty.all_reduce(buf.data(), 1, DType::f32, ReduceOp::Sum, s.get()); });
  ASSERT_TRUE(e2.has_value());
  EXPECT_EQ(e2->code(), ErrorCode::InvalidState);
}

// ------------------------------------------------------------------ layout agreement

inline std::vector<ParamSpec> check_specs() {
  return {ParamSpec::tensor("embed.weight", {64, 16}), ParamSpec::tensor("norm.weight", {16}, DType::bf16, "no_decay"),
          ParamSpec::tensor("mlp.up.weight", {32, 16}), ParamSpec::tensor("mlp.down.weight", {16, 32}),
          ParamSpec::tensor("head.weight", {64, 16}, DType::f32)};
}

/// Expects every rank to throw LayoutMismatch from `f`, with all of `parts` in the message.
template <class F>
void expect_mismatch(F&& f, const std::vector<std::string>& parts) {
  const auto e = error_of(f);
  ASSERT_TRUE(e.has_value()) << "no error on this rank";
  EXPECT_EQ(e->code(), ErrorCode::LayoutMismatch) << e->what();
  for (const auto& p : parts) EXPECT_TRUE(contains(e->what(), p)) << "missing '" << p << "' in: " << e->what();
}

/// Ranks that disagree fail together, within a bounded time, naming the first
/// differing parameter, its index and the ranks; the group stays usable.
inline void layout_mismatch_is_reported_on_every_rank(Backend be) {
  Watchdog dog(120);
  Communicator& comm = world(be);
  const int n = comm.size(), me = comm.rank(), last = n - 1;

  // Agreement.
  EXPECT_NO_THROW(check_layout(comm, Layout(check_specs(), n)));

  // A different shape of parameter #2 on the last rank.
  {
    auto specs = check_specs();
    if (me == last) specs[2].shape = {33, 16};
    expect_mismatch([&] { check_layout(comm, Layout(specs, n)); },
                    {"parameter #2", "'mlp.up.weight' [32, 16]", "'mlp.up.weight' [33, 16]",
                     "rank " + std::to_string(last) + " differs from rank 0"});
  }
  // One more parameter on the last rank: the first difference is index 5.
  {
    auto specs = check_specs();
    if (me == last) specs.push_back(ParamSpec::tensor("extra.bias", {7}));
    expect_mismatch([&] { check_layout(comm, Layout(specs, n)); },
                    {"parameter #5", "'extra.bias'", "no parameter #5", std::to_string(last)});
  }
  // Another name of parameter #0 on rank 0 only: every other rank differs from rank 0.
  {
    auto specs = check_specs();
    if (me == 0) specs[0].name = "tok_embed.weight";
    expect_mismatch([&] { check_layout(comm, Layout(specs, n)); }, {"parameter #0", "'tok_embed.weight'", "differ"});
  }
  // Same parameters, other options.
  {
    LayoutOptions o;
    if (me == last) o.bucket_numel = 512;
    expect_mismatch([&] { check_layout(comm, Layout(check_specs(), n, o)); },
                    {"same 5 parameters", "bucket threshold 512"});
  }
  // A layout for another world size, the same on every rank: a plain argument error.
  {
    const auto e = error_of([&] { check_layout(comm, Layout(check_specs(), n + 1)); });
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code(), ErrorCode::InvalidArgument) << e->what();
    EXPECT_TRUE(contains(e->what(), "world size of " + std::to_string(n + 1))) << e->what();
  }
  // The group is still usable.
  EXPECT_FALSE(comm.failed());
  EXPECT_EQ(comm.all_gather_value(1).size(), static_cast<std::size_t>(n));
}

}  // namespace shardopt::test

/// Instantiates every communicator case for `backend` in test suite `Suite`.
#define SHARDOPT_COMM_CASES(Suite, backend)                                                                   \
  TEST(Suite, ReduceScatterRandomDataWithinOrderTolerance) {                                                  \
    ::shardopt::test::reduce_scatter_matches_reference(backend, false);                                       \
  }                                                                                                           \
  TEST(Suite, ReduceScatterExactDataBitwise) { ::shardopt::test::reduce_scatter_matches_reference(backend, true); } \
  TEST(Suite, AllGatherEveryDtypeBitwise) { ::shardopt::test::all_gather_is_exact(backend); }                 \
  TEST(Suite, AllReduceFloatsAndU32) { ::shardopt::test::all_reduce_matches_reference(backend); }             \
  TEST(Suite, SplitFormsOrderedGroups) { ::shardopt::test::split_forms_ordered_groups(backend); }             \
  TEST(Suite, BarrierAndValues) { ::shardopt::test::barrier_and_values(backend); }                            \
  TEST(Suite, SelfIsIdentity) { ::shardopt::test::self_is_identity(backend); }                                \
  TEST(Suite, BackendFailurePoisonsTheGroup) { ::shardopt::test::backend_failure_poisons_the_group(backend); } \
  TEST(Suite, InvalidArgumentsAreClearErrors) { ::shardopt::test::invalid_arguments_are_clear_errors(backend); } \
  TEST(Suite, LayoutMismatchOnEveryRank) { ::shardopt::test::layout_mismatch_is_reported_on_every_rank(backend); }
