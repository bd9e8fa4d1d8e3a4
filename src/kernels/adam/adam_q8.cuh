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

/// Step 1 for one element: grad, master p (in/out), the element's old bytes and the
/// block's old scales; returns the new m and r = sqrtf(new v).
template <bool kDecoupled>
SHARDOPT_HD void adam_q8_element(const AdamElementConsts& c, const AdamStepValues& sv, const MomentMaps& maps,
                                 float grad, float& p, std::uint8_t m_code, std::uint8_t v_code, float m_scale,
                                 float r_scale, float& m, float& r) {
  m = decode_first_moment(maps, m_code, m_scale);
  float v = decode_second_moment(maps, v_code, r_scale);
  adam_element<kDecoupled>(c, sv, grad, p, m, v);
  r = sqrtf(v);
}

/// The gradient of one element, widened to float.
template <class Tr>
SHARDOPT_HD float adam_q8_load_grad(const AdamApplyParams& a, std::int64_t bi) {
  using GT = storage_t<Tr::grad>;
  return num::Storage<Tr::grad>::load(static_cast<const GT*>(a.grads)[bi]);
}

}  // namespace shardopt::kernels
