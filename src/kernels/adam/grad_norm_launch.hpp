// grad_norm_launch.hpp - internal entry points of the gradient-norm kernels: CUDA
// launch wrappers (grad_norm.cu, CUDA builds only) and host twins (grad_norm_host.cpp).
#pragma once

#include "kernels/adam/grad_norm.cuh"
#include "shardopt/backend.hpp"

namespace shardopt::kernels {

/// CUDA: both passes of accumulate_grad_sumsq (two launches).
void launch_grad_sumsq(DType grad_dtype, const GradNormParams& a, Stream stream);
/// CUDA: finalize_grad_norm's one-thread kernel.
void launch_finalize_grad_norm(float max_norm, StepScalars* scalars, Stream stream);

/// Host twin of both passes (runs now; callers wrap it in host_enqueue).
void host_grad_sumsq(DType grad_dtype, const GradNormParams& a);

}  // namespace shardopt::kernels
