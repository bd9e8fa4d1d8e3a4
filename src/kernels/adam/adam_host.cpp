// adam_host.cpp - host twin of the fused Adam main pass: the same element math
// (adam_math.cuh) element by element, so it matches the CUDA kernel bitwise. With an
// amax table it also emits the NVFP4 partial amaxes of the new master (of the master as
// it is on a skipped step, which writes nothing else), as the kernel does.
#include <algorithm>
#include <cmath>

#include "kernels/adam/adam_launch.hpp"
#include "kernels/adam/adam_q8.cuh"

namespace shardopt::kernels {

void host_adam_apply(const AdamVariant& v, const AdamApplyParams& a) {
  const bool skipped = a.scalars->found_inf != 0;  // a skipped step writes nothing
  if (skipped && a.amax == nullptr) return;
  dispatch_adam_variant<true>(v, [&]<class Tr>() {
    for (std::int64_t c = 0; c < a.num_chunks; ++c) {
      const ShardChunk& ch = a.chunks[c];
      const AdamAmaxChunk* t = a.amax != nullptr && a.amax[c].amax != nullptr ? &a.amax[c] : nullptr;
      if (skipped) {
        for (std::int64_t i = 0; t != nullptr && i < ch.length; ++i)
          host_emit_amax(*t, t->first + i, a.master[ch.shard_offset + i]);
        continue;
      }
      const AdamStepValues sv = adam_step_values(a, ch.group);
      for (std::int64_t i = 0; i < ch.length; ++i) {
        const float p = adam_scalar<Tr>(a, sv, ch.shard_offset + i, ch.buffer_offset + i, ch.moment_shift);
        if (t != nullptr) host_emit_amax(*t, t->first + i, p);
      }
    }
  });
}

// The 8-bit moment pass, block by block in the order adam_q8.cuh gives (a block's new
// scales are maxima: the order of its elements does not change them).
void host_adam_q8_apply(const AdamVariant& v, const AdamApplyParams& a) {
  if (a.scalars->found_inf != 0) return;
  dispatch_adam_variant<true, true>(v, [&]<class Tr>() {
    auto* mc = static_cast<std::uint8_t*>(a.exp_avg);
    auto* vc = static_cast<std::uint8_t*>(a.exp_avg_sq);
    float m[kMomentBlock], r[kMomentBlock], p[kMomentBlock];
    for (std::int64_t c = 0; c < a.num_chunks; ++c) {
      const ShardChunk& ch = a.chunks[c];
      const AdamStepValues sv = adam_step_values(a, ch.group);
      const std::int64_t m0 = ch.shard_offset - ch.moment_shift;
      for (std::int64_t e0 = 0; e0 < ch.length; e0 += kMomentBlock) {
        const std::int64_t n = std::min<std::int64_t>(kMomentBlock, ch.length - e0);
        const std::int64_t block = (m0 + e0) / kMomentBlock;
        float m_max = 0.0f, r_max = 0.0f;
        for (std::int64_t i = 0; i < n; ++i) {
          const std::int64_t si = ch.shard_offset + e0 + i, bi = ch.buffer_offset + e0 + i;
          p[i] = adam_load_master<Tr>(a, si, bi);
          adam_q8_element<Tr::decoupled>(a.consts, sv, kMomentMaps, adam_q8_load_grad<Tr>(a, bi), p[i],
                                         mc[m0 + e0 + i], vc[m0 + e0 + i], a.exp_avg_scale[block],
                                         a.exp_avg_sq_scale[block], m[i], r[i]);
          m_max = std::fmax(m_max, std::fabs(m[i]));
          r_max = std::fmax(r_max, r[i]);
        }
        for (std::int64_t i = 0; i < n; ++i) {
          mc[m0 + e0 + i] = encode_first_moment(kMomentMaps, m[i], m_max);
          vc[m0 + e0 + i] = encode_second_moment(kMomentMaps, r[i], r_max);
          adam_store_master<Tr>(a, ch.shard_offset + e0 + i, ch.buffer_offset + e0 + i, p[i]);
        }
        a.exp_avg_scale[block] = m_max;
        a.exp_avg_sq_scale[block] = r_max;
      }
    }
  });
}

}  // namespace shardopt::kernels
