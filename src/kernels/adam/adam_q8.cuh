// adam_q8.cuh - the fused Adam step with 8-bit block-quantized moments (DType::q8_block):
// the math of one element and of one block, shared by the CUDA kernel (adam_q8.cu) and
// its host twin (adam_host.cpp), which therefore agree bitwise.
//
// Per block of kMomentBlock moment elements (one parameter's, moment_code.cuh):
//   1. each element: m, v decoded with the block's old scales; the usual element update
//      (adam_element: fp32 master, new m and v in fp32; the parameter uses them unrounded);
//   2. the new scales: max |m| and max sqrt(v) over the block's elements (a max: the same
//      whatever the order);
//   3. each element's bytes: the nearest codes under the new scales.
// A block belongs to one parameter and is updated whole by one warp (one loop on the
// host), so the result depends on nothing but the parameter's own values.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/adam/adam_math.cuh"
#include "kernels/adam/moment_code.cuh"

namespace shardopt::kernels {

/// Step 1's first part for one element: grad, master p (in/out), the element's old bytes
/// and the block's old scales; returns the new m and v (adam_moments; p decayed).
template <bool kDecoupled>
SHARDOPT_HD void adam_q8_moments(const AdamElementConsts& c, const AdamStepValues& sv, const MomentMaps& maps,
                                 float grad, float& p, std::uint8_t m_code, std::uint8_t v_code, float m_scale,
                                 float r_scale, float& m, float& v) {
  m = decode_first_moment(maps, m_code, m_scale);
  v = decode_second_moment(maps, v_code, r_scale);
  adam_moments<kDecoupled>(c, sv, grad, p, m, v);
}

/// Step 1 for one element: adam_q8_moments, then the master's update (adam_element's
/// other parts); returns the new m and r = sqrtf(new v). The CUDA pass runs the same
/// parts with sqrtf and the division's fast paths interleaved over a lane's elements.
template <bool kDecoupled>
SHARDOPT_HD void adam_q8_element(const AdamElementConsts& c, const AdamStepValues& sv, const MomentMaps& maps,
                                 float grad, float& p, std::uint8_t m_code, std::uint8_t v_code, float m_scale,
                                 float r_scale, float& m, float& r) {
  float v;
  adam_q8_moments<kDecoupled>(c, sv, maps, grad, p, m_code, v_code, m_scale, r_scale, m, v);
  r = sqrtf(v);
  adam_apply_quotient(sv, m / adam_denominator(c, sv, r), p);
}

/// The gradient of one element, widened to float.
template <class Tr>
SHARDOPT_HD float adam_q8_load_grad(const AdamApplyParams& a, std::int64_t bi) {
  using GT = storage_t<Tr::grad>;
  return num::Storage<Tr::grad>::load(static_cast<const GT*>(a.grads)[bi]);
}

}  // namespace shardopt::kernels
