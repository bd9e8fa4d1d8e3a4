#include "gpu/comm_test_kernels.hpp"

#include <stdexcept>
#include <string>

namespace shardopt::test {
namespace {

__device__ std::uint64_t now_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every block waits (so no block writes early), then the grid fills the buffer.
__global__ void spin_then_fill_kernel(std::uint64_t ns, void* data, long long count, int element_bytes,
                                      std::uint32_t pattern) {
  if (ns > 0) {
    if (threadIdx.x == 0) {
      const std::uint64_t t0 = now_ns();
      while (now_ns() - t0 < ns) {
      }
    }
    __syncthreads();
  }
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    if (element_bytes == 2)
      static_cast<std::uint16_t*>(data)[i] = static_cast<std::uint16_t>(pattern);
    else
      static_cast<std::uint32_t*>(data)[i] = pattern;
  }
}

__global__ void spin_until_flag_kernel(const volatile int* flag, std::uint64_t max_ns) {
  const std::uint64_t t0 = now_ns();
  while (*flag == 0 && now_ns() - t0 < max_ns) {
  }
}

void check_launch() {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("kernel launch: ") + cudaGetErrorString(e));
}

}  // namespace

void spin_then_fill(cudaStream_t stream, std::uint64_t ns, void* data, long long count, int element_bytes,
                    std::uint32_t pattern) {
  spin_then_fill_kernel<<<64, 256, 0, stream>>>(ns, data, count, element_bytes, pattern);
  check_launch();
}

void spin(cudaStream_t stream, std::uint64_t ns) {
  spin_then_fill_kernel<<<1, 32, 0, stream>>>(ns, nullptr, 0, 4, 0);
  check_launch();
}

void spin_until_flag(cudaStream_t stream, const volatile int* flag, std::uint64_t max_ns) {
  spin_until_flag_kernel<<<1, 1, 0, stream>>>(flag, max_ns);
  check_launch();
}

HostFlag::HostFlag() {
  void* p = nullptr;
  cudaError_t e = cudaHostAlloc(&p, sizeof(int), cudaHostAllocMapped);
  if (e != cudaSuccess) throw std::runtime_error(std::string("cudaHostAlloc: ") + cudaGetErrorString(e));
  host_ = static_cast<volatile int*>(p);
  *host_ = 0;
  void* d = nullptr;
  e = cudaHostGetDevicePointer(&d, p, 0);
  if (e != cudaSuccess) {
    (void)cudaFreeHost(p);
    throw std::runtime_error(std::string("cudaHostGetDevicePointer: ") + cudaGetErrorString(e));
  }
  device_ = static_cast<const volatile int*>(d);
}

HostFlag::~HostFlag() { (void)cudaFreeHost(const_cast<int*>(host_)); }

}  // namespace shardopt::test
