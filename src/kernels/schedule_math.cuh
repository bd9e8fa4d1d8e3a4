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
      const double pi = 3.14159265358979323846;
      return static_cast<float>(static_cast<double>(s.min_lr) + (static_cast<double>(s.peak) - s.min_lr) * 0.5 *
                                                                    (1.0 + cos(pi * progress)));
    }
  }
  return host_lr;
}

}  // namespace shardopt::kernels
