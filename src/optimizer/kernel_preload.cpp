#include "optimizer/kernel_preload.hpp"

#include "core/device_guard.hpp"
#include "kernels/common/kernel_files.hpp"

namespace shardopt::detail {

void preload_step_kernels(const Communicator& comm) {
  if (comm.backend() != Backend::Cuda) return;
  const DeviceGuard guard(comm.device());
  kernels::load_step_kernels(Backend::Cuda);
}

}  // namespace shardopt::detail
