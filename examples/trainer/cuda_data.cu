// cuda_data.cu - CudaOps' data: the parameters' initial values (init_param), the synthetic
// task's batches (make_batch) and the text windows of the GPT (text_batch). Every value is
// a function of its position, the seed and the step read from device memory, as on the host
// (op_math.hpp).
#include <stdexcept>

#include "cuda_ops.cuh"

namespace trainer::gpu {
namespace {

template <class P>
__global__ void k_init_param(P* out, InitArgs a, i64 n) {
  for (i64 e = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; e < n; e += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 q = a.offset + e;
    const float v = a.is_constant ? a.constant : math::init_uniform(a.keys[q / a.member_numel], q % a.member_numel, a.bound);
    st(out, e, v);
  }
}

__global__ void k_make_batch(BatchArgs a, std::int32_t* tokens, std::int32_t* targets) {
  const i64 step = a.scalars != nullptr ? a.scalars->step : a.step;
  const std::int32_t mb = a.microbatch != nullptr ? a.microbatch->index : 0;
  for (i64 t = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; t < a.tokens; t += static_cast<i64>(gridDim.x) * blockDim.x) {
    const std::int32_t x = math::token_at(a.seed, a.rank, step, mb, t, a.vocab);
    tokens[t] = x;
    targets[t] = math::target_of(x, a.rule_a, a.rule_c, a.vocab);
  }
}

__global__ void k_text_batch(TextBatchArgs a, std::int32_t* tokens, std::int32_t* targets) {
  const i64 step = a.scalars != nullptr ? a.scalars->step : a.step;
  const std::int32_t mb = a.microbatch != nullptr ? a.microbatch->index : 0;
  const i64 n = a.seqs * a.context;
  for (i64 t = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; t < n; t += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 j = t / a.context, i = t % a.context;
    const i64 start = math::window_start(a.seed, a.rank, step, mb, j, a.data_tokens - a.context);
    tokens[t] = a.data[start + i];
    targets[t] = a.data[start + i + 1];
  }
}

}  // namespace

void CudaOps::init_param(const Tensor& t, const InitArgs& a, Stream s) {
  if (t.elem == Elem::bf16)
    k_init_param<<<blocks_for(t.numel), kThreads, 0, cu(s)>>>(t.as<bf16>(), a, t.numel);
  else if (t.elem == Elem::f32)
    k_init_param<<<blocks_for(t.numel), kThreads, 0, cu(s)>>>(t.as<float>(), a, t.numel);
  else
    throw std::invalid_argument("cuda ops: init_param takes bf16 parameters or f32 master pieces");
  TRAINER_LAUNCHED();
}

void CudaOps::make_batch(const BatchArgs& a, const Tensor& tokens, const Tensor& targets, Stream s) {
  k_make_batch<<<blocks_for(a.tokens), kThreads, 0, cu(s)>>>(a, tokens.as<std::int32_t>(), targets.as<std::int32_t>());
  TRAINER_LAUNCHED();
}

void CudaOps::text_batch(const TextBatchArgs& a, const Tensor& tokens, const Tensor& targets, Stream s) {
  check_text_batch(a, tokens, targets);
  k_text_batch<<<blocks_for(a.seqs * a.context), kThreads, 0, cu(s)>>>(a, tokens.as<std::int32_t>(),
                                                                        targets.as<std::int32_t>());
  TRAINER_LAUNCHED();
}

}  // namespace trainer::gpu
