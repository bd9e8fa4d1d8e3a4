// step_control.hpp - tiny one-thread kernels that keep per-step state on the device:
// the learning-rate schedule evaluated from the device step counter, and the
// microbatch counter and flags advanced by the (captured) microbatch graph itself.
#pragma once

#include "shardopt/backend.hpp"
#include "shardopt/fused_adam.hpp"
#include "shardopt/microbatch.hpp"
#include "shardopt/numerics.hpp"
#include "shardopt/schedule.hpp"

namespace shardopt::kernels {

/// scalars->lr = schedule_lr(schedule, scalars->step + 1, *host_lr) where host_lr points
/// to device (or pinned) memory holding the host slot's value (Kind::Host only).
void apply_lr_schedule(const LrSchedule& schedule, const float* host_lr, StepScalars* scalars, Backend backend,
                       Stream stream);

/// index = (index + 1) % count; first/last/skip_weight_update follow index.
void advance_microbatch(MicrobatchState* state, Backend backend, Stream stream);

/// Element function shared by the kernel and the host (used by both entry points).
SHARDOPT_HD void advance_microbatch_state(MicrobatchState* s) {
  s->index = (s->index + 1) % (s->count > 0 ? s->count : 1);
  s->first = s->index == 0 ? 1 : 0;
  s->last = s->index == s->count - 1 ? 1 : 0;
  s->skip_weight_update = s->first ? 0 : 1;
}

/// CUDA only: adds 1 to *counter when the stream reaches this point (one thread; the
/// counter may be pinned host memory that a host thread reads: the write is made visible
/// to the whole system). Captured at the end of a StepGraph's iteration, it counts the
/// replays that have completed, for the step watchdog.
void count_completion_cuda(unsigned long long* counter, Stream stream);

void apply_lr_schedule_cuda(const LrSchedule& schedule, const float* host_lr, StepScalars* scalars, Stream stream);
void advance_microbatch_cuda(MicrobatchState* state, Stream stream);

}  // namespace shardopt::kernels
