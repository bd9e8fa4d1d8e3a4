// schedule_math.cuh - the learning-rate schedule, shared by the device kernel and the host.
#pragma once

#include <cmath>
#include <cstdint>

#include "shardopt/numerics.hpp"
#include "shardopt/schedule.hpp"

namespace shardopt::kernels {

/// lr of 1-based step `step`; computed in double, rounded once to float.
SHARDOPT_HD float schedule_lr_value(const LrSchedule& s, std::int64_t step, float host_lr) {
  switch (s.kind) {
    case LrSchedule::Kind::Host: return host_lr;
    case LrSchedule::Kind::Constant: return s.peak;
    case LrSchedule::Kind::WarmupCosine: {
      if (s.warmup_steps > 0 && step <= s.warmup_steps)
        return static_cast<float>(static_cast<double>(s.peak) * static_cast<double>(step) /
                                  static_cast<double>(s.warmup_steps));
      if (step >= s.total_steps) return s.min_lr;
      const double progress = static_cast<double>(step - s.warmup_steps) /
                              static_cast<double>(s.total_steps - s.warmup_steps);
#ifdef __CUDA_ARCH__
      // cospi: cos(x)'s argument reduction keeps a local-memory table (a 40-byte stack
      // frame), and the first launch of a kernel that needs more local memory than the
      // context holds waits for the device to idle: behind a NCCL kernel that waits for a
      // dead peer, that wait never ends and no Error(Timeout) is raised. Equal to the host's
      // cos(pi * progress) within an ulp of double, far below the float rounding.
      const double c = cospi(progress);
#else
      const double c = cos(3.14159265358979323846 * progress);
#endif
      return static_cast<float>(static_cast<double>(s.min_lr) + (static_cast<double>(s.peak) - s.min_lr) * 0.5 *
                                                                    (1.0 + c));
    }
  }
  return host_lr;
}

}  // namespace shardopt::kernels
