// fast_divide.hpp - division of integers below 2^31 by a divisor fixed at run time, as
// one 32 x 32 -> 64-bit multiply and one shift, on the host and in kernels.
//
// Granlund and Montgomery (1994), Theorem 4.2 with N = 31: for 2^(l-1) < d <= 2^l and
// m = ceil(2^(31 + l) / d), floor(n / d) = floor(n * m / 2^(31 + l)) for every
// 0 <= n < 2^31, because 2^(31 + l) <= m * d < 2^(31 + l) + 2^l; and m < 2^32.
#pragma once

#include <cstdint>

#include "shardopt/numerics.hpp"  // SHARDOPT_HD

namespace shardopt {

/// floor(n / d) for a divisor d >= 1 chosen at run time and dividends n < 2^31.
struct FastDivider {
  std::uint32_t magic = 0x80000000u;  ///< ceil(2^shift / d) (d = 1: 2^31)
  std::uint32_t shift = 31;           ///< 31 + ceil(log2(d))

  SHARDOPT_HD std::uint32_t divide(std::uint32_t n) const {
    return static_cast<std::uint32_t>((static_cast<std::uint64_t>(n) * magic) >> shift);
  }
};

/// The divider of d (1 <= d < 2^31; the caller checks).
inline FastDivider make_divider(std::uint32_t d) {
  std::uint32_t l = 0;
  while ((std::uint64_t{1} << l) < d) ++l;
  FastDivider f;
  f.shift = 31 + l;
  f.magic = static_cast<std::uint32_t>(((std::uint64_t{1} << f.shift) + d - 1) / d);
  return f;
}

}  // namespace shardopt
