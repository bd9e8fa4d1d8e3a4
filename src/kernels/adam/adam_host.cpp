// adam_host.cpp - host twin of the fused Adam main pass: the same element math
// (adam_math.cuh) element by element, so it matches the CUDA kernel bitwise. With an
// amax table it also emits the NVFP4 partial amaxes of the new master (of the master as
// it is on a skipped step, which writes nothing else), as the kernel does.
#include "kernels/adam/adam_launch.hpp"

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

}  // namespace shardopt::kernels
