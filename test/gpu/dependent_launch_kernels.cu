// dependent_launch_kernels.cu - see dependent_launch_kernels.hpp.
#include "dependent_launch_kernels.hpp"

#include "core/check.hpp"

namespace dependent_launch_test {
namespace {

__global__ void late_copy_kernel(std::uint16_t* dst, const std::uint16_t* values, std::int64_t n,
                                 long long spin_ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  // Spin on the global timer (nanoseconds), the same span in every block.
  long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < spin_ns);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = values[i];
}

}  // namespace

void launch_late_copy(std::uint16_t* dst, const std::uint16_t* values, std::int64_t n, int spin_us,
                      cudaStream_t stream) {
  // Few blocks: the consumer's blocks find room beside them while they spin.
  late_copy_kernel<<<8, 256, 0, stream>>>(dst, values, n, 1000LL * spin_us);
  SHARDOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dependent_launch_test
