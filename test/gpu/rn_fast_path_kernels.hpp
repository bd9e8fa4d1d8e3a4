// rn_fast_path_kernels.hpp - the fast paths of sqrtf and / without their branch
// (kernels/common/rn_fast_path.cuh) against the compiler's sqrtf and / on the device
// (implemented in rn_fast_path_kernels.cu, called from test_rn_fast_path_gpu.cpp).
#pragma once

#include <cstdint>

namespace rn_fast_path_test {

/// What a sweep found: inputs checked, results that differ from the IEEE operation where
/// the fast path says it is exact, `exact` flags that differ from the documented range,
/// and the first differing input's bits (a, and b for a division).
/// (The kernels count into it directly: the atomics' types.)
struct Sweep {
  unsigned long long checked = 0;
  unsigned long long wrong_results = 0;
  unsigned long long wrong_flags = 0;
  unsigned int first_a = 0xFFFFFFFFu, first_b = 0;  ///< first_a 0xFFFFFFFF: none
};

/// sqrt_rn_fast against sqrtf for every float whose bits lie in [lo, hi] (unsigned).
Sweep sqrt_sweep(std::uint32_t lo, std::uint32_t hi);

/// div_rn_fast against / for every divisor significand (2^23), each with `per_divisor`
/// dividends of random significand, both exponents random over [lo_exp, hi_exp]
/// (unbiased), signs of the dividend random, plus zero dividends.
Sweep div_sweep(int per_divisor, int lo_exp, int hi_exp, std::uint64_t seed);

}  // namespace rn_fast_path_test
