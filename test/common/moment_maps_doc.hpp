// moment_maps_doc.hpp - the 8-bit moment maps as docs/state_precision.md defines them,
// computed in double: the tests' oracle for kernels/adam/moment_code.cuh.
#pragma once

#include <cmath>
#include <vector>

namespace shardopt::test {

/// 0; per decade e (10^(e-6) x [0.1, 1)) n equal intervals, each coded by its midpoint; 1.
/// The first moment's 128 magnitudes (e = 1..6, 2^e codes), or the second moment's 256
/// square roots (`second`: e = 0..6, 2^(e+1) codes), ascending.
inline std::vector<double> doc_map(bool second) {
  std::vector<double> m{0.0};
  for (int e = second ? 0 : 1; e <= 6; ++e) {
    const int n = second ? 2 << e : 1 << e;
    for (int k = 0; k < n; ++k) m.push_back(std::pow(10.0, e - 6) * (0.1 + 0.9 * (k + 0.5) / n));
  }
  m.push_back(1.0);
  return m;
}

}  // namespace shardopt::test
