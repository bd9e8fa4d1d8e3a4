// shardopt/schedule.hpp - learning-rate schedules evaluated on the device.
#pragma once

#include <cstdint>

namespace shardopt {

/// How an optimizer gets its learning rate each step.
struct LrSchedule {
  enum class Kind {
    Host,          ///< set_lr(): a pinned host slot that each (replayed) step copies to the device
    Constant,      ///< `peak` every step
    WarmupCosine,  ///< linear warm-up to `peak` over `warmup_steps`, then cosine decay to
                   ///< `min_lr` at `total_steps` (then `min_lr`)
  };
  Kind kind = Kind::Host;
  float peak = 1e-3f;
  float min_lr = 0.0f;
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 1;

  static LrSchedule host() { return {}; }
  static LrSchedule constant(float lr) { return {Kind::Constant, lr, lr, 0, 1}; }
  static LrSchedule warmup_cosine(float peak, float min_lr, std::int64_t warmup, std::int64_t total) {
    return {Kind::WarmupCosine, peak, min_lr, warmup, total};
  }
};

/// The learning rate of step `step` (1-based: the step about to be applied) under `s`
/// (Kind::Host returns `host_lr`). The device kernel and this host function share the
/// same code.
float schedule_lr(const LrSchedule& s, std::int64_t step, float host_lr);

}  // namespace shardopt
