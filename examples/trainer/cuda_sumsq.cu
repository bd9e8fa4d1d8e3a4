// cuda_sumsq.cu - CudaOps' sums of squares for the gradient norms (sumsq): fixed-shape
// partial sums in double, then one block adds them in order into the norm's slot.
#include "cuda_ops.cuh"

namespace trainer::gpu {
namespace {

template <class D>
__global__ void k_sumsq_partial(const D* x, i64 n, double* partial) {
  __shared__ double shared[32];
  const i64 per = (n + gridDim.x - 1) / gridDim.x;
  const i64 begin = blockIdx.x * per, end = begin + per < n ? begin + per : n;
  double s = 0.0;
  for (i64 i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = ld(x, i);
    s += v * v;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void k_sumsq_final(const double* partial, int blocks, float* slot, const shardopt::MicrobatchState* mb,
                              SumsqWhen when) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const bool write = mb == nullptr || when == SumsqWhen::SumOverMicrobatches || mb->last != 0;
  if (!write) return;
  const bool add = mb != nullptr && when == SumsqWhen::SumOverMicrobatches && mb->first == 0;
  double s = 0.0;
  for (int b = 0; b < blocks; ++b) s += partial[b];
  slot[0] = add ? slot[0] + static_cast<float>(s) : static_cast<float>(s);
}

}  // namespace

void CudaOps::sumsq(const Tensor& x, const Tensor& slot, const shardopt::MicrobatchState* mb, SumsqWhen when,
                    Stream s) {
  const int blocks = static_cast<int>(x.numel < kSumsqBlocks * 1024 ? (x.numel + 1023) / 1024 : kSumsqBlocks);
  const int b = blocks < 1 ? 1 : blocks;
  if (x.elem == Elem::f32)
    k_sumsq_partial<<<b, kThreads, 0, cu(s)>>>(x.as<float>(), x.numel, partials_);
  else
    k_sumsq_partial<<<b, kThreads, 0, cu(s)>>>(x.as<bf16>(), x.numel, partials_);
  TRAINER_LAUNCHED();
  k_sumsq_final<<<1, 32, 0, cu(s)>>>(partials_, b, slot.as<float>(), mb, when);
  TRAINER_LAUNCHED();
}

}  // namespace trainer::gpu
