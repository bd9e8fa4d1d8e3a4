#include "kernels/step_control.hpp"

#include "core/check.hpp"
#include "kernels/schedule_math.cuh"
#include "shardopt/host_stream.hpp"

namespace shardopt {

float schedule_lr(const LrSchedule& s, std::int64_t step, float host_lr) {
  return kernels::schedule_lr_value(s, step, host_lr);
}

namespace kernels {

void apply_lr_schedule(const LrSchedule& schedule, const float* host_lr, StepScalars* scalars, Backend backend,
                       Stream stream) {
  if (backend == Backend::Host) {
    host_enqueue(stream, [=] {
      scalars->lr = schedule_lr_value(schedule, scalars->step + 1, host_lr != nullptr ? *host_lr : 0.0f);
    });
    return;
  }
#if SHARDOPT_HAVE_CUDA
  apply_lr_schedule_cuda(schedule, host_lr, scalars, stream);
#else
  SHARDOPT_REQUIRE(false, ErrorCode::Unsupported, "this build has no CUDA backend");
#endif
}

void advance_microbatch(MicrobatchState* state, Backend backend, Stream stream) {
  if (backend == Backend::Host) {
    host_enqueue(stream, [=] { advance_microbatch_state(state); });
    return;
  }
#if SHARDOPT_HAVE_CUDA
  advance_microbatch_cuda(state, stream);
#else
  SHARDOPT_REQUIRE(false, ErrorCode::Unsupported, "this build has no CUDA backend");
#endif
}

}  // namespace kernels
}  // namespace shardopt
