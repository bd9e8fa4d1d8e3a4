// CUDA writer of the test gradient stream: one launch per target, reading the step and
// microbatch counters from device memory when it runs.
#include <vector>

#include "core/check.hpp"
#include "grad_stream.hpp"

namespace shardopt::test {
namespace {
__global__ void add_grads_kernel(GradStreamParams p, GradTarget t) {
  const std::int64_t step = p.scalars != nullptr ? p.scalars->step : 0;
  const std::int32_t mb = p.microbatch != nullptr ? p.microbatch->index : 0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < t.numel; j += stride)
    add_grad_element(p, step, mb, t, j);
}
__global__ void sleep_kernel(long long ns) {
  const long long start = clock64();
  // clock64 counts SM cycles; ~2 GHz on H100/H200. Sleep in short naps until done.
  while (clock64() - start < ns * 2) __nanosleep(1000);
}
}  // namespace

void delay_stream_cuda(Stream stream, int microseconds) {
  sleep_kernel<<<1, 1, 0, reinterpret_cast<cudaStream_t>(stream)>>>(static_cast<long long>(microseconds) * 1000);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

void add_grads_cuda(Stream stream, const GradStreamParams& p, const std::vector<GradTarget>& targets) {
  for (const auto& t : targets) {
    const std::int64_t blocks = (t.numel + 255) / 256;
    add_grads_kernel<<<static_cast<unsigned>(blocks < 1024 ? blocks : 1024), 256, 0,
                       reinterpret_cast<cudaStream_t>(stream)>>>(p, t);
    SHARDOPT_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace shardopt::test
