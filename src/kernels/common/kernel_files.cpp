#include "kernels/common/kernel_files.hpp"

#include <mutex>
#include <set>
#include <utility>

#include "core/check.hpp"
#include "core/device_guard.hpp"

namespace shardopt::kernels {

std::vector<KernelFile> kernel_files_cuda() {
#if SHARDOPT_HAVE_CUDA
  return {
      adam_kernels_cuda,
      adam_q8_kernels_cuda,
      convert_kernels_cuda,
      grad_norm_kernels_cuda,
      step_control_kernels_cuda,
      piece_sum_kernels_cuda,
      mxfp8_kernels_cuda,
      mxfp8_batch_kernels_cuda,
      mxfp8_shard_kernels_cuda,
      mxfp8_decode_kernels_cuda,
      nvfp4_kernels_cuda,
      nvfp4_shard_kernels_cuda,
      nvfp4_decode_kernels_cuda,
      byte_copies_kernels_cuda,
  };
#else
  return {};
#endif
}

void load_kernel_file(KernelFile file, Backend backend) {
  if (backend != Backend::Cuda) return;
#if SHARDOPT_HAVE_CUDA
  const int device = detail::current_device();
  // One lock for all: loading happens at construction, never on a step's path.
  static std::mutex mutex;
  static std::set<std::pair<KernelFile, int>> done;
  const std::lock_guard<std::mutex> lock(mutex);
  if (done.count({file, device}) != 0) return;
  file([](const void* kernel) {
    cudaFuncAttributes attributes{};
    SHARDOPT_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  });
  done.insert({file, device});  // only once every kernel of the file loaded
#else
  (void)file;
  detail::no_cuda("loading the CUDA kernels");
#endif
}

void* kernel_function_cuda(const void* kernel) {
#if SHARDOPT_HAVE_CUDA
  cudaFunction_t function = nullptr;
  SHARDOPT_CUDA_CHECK(cudaGetFuncBySymbol(&function, kernel));
  return static_cast<void*>(function);
#else
  (void)kernel;
  detail::no_cuda("kernel handles");
#endif
}

void load_step_kernels(Backend backend) {
  for (KernelFile file : kernel_files_cuda()) load_kernel_file(file, backend);
}

}  // namespace shardopt::kernels
