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

/// Where the nearest-code search starts: a float a in [2^-23, 1) is keyed by its exponent
/// and its top kStartBits mantissa bits (its bits >> kStartShift, less kStartKeyLow); the
/// key's entry is the largest map index whose value is <= the smallest float of that key.
/// At 7 bits a key spans 1/128 of a binade, which holds at most one entry of either map
/// (MomentCode.IndexedSearchEqualsTheSearch checks every key), so the search ends after
/// one step.
inline constexpr int kStartBits = 7;
inline constexpr int kStartShift = 23 - kStartBits;
inline constexpr std::uint32_t kStartKeyLow = 104u << kStartBits;  ///< biased exponent 104: 2^-23
inline constexpr int kStartKeys = (127 - 104) << kStartBits;        ///< 2944 keys, up to 1

/// The two maps, ascending; entry 0 is 0, the last is 1; and each map's start table.
struct MomentMaps {
  float first[128];   ///< magnitudes of the first moment: 0, decades 10^-5..1 (2^e codes in decade e), 1
  float second[256];  ///< square roots of the second moment: 0, decades 10^-6..1 (2^(e+1) codes), 1
  std::uint8_t first_start[kStartKeys];   ///< search starts in `first` (kStartBits)
  std::uint8_t second_start[kStartKeys];  ///< search starts in `second`
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
  // Start tables: the smallest float of key k is 2^(x - 127) (1 + f / 2^kStartBits) for
  // biased exponent x = 104 + k / 2^kStartBits and mantissa bits f = k mod 2^kStartBits,
  // exact in double; its entry is the largest index whose value is <= it.
  double binade = 1.0;
  for (int x = 127; x > 104; --x) binade /= 2.0;  // 2^-23
  int g1 = 0, g2 = 0;
  for (int k = 0; k < kStartKeys; ++k) {
    if (k > 0 && k % (1 << kStartBits) == 0) binade *= 2.0;
    const double low = binade * (1.0 + static_cast<double>(k % (1 << kStartBits)) / (1 << kStartBits));
    while (g1 + 1 < 128 && static_cast<double>(maps.first[g1 + 1]) <= low) ++g1;
    while (g2 + 1 < 256 && static_cast<double>(maps.second[g2 + 1]) <= low) ++g2;
    maps.first_start[k] = static_cast<std::uint8_t>(g1);
    maps.second_start[k] = static_cast<std::uint8_t>(g2);
  }
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

/// nearest_code of a map with a start table (MomentMaps): the table's entry for a's key,
/// one step up when the next entry is <= a too (a key's span holds at most one entry),
/// then nearest_code's choice between it and the next. The same index as nearest_code for
/// every a, in three reads and no loop (no divergence in a warp).
SHARDOPT_HD int nearest_code_indexed(const float* map, const std::uint8_t* start, int n, float a) {
  if (!(a > 0.0f)) return 0;
  if (a >= map[n - 1]) return n - 1;
  const std::uint32_t key = num::f32_bits(a) >> kStartShift;  // a < 1: key < 127 << kStartBits
  int g = key < kStartKeyLow ? 0 : start[key - kStartKeyLow];
  g += map[g + 1] <= a ? 1 : 0;  // g + 1 <= n - 1: map[n - 1] = 1 > a
  return map[g + 1] - a < a - map[g] ? g + 1 : g;
}

/// The byte of first-moment value m in a block of scale `scale` (= the block's max |m|).
SHARDOPT_HD std::uint8_t encode_first_moment(const MomentMaps& maps, float m, float scale) {
  if (!(scale > 0.0f)) return 0;
  const int k = nearest_code_indexed(maps.first, maps.first_start, 128, fabsf(m) / scale);
  return static_cast<std::uint8_t>(k != 0 && std::signbit(m) ? (0x80 | k) : k);
}

/// The first-moment value of byte c in a block of scale `scale`.
SHARDOPT_HD float decode_first_moment(const MomentMaps& maps, std::uint8_t c, float scale) {
  const float x = maps.first[c & 0x7F] * scale;
  return (c & 0x80) != 0 ? -x : x;
}

/// The byte of second-moment square root r = sqrtf(v) in a block of scale `scale` (= the
/// block's max r).
SHARDOPT_HD std::uint8_t encode_second_moment(const MomentMaps& maps, float r, float scale) {
  if (!(scale > 0.0f)) return 0;
  return static_cast<std::uint8_t>(nearest_code_indexed(maps.second, maps.second_start, 256, r / scale));
}

/// The second-moment value of byte c in a block of scale `scale`: (second[c] * scale)^2.
SHARDOPT_HD float decode_second_moment(const MomentMaps& maps, std::uint8_t c, float scale) {
  const float r = maps.second[c] * scale;
  return r * r;
}

}  // namespace shardopt::kernels
