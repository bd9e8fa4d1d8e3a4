#include "optimizer/kernel_preload.hpp"

#include "core/device_guard.hpp"
#include "quantized/byte_copies.hpp"

namespace shardopt::detail {

std::vector<kernels::KernelFile> step_kernel_files_cuda() {
  std::vector<kernels::KernelFile> files = kernels::kernel_files_cuda();
#if SHARDOPT_HAVE_CUDA
  files.push_back(byte_copies_kernels_cuda);
#endif
  return files;
}

void preload_step_kernels(const Communicator& comm) {
  if (comm.backend() != Backend::Cuda) return;
  const DeviceGuard guard(comm.device());
  for (kernels::KernelFile file : step_kernel_files_cuda()) kernels::load_kernel_file(file, Backend::Cuda);
}

}  // namespace shardopt::detail
