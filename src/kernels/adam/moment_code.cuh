// moment_code.cuh - the 8-bit codes of block-quantized Adam moments (DType::q8_block),
// shared by the CUDA kernels and their host twins so that both round identically
// (docs/state_precision.md, "8-bit moments").
//
// A moment array is cut into blocks of kMomentBlock elements of one parameter; each
// block keeps one fp32 scale and one byte per element:
//   first moment m:   scale = max |m| over the block; byte = sign bit | 7-bit index k
//                     into kMomentMaps.first (128 magnitudes), the one nearest |m| / scale;
//                     m = +-first[k] * scale.
//   second moment v:  kept as its square root r = sqrt(v) (Adam divides by sqrt(v)):
//                     scale = max r over the block; byte = index k into
//                     kMomentMaps.second (256 magnitudes) nearest r / scale;
//                     v = (second[k] * scale)^2.
// Both maps are dynamic (Dettmers 2016): decades 10^-6..1 of [0.1, 1), each split into
// equal intervals whose midpoints are the codes, twice as many per decade up to 1; plus
// 0 and 1 exactly (so that a block's largest element and zero are exact).
#pragma once

#include <cmath>
#include <cstdint>

#include "shardopt/fused_adam.hpp"
#include "shardopt/numerics.hpp"

namespace shardopt::kernels {

/// The two maps, ascending; entry 0 is 0, the last is 1.
struct MomentMaps {
  float first[128];   ///< magnitudes of the first moment: 0, decades 10^-5..1 (2^e codes in decade e), 1
  float second[256];  ///< square roots of the second moment: 0, decades 10^-6..1 (2^(e+1) codes), 1
};

/// Builds the maps in double, each entry rounded once to float (the same IEEE operations
/// wherever it is evaluated: the compiler computes it).
constexpr MomentMaps make_moment_maps() {
  constexpr double kDecade[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  MomentMaps maps{};
  int i = 0;
  maps.first[i++] = 0.0f;
  for (int e = 1; e <= 6; ++e) {
    const int n = 1 << e;
    for (int k = 0; k < n; ++k) maps.first[i++] = static_cast<float>(kDecade[e] * (0.1 + 0.9 * ((k + 0.5) / n)));
  }
  maps.first[i] = 1.0f;
  int j = 0;
  maps.second[j++] = 0.0f;
  for (int e = 0; e <= 6; ++e) {
    const int n = 2 << e;
    for (int k = 0; k < n; ++k) maps.second[j++] = static_cast<float>(kDecade[e] * (0.1 + 0.9 * ((k + 0.5) / n)));
  }
  maps.second[j] = 1.0f;
  return maps;
}

/// The maps of the host twins (the CUDA kernels keep a __constant__ copy of the same value).
inline constexpr MomentMaps kMomentMaps = make_moment_maps();

/// Index of the entry of `map` (n ascending entries, map[0] = 0, map[n-1] = 1) nearest to
/// a: the largest i with map[i] <= a, or i + 1 when map[i + 1] - a < a - map[i] (an exact
/// tie goes to the smaller magnitude). a <= 0 and NaN give 0; a >= 1 gives n - 1.
SHARDOPT_HD int nearest_code(const float* map, int n, float a) {
  if (!(a > 0.0f)) return 0;
  if (a >= map[n - 1]) return n - 1;
  int lo = 0, hi = n - 1;  // map[lo] <= a < map[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (map[mid] <= a) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return map[hi] - a < a - map[lo] ? hi : lo;
}

/// nearest_code of a map of kMomentMaps' shape, found from a guess instead of a binary
/// search: the decade of a by comparisons with its bounds, its interval by one multiply,
/// then a walk to the largest entry <= a (a step or two) and the same choice between it
/// and the next. The same index as nearest_code for every a (the walk ends where the
/// search does), in a few reads of the map instead of log2(n). `second`: which map (the
/// first's decades are e = 1..6 with 2^e codes, the second's e = 0..6 with 2^(e+1)).
SHARDOPT_HD int nearest_code_guessed(const float* map, int n, float a, bool second) {
  if (!(a > 0.0f)) return 0;
  if (a >= map[n - 1]) return n - 1;
  // Decade e holds [10^(e-7), 10^(e-6)); its codes start at index 2^e - 1 (first map) or
  // 2^(e+1) - 1 (second map) and number 2^e or 2^(e+1).
  int e = 0;
  float top = 1e-6f;  // 10^(e-6), the decade's upper end
  if (a >= 1e-6f) e = 1, top = 1e-5f;
  if (a >= 1e-5f) e = 2, top = 1e-4f;
  if (a >= 1e-4f) e = 3, top = 1e-3f;
  if (a >= 1e-3f) e = 4, top = 1e-2f;
  if (a >= 1e-2f) e = 5, top = 1e-1f;
  if (a >= 1e-1f) e = 6, top = 1.0f;
  const int lowest = second ? 0 : 1;
  int g = 0;
  if (e >= lowest && a >= 0.1f * top) {
    const int count = second ? 2 << e : 1 << e;
    const float t = (a / top - 0.1f) * (static_cast<float>(count) / 0.9f);
    int k = static_cast<int>(t);
    k = k < 0 ? 0 : (k >= count ? count - 1 : k);
    g = count - 1 + k;
  }
  while (g + 1 < n && map[g + 1] <= a) ++g;
  while (g > 0 && map[g] > a) --g;
  return map[g + 1] - a < a - map[g] ? g + 1 : g;
}

/// The byte of first-moment value m in a block of scale `scale` (= the block's max |m|).
SHARDOPT_HD std::uint8_t encode_first_moment(const float* first, float m, float scale) {
  if (!(scale > 0.0f)) return 0;
  const int k = nearest_code_guessed(first, 128, fabsf(m) / scale, false);
  return static_cast<std::uint8_t>(k != 0 && std::signbit(m) ? (0x80 | k) : k);
}

/// The first-moment value of byte c in a block of scale `scale`.
SHARDOPT_HD float decode_first_moment(const float* first, std::uint8_t c, float scale) {
  const float x = first[c & 0x7F] * scale;
  return (c & 0x80) != 0 ? -x : x;
}

/// The byte of second-moment square root r = sqrtf(v) in a block of scale `scale` (= the
/// block's max r).
SHARDOPT_HD std::uint8_t encode_second_moment(const float* second, float r, float scale) {
  if (!(scale > 0.0f)) return 0;
  return static_cast<std::uint8_t>(nearest_code_guessed(second, 256, r / scale, true));
}

/// The second-moment value of byte c in a block of scale `scale`: (second[c] * scale)^2.
SHARDOPT_HD float decode_second_moment(const float* second, std::uint8_t c, float scale) {
  const float r = second[c] * scale;
  return r * r;
}

}  // namespace shardopt::kernels
