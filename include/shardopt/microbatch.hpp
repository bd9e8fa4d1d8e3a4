// shardopt/microbatch.hpp - per-microbatch state that lives on the device.
//
// One captured microbatch graph serves every microbatch of a step only if nothing in it
// depends on a host value frozen at capture. So the microbatch counter and the flags a
// trainer's kernels branch on live in device memory and are advanced by the graph itself.
#pragma once

#include <cstdint>

namespace shardopt {

/// Device-resident microbatch state. `index` counts microbatches within the step;
/// `first` is 1 on the first microbatch of a step; `skip_weight_update` is 1 on every
/// microbatch except the first (weights changed only at the step, so casts/quantizations
/// of them for compute are reused); `last` is 1 on the last microbatch.
struct MicrobatchState {
  std::int32_t index = 0;
  std::int32_t count = 1;
  std::int32_t first = 1;
  std::int32_t last = 1;
  std::int32_t skip_weight_update = 0;
  std::int32_t pad_ = 0;
};

}  // namespace shardopt
