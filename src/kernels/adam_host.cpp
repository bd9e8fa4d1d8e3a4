// adam_host.cpp - host twin of the fused Adam main pass: the same element math
// (adam_math.cuh) element by element, so it matches the CUDA kernel bitwise.
#include "kernels/adam_launch.hpp"

namespace shardopt::kernels {

void host_adam_apply(const AdamVariant& v, const AdamApplyParams& a) {
  if (a.scalars->found_inf != 0) return;  // a skipped step writes nothing
  dispatch_adam_variant(v, [&]<class Tr>() {
    for (std::int64_t c = 0; c < a.num_chunks; ++c) {
      const ShardChunk& ch = a.chunks[c];
      const AdamStepValues sv = adam_step_values(a, ch.group);
      for (std::int64_t i = 0; i < ch.length; ++i)
        adam_scalar<Tr>(a, sv, ch.shard_offset + i, ch.buffer_offset + i);
    }
  });
}

}  // namespace shardopt::kernels
