#include "kernels/adam/step_control.hpp"

#include "core/check.hpp"
#include "kernels/adam/schedule_math.cuh"
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
  apply_lr_schedule_cuda(schedule, host_lr, scalars, stream);
}

void advance_microbatch(MicrobatchState* state, Backend backend, Stream stream) {
  if (backend == Backend::Host) {
    host_enqueue(stream, [=] { advance_microbatch_state(state); });
    return;
  }
  advance_microbatch_cuda(state, stream);
}

}  // namespace kernels
}  // namespace shardopt

#if !SHARDOPT_HAVE_CUDA
// A build without CUDA compiles no .cu file: the launches refuse.
namespace shardopt::kernels {
void apply_lr_schedule_cuda(const LrSchedule&, const float*, StepScalars*, Stream) { detail::no_cuda("the step-control kernels"); }
void advance_microbatch_cuda(MicrobatchState*, Stream) { detail::no_cuda("the step-control kernels"); }
void count_completion_cuda(unsigned long long*, Stream) { detail::no_cuda("the step-control kernels"); }
}  // namespace shardopt::kernels
#endif
