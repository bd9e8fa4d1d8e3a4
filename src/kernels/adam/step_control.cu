#include "core/check.hpp"
#include "kernels/common/kernel_files.hpp"
#include "kernels/adam/schedule_math.cuh"
#include "kernels/adam/step_control.hpp"

namespace shardopt::kernels {
namespace {

__global__ void lr_schedule_kernel(LrSchedule schedule, const float* host_lr, StepScalars* scalars) {
  scalars->lr = schedule_lr_value(schedule, scalars->step + 1, host_lr != nullptr ? *host_lr : 0.0f);
}

__global__ void advance_microbatch_kernel(MicrobatchState* state) { advance_microbatch_state(state); }

// One writer at a time (replays of one graph run in order), so a plain read-modify-write
// through volatile: PCIe hosts refuse system-scope atomics on pinned host memory.
__global__ void count_completion_kernel(unsigned long long* counter) {
  volatile unsigned long long* c = counter;
  *c = *c + 1;
  __threadfence_system();
}

}  // namespace

void apply_lr_schedule_cuda(const LrSchedule& schedule, const float* host_lr, StepScalars* scalars, Stream stream) {
  lr_schedule_kernel<<<1, 1, 0, reinterpret_cast<cudaStream_t>(stream)>>>(schedule, host_lr, scalars);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void advance_microbatch_cuda(MicrobatchState* state, Stream stream) {
  advance_microbatch_kernel<<<1, 1, 0, reinterpret_cast<cudaStream_t>(stream)>>>(state);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void count_completion_cuda(unsigned long long* counter, Stream stream) {
  count_completion_kernel<<<1, 1, 0, reinterpret_cast<cudaStream_t>(stream)>>>(counter);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace shardopt::kernels

namespace shardopt::kernels {

// Every kernel of this file, for load_step_kernels (kernel_files.hpp).
void step_control_kernels_cuda(const KernelVisitor& visit) {
  visit(kernel_symbol(lr_schedule_kernel));
  visit(kernel_symbol(advance_microbatch_kernel));
  visit(kernel_symbol(count_completion_kernel));
}

}  // namespace shardopt::kernels
