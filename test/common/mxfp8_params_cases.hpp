// mxfp8_params_cases.hpp - quantized parameters inside DistributedAdam, MXFP8 (issue 7)
// and NVFP4 (issue 19; every case taking a ParamFormat), written once and run on the
// host backend under mpiexec (test/mpi/test_mxfp8_params.cpp,
// test/mpi/test_nvfp4_params.cpp) and on GPUs under mpirun (test/gpu/test_mxfp8_params_gpu.cpp,
// test/gpu/test_nvfp4_params_gpu.cpp).
//
// The expected bytes always come from the independent oracles of
// test/unit/test_mxfp8_reference.hpp and test/unit/test_nvfp4_reference.hpp applied to
// bf16 of the full fp32 master, which the
// test assembles from every rank's shard_master piece (MPI_Allgatherv). The path cases
// (train -> eval -> train, forced gather, found-inf, deferred gathers) compare a variant
// against plain train-only runs, bitwise; their trainers accumulate gradients (+=) and,
// in the variants that do not call zero_grad, rely on the library's zeroing of the
// gradient regions alone, so that staging bytes left in a region change the result.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/dist_adam_cases.hpp"
#include "core/float_env.hpp"
#include "optimizer/grad_zeroing.hpp"
#include "quantized/phase_probe.hpp"
#include "quantized/quantized_params.hpp"
#include "shardopt/bucket_store.hpp"
#include "shardopt/mxfp8.hpp"
#include "unit/test_mxfp8_reference.hpp"
#include "unit/test_nvfp4_reference.hpp"

namespace shardopt::test {

// ------------------------------------------------------------------ helpers

/// The shardopt::Error `f` throws, or nothing.
template <class F>
std::optional<Error> mx_error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

inline void expect_error(const std::optional<Error>& e, ErrorCode code, const std::string& part) {
  ASSERT_TRUE(e.has_value()) << "expected Error(" << static_cast<int>(code) << ") mentioning '" << part << "'";
  EXPECT_EQ(e->code(), code) << e->what();
  EXPECT_NE(std::string(e->what()).find(part), std::string::npos) << e->what();
}

/// MXFP8 weights with odd shapes (rows and cols not multiples of 32, so every rank
/// boundary cuts blocks), a grouped parameter, two buckets of two params, and (unless
/// `native` is false) two 1-D parameters, which stay native (f32). "tiny" is in the
/// no_decay group, so both groups are used either way.
inline std::vector<ParamSpec> mx_model(bool native = true) {
  std::vector<ParamSpec> s = {
      ParamSpec::tensor("embed", {37, 40}),
      ParamSpec::tensor("norm1", {40}, DType::bf16, "no_decay"),
      ParamSpec::tensor("w1", {45, 40}),
      ParamSpec::grouped("experts", 3, {35, 24}),
      ParamSpec::tensor("small", {5, 7}),
      ParamSpec::tensor("bias1", {45}, DType::bf16, "no_decay"),
      ParamSpec::tensor("w2", {40, 45}),
      ParamSpec::tensor("tiny", {2, 33}, DType::bf16, "no_decay"),
      ParamSpec::tensor("head", {37, 40}),
  };
  if (!native) s.erase(std::remove_if(s.begin(), s.end(), [](const ParamSpec& p) { return p.shape.size() < 2; }), s.end());
  return s;
}

/// The model of the cases in `format`: mx_model, plus for NVFP4 a grouped parameter whose
/// members have an odd number of elements (45), so that rank boundaries fall at odd
/// offsets inside members (two ranks share a data byte; count_odd_boundaries).
inline std::vector<ParamSpec> q_model(ParamFormat format, bool native = true) {
  std::vector<ParamSpec> s = mx_model(native);
  if (format == ParamFormat::Nvfp4) s.insert(s.begin() + 3, ParamSpec::grouped("odd_experts", 21, {5, 9}));
  return s;
}

/// Options of the quantized cases: buckets of about 2000 elements, clipping, a schedule.
inline DistributedAdamOptions mx_options(DType grad_dtype = DType::bf16, ParamFormat format = ParamFormat::Mxfp8) {
  DistributedAdamOptions o = base_options(grad_dtype);
  o.param_format = format;
  o.bucket_numel = 2000;
  return o;
}

/// Initial master value of (id, element j of a row of `cols`): a hash-driven value of
/// magnitude 2^-4..2^3 that changes scale from row to row (many scale bytes occur).
inline float mx_init_value(int id, std::int64_t j, std::int64_t cols) {
  const std::uint64_t h = mix64((static_cast<std::uint64_t>(id) << 40) ^ static_cast<std::uint64_t>(j) ^ 0x5bd1e995ull);
  const int shift = static_cast<int>((static_cast<std::uint64_t>(j / cols) * 2654435761ull >> 7) % 8) - 4;
  const float m = static_cast<float>(static_cast<int>(h % 2001u) - 1000) / 1000.0f;
  return std::ldexp(m, shift);
}

/// Writes value(i, e) (e: element of the flattened parameter) into every rank's
/// shard_master piece of every parameter.
template <class F>
void write_master(DistributedAdam& opt, F value) {
  for (int i = 0; i < opt.num_params(); ++i) {
    const ShardView m = opt.shard_master(i);
    std::vector<float> v(static_cast<std::size_t>(m.numel()));
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = value(i, m.param_offset + static_cast<std::int64_t>(k));
    from_host(opt.backend(), m.data, v);
  }
}

/// The default initial master of the MXFP8 cases, then init_from_master.
inline void mx_init(DistributedAdam& opt, Stream s) {
  write_master(opt, [&opt](int i, std::int64_t e) {
    return mx_init_value(i, e, opt.layout().specs()[static_cast<std::size_t>(i)].shape.back());
  });
  opt.init_from_master(s);
}

/// Parameter i's whole fp32 master, assembled from every rank's piece (collective over
/// MPI_COMM_WORLD unless the optimizer runs on one rank).
inline std::vector<float> full_master(const DistributedAdam& opt, int i) {
  const ShardView m = opt.shard_master(i);
  const std::vector<float> mine = read_f32(opt.backend(), m);
  if (opt.comm().size() == 1) return mine;
  const int world = world_size();
  const long long meta[2] = {static_cast<long long>(m.param_offset), static_cast<long long>(mine.size())};
  std::vector<long long> all(2 * static_cast<std::size_t>(world));
  MPI_Allgather(meta, 2, MPI_LONG_LONG, all.data(), 2, MPI_LONG_LONG, MPI_COMM_WORLD);
  std::vector<int> counts(static_cast<std::size_t>(world)), displs(static_cast<std::size_t>(world));
  int total = 0;
  for (int r = 0; r < world; ++r) {
    counts[static_cast<std::size_t>(r)] = static_cast<int>(all[2 * static_cast<std::size_t>(r) + 1]);
    displs[static_cast<std::size_t>(r)] = total;
    total += counts[static_cast<std::size_t>(r)];
  }
  std::vector<float> pieces(static_cast<std::size_t>(total));
  MPI_Allgatherv(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, pieces.data(), counts.data(), displs.data(),
                 MPI_FLOAT, MPI_COMM_WORLD);
  const std::int64_t n = numel(opt.layout().specs()[static_cast<std::size_t>(i)].shape);
  std::vector<float> full(static_cast<std::size_t>(n), 0.0f);
  std::vector<char> seen(static_cast<std::size_t>(n), 0);
  for (int r = 0; r < world; ++r)
    for (int k = 0; k < counts[static_cast<std::size_t>(r)]; ++k) {
      const auto e = static_cast<std::size_t>(all[2 * static_cast<std::size_t>(r)] + k);
      full[e] = pieces[static_cast<std::size_t>(displs[static_cast<std::size_t>(r)] + k)];
      seen[e] = 1;
    }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](char c) { return c != 0; }))
      << "the ranks' master pieces do not cover parameter " << i;
  return full;
}

/// The oracle: quantize(bf16(full master)) of MXFP8 parameter i (collective).
inline mxfp8_ref::Quantized expected_mx(const DistributedAdam& opt, int i) {
  const std::vector<float> master = full_master(opt, i);
  std::vector<std::uint16_t> x(master.size());
  for (std::size_t k = 0; k < x.size(); ++k) x[k] = mxfp8_ref::to_bf16(master[k]);
  const Mxfp8Shape s = Mxfp8Shape::of(opt.layout().specs()[static_cast<std::size_t>(i)]);
  return mxfp8_ref::quantize(s.members, s.rows, s.cols, x);
}

/// The four planes of MXFP8 parameter i's storage.
inline mxfp8_ref::Quantized read_mx(const DistributedAdam& opt, int i) {
  const Mxfp8View v = opt.mxfp8_param(i);
  const Backend b = opt.backend();
  mxfp8_ref::Quantized q;
  q.data_row = to_host<std::uint8_t>(b, v.planes.data_row, static_cast<std::size_t>(v.shape.numel()));
  q.data_col = to_host<std::uint8_t>(b, v.planes.data_col, static_cast<std::size_t>(v.shape.numel()));
  q.scale_row = to_host<std::uint8_t>(b, v.planes.scale_row, static_cast<std::size_t>(v.shape.scale_row_numel()));
  q.scale_col = to_host<std::uint8_t>(b, v.planes.scale_col, static_cast<std::size_t>(v.shape.scale_col_numel()));
  return q;
}

inline std::string differing_planes(const mxfp8_ref::Quantized& got, const mxfp8_ref::Quantized& want) {
  std::string s;
  if (got.data_row != want.data_row) s += "data_row ";
  if (got.data_col != want.data_col) s += "data_col ";
  if (got.scale_row != want.scale_row) s += "scale_row ";
  if (got.scale_col != want.scale_col) s += "scale_col ";
  return s;
}

/// True when parameter i is quantized (MXFP8 or NVFP4).
inline bool is_quantized(const DistributedAdam& opt, int i) { return opt.is_mxfp8(i) || opt.is_nvfp4(i); }

/// A quantized parameter's storage as named byte planes, whatever its format.
struct QPlanes {
  std::vector<std::pair<std::string, std::vector<std::uint8_t>>> planes;
  bool operator==(const QPlanes&) const = default;
};

inline QPlanes planes_of(const mxfp8_ref::Quantized& q) {
  return QPlanes{{{"data_row", q.data_row}, {"data_col", q.data_col}, {"scale_row", q.scale_row},
                  {"scale_col", q.scale_col}}};
}

inline std::vector<std::uint8_t> bytes_of(std::uint32_t bits) {
  std::vector<std::uint8_t> v(4);
  std::memcpy(v.data(), &bits, 4);
  return v;
}

/// Appends NVFP4 member `q`'s planes, named with index `g`.
inline void add_nvfp4_planes(QPlanes& out, const nvfp4_ref::Quantized& q, std::int64_t g) {
  // Appended rather than "[" + to_string(g): g++ 12 warns falsely (-Wrestrict) on that form.
  std::string k = "[";
  k += std::to_string(g);
  k += "]";
  out.planes.push_back({"data" + k, q.data});
  out.planes.push_back({"scale" + k, q.scale});
  out.planes.push_back({"amax" + k, bytes_of(q.amax)});
  out.planes.push_back({"decode_scale" + k, bytes_of(q.decode_scale)});
}

/// Member g of NVFP4 parameter i's storage, as the oracle's type.
inline nvfp4_ref::Quantized read_nvfp4_member(const DistributedAdam& opt, int i, std::int64_t g) {
  const Nvfp4View v = opt.nvfp4_param(i);
  const Nvfp4Planes m = v.member(g);
  const Backend b = opt.backend();
  nvfp4_ref::Quantized q;
  q.data = to_host<std::uint8_t>(b, m.data, static_cast<std::size_t>(v.shape.data_bytes()));
  q.scale = to_host<std::uint8_t>(b, m.scale, static_cast<std::size_t>(v.shape.scale_numel()));
  q.amax = nvfp4_ref::bits(to_host<float>(b, m.amax, 1)[0]);
  q.decode_scale = nvfp4_ref::bits(to_host<float>(b, m.decode_scale, 1)[0]);
  return q;
}

/// Quantized parameter i's storage (collective-free).
inline QPlanes read_q(const DistributedAdam& opt, int i) {
  if (opt.is_mxfp8(i)) return planes_of(read_mx(opt, i));
  QPlanes out;
  for (std::int64_t g = 0; g < opt.nvfp4_param(i).members; ++g) add_nvfp4_planes(out, read_nvfp4_member(opt, i, g), g);
  return out;
}

/// The oracle of quantized parameter i: quantize(bf16(full master)), member by member
/// for NVFP4 (collective).
inline QPlanes expected_q(const DistributedAdam& opt, int i) {
  if (opt.is_mxfp8(i)) return planes_of(expected_mx(opt, i));
  const std::vector<float> master = full_master(opt, i);
  const Nvfp4View v = opt.nvfp4_param(i);
  const std::int64_t mn = v.shape.numel();
  const detail::IeeeSubnormals ieee;  // the oracle's float code, whatever CUDA's start-up left in the CPU
  QPlanes out;
  for (std::int64_t g = 0; g < v.members; ++g) {
    std::vector<std::uint16_t> x(static_cast<std::size_t>(mn));
    for (std::int64_t k = 0; k < mn; ++k) x[static_cast<std::size_t>(k)] = mxfp8_ref::to_bf16(master[static_cast<std::size_t>(g * mn + k)]);
    add_nvfp4_planes(out, nvfp4_ref::quantize(v.shape.rows, v.shape.cols, x), g);
  }
  return out;
}

/// Member m of quantized parameter i, named as the planes of a one-member parameter.
inline QPlanes member_q(const DistributedAdam& opt, int i, std::int64_t m) {
  QPlanes out;
  if (opt.is_nvfp4(i)) {
    add_nvfp4_planes(out, read_nvfp4_member(opt, i, m), 0);
    return out;
  }
  const Mxfp8Shape s = opt.mxfp8_param(i).shape;
  const auto q = read_mx(opt, i);
  const auto slice = [](const std::vector<std::uint8_t>& v, std::int64_t off, std::int64_t n) {
    return std::vector<std::uint8_t>(v.begin() + off, v.begin() + off + n);
  };
  const std::int64_t mn = s.member_numel();
  const std::int64_t sr = s.scale_row_numel() / s.members, sc = s.scale_col_numel() / s.members;
  return QPlanes{{{"data_row", slice(q.data_row, m * mn, mn)}, {"data_col", slice(q.data_col, m * mn, mn)},
                  {"scale_row", slice(q.scale_row, m * sr, sr)}, {"scale_col", slice(q.scale_col, m * sc, sc)}}};
}

inline std::string differing_planes(const QPlanes& got, const QPlanes& want) {
  std::string s;
  for (std::size_t k = 0; k < got.planes.size() || k < want.planes.size(); ++k)
    if (k >= got.planes.size() || k >= want.planes.size() || got.planes[k] != want.planes[k])
      s += (k < want.planes.size() ? want.planes[k].first : got.planes[k].first) + " ";
  return s;
}

/// The rank boundaries that fall at an odd offset inside a member of an NVFP4 parameter
/// (each is a data byte two ranks share).
inline int count_odd_boundaries(const DistributedAdam& opt) {
  const Layout& L = opt.layout();
  int n = 0;
  for (int i = 0; i < opt.num_params(); ++i) {
    if (!opt.is_nvfp4(i)) continue;
    const ParamPlacement& pl = L.params()[static_cast<std::size_t>(i)];
    for (int r = 1; r < L.world_size(); ++r)
      for (const Segment& seg : L.segments(pl.buffer, r))
        if (seg.param == i && seg.param_offset > 0 && (seg.param_offset % pl.member_numel) % 2 == 1) ++n;
  }
  return n;
}

/// The rank boundaries that cut a rowwise 32-element scale block of an MXFP8 parameter
/// (the block's scale needs the amax of two ranks: the cross-rank scale path).
inline int count_mid_block_boundaries(const DistributedAdam& opt) {
  const Layout& L = opt.layout();
  int n = 0;
  for (int i = 0; i < opt.num_params(); ++i) {
    if (!opt.is_mxfp8(i)) continue;
    const ParamPlacement& pl = L.params()[static_cast<std::size_t>(i)];
    const std::int64_t cols = opt.mxfp8_param(i).shape.cols;
    for (int r = 1; r < L.world_size(); ++r)
      for (const Segment& seg : L.segments(pl.buffer, r))
        if (seg.param == i && seg.param_offset > 0 && ((seg.param_offset % pl.member_numel) % cols) % 32 != 0) ++n;
  }
  return n;
}

/// Every MXFP8 parameter's storage equals the oracle, every native parameter equals its
/// f32 master, every bucket is Idle (collective).
inline void expect_matches_oracle(const DistributedAdam& opt, const std::string& when) {
  SCOPED_TRACE(when);
  for (int b = 0; b < static_cast<int>(opt.layout().buckets().size()); ++b)
    EXPECT_EQ(opt.gather_state(b), GatherState::Idle) << "bucket " << b;
  for (int i = 0; i < opt.num_params(); ++i) {
    const std::string& name = opt.layout().specs()[static_cast<std::size_t>(i)].name;
    if (is_quantized(opt, i)) {
      const QPlanes want = expected_q(opt, i), got = read_q(opt, i);
      EXPECT_TRUE(got == want) << name << ": " << differing_planes(got, want);
    } else {
      // No ASSERT in a collective helper: a rank that returned early would leave the
      // others waiting in the next all-gather.
      const std::vector<float> master = full_master(opt, i);
      const std::vector<float> p = read_f32(opt.backend(), opt.param(i));
      std::size_t differ = p.size() == master.size() ? 0 : 1;
      for (std::size_t k = 0; k < p.size() && k < master.size(); ++k)
        differ += num::f32_bits(p[k]) != num::f32_bits(master[k]) ? 1 : 0;
      EXPECT_EQ(differ, 0u) << name << ": native parameter elements that differ from the f32 master";
    }
  }
}

/// Storage, master and moments of two optimizers with the same specs, bitwise.
inline void expect_same_mx_state(const DistributedAdam& a, const DistributedAdam& b) {
  for (int i = 0; i < a.num_params(); ++i) {
    SCOPED_TRACE(a.layout().specs()[static_cast<std::size_t>(i)].name);
    if (is_quantized(a, i)) {
      const auto x = read_q(a, i), y = read_q(b, i);
      EXPECT_TRUE(x == y) << differing_planes(x, y);
    } else {
      EXPECT_EQ(read_bytes(a.backend(), a.param(i)), read_bytes(b.backend(), b.param(i)));
    }
    EXPECT_EQ(read_bytes(a.backend(), a.shard_master(i)), read_bytes(b.backend(), b.shard_master(i)));
    EXPECT_EQ(read_bytes(a.backend(), a.shard_exp_avg(i)), read_bytes(b.backend(), b.shard_exp_avg(i)));
    EXPECT_EQ(read_bytes(a.backend(), a.shard_exp_avg_sq(i)), read_bytes(b.backend(), b.shard_exp_avg_sq(i)));
  }
}

/// Every gradient view of the quantized parameters is zero.
inline void expect_mx_grads_zero(const DistributedAdam& opt) {
  for (int i = 0; i < opt.num_params(); ++i) {
    if (!is_quantized(opt, i)) continue;
    for (float x : read_f32(opt.backend(), opt.grad(i)))
      ASSERT_EQ(num::f32_bits(x), 0u) << opt.layout().specs()[static_cast<std::size_t>(i)].name;
  }
}

/// The bytes of every quantized parameter's gradient view, in parameter order.
inline std::vector<std::vector<std::uint8_t>> quantized_grad_bytes(const DistributedAdam& opt) {
  std::vector<std::vector<std::uint8_t>> out;
  for (int i = 0; i < opt.num_params(); ++i)
    if (is_quantized(opt, i)) out.push_back(read_bytes(opt.backend(), opt.grad(i)));
  return out;
}

/// What a step leaves in the quantized gradient regions: NVFP4 stages its gather there
/// and zeroes them; MXFP8 gathers in place into its storage (issue 29), so the step
/// leaves the gradients as the backward and the reduce-scatter left them (`reduced`,
/// read after reduce_grads), exactly as for native parameters.
inline void expect_step_left_grads(const DistributedAdam& opt, const std::vector<std::vector<std::uint8_t>>& reduced) {
  if (opt.options().param_format != ParamFormat::Mxfp8) {
    expect_mx_grads_zero(opt);
    return;
  }
  EXPECT_TRUE(quantized_grad_bytes(opt) == reduced) << "the MXFP8 step wrote its gradient regions";
}

inline void wait_all(DistributedAdam& opt, Stream s) {
  for (int k = 0; k < static_cast<int>(opt.layout().buckets().size()); ++k) opt.wait_param(k, s);
}

/// One backward: gradients accumulated (+=) into every grad view, then reported.
inline void mx_backward(DistributedAdam& opt, Backend b, Stream s, GradKind kind, bool poison = false) {
  GradStreamParams p;
  p.kind = kind;
  p.scale = 0.2f;
  p.rank = world_rank();
  p.scalars = opt.device_scalars();
  p.microbatch = opt.device_microbatch();
  if (poison && world_rank() == world_size() - 1) {  // an Inf in one rank's gradient of 'w1'
    p.poison_param = opt.param_index("w1");
    p.poison_element = 7;
    p.poison_step = 4;
  }
  add_grads(b, s, p, grad_targets(opt));
  report_all(opt, s);
}

// ------------------------------------------------------------------ communicator

/// The 8-bit Max all-reduce of MXFP8 scale bytes (DType::e8m0): the byte-wise maximum
/// over the ranks, every byte value included; other reductions of e8m0 are refused.
inline void case_e8m0_all_reduce_max(Backend b) {
  const int rank = world_rank(), world = world_size();
  Communicator comm = make_comm(b);
  TestStream s(b);
  for (std::int64_t count : {1, 31, 4099}) {
    auto byte = [](int r, std::int64_t j) {
      return static_cast<std::uint8_t>(mix64((static_cast<std::uint64_t>(r) << 32) ^ static_cast<std::uint64_t>(j)));
    };
    std::vector<std::uint8_t> mine(static_cast<std::size_t>(count));
    for (std::int64_t j = 0; j < count; ++j) mine[static_cast<std::size_t>(j)] = byte(rank, j);
    if (count > 2) mine[2] = rank == world - 1 ? 0xFF : 0x00;  // NaN scale wins
    DeviceBuffer buf(b, mine.size());
    from_host(b, buf.data(), mine);
    comm.all_reduce(buf.data(), count, DType::e8m0, ReduceOp::Max, s.get());
    s.sync();
    const auto got = to_host<std::uint8_t>(b, buf.data(), mine.size());
    std::int64_t differ = 0;
    for (std::int64_t j = 0; j < count; ++j) {
      std::uint8_t want = 0;
      for (int r = 0; r < world; ++r) want = std::max(want, byte(r, j));
      if (j == 2) want = 0xFF;
      differ += got[static_cast<std::size_t>(j)] != want ? 1 : 0;
    }
    EXPECT_EQ(differ, 0) << "count " << count << ": bytes that are not the maximum over the ranks";
  }
  // Sum of scale bytes means nothing: refused on every rank (the group is then failed,
  // so a group of its own).
  Communicator spare = make_comm(b);
  DeviceBuffer one(b, 16);
  expect_error(mx_error_of([&] { spare.all_reduce(one.data(), 16, DType::e8m0, ReduceOp::Sum, s.get()); }),
               ErrorCode::InvalidArgument, "Max");
}

// ------------------------------------------------------------------ bucket store

/// BucketStoreOptions::buffer_params and staged_gather_bytes: a buffer without a param
/// buffer (none allocated, nullptr views) gathers staged bytes through its bucket's
/// gradient region, in place, exactly 2S bytes per rank, leaving the rest of the region
/// alone; the other buffer gathers its params as before; the checks say what to change.
/// The layout of the staged-store cases: a bf16 buffer (to stage) and an f32 one, buckets
/// of about 700 elements.
inline Layout staged_store_layout(int world) {
  const std::vector<ParamSpec> specs = {ParamSpec::tensor("a", {37, 11}), ParamSpec::tensor("n", {129}, DType::f32),
                                        ParamSpec::tensor("b", {61, 7}), ParamSpec::tensor("c", {1000})};
  LayoutOptions lo;
  lo.bucket_numel = 700;
  return Layout(specs, world, lo);
}

/// Every bucket's parameter all-gather of `st`, one by one or as one group, waited for.
inline void gather_every_bucket(BucketStore& st, TestStream& s, bool grouped) {
  const int nb = static_cast<int>(st.layout().buckets().size());
  if (grouped) {
    st.start_param_gathers(0, nb, s.get());
  } else {
    for (int bk = 0; bk < nb; ++bk) st.start_param_gather(bk, s.get());
  }
  for (int bk = 0; bk < nb; ++bk) st.wait_param_gather(bk, s.get());
  s.sync();
}

/// Every rank writes a pattern into its staged piece of each bucket of `staged_buffer`
/// (`rank_bytes(bucket)` bytes at rank * rank_bytes) and sentinels elsewhere in the region;
/// after the store's staged all-gathers (one by one, then grouped) every rank's piece is
/// in place and nothing beyond the staging changed.
template <class RankBytes>
void expect_staged_gathers(Backend b, BucketStore& st, const Layout& layout, int staged_buffer, RankBytes rank_bytes) {
  const int rank = world_rank(), world = world_size();
  const auto gsize = static_cast<std::int64_t>(size_of(st.options().grad_dtype));
  TestStream s(b);
  auto pattern = [](int r, int bk, std::int64_t j) { return static_cast<std::uint8_t>(r * 61 + bk * 17 + j * 3 + 5); };
  for (bool grouped : {false, true}) {
    // Staged pieces and sentinels in every bucket region of the staged buffer.
    for (int bk : layout.buffers()[static_cast<std::size_t>(staged_buffer)].buckets) {
      const Bucket& B = layout.buckets()[static_cast<std::size_t>(bk)];
      const std::int64_t n = rank_bytes(bk), bytes = B.range.size() * gsize;
      std::vector<std::uint8_t> region(static_cast<std::size_t>(bytes), 0xEE);
      for (std::int64_t j = 0; j < n; ++j) region[static_cast<std::size_t>(rank * n + j)] = pattern(rank, bk, j);
      from_host(b, static_cast<char*>(st.grad_buffer(staged_buffer)) + B.range.begin * gsize, region);
    }
    gather_every_bucket(st, s, grouped);
    for (int bk : layout.buffers()[static_cast<std::size_t>(staged_buffer)].buckets) {
      const Bucket& B = layout.buckets()[static_cast<std::size_t>(bk)];
      const std::int64_t n = rank_bytes(bk), bytes = B.range.size() * gsize;
      const auto got = to_host<std::uint8_t>(b, static_cast<char*>(st.grad_buffer(staged_buffer)) + B.range.begin * gsize,
                                             static_cast<std::size_t>(bytes));
      std::int64_t wrong_piece = 0, touched = 0;
      for (int r = 0; r < world; ++r)
        for (std::int64_t j = 0; j < n; ++j) wrong_piece += got[static_cast<std::size_t>(r * n + j)] != pattern(r, bk, j) ? 1 : 0;
      for (std::int64_t j = world * n; j < bytes; ++j) touched += got[static_cast<std::size_t>(j)] != 0xEE ? 1 : 0;
      EXPECT_EQ(wrong_piece, 0) << "bucket " << bk << (grouped ? " (grouped)" : "") << ": staged bytes not gathered";
      EXPECT_EQ(touched, 0) << "bucket " << bk << ": bytes beyond the staging changed";
    }
  }
}

inline void case_store_staged_gather(Backend b) {
  const int world = world_size();
  Communicator comm = make_comm(b);
  const Layout layout = staged_store_layout(world);
  ASSERT_EQ(layout.buffers().size(), 2u);
  const int staged_buffer = layout.buffers()[0].dtype == DType::bf16 ? 0 : 1;
  BucketStoreOptions o;
  o.grad_dtype = DType::f32;  // 4 bytes of room per element, 2 staged: half the region moves
  o.nccl_registered = false;
  o.buffer_params.assign(2, true);
  o.buffer_params[static_cast<std::size_t>(staged_buffer)] = false;
  o.staged_gather_bytes = 2;
  BucketStore st(comm, layout, o);
  EXPECT_EQ(st.param_buffer(staged_buffer), nullptr);
  EXPECT_FALSE(st.has_params(staged_buffer));
  EXPECT_TRUE(st.has_params(1 - staged_buffer));
  EXPECT_EQ(st.param_bytes(), static_cast<std::size_t>(layout.buffers()[static_cast<std::size_t>(1 - staged_buffer)].numel) *
                                  size_of(layout.buffers()[static_cast<std::size_t>(1 - staged_buffer)].dtype));
  for (int p = 0; p < static_cast<int>(layout.params().size()); ++p)
    if (layout.params()[static_cast<std::size_t>(p)].buffer == staged_buffer) { EXPECT_EQ(st.param_data(p), nullptr); }
  expect_staged_gathers(b, st, layout, staged_buffer, [&](int bk) {
    return 2 * layout.buckets()[static_cast<std::size_t>(bk)].range.size() / world;  // 2S
  });
  TestStream s(b);
  // Gathering a bucket that has neither params nor staging is refused.
  BucketStoreOptions none = o;
  none.staged_gather_bytes = 0;
  BucketStore plain(comm, layout, none);
  const int first_staged = layout.buffers()[static_cast<std::size_t>(staged_buffer)].buckets.front();
  expect_error(mx_error_of([&] { plain.start_param_gather(first_staged, s.get()); }), ErrorCode::InvalidState,
               "staged_gather_bytes");
  // More staged bytes than the gradient region holds: the construction error.
  BucketStoreOptions wide = o;
  wide.grad_dtype = DType::bf16;
  wide.staged_gather_bytes = 4;
  expect_error(mx_error_of([&] { BucketStore bad(comm, layout, wide); }), ErrorCode::InvalidArgument,
               "staged_gather_bytes 4 does not fit the gradient buffer");
  BucketStoreOptions miscount = o;
  miscount.buffer_params = {false};
  expect_error(mx_error_of([&] { BucketStore bad(comm, layout, miscount); }), ErrorCode::InvalidArgument,
               "one entry per buffer");
}

/// BucketStore::set_gather_planes (issue 29): a bucket of a buffer without params gets two
/// planes of its own; its gathers (one by one, then grouped with the other buckets) move
/// each plane in place, rank r's S bytes at r * S, and touch neither the bytes around the
/// planes nor its gradient region; the refusals say what to change.
inline void case_store_gather_planes(Backend b) {
  const int rank = world_rank(), world = world_size();
  Communicator comm = make_comm(b);
  const Layout layout = staged_store_layout(world);
  const int mx = layout.buffers()[0].dtype == DType::bf16 ? 0 : 1;
  BucketStoreOptions o;
  o.grad_dtype = DType::bf16;
  o.nccl_registered = false;
  o.buffer_params.assign(2, true);
  o.buffer_params[static_cast<std::size_t>(mx)] = false;
  BucketStore st(comm, layout, o);
  const std::vector<int>& buckets = layout.buffers()[static_cast<std::size_t>(mx)].buckets;
  const int nb = static_cast<int>(layout.buckets().size()), bk0 = buckets.front();
  // Per bucket one allocation: 16 guard bytes, plane 0, 16 guard bytes, plane 1, 16 guard bytes.
  auto S = [&](int bk) { return layout.buckets()[static_cast<std::size_t>(bk)].range.size() / world; };
  auto padded = [](std::int64_t n) { return (n + 15) / 16 * 16; };
  std::vector<DeviceBuffer> memory;
  for (int bk : buckets) memory.emplace_back(b, static_cast<std::size_t>(16 + 2 * (padded(world * S(bk)) + 16)));
  auto plane = [&](std::size_t k, int i) {
    return memory[k].as<std::uint8_t>() + 16 + static_cast<std::size_t>(i * (padded(world * S(buckets[k])) + 16));
  };
  TestStream s(b);
  // Refusals (each collective: every rank passes the same bad call).
  const int native_bucket = layout.buffers()[static_cast<std::size_t>(1 - mx)].buckets.front();
  std::vector<GatherPlane> good = {GatherPlane{plane(0, 0), S(bk0)}, GatherPlane{plane(0, 1), S(bk0)}};
  expect_error(mx_error_of([&] { st.set_gather_planes(nb, good); }), ErrorCode::OutOfRange, "out of range");
  expect_error(mx_error_of([&] { st.set_gather_planes(native_bucket, good); }), ErrorCode::InvalidArgument,
               "buffers without parameters");
  expect_error(mx_error_of([&] { st.set_gather_planes(bk0, {}); }), ErrorCode::InvalidArgument, "give 1 to 8");
  expect_error(mx_error_of([&] { st.set_gather_planes(bk0, {GatherPlane{plane(0, 0) + 1, S(bk0)}}); }),
               ErrorCode::InvalidArgument, "16-byte aligned");
  expect_error(mx_error_of([&] { st.set_gather_planes(bk0, {GatherPlane{nullptr, S(bk0)}}); }),
               ErrorCode::InvalidArgument, "null");
  expect_error(mx_error_of([&] { st.set_gather_planes(bk0, {GatherPlane{plane(0, 0), 0}}); }),
               ErrorCode::InvalidArgument, "rank_bytes 0");
  if (world > 1) {  // ranks that disagree: every rank throws LayoutMismatch
    expect_error(mx_error_of([&] { st.set_gather_planes(bk0, {GatherPlane{plane(0, 0), rank == 0 ? 1 : 2}}); }),
                 ErrorCode::LayoutMismatch, "pass the same on every rank");
    // One rank's refusal reaches every rank (the others' calls were fine).
    expect_error(mx_error_of([&] { st.set_gather_planes(bk0, {GatherPlane{rank == 0 ? nullptr : plane(0, 0), S(bk0)}}); }),
                 ErrorCode::InvalidArgument, "");
  }
  EXPECT_FALSE(st.has_gather_planes(bk0)) << "a refused call gives no planes";
  {  // A bucket whose (staged) gather is pending gets no planes.
    BucketStoreOptions staged = o;
    staged.staged_gather_bytes = 1;
    BucketStore st2(comm, layout, staged);
    st2.start_param_gather(bk0, s.get());
    expect_error(mx_error_of([&] { st2.set_gather_planes(bk0, good); }), ErrorCode::InvalidState, "not waited for");
    st2.wait_param_gather(bk0, s.get());
    s.sync();
  }
  // Without planes (and staged_gather_bytes 0) the bucket has nothing to gather.
  expect_error(mx_error_of([&] { st.start_param_gather(bk0, s.get()); }), ErrorCode::InvalidState, "set_gather_planes");
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    const int bk = buckets[k];
    st.set_gather_planes(bk, {GatherPlane{plane(k, 0), S(bk)}, GatherPlane{plane(k, 1), S(bk)}});
    EXPECT_TRUE(st.has_gather_planes(bk));
  }
  expect_error(mx_error_of([&] { st.set_gather_planes(bk0, good); }), ErrorCode::InvalidState, "already has");
  st.start_param_gather(bk0, s.get());
  expect_error(mx_error_of([&] { (void)st.has_gather_planes(-1); }), ErrorCode::OutOfRange, "out of range");
  st.wait_param_gather(bk0, s.get());
  s.sync();
  // The gathers' bytes: each rank writes its slice of both planes, guards 0xEE elsewhere,
  // and its gradient region a pattern of its own, which no gather may change.
  auto pattern = [](int r, int bk, int i, std::int64_t j) {
    return static_cast<std::uint8_t>(r * 61 + bk * 17 + i * 101 + j * 3 + 5);
  };
  const auto gsize = static_cast<std::size_t>(size_of(o.grad_dtype));
  for (bool grouped : {false, true}) {
    for (std::size_t k = 0; k < buckets.size(); ++k) {
      const int bk = buckets[k];
      std::vector<std::uint8_t> host(memory[k].bytes(), 0xEE);
      for (int i = 0; i < 2; ++i)
        for (std::int64_t j = 0; j < S(bk); ++j)
          host[static_cast<std::size_t>(plane(k, i) - memory[k].as<std::uint8_t>() + rank * S(bk) + j)] =
              pattern(rank, bk, i, j);
      from_host(b, memory[k].data(), host);
    }
    const auto grads_before = to_host<std::uint8_t>(b, st.grad_buffer(mx), static_cast<std::size_t>(
                                                                               layout.buffers()[static_cast<std::size_t>(mx)].numel) * gsize);
    gather_every_bucket(st, s, grouped);
    for (std::size_t k = 0; k < buckets.size(); ++k) {
      const int bk = buckets[k];
      const auto got = to_host<std::uint8_t>(b, memory[k].data(), memory[k].bytes());
      std::int64_t wrong = 0, guards = 0;
      for (std::size_t x = 0; x < got.size(); ++x) {
        bool in_plane = false;
        for (int i = 0; i < 2; ++i) {
          const auto off = static_cast<std::int64_t>(plane(k, i) - memory[k].as<std::uint8_t>());
          const auto j = static_cast<std::int64_t>(x) - off;
          if (j < 0 || j >= world * S(bk)) continue;
          in_plane = true;
          wrong += got[x] != pattern(static_cast<int>(j / S(bk)), bk, i, j % S(bk)) ? 1 : 0;
        }
        if (!in_plane) guards += got[x] != 0xEE ? 1 : 0;
      }
      EXPECT_EQ(wrong, 0) << "bucket " << bk << (grouped ? " (grouped)" : "") << ": plane bytes not gathered";
      EXPECT_EQ(guards, 0) << "bucket " << bk << ": bytes around the planes changed";
    }
    EXPECT_EQ(to_host<std::uint8_t>(b, st.grad_buffer(mx), grads_before.size()), grads_before)
        << "an in-place gather wrote the gradient region";
  }
}

// ------------------------------------------------------------------ oracle

/// After init_from_master and after every step, every rank's MXFP8 storage equals the
/// oracle's quantize(bf16(full master)) bitwise (shard boundaries mid-block, a grouped
/// parameter, buckets of several params), the native 1-D params equal the master, the
/// quantized gradient regions are what the step leaves there (expect_step_left_grads)
/// and zero after zero_grad, and every bucket is Idle.
inline void case_mx_matches_oracle(Backend b, DType grad_dtype, int microbatches, int steps, bool one_rank = false,
                                   ParamFormat format = ParamFormat::Mxfp8) {
  DistributedAdamOptions o = mx_options(grad_dtype, format);
  o.microbatches = microbatches;
  DistributedAdam opt(one_rank ? Communicator::self(b) : make_comm(b), q_model(format), o);
  TestStream s(b);
  ASSERT_EQ(opt.layout().buffers().size(), 2u);
  for (int i = 0; i < opt.num_params(); ++i) {
    const bool q = opt.layout().specs()[static_cast<std::size_t>(i)].shape.size() >= 2;
    EXPECT_EQ(opt.is_mxfp8(i), q && format == ParamFormat::Mxfp8);
    EXPECT_EQ(opt.is_nvfp4(i), q && format == ParamFormat::Nvfp4);
  }
  mx_init(opt, s.get());
  s.sync();
  expect_matches_oracle(opt, "after init_from_master");
  const int ex = opt.param_index("experts");
  if (format == ParamFormat::Nvfp4) {
    // Each member its own NVFP4 tensor of the member shape.
    const Nvfp4View v = opt.nvfp4_param(ex);
    EXPECT_EQ(v.members, 3);
    EXPECT_EQ(v.shape.rows, 35);
    EXPECT_EQ(v.shape.cols, 24);
    if (!one_rank && world_size() > 1) {
      EXPECT_GT(count_odd_boundaries(opt), 0) << "no rank boundary shares a byte";
    }
  } else {
    // Rank boundaries mid-block: the cross-rank scale path is exercised.
    if (!one_rank && world_size() > 1) {
      EXPECT_GT(count_mid_block_boundaries(opt), 0) << "no rank boundary cuts an MXFP8 scale block";
    }
    // The device member table of the grouped parameter.
    const Mxfp8View v = opt.mxfp8_param(ex);
    EXPECT_EQ(v.shape.members, 3);
    const auto table = to_host<Mxfp8Member>(b, v.members, 3);
    const auto want_table = mxfp8_contiguous_members(v.shape);
    for (std::size_t g = 0; g < 3; ++g) {
      EXPECT_EQ(table[g].element_offset, want_table[g].element_offset);
      EXPECT_EQ(table[g].scale_row_offset, want_table[g].scale_row_offset);
      EXPECT_EQ(table[g].scale_col_offset, want_table[g].scale_col_offset);
    }
  }
  for (int t = 0; t < steps; ++t) {
    for (int mb = 0; mb < microbatches; ++mb) {
      const bool last = mb == microbatches - 1;
      opt.set_grad_sync(last);
      GradStreamParams p;
      p.kind = GradKind::Random;
      p.scale = 0.2f;
      p.rank = world_rank();
      p.scalars = opt.device_scalars();
      p.microbatch = opt.device_microbatch();
      add_grads(b, s.get(), p, grad_targets(opt));
      if (last) report_all(opt, s.get());
      opt.set_grad_sync(true);
      opt.advance_microbatch(s.get());
    }
    opt.reduce_grads(s.get());
    s.sync();
    const auto reduced = quantized_grad_bytes(opt);
    opt.step(s.get());
    s.sync();
    expect_step_left_grads(opt, reduced);
    expect_matches_oracle(opt, "after step " + std::to_string(t + 1));
    opt.zero_grad(s.get());
    s.sync();
    expect_mx_grads_zero(opt);
  }
  const StepScalars x = opt.read_scalars(s.get());
  EXPECT_EQ(x.step, steps);
  EXPECT_LT(x.clip_coef, 1.0f) << "clipping must be active";
}

/// One rank: the all-gather moves nothing, so phase 2 writes the storage itself and the
/// step makes no landing copies (the phase probe sees no "landing" mark), with the
/// oracle's bytes; several ranks land NVFP4, while MXFP8 gathers in place (issue 29) and
/// lands nothing there either.
inline void case_one_rank_writes_storage(Backend b, ParamFormat format = ParamFormat::Mxfp8) {
  auto landings = [&](const Communicator& comm) {
    DistributedAdam opt(comm, q_model(format), mx_options(DType::bf16, format));
    TestStream s(b);
    mx_init(opt, s.get());
    mx_backward(opt, b, s.get(), GradKind::Grid);
    opt.reduce_grads(s.get());
    s.sync();
    const auto reduced = quantized_grad_bytes(opt);
    std::vector<std::string> marks;
    detail::set_phase_probe(
        [](const char* phase, Stream, void* user) { static_cast<std::vector<std::string>*>(user)->push_back(phase); },
        &marks);
    opt.step(s.get());
    detail::set_phase_probe(nullptr, nullptr);
    s.sync();
    expect_step_left_grads(opt, reduced);
    expect_matches_oracle(opt, "after one step");
    EXPECT_GT(std::count(marks.begin(), marks.end(), std::string("quantize")), 0) << "no quantize mark";
    return std::count(marks.begin(), marks.end(), std::string("landing"));
  };
  EXPECT_EQ(landings(Communicator::self(b)), 0) << "one rank: landing copies";
  if (world_size() > 1) {
    if (format == ParamFormat::Mxfp8) {  // gathered in place (issue 29): nothing to land at any world size
      EXPECT_EQ(landings(make_comm(b)), 0) << "several ranks: MXFP8 landing copies";
    } else {
      EXPECT_GT(landings(make_comm(b)), 0) << "several ranks: no landing copies";
    }
  }
}

/// Adam on the MXFP8 buffer (master only, write_params off) updates the master exactly
/// as native f32 parameters do: grid gradients make the global norm independent of the
/// two layouts' summation orders, so the full masters agree bitwise.
inline void case_mx_master_equals_native(Backend b, ParamFormat format = ParamFormat::Mxfp8) {
  DistributedAdamOptions om = mx_options(DType::bf16, format), on = base_options(DType::bf16);
  on.param_dtype = DType::f32;
  on.bucket_numel = 2000;
  // Without clipping the norm (whose f32 sum depends on the layout when the world is not
  // a power of two) does not enter the update.
  om.clip_max_norm = on.clip_max_norm = 0.0f;
  Communicator comm = make_comm(b);
  DistributedAdam mx(comm, q_model(format), om), nat(comm, q_model(format), on);
  TestStream s(b);
  mx_init(mx, s.get());
  mx_init(nat, s.get());
  for (int t = 0; t < 4; ++t) {
    for (DistributedAdam* opt : {&mx, &nat}) {
      mx_backward(*opt, b, s.get(), GradKind::Grid);
      opt->step(s.get());
      opt->zero_grad(s.get());
    }
  }
  s.sync();
  for (int i = 0; i < mx.num_params(); ++i) {
    const auto a = full_master(mx, i), c = full_master(nat, i);
    for (std::size_t k = 0; k < a.size(); ++k)
      ASSERT_EQ(num::f32_bits(a[k]), num::f32_bits(c[k])) << mx.layout().specs()[static_cast<std::size_t>(i)].name << " " << k;
  }
}

// ------------------------------------------------------------------ paths

/// The ways a training run can reach the next backward after a step.
enum class MxPath {
  TrainTrain,        ///< step, next backward
  TrainEvalTrain,    ///< step, eval (forward-only reads of mxfp8_param), next backward
  ForcedGather,      ///< step, gather_params (before "saving"), next backward
  FoundInf,          ///< a step skipped by an Inf in the middle
  Deferred,          ///< overlap_param_gather: the forward calls wait_param
  DeferredEval,      ///< deferred; eval forward calls wait_param, the next forward again
  DeferredZeroGrad,  ///< deferred; zero_grad right after the step (lands first)
};

inline const char* path_name(MxPath p) {
  switch (p) {
    case MxPath::TrainTrain: return "train-train";
    case MxPath::TrainEvalTrain: return "train-eval-train";
    case MxPath::ForcedGather: return "forced-gather";
    case MxPath::FoundInf: return "found-inf";
    case MxPath::Deferred: return "deferred";
    case MxPath::DeferredEval: return "deferred-eval";
    case MxPath::DeferredZeroGrad: return "deferred-zero-grad";
  }
  return "?";
}

/// A path variant trains exactly like plain train-only (non-deferred, zero_grad after
/// every step): MXFP8 storage, master and moments bitwise equal after 6 steps.
/// `variant_zero_grad` false: the variant never calls zero_grad (MXFP8-only model), so
/// the only zeroing of its gradient regions is the library's landing; staging bytes left
/// there would be accumulated into its next gradients and the states would differ.
inline void case_mx_path(Backend b, MxPath path, bool variant_zero_grad, ParamFormat format = ParamFormat::Mxfp8) {
  SCOPED_TRACE(std::string(path_name(path)) + (variant_zero_grad ? " with zero_grad" : " without zero_grad"));
  const bool deferred = path == MxPath::Deferred || path == MxPath::DeferredEval || path == MxPath::DeferredZeroGrad;
  const auto specs = q_model(format, /*native=*/variant_zero_grad);
  Communicator comm = make_comm(b);
  DistributedAdamOptions o = mx_options(DType::bf16, format);
  o.gather_pipeline = 2;
  DistributedAdamOptions ov = o;
  ov.overlap_param_gather = deferred;
  DistributedAdam ref(comm, specs, o), var(comm, specs, ov);
  TestStream s(b), sv(b);
  mx_init(ref, s.get());
  mx_init(var, sv.get());
  const int nb = static_cast<int>(var.layout().buckets().size());
  const bool poison_path = path == MxPath::FoundInf;
  // MXFP8 (issue 29) gathers into its storage: the step leaves the gradients as the
  // backward and reduce-scatter left them, exactly as for native parameters, so without
  // zero_grad they accumulate. The reference then zeroes exactly when the variant does,
  // and the two still agree only if no path (eval, wait_param, a forced gather) touches
  // the gradients; a found Inf stays in them until zero_grad, so that path zeroes.
  const bool var_zero = path == MxPath::DeferredZeroGrad || variant_zero_grad ||
                        (format == ParamFormat::Mxfp8 && poison_path);
  const bool ref_zero = format != ParamFormat::Mxfp8 || var_zero;
  std::vector<QPlanes> before_inf;
  for (int t = 0; t < 6; ++t) {
    const bool poison = poison_path && t == 3;  // the 4th step finds an Inf
    // Reference: plain.
    mx_backward(ref, b, s.get(), GradKind::Random, poison);
    ref.step(s.get());
    if (ref_zero) ref.zero_grad(s.get());
    // Variant.
    if (deferred) wait_all(var, sv.get());  // the forward waits for (lands) its buckets
    if (poison) {
      sv.sync();
      for (int i = 0; i < var.num_params(); ++i)
        if (is_quantized(var, i)) before_inf.push_back(read_q(var, i));
    }
    mx_backward(var, b, sv.get(), GradKind::Random, poison);
    var.step(sv.get());
    if (deferred) {
      int in_flight = 0;
      for (int k = 0; k < nb; ++k) in_flight += var.gather_state(k) == GatherState::InFlight ? 1 : 0;
      EXPECT_GT(in_flight, 0) << "deferred: the step leaves the MXFP8 gathers in flight";
    } else {
      for (int k = 0; k < nb; ++k) EXPECT_EQ(var.gather_state(k), GatherState::Idle);
    }
    if (var_zero) var.zero_grad(sv.get());
    if (path == MxPath::DeferredZeroGrad) {
      for (int k = 0; k < nb; ++k)
        if (is_quantized(var, var.layout().buckets()[static_cast<std::size_t>(k)].params.front())) {
          EXPECT_EQ(var.gather_state(k), GatherState::Idle) << "zero_grad lands MXFP8 bucket " << k << " first";
        }
    }
    const bool odd = t % 2 == 1;
    if (odd && (path == MxPath::TrainEvalTrain || path == MxPath::DeferredEval)) {
      // Eval: a forward-only pass reads every weight (after wait_param when deferred).
      if (path == MxPath::DeferredEval) wait_all(var, sv.get());
      sv.sync();
      expect_matches_oracle(var, "eval after step " + std::to_string(t + 1));
    }
    if (odd && path == MxPath::ForcedGather) {
      var.gather_params(sv.get());  // e.g. before saving a checkpoint
      for (int k = 0; k < nb; ++k) EXPECT_EQ(var.gather_state(k), GatherState::Idle);
      sv.sync();
      expect_matches_oracle(var, "saved after step " + std::to_string(t + 1));
    }
    if (poison) {
      sv.sync();
      const StepScalars x = var.read_scalars(sv.get());
      EXPECT_EQ(x.found_inf, 1);
      if (deferred) wait_all(var, sv.get());
      sv.sync();
      std::size_t k = 0;
      for (int i = 0; i < var.num_params(); ++i)
        if (is_quantized(var, i)) {
          EXPECT_TRUE(read_q(var, i) == before_inf[k++]) << "a skipped step rewrites the same bytes";
        }
    }
  }
  wait_all(var, sv.get());
  s.sync();
  sv.sync();
  const StepScalars x = ref.read_scalars(s.get()), y = var.read_scalars(sv.get());
  EXPECT_EQ(x.step, poison_path ? 5 : 6);
  EXPECT_EQ(y.step, x.step);
  EXPECT_EQ(num::f32_bits(x.grad_norm), num::f32_bits(y.grad_norm));
  expect_same_mx_state(ref, var);
  expect_matches_oracle(var, "end");
}

/// The state machine's refusals and queries: after a deferred step the MXFP8 buckets
/// are InFlight; a backward (grad_ready), reduce_grads or step before wait_param is
/// Error(InvalidState) naming the bucket and wait_param; wait_param(b) makes b Idle;
/// zero_grad lands the rest; gather_params between grad_ready and step is refused where it
/// stages (NVFP4) and leaves the live gradients alone where it gathers in place (MXFP8);
/// the views say where MXFP8 and native parameters live.
inline void case_mx_state_machine(Backend b, ParamFormat format = ParamFormat::Mxfp8) {
  DistributedAdamOptions o = mx_options(DType::bf16, format);
  o.overlap_param_gather = true;
  DistributedAdam opt(make_comm(b), q_model(format), o);
  const std::string view_call = format == ParamFormat::Nvfp4 ? "nvfp4_param" : "mxfp8_param";
  TestStream s(b);
  mx_init(opt, s.get());
  const int nb = static_cast<int>(opt.layout().buckets().size());
  for (int k = 0; k < nb; ++k) EXPECT_EQ(opt.gather_state(k), GatherState::Idle);
  mx_backward(opt, b, s.get(), GradKind::Random);
  opt.step(s.get());
  const int w1 = opt.param_index("w1"), norm = opt.param_index("norm1");
  const int bw1 = opt.layout().params()[static_cast<std::size_t>(w1)].bucket;
  for (int k = 0; k < nb; ++k) {
    const bool mxb = opt.layout().buffers()[static_cast<std::size_t>(opt.layout().buckets()[static_cast<std::size_t>(k)].buffer)].dtype == DType::bf16;
    EXPECT_EQ(opt.gather_state(k), GatherState::InFlight) << "bucket " << k << (mxb ? " (MXFP8)" : " (native)");
  }
  const std::string name = "bucket " + std::to_string(bw1);
  expect_error(mx_error_of([&] { opt.grad_ready(w1, s.get()); }), ErrorCode::InvalidState, "wait_param(" + std::to_string(bw1));
  expect_error(mx_error_of([&] { opt.reduce_grads(s.get()); }), ErrorCode::InvalidState, "wait_param(");
  expect_error(mx_error_of([&] { opt.step(s.get()); }), ErrorCode::InvalidState, "wait_param(");
  opt.wait_param(bw1, s.get());
  EXPECT_EQ(opt.gather_state(bw1), GatherState::Idle);
  opt.zero_grad(s.get());
  for (int k = 0; k < nb; ++k) {
    const bool mxb = is_quantized(opt, opt.layout().buckets()[static_cast<std::size_t>(k)].params.front());
    if (mxb) { EXPECT_EQ(opt.gather_state(k), GatherState::Idle) << "zero_grad landed bucket " << k; }
  }
  wait_all(opt, s.get());
  s.sync();
  expect_matches_oracle(opt, "after the recoveries");
  // Live gradients: a staged (NVFP4) forced gather would stage over them and is refused;
  // MXFP8 gathers into its storage (issue 29), so it runs and leaves them as they were.
  GradStreamParams p;
  p.rank = world_rank();
  p.scalars = opt.device_scalars();
  add_grads(b, s.get(), p, grad_targets(opt));
  opt.grad_ready(w1, s.get());
  if (format == ParamFormat::Mxfp8) {
    s.sync();
    const auto live = quantized_grad_bytes(opt);
    opt.gather_params(s.get());
    wait_all(opt, s.get());  // overlap_param_gather: the native buckets are still in flight
    s.sync();
    EXPECT_TRUE(quantized_grad_bytes(opt) == live) << "an MXFP8 forced gather wrote live gradients";
    expect_matches_oracle(opt, "forced gather with live gradients");
  } else {
    expect_error(mx_error_of([&] { opt.gather_params(s.get()); }), ErrorCode::InvalidState, "gather_params");
  }
  opt.reduce_grads(s.get());  // ends the round grad_ready began
  opt.zero_grad(s.get());     // and discards the gradients
  // Views.
  expect_error(mx_error_of([&] { (void)opt.param(w1); }), ErrorCode::InvalidArgument, view_call);
  expect_error(mx_error_of([&] { (void)opt.member_param(opt.param_index("experts"), 0); }), ErrorCode::InvalidArgument,
               view_call);
  expect_error(mx_error_of([&] { (void)opt.shard_param(w1); }), ErrorCode::InvalidArgument, "shard_master");
  if (format == ParamFormat::Nvfp4) {
    expect_error(mx_error_of([&] { (void)opt.nvfp4_param(norm); }), ErrorCode::InvalidArgument, "1-D");
    expect_error(mx_error_of([&] { (void)opt.mxfp8_param(w1); }), ErrorCode::InvalidArgument, "nvfp4_param");
  } else {
    expect_error(mx_error_of([&] { (void)opt.mxfp8_param(norm); }), ErrorCode::InvalidArgument, "1-D");
  }
  EXPECT_EQ(opt.param(norm).dtype, DType::f32);
  expect_error(mx_error_of([&] { opt.init_master(s.get()); }), ErrorCode::InvalidState, "init_from_master");
  DistributedAdamOptions bad = mx_options(DType::bf16, format);
  bad.param_dtype = DType::bf16;
  expect_error(mx_error_of([&] { DistributedAdam x(make_comm(b), q_model(format), bad); }), ErrorCode::InvalidArgument,
               "param_dtype");
  // The optimizer still works: a plain step after all this.
  wait_all(opt, s.get());
  mx_backward(opt, b, s.get(), GradKind::Random);
  opt.step(s.get());
  wait_all(opt, s.get());
  s.sync();
  expect_matches_oracle(opt, "after a last step");
}

// ------------------------------------------------------------------ grouped vs discrete

/// The grouped-vs-discrete pair of models: embed, norm, G experts of `member` (one
/// grouped parameter "experts", or G discrete ones "experts.m"), head.
inline std::pair<std::vector<ParamSpec>, std::vector<ParamSpec>> moe_models(int G, const Shape& member) {
  std::vector<ParamSpec> grouped = {ParamSpec::tensor("embed", {37, 40}),
                                    ParamSpec::tensor("norm", {40}, DType::bf16, "no_decay"),
                                    ParamSpec::grouped("experts", G, member), ParamSpec::tensor("head", {37, 40})};
  std::vector<ParamSpec> discrete = {ParamSpec::tensor("embed", {37, 40}),
                                     ParamSpec::tensor("norm", {40}, DType::bf16, "no_decay")};
  for (int m = 0; m < G; ++m) discrete.push_back(ParamSpec::tensor("experts." + std::to_string(m), member));
  discrete.push_back(ParamSpec::tensor("head", {37, 40}));
  return {grouped, discrete};
}

/// The id (initial values, gradient stream) of a parameter of moe_models: embed 0,
/// norm 1, head 2, expert m 100 + m (`member_index` for the grouped one).
inline int moe_id(const std::string& name, std::int64_t member_index) {
  if (name == "embed") return 0;
  if (name == "norm") return 1;
  if (name == "head") return 2;
  if (name == "experts") return 100 + static_cast<int>(member_index);
  return 100 + std::stoi(name.substr(8));
}

/// A grouped weight registered as one tensor and as G tensors: after 10 steps every
/// member's MXFP8 data and scales are identical (blocks never straddle members), with
/// and without gradient accumulation across microbatches. Grid gradients depend on a
/// member id, not on the registration (clipping off: the norm's summation order follows
/// the layout).
inline void case_grouped_vs_discrete(Backend b, int microbatches, ParamFormat format = ParamFormat::Mxfp8) {
  // NVFP4: an odd member numel (153), so that rank boundaries fall mid-byte inside
  // members at 2, 3 and 4 ranks (count_odd_boundaries).
  const int G = format == ParamFormat::Nvfp4 ? 6 : 4;
  const Shape member = format == ParamFormat::Nvfp4 ? Shape{17, 9} : Shape{35, 24};
  const auto [grouped, discrete] = moe_models(G, member);
  DistributedAdamOptions o = mx_options(DType::bf16, format);
  o.bucket_numel = 1000;
  o.microbatches = microbatches;
  o.clip_max_norm = 0.0f;  // the two layouts sum the norm in different orders
  Communicator comm = make_comm(b);
  DistributedAdam og(comm, grouped, o), od(comm, discrete, o);
  TestStream sg(b), sd(b);
  const std::int64_t mn = numel(member);
  auto id_of = moe_id;
  auto init = [&](DistributedAdam& opt) {
    write_master(opt, [&](int i, std::int64_t e) {
      const ParamSpec& sp = opt.layout().specs()[static_cast<std::size_t>(i)];
      const bool grp = sp.name == "experts";
      return mx_init_value(id_of(sp.name, grp ? e / mn : 0), grp ? e % mn : e, sp.shape.back());
    });
  };
  init(og);
  init(od);
  og.init_from_master(sg.get());
  od.init_from_master(sd.get());
  auto targets = [&](DistributedAdam& opt) {
    std::vector<GradTarget> t;
    for (int i = 0; i < opt.num_params(); ++i) {
      const std::string& name = opt.layout().specs()[static_cast<std::size_t>(i)].name;
      if (name == "experts") {
        for (int m = 0; m < G; ++m) {
          const GradView g = opt.member_grad(i, m);
          t.push_back(GradTarget{g.data, g.numel(), id_of(name, m), g.dtype});
        }
      } else {
        const GradView g = opt.grad(i);
        t.push_back(GradTarget{g.data, g.numel(), id_of(name, 0), g.dtype});
      }
    }
    return t;
  };
  const auto tg = targets(og), td = targets(od);
  for (int t = 0; t < 10; ++t) {
    for (auto [opt, st, tt] : {std::make_tuple(&og, sg.get(), &tg), std::make_tuple(&od, sd.get(), &td)}) {
      for (int mb = 0; mb < microbatches; ++mb) {
        const bool last = mb == microbatches - 1;
        opt->set_grad_sync(last);
        GradStreamParams p;
        p.kind = GradKind::Grid;
        p.rank = world_rank();
        p.scalars = opt->device_scalars();
        p.microbatch = opt->device_microbatch();
        add_grads(b, st, p, *tt);
        if (last) report_all(*opt, st);
        opt->set_grad_sync(true);
        opt->advance_microbatch(st);
      }
      opt->step(st);
      opt->zero_grad(st);
    }
  }
  sg.sync();
  sd.sync();
  const int ex = og.param_index("experts");
  for (int m = 0; m < G; ++m) {
    SCOPED_TRACE("member " + std::to_string(m));
    const QPlanes qg = member_q(og, ex, m), qd = read_q(od, od.param_index("experts." + std::to_string(m)));
    EXPECT_TRUE(qg == qd) << differing_planes(qg, qd);
  }
  EXPECT_EQ(format == ParamFormat::Nvfp4 ? og.nvfp4_param(ex).members : og.mxfp8_param(ex).shape.members, G);
  if (format == ParamFormat::Nvfp4 && world_size() > 1) {
    EXPECT_GT(count_odd_boundaries(og), 0);
  }
  for (const char* name : {"embed", "head"}) EXPECT_TRUE(read_q(og, og.param_index(name)) == read_q(od, od.param_index(name))) << name;
  EXPECT_EQ(read_bytes(b, og.param(og.param_index("norm"))), read_bytes(b, od.param(od.param_index("norm"))));
  const StepScalars x = og.read_scalars(sg.get());
  EXPECT_EQ(x.step, 10);
  expect_matches_oracle(og, "grouped");
}

// ------------------------------------------------------------------ memory

/// MXFP8 parameters have no param buffer: MemoryReport::params counts the native (f32)
/// buffer only; MemoryReport::mxfp8 is, per MXFP8 bucket, 2 bytes per bucket element (its
/// two gather planes, padding included: issue 29) plus the scale bytes (each plane and
/// scale tensor rounded up to 16 bytes: exact for sizes that are multiples of 16).
inline void case_mx_memory(Backend b) {
  const int world = world_size();
  auto piece = [](std::int64_t n) { return (n + 15) / 16 * 16; };
  for (DType g : {DType::bf16, DType::f32}) {
    for (bool round_shapes : {false, true}) {
      std::vector<ParamSpec> specs = mx_model();
      if (round_shapes)
        specs = {ParamSpec::tensor("embed", {256, 128}), ParamSpec::tensor("norm", {128}, DType::bf16, "no_decay"),
                 ParamSpec::grouped("experts", 4, {64, 96}), ParamSpec::tensor("head", {256, 128})};
      DistributedAdamOptions o = mx_options(g);
      o.nccl_registered = false;
      DistributedAdam opt(make_comm(b), specs, o);
      const Layout& L = opt.layout();
      std::int64_t native_numel = 0, mx_bytes = 0, mx_exact = 0;
      for (const auto& buf : L.buffers())
        if (buf.dtype == DType::f32) native_numel += buf.numel;
      for (const Bucket& bk : L.buckets())
        if (opt.is_mxfp8(bk.params.front())) {
          mx_bytes += 2 * piece(bk.range.size());
          mx_exact += 2 * bk.range.size();
        }
      for (int i = 0; i < opt.num_params(); ++i) {
        if (!opt.is_mxfp8(i)) continue;
        const Mxfp8Shape s = Mxfp8Shape::of(L.specs()[static_cast<std::size_t>(i)]);
        mx_bytes += piece(s.scale_row_numel()) + piece(s.scale_col_numel());
        mx_exact += s.scale_row_numel() + s.scale_col_numel();
      }
      const MemoryReport r = opt.memory();
      const std::int64_t n = L.total_numel();
      EXPECT_EQ(r.params, 4 * native_numel) << "no param allocation for the MXFP8 buffer";
      EXPECT_EQ(r.mxfp8, mx_bytes);
      if (round_shapes) { EXPECT_EQ(r.mxfp8, mx_exact) << "2 bytes per bucket element + scales"; }
      EXPECT_EQ(r.grads, static_cast<std::int64_t>(size_of(g)) * n);
      EXPECT_EQ(r.master, 4 * n / world);
      EXPECT_EQ(r.moments, 8 * n / world);
      EXPECT_EQ(r.total(), r.params + r.grads + r.master + r.moments + r.mxfp8 + r.nccl_overhead);
    }
  }
}

// ------------------------------------------------------------------ graph

/// StepGraph capture + replay of iterations with MXFP8 parameters (Adam, phases 1-2, the
/// scale all-reduce, the all-gather into the gradient buffer, landing and zeroing all
/// inside the step graph) equals eager iterations bitwise; the captured step leaves
/// every bucket Idle.
inline void case_mx_graph_equals_eager(Backend b, int microbatches, int iterations, bool one_graph, bool deferred,
                                       ParamFormat format = ParamFormat::Mxfp8) {
  const int rank = world_rank();
  DistributedAdamOptions o = mx_options(DType::bf16, format);
  o.microbatches = microbatches;
  o.clip_max_norm = 0.05f;
  o.overlap_param_gather = deferred;
  o.gather_pipeline = 2;
  Communicator comm = make_comm(b);
  DistributedAdam eager(comm, q_model(format), o), graphed(comm, q_model(format), o);
  TestStream se(b), sg(b);
  mx_init(eager, se.get());
  mx_init(graphed, sg.get());
  auto make_fn = [rank, b](DistributedAdam& opt) {
    return random_grads_fn(opt, b, rank, [&opt](Stream s) { wait_all(opt, s); });  // the forward reads the weights
  };
  StepGraphOptions go;
  go.warmup_iterations = 1;
  go.one_graph = one_graph;
  StepGraph ge(eager, make_fn(eager));
  StepGraph gg(graphed, make_fn(graphed), go);
  gg.capture(sg.get());
  const int nb = static_cast<int>(graphed.layout().buckets().size());
  for (int k = 0; k < nb; ++k) EXPECT_EQ(graphed.gather_state(k), GatherState::Idle) << "after capture, bucket " << k;
  for (int it = 1; it < iterations; ++it) gg.replay(sg.get());
  for (int it = 0; it < iterations; ++it) ge.run_eager(se.get());
  wait_all(eager, se.get());
  se.sync();
  sg.sync();
  const StepScalars x = graphed.read_scalars(sg.get()), y = eager.read_scalars(se.get());
  EXPECT_EQ(x.step, iterations);
  EXPECT_EQ(y.step, iterations);
  EXPECT_LT(x.clip_coef, 1.0f) << "clipping must be active";
  EXPECT_EQ(num::f32_bits(x.grad_norm), num::f32_bits(y.grad_norm));
  expect_same_mx_state(eager, graphed);
  expect_matches_oracle(graphed, "replayed");
  expect_mx_grads_zero(graphed);
}

/// Issue 29, "the two-rank MXFP8 step gathers straight into its storage": at two or more
/// ranks every MXFP8 bucket is all-gathered in place in the storage (its two gather
/// planes), so neither init_from_master nor a step lands a byte (detail::landed_bytes,
/// the landing copies asked for), the storage equals the oracle's, the step leaves the
/// MXFP8 parameters' gradients as the backward and the reduce-scatter left them, and
/// zero_grad zeroes them, as native ones.
inline void case_step_gathers_into_storage(Backend b) {
  if (world_size() < 2) GTEST_SKIP() << "the two-rank path";
  DistributedAdam opt(make_comm(b), q_model(ParamFormat::Mxfp8), mx_options(DType::bf16));
  TestStream s(b);
  std::int64_t before = detail::landed_bytes();
  mx_init(opt, s.get());
  s.sync();
  EXPECT_EQ(detail::landed_bytes() - before, 0) << "init_from_master landed bytes";
  expect_matches_oracle(opt, "after init_from_master");
  for (int step = 0; step < 2; ++step) {
    mx_backward(opt, b, s.get(), GradKind::Random);
    opt.reduce_grads(s.get());
    s.sync();
    const auto reduced = quantized_grad_bytes(opt);
    std::int64_t nonzero = 0;
    for (const auto& g : reduced)
      for (std::uint8_t x : g) nonzero += x != 0 ? 1 : 0;
    ASSERT_GT(nonzero, 0) << "zero gradients: the case proves nothing";
    before = detail::landed_bytes();
    opt.step(s.get());
    s.sync();
    EXPECT_EQ(detail::landed_bytes() - before, 0) << "step " << step << " landed bytes";
    EXPECT_TRUE(quantized_grad_bytes(opt) == reduced) << "step " << step << " wrote the MXFP8 gradients";
    expect_matches_oracle(opt, "after step " + std::to_string(step));
    opt.zero_grad(s.get());
    s.sync();
    expect_mx_grads_zero(opt);
  }
}

/// Issue 29, a fair iteration: NVFP4's landing leaves its gradient regions zero, so the
/// zero_grad that StepGraph runs right behind the step (step_and_zero_grad) clears only
/// the other buffers' gradients, while a zero_grad called on its own still clears
/// everything (a backward may have written the regions since). MXFP8 gathers in place
/// and never writes its gradient regions, so that zero_grad clears them too, as native
/// ones: every byte. Observed through the count of bytes zero_grad enqueues
/// (optimizer/grad_zeroing.hpp) and, after every iteration, every gradient zero and the
/// storage the oracle's.
inline void case_zero_grad_skips_landed(Backend b, ParamFormat format = ParamFormat::Mxfp8) {
  const int rank = world_rank();
  DistributedAdamOptions o = mx_options(DType::bf16, format);
  DistributedAdam opt(make_comm(b), q_model(format), o);
  TestStream s(b);
  mx_init(opt, s.get());
  const Layout& L = opt.layout();
  std::int64_t all = 0, native = 0;  // gradient bytes of every buffer / of the native ones
  for (const BufferLayout& buf : L.buffers()) {
    const std::int64_t bytes = buf.numel * static_cast<std::int64_t>(size_of(DType::bf16));
    all += bytes;
    bool quantized = false;
    for (int p : buf.params) quantized = quantized || is_quantized(opt, p);
    if (!quantized) native += bytes;
  }
  ASSERT_GT(native, 0) << "the model must have a native buffer";
  ASSERT_LT(native, all) << "the model must have a quantized buffer";
  const std::int64_t behind_step = format == ParamFormat::Mxfp8 ? all : native;  // what that zero_grad clears
  auto expect_all_grads_zero = [&](const std::string& when) {
    for (int i = 0; i < opt.num_params(); ++i)
      for (float x : read_f32(b, opt.grad(i)))
        ASSERT_EQ(num::f32_bits(x), 0u) << when << ": " << L.specs()[static_cast<std::size_t>(i)].name;
  };
  StepGraph g(opt, random_grads_fn(opt, b, rank));
  for (int it = 0; it < 2; ++it) {  // eager iterations: backward, step, zero_grad behind it
    const std::int64_t before = detail::zero_grad_bytes();
    g.run_eager(s.get());
    s.sync();
    EXPECT_EQ(detail::zero_grad_bytes() - before, behind_step) << "iteration " << it << ": the zero_grad behind the step";
    expect_all_grads_zero("after iteration " + std::to_string(it));
    expect_matches_oracle(opt, "after iteration " + std::to_string(it));
  }
  // zero_grad on its own: a backward may have written the quantized regions since the
  // step (here it did, with grad sync off: no reduce starts), so every byte is cleared.
  opt.set_grad_sync(false);
  mx_backward(opt, b, s.get(), GradKind::Grid);
  opt.set_grad_sync(true);
  const std::int64_t before = detail::zero_grad_bytes();
  opt.zero_grad(s.get());
  s.sync();
  EXPECT_EQ(detail::zero_grad_bytes() - before, all) << "a zero_grad on its own must clear every buffer";
  expect_all_grads_zero("after zero_grad");
  // Captured: the graph's zero_grad clears the same bytes, and replays keep every
  // gradient zero between iterations (the oracle sees no stale gradient).
  const std::int64_t at_capture = detail::zero_grad_bytes();
  g.capture(s.get());
  EXPECT_EQ(detail::zero_grad_bytes() - at_capture, 2 * behind_step)  // the warm-up iteration and the captured one
      << "capture's zero_grad";
  for (int it = 0; it < 2; ++it) g.replay(s.get());
  s.sync();
  expect_all_grads_zero("after replays");
  expect_matches_oracle(opt, "after replays");
}

// ------------------------------------------------------------------ native init_from_master

/// init_from_master in Native mode: params become the master rounded to their dtype,
/// on every rank, and training from there equals training from init_params bitwise.
inline void case_native_init_from_master(Backend b) {
  DistributedAdamOptions o = base_options(DType::bf16);
  Communicator comm = make_comm(b);
  DistributedAdam a(comm, small_model(), o), c(comm, small_model(), o);
  TestStream s(b), sc(b);
  init_params(a, s.get());
  write_master(c, [](int i, std::int64_t e) { return init_value(i, e); });
  c.init_from_master(sc.get());
  sc.sync();
  for (int i = 0; i < c.num_params(); ++i) {
    const ParamView v = c.param(i);
    const auto got = read_bytes(b, v);
    for (std::int64_t j = 0; j < v.numel(); ++j) {
      const std::uint32_t want = num::encode(v.dtype, init_value(i, j));
      std::uint32_t code = 0;
      std::memcpy(&code, got.data() + static_cast<std::size_t>(j) * size_of(v.dtype), size_of(v.dtype));
      ASSERT_EQ(code, want) << "param " << i << " element " << j;
    }
  }
  for (int t = 0; t < 3; ++t)
    for (auto [opt, st] : {std::make_pair(&a, s.get()), std::make_pair(&c, sc.get())}) {
      GradStreamParams p;
      p.kind = GradKind::Random;
      p.rank = world_rank();
      p.scalars = opt->device_scalars();
      add_grads(b, st, p, grad_targets(*opt));
      report_all(*opt, st);
      opt->step(st);
      opt->zero_grad(st);
    }
  expect_same_state(a, c, s.get(), sc.get());
}

}  // namespace shardopt::test
