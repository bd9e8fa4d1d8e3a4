// test_mxfp8_common.hpp - test data and the sharded-protocol simulation, shared by the
// host suite (test/unit/test_mxfp8*.cpp) and the GPU suite (test/gpu/test_mxfp8*.cpp).
// The expected bytes always come from the oracle in test_mxfp8_reference.hpp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/mxfp8/mxfp8_shard_calls.hpp"
#include "shardopt/mxfp8.hpp"
#include "unit/test_mxfp8_reference.hpp"

namespace mxfp8_test {

inline constexpr std::uint8_t kPoison = 0xA5;

inline float f32_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// Random bf16 weights: normal values times 2^k with k drawn per row in [kmin, kmax]
/// (so that many scale bytes occur), plus a fraction of raw random finite patterns.
inline std::vector<std::uint16_t> random_bf16(std::int64_t n, std::int64_t cols, std::uint32_t seed, int kmin = -30,
                                              int kmax = 30, double raw_fraction = 0.02) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> k(kmin, kmax);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<std::uint16_t> out(static_cast<std::size_t>(n));
  int shift = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (i % cols == 0) shift = k(rng);
    if (u(rng) < raw_fraction) {
      std::uint16_t h;
      do h = static_cast<std::uint16_t>(rng()); while ((h & 0x7F80) == 0x7F80);
      out[static_cast<std::size_t>(i)] = h;
    } else {
      out[static_cast<std::size_t>(i)] = mxfp8_ref::to_bf16(std::ldexp(normal(rng), shift));
    }
  }
  return out;
}

/// Fast random bf16 patterns for large tensors: per row a base exponent, per element an
/// exponent up to 7 below it, random mantissa and sign; `special` of the elements are
/// zeros, subnormals, +-Inf or NaN.
inline std::vector<std::uint16_t> fast_random_bf16(std::int64_t n, std::int64_t cols, std::uint64_t seed,
                                                   double special = 0.0) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint16_t> out(static_cast<std::size_t>(n));
  int base = 127;
  const auto threshold = static_cast<std::uint64_t>(special * 65536.0);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t r = rng();
    if (i % cols == 0) base = 20 + static_cast<int>(r % 220);
    const int exp = std::max(1, base - static_cast<int>((r >> 8) % 8));
    std::uint16_t h = static_cast<std::uint16_t>(((r >> 16) & 0x8000) | (exp << 7) | ((r >> 32) & 0x7F));
    if ((r >> 40 & 0xFFFF) < threshold) {
      static constexpr std::uint16_t kSpecial[] = {0x0000, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80, 0x7FC0, 0xFFFF};
      h = kSpecial[(r >> 56) % 8];
    }
    out[static_cast<std::size_t>(i)] = h;
  }
  return out;
}

/// Random fp32 master values (normal times 2^k per row) with specials sprinkled in:
/// NaN, +-Inf, +-0, values that sit exactly on a bf16 rounding tie, values that round
/// up across 1.75 * 2^k (a scale boundary) once rounded to bf16.
inline std::vector<float> random_master(std::int64_t n, std::int64_t cols, std::uint32_t seed,
                                        double special_fraction = 0.01, bool nonfinite = true) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> k(-20, 20);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<float> out(static_cast<std::size_t>(n));
  int shift = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (i % cols == 0) shift = k(rng);
    float v = std::ldexp(normal(rng), shift);
    if (u(rng) < special_fraction) {
      switch (rng() % 7) {
        case 0: v = nonfinite ? std::numeric_limits<float>::quiet_NaN() : 0.0f; break;
        case 1: v = nonfinite ? std::numeric_limits<float>::infinity() : 1.0f; break;
        case 2: v = nonfinite ? -std::numeric_limits<float>::infinity() : -1.0f; break;
        case 3: v = -0.0f; break;
        case 4: v = f32_of((bits_of(v) & 0xFFFF0000u) | 0x8000u); break;  // a bf16 tie
        case 5: v = std::ldexp(f32_of(0x3FE08001u), shift + 3); break;  // just above the tie: bf16 1.7578125
        default: v = std::ldexp(f32_of(0x3FE07FFFu), shift + 3); break; // just below it: bf16 1.75
      }
    }
    out[static_cast<std::size_t>(i)] = v;
  }
  return out;
}

/// bf16(master) with the oracle's rounding.
inline std::vector<std::uint16_t> to_bf16(const std::vector<float>& master) {
  std::vector<std::uint16_t> out(master.size());
  for (std::size_t i = 0; i < master.size(); ++i) out[i] = mxfp8_ref::to_bf16(master[i]);
  return out;
}

inline mxfp8_ref::Quantized reference(const shardopt::Mxfp8Shape& s, const std::vector<std::uint16_t>& x) {
  return mxfp8_ref::quantize(s.members, s.rows, s.cols, x);
}

/// Poisoned output buffers of a shape, on the host.
inline mxfp8_ref::Quantized poisoned(const shardopt::Mxfp8Shape& s) {
  mxfp8_ref::Quantized q;
  q.data_row.assign(static_cast<std::size_t>(s.numel()), kPoison);
  q.data_col.assign(static_cast<std::size_t>(s.numel()), kPoison);
  q.scale_row.assign(static_cast<std::size_t>(s.scale_row_numel()), kPoison);
  q.scale_col.assign(static_cast<std::size_t>(s.scale_col_numel()), kPoison);
  return q;
}

/// First index where two byte vectors differ, for messages.
inline std::string first_diff(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  if (a.size() != b.size()) return "sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "first difference at %zu: 0x%02x vs 0x%02x", i, a[i], b[i]);
      return buf;
    }
  return "equal";
}

/// Rank boundaries as text, for messages: "{0,17,40}".
inline std::string bounds_str(const std::vector<std::int64_t>& b) {
  std::string s = "{";
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(b[i]);
  }
  return s + "}";
}

/// Rank boundaries 0 = b0 <= b1 <= ... <= bW = numel: an even split moved by `shift`.
inline std::vector<std::int64_t> even_bounds(std::int64_t numel, int world, std::int64_t shift) {
  std::vector<std::int64_t> b(static_cast<std::size_t>(world) + 1);
  for (int r = 0; r <= world; ++r) {
    std::int64_t v = numel * r / world;
    if (r != 0 && r != world) v = std::clamp<std::int64_t>(v + shift, 0, numel);
    b[static_cast<std::size_t>(r)] = v;
  }
  std::sort(b.begin(), b.end());
  return b;
}

/// Random boundaries (empty shards and shards smaller than a block included).
inline std::vector<std::int64_t> random_bounds(std::int64_t numel, int world, std::mt19937& rng) {
  std::vector<std::int64_t> b{0, numel};
  std::uniform_int_distribution<std::int64_t> pos(0, numel);
  for (int r = 1; r < world; ++r) b.push_back(pos(rng));
  std::sort(b.begin(), b.end());
  return b;
}

/// The collective the integrator runs between the two phases: element-wise max over
/// the ranks' buffers (Communicator::all_reduce(..., ReduceOp::Max)).
template <class T>
std::vector<T> all_reduce_max(const std::vector<std::vector<T>>& per_rank) {
  std::vector<T> out = per_rank.front();
  for (const auto& v : per_rank)
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::max(out[i], v[i]);
  return out;
}

}  // namespace mxfp8_test

// ---------------------------------------------------------------------------------
// Running on either backend (Backend::Host: host memory; Backend::Cuda: device memory).

#include "common/device_copy.hpp"
#include "core/memory.hpp"

namespace mxfp8_test {

template <class T>
shardopt::DeviceBuffer upload(shardopt::Backend b, const std::vector<T>& v) {
  shardopt::DeviceBuffer d(b, v.size() * sizeof(T));
  shardopt::test::from_host(b, d.data(), v);
  return d;
}

template <class T>
std::vector<T> download(shardopt::Backend b, const shardopt::DeviceBuffer& d, std::size_t n) {
  return shardopt::test::to_host<T>(b, d.data(), n);
}

/// Device copies of the four outputs of a shape, poisoned.
struct DevicePlanes {
  shardopt::DeviceBuffer data_row, scale_row, data_col, scale_col;
  DevicePlanes(shardopt::Backend b, const shardopt::Mxfp8Shape& s) {
    const mxfp8_ref::Quantized p = poisoned(s);
    data_row = upload(b, p.data_row);
    scale_row = upload(b, p.scale_row);
    data_col = upload(b, p.data_col);
    scale_col = upload(b, p.scale_col);
  }
  shardopt::Mxfp8Planes planes() const {
    return {data_row.as<std::uint8_t>(), scale_row.as<std::uint8_t>(), data_col.as<std::uint8_t>(),
            scale_col.as<std::uint8_t>()};
  }
  mxfp8_ref::Quantized get(shardopt::Backend b, const shardopt::Mxfp8Shape& s) const {
    return {download<std::uint8_t>(b, data_row, static_cast<std::size_t>(s.numel())),
            download<std::uint8_t>(b, scale_row, static_cast<std::size_t>(s.scale_row_numel())),
            download<std::uint8_t>(b, data_col, static_cast<std::size_t>(s.numel())),
            download<std::uint8_t>(b, scale_col, static_cast<std::size_t>(s.scale_col_numel()))};
  }
};

/// Whole-tensor quantization on a backend.
inline mxfp8_ref::Quantized quantize_on(shardopt::Backend b, const shardopt::Mxfp8Shape& s,
                                        const std::vector<std::uint16_t>& x) {
  const shardopt::DeviceBuffer src = upload(b, x);
  DevicePlanes out(b, s);
  shardopt::quantize_mxfp8(s, src.as<std::uint16_t>(), out.planes(), nullptr, b, nullptr);
  return out.get(b, s);
}

/// The exchange of the sharded protocol (see shardopt/mxfp8.hpp).
enum class Scheme {
  ScaleMax,  ///< (A) partial scale bytes, Max all-reduce of the scale tensors
  AmaxMax,   ///< (B) partial u32 amaxes, Max all-reduce of the amax buffers
};

inline const char* to_string(Scheme s) { return s == Scheme::ScaleMax ? "scale-max" : "amax-max"; }

/// Simulates W ranks (bounds: W + 1 increasing offsets from 0 to numel) running the
/// sharded protocol on backend `b`: phase 1 on every rank, the Max all-reduce, phase 2 on
/// every rank into its own poisoned outputs. Returns the scales and the data assembled
/// from each rank's range; appends to `problems` whatever a rank wrote outside its range
/// or a scale tensor that differs between ranks.
inline mxfp8_ref::Quantized simulate(shardopt::Backend b, Scheme scheme, const shardopt::Mxfp8Shape& s,
                                     const std::vector<float>& master, const std::vector<std::int64_t>& bounds,
                                     std::string* problems) {
  using namespace shardopt;
  const int world = static_cast<int>(bounds.size()) - 1;
  const auto nr = static_cast<std::size_t>(s.scale_row_numel()), nc = static_cast<std::size_t>(s.scale_col_numel());
  const auto n = static_cast<std::size_t>(s.numel());
  const DeviceBuffer master_dev = upload(b, master);
  auto range_of = [&](int r) { return Range{bounds[static_cast<std::size_t>(r)], bounds[static_cast<std::size_t>(r) + 1]}; };
  auto shard_of = [&](int r) { return master_dev.as<float>() + bounds[static_cast<std::size_t>(r)]; };

  mxfp8_ref::Quantized out;
  out.data_row.assign(n, kPoison);
  out.data_col.assign(n, kPoison);
  DeviceBuffer combined_row, combined_col;  // what every rank holds after the all-reduce
  if (scheme == Scheme::ScaleMax) {
    std::vector<std::vector<std::uint8_t>> rows(static_cast<std::size_t>(world)), cols(rows.size());
    for (int r = 0; r < world; ++r) {
      DevicePlanes p(b, s);
      mxfp8_partial_scales(s, range_of(r), shard_of(r), p.scale_row.as<std::uint8_t>(), p.scale_col.as<std::uint8_t>(), b,
                           nullptr);
      rows[static_cast<std::size_t>(r)] = download<std::uint8_t>(b, p.scale_row, nr);
      cols[static_cast<std::size_t>(r)] = download<std::uint8_t>(b, p.scale_col, nc);
    }
    out.scale_row = all_reduce_max(rows);
    out.scale_col = all_reduce_max(cols);
    combined_row = upload(b, out.scale_row);
    combined_col = upload(b, out.scale_col);
  } else {
    std::vector<std::vector<std::uint32_t>> rows(static_cast<std::size_t>(world)), cols(rows.size());
    for (int r = 0; r < world; ++r) {
      const DeviceBuffer ar = upload(b, std::vector<std::uint32_t>(nr, 0xA5A5A5A5u));
      const DeviceBuffer ac = upload(b, std::vector<std::uint32_t>(nc, 0xA5A5A5A5u));
      mxfp8_partial_amax(s, range_of(r), shard_of(r), ar.as<std::uint32_t>(), ac.as<std::uint32_t>(), b, nullptr);
      rows[static_cast<std::size_t>(r)] = download<std::uint32_t>(b, ar, nr);
      cols[static_cast<std::size_t>(r)] = download<std::uint32_t>(b, ac, nc);
    }
    combined_row = upload(b, all_reduce_max(rows));
    combined_col = upload(b, all_reduce_max(cols));
  }
  for (int r = 0; r < world; ++r) {
    const Range range = range_of(r);
    DevicePlanes p(b, s);
    if (scheme == Scheme::ScaleMax) {
      quantize_mxfp8_shard_data(s, range, shard_of(r), combined_row.as<std::uint8_t>(), combined_col.as<std::uint8_t>(),
                                p.data_row.as<std::uint8_t>(), p.data_col.as<std::uint8_t>(), b, nullptr);
    } else {
      quantize_mxfp8_shard(s, range, shard_of(r), combined_row.as<std::uint32_t>(), combined_col.as<std::uint32_t>(),
                           p.planes(), b, nullptr);
    }
    const mxfp8_ref::Quantized q = p.get(b, s);
    if (scheme == Scheme::AmaxMax) {
      if (r == 0) {
        out.scale_row = q.scale_row;
        out.scale_col = q.scale_col;
      } else if (q.scale_row != out.scale_row || q.scale_col != out.scale_col) {
        *problems += "rank " + std::to_string(r) + " computed other scales than rank 0; ";
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      const bool mine = static_cast<std::int64_t>(i) >= range.begin && static_cast<std::int64_t>(i) < range.end;
      if (mine) {
        out.data_row[i] = q.data_row[i];
        out.data_col[i] = q.data_col[i];
      } else if (q.data_row[i] != kPoison || q.data_col[i] != kPoison) {
        *problems += "rank " + std::to_string(r) + " wrote element " + std::to_string(i) + " outside [" +
                     std::to_string(range.begin) + ", " + std::to_string(range.end) + "); ";
        break;
      }
    }
  }
  return out;
}

/// Runs both schemes (simulate on backend `b`) and compares with the oracle's `want`;
/// returns false after the first failure (reported with the shape and the bounds).
inline bool check_sharding(shardopt::Backend b, const shardopt::Mxfp8Shape& s, const std::vector<float>& master,
                           const mxfp8_ref::Quantized& want, const std::vector<std::int64_t>& bounds) {
  for (Scheme scheme : {Scheme::ScaleMax, Scheme::AmaxMax}) {
    std::string problems;
    const mxfp8_ref::Quantized got = simulate(b, scheme, s, master, bounds, &problems);
    const bool ok = problems.empty() && got == want;
    EXPECT_TRUE(ok) << s.members << "x" << s.rows << "x" << s.cols << " " << to_string(scheme) << " bounds "
                    << bounds_str(bounds) << ": " << problems
                    << (got.data_row != want.data_row ? "data_row differs; " : "")
                    << (got.data_col != want.data_col ? "data_col differs; " : "")
                    << (got.scale_row != want.scale_row ? "scale_row differs; " : "")
                    << (got.scale_col != want.scale_col ? "scale_col differs; " : "");
    if (!ok) return false;
  }
  return true;
}

}  // namespace mxfp8_test
