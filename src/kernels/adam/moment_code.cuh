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

/// How the code tables are keyed: a float a in [2^-23, 1) is keyed by its exponent and
/// its top kKeyBits mantissa bits (its bits >> kKeyShift, less kKeyLow). At 7 bits a key
/// spans 1/128 of a binade, which holds at most one boundary between two codes of either
/// map (checked where the tables are built, and by MomentCode.CodeTablesEqualTheRule), so a
/// table entry per key and one comparison give the code.
inline constexpr int kKeyBits = 7;
inline constexpr int kKeyShift = 23 - kKeyBits;
inline constexpr std::uint32_t kKeyLow = 104u << kKeyBits;  ///< biased exponent 104: 2^-23
inline constexpr int kKeys = (127 - 104) << kKeyBits;        ///< 2944 keys, up to 1
inline constexpr std::uint32_t kKeyLowBits = (1u << kKeyShift) - 1;  ///< a's bits below its key
inline constexpr int kTableKeys = kKeys + 2;  ///< and two more: 1's, and one above 1 (nearest_code_unit)

/// The two maps, ascending; entry 0 is 0, the last is 1; and each map's code table.
/// A code table entry is (c << 16) | (0xFFFF - t) for the key's span of floats: c is the
/// code of the span's smallest float, and the floats of the span whose low 16 bits exceed
/// t take code c + 1 (t = 0xFFFF: none do). So (entry + a float's low 16 bits) >> 16 is the
/// float's code: the sum carries into the code exactly when the low bits exceed t.
struct MomentMaps {
  float first[128];   ///< magnitudes of the first moment: 0, decades 10^-5..1 (2^e codes in decade e), 1
  float second[256];  ///< square roots of the second moment: 0, decades 10^-6..1 (2^(e+1) codes), 1
  float first_by_byte[256];  ///< the first moment of each byte at scale 1: +-first[byte & 0x7F]
  std::uint32_t first_codes[kTableKeys];   ///< code table of `first`
  std::uint32_t second_codes[kTableKeys];  ///< code table of `second`
  bool one_boundary_per_key;               ///< every key's span holds at most one code boundary
};

/// The boundary t of a code table entry (0xFFFF: the key's span holds none).
SHARDOPT_HD constexpr std::uint32_t code_table_boundary(std::uint32_t entry) {
  return kKeyLowBits - (entry & kKeyLowBits);
}

namespace code_tables {  // how make_moment_maps builds the maps and their code tables

/// 2^e in double, exact (|e| <= 1022), in a constant expression.
constexpr double exact_pow2(int e) {
  double r = 1.0;
  double b = e < 0 ? 0.5 : 2.0;
  for (int k = e < 0 ? -e : e; k > 0; k >>= 1, b *= b)
    if ((k & 1) != 0) r *= b;
  return r;
}

/// The value of the positive normal float with bits u, exact in double.
constexpr double normal_float_value(std::uint32_t u) {
  return exact_pow2(static_cast<int>(u >> 23) - 127) * (1.0 + static_cast<double>(u & 0x7FFFFFu) / 8388608.0);
}

/// The bits of x, a positive normal float's value held in double.
constexpr std::uint32_t normal_float_bits(double x) {
  int e = 0;
  while (x >= exact_pow2(e + 1)) ++e;
  while (x < exact_pow2(e)) --e;
  return (static_cast<std::uint32_t>(e + 127) << 23) |
         static_cast<std::uint32_t>((x / exact_pow2(e) - 1.0) * 8388608.0);
}

/// The rule's choice for a (a float's value) between entries lo < hi around it: the upper
/// one when hi - a < a - lo, each difference rounded to float as the kernels compute it
/// (both are exact in double: the values lie in [0, 1] and a >= 2^-23).
constexpr bool takes_upper(double lo, double hi, double a) {
  return static_cast<float>(hi - a) < static_cast<float>(a - lo);
}

/// Fills the code table of map (n entries): the boundaries first (for each pair of
/// neighbours, the bits of the largest float that still takes the lower one, by bisection
/// over the bits: takes_upper is monotone in a), then each key's entry. Returns false when
/// a key's span holds two boundaries.
constexpr bool build_code_table(const float* map, int n, std::uint32_t* table) {
  std::uint32_t bound[255] = {};
  for (int j = 0; j + 1 < n; ++j) {
    std::uint32_t lo = j == 0 ? kKeyLow << kKeyShift : normal_float_bits(map[j]);  // takes the lower
    std::uint32_t hi = normal_float_bits(map[j + 1]);                             // takes the upper
    while (hi - lo > 1) {
      const std::uint32_t mid = lo + (hi - lo) / 2;
      if (takes_upper(map[j], map[j + 1], normal_float_value(mid))) {
        hi = mid;
      } else {
        lo = mid;
      }
    }
    bound[j] = lo;
  }
  bool one = true;
  int c = 0;  // boundaries below the current key's smallest float
  for (int k = 0; k < kKeys; ++k) {
    const std::uint32_t first = (kKeyLow + static_cast<std::uint32_t>(k)) << kKeyShift;
    const std::uint32_t last = first | kKeyLowBits;
    while (c + 1 < n && bound[c] < first) ++c;
    const bool inside = c + 1 < n && bound[c] < last;
    if (inside && c + 2 < n && bound[c + 1] < last) one = false;
    table[k] = (static_cast<std::uint32_t>(c) << 16) | (kKeyLowBits - (inside ? (bound[c] & kKeyLowBits) : kKeyLowBits));
  }
  table[kKeys] = static_cast<std::uint32_t>(n - 1) << 16;  // 1's key: the last code, no boundary
  table[kKeys + 1] = 0;                                     // above: code 0 (nearest_code_unit's NaN)
  return one;
}

}  // namespace code_tables

/// Builds the maps in double, each entry rounded once to float, and their code tables (the
/// same IEEE operations wherever it is evaluated: the compiler computes it).
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
  for (int c = 0; c < 256; ++c) maps.first_by_byte[c] = (c & 0x80) != 0 ? -maps.first[c & 0x7F] : maps.first[c & 0x7F];
  const bool first_one = code_tables::build_code_table(maps.first, 128, maps.first_codes);
  const bool second_one = code_tables::build_code_table(maps.second, 256, maps.second_codes);
  maps.one_boundary_per_key = first_one && second_one;
  return maps;
}

/// The maps of the host twins (the CUDA kernels keep a copy of the same value).
inline constexpr MomentMaps kMomentMaps = make_moment_maps();
static_assert(kMomentMaps.one_boundary_per_key, "a key's span holds two code boundaries: raise kKeyBits");
static_assert(kMomentMaps.first_codes[0] == 0 && kMomentMaps.second_codes[0] == 0,
              "key 0 (2^-23) must hold code 0 and no boundary: nearest_code_keyed reads it below 2^-23");

/// Index of the entry of `map` (n ascending entries, map[0] = 0, map[n-1] = 1) nearest to
/// a: the largest i with map[i] <= a, or i + 1 when map[i + 1] - a < a - map[i] (an exact
/// tie goes to the smaller magnitude). a <= 0 and NaN give 0; a >= 1 gives n - 1. The
/// rule's definition: the kernels use nearest_code_keyed, which gives the same index.
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

/// nearest_code of a map (n entries) through its code table: one read and one addition,
/// no loop and no branch (no divergence in a warp). Floats below 2^-23 read key 0's entry,
/// which places no boundary and code 0 (every map's first boundary lies above 2^-23);
/// floats from 1 up (and negative floats and NaN, whose bits are larger) read 1's entry,
/// code n - 1 with no boundary; the last comparison answers zero, negative a and NaN.
SHARDOPT_HD int nearest_code_keyed(const std::uint32_t* table, float a) {
  const std::uint32_t bits = num::f32_bits(a);
  std::uint32_t key = bits >> kKeyShift;
  key = key < kKeyLow ? kKeyLow : key;
  key = key > kKeyLow + kKeys ? kKeyLow + kKeys : key;
  const int code = static_cast<int>((table[key - kKeyLow] + (bits & kKeyLowBits)) >> 16);
  return a > 0.0f ? code : 0;
}

/// nearest_code_keyed for a in [0, 1] or NaN, what an encoder's quotient by a finite block
/// scale can be: NaN (and every float from 1 + 2^-7 up) reads the entry above 1's, code 0,
/// so no comparison is left.
SHARDOPT_HD int nearest_code_unit(const std::uint32_t* table, float a) {
  const std::uint32_t bits = num::f32_bits(a);
  std::uint32_t key = bits >> kKeyShift;
  key = key < kKeyLow ? kKeyLow : key;
  key = key > kKeyLow + kKeys + 1 ? kKeyLow + kKeys + 1 : key;
  return static_cast<int>((table[key - kKeyLow] + (bits & kKeyLowBits)) >> 16);
}

/// A block's scale, ready to divide by: what divide_by_scale needs.
struct CodeScale {
  float scale = 0.0f;  ///< the block's largest magnitude
  float inv = 0.0f;    ///< 1 / scale, rounded to nearest (used when `fast`)
  bool fast = false;   ///< scale in [2^-64, 2^64]: divide_by_scale multiplies by `inv`
};

/// The CodeScale of `scale`: one reciprocal per block instead of a division per element.
SHARDOPT_HD CodeScale code_scale(float scale) {
  CodeScale s;
  s.scale = scale;
  s.fast = scale >= 0x1p-64f && scale <= 0x1p64f;
#if defined(__CUDA_ARCH__)
  s.inv = s.fast ? __frcp_rn(scale) : 0.0f;
#else
  s.inv = s.fast ? 1.0f / scale : 0.0f;
#endif
  return s;
}

/// a / s.scale rounded to nearest, as the IEEE division gives it, for 0 <= a <= s.scale
/// (what the encoders divide). With `fast`: Markstein's correction of a * inv (with inv
/// the rounded reciprocal and q a quotient within an ulp, q + (a - q scale) inv rounds to
/// the quotient; a - q scale is exact), in a multiply and two fused multiply-adds. The
/// scale's range keeps every intermediate normal for quotients >= 2^-24; smaller ones
/// code as 0 either way. MomentCode.DivisionByScaleIsTheDivision checks it.
/// kFastScale: the caller knows s.fast (no branch).
template <bool kFastScale = false>
SHARDOPT_HD float divide_by_scale(float a, const CodeScale& s) {
  if (!kFastScale && !s.fast) return a / s.scale;
  const float q = a * s.inv;
  return fmaf(fmaf(-q, s.scale, a), s.inv, q);
}

/// The byte of first-moment value m in a block of scale s.scale (= the block's max |m|).
/// kFastScale: the caller knows s.fast (divide_by_scale) and |m| <= s.scale or m is NaN
/// (nearest_code_unit).
template <bool kFastScale = false>
SHARDOPT_HD std::uint8_t encode_first_moment(const MomentMaps& maps, float m, const CodeScale& s) {
  if (!kFastScale && !(s.scale > 0.0f)) return 0;
  const float a = divide_by_scale<kFastScale>(fabsf(m), s);  // in [0, 1] or NaN under a fast scale
  const int k = kFastScale ? nearest_code_unit(maps.first_codes, a) : nearest_code_keyed(maps.first_codes, a);
  return static_cast<std::uint8_t>(k != 0 && std::signbit(m) ? (0x80 | k) : k);
}

/// encode_first_moment under a block scale given as a float.
SHARDOPT_HD std::uint8_t encode_first_moment(const MomentMaps& maps, float m, float scale) {
  return encode_first_moment(maps, m, code_scale(scale));
}

/// The first-moment value of byte c in a block of scale `scale`: +-first[c & 0x7F] x
/// scale (one read of the signed entry: the product's sign is the entry's).
SHARDOPT_HD float decode_first_moment(const MomentMaps& maps, std::uint8_t c, float scale) {
  return maps.first_by_byte[c] * scale;
}

/// The byte of second-moment square root r = sqrtf(v) in a block of scale s.scale (= the
/// block's max r). kFastScale: the caller knows s.fast and r <= s.scale or r is NaN.
template <bool kFastScale = false>
SHARDOPT_HD std::uint8_t encode_second_moment(const MomentMaps& maps, float r, const CodeScale& s) {
  if (!kFastScale && !(s.scale > 0.0f)) return 0;
  const float a = divide_by_scale<kFastScale>(r, s);  // in [0, 1] or NaN under a fast scale
  return static_cast<std::uint8_t>(kFastScale ? nearest_code_unit(maps.second_codes, a)
                                              : nearest_code_keyed(maps.second_codes, a));
}

/// encode_second_moment under a block scale given as a float.
SHARDOPT_HD std::uint8_t encode_second_moment(const MomentMaps& maps, float r, float scale) {
  return encode_second_moment(maps, r, code_scale(scale));
}

/// The second-moment value of byte c in a block of scale `scale`: (second[c] * scale)^2.
SHARDOPT_HD float decode_second_moment(const MomentMaps& maps, std::uint8_t c, float scale) {
  const float r = maps.second[c] * scale;
  return r * r;
}

}  // namespace shardopt::kernels
