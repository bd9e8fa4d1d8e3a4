// kernel_preload.hpp - the optimizers load every CUDA kernel they can launch (step,
// zero_grad, checkpoints, the quantized formats' quantize and landing) when they are
// constructed, before their first collective. CUDA loads a kernel lazily at its first
// launch, and that load waits for the device: behind NCCL kernels spinning on a dead
// peer, a step's first launch of a kernel never returned and the watchdog never fired
// (the 4-GPU HSDP fault case, docs/faults.md).
#pragma once

#include "kernels/common/kernel_files.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt::detail {

/// Loads every kernel of kernels::kernel_files_cuda() (every .cu file of src/kernels: all
/// an optimizer can launch) on the communicator's device, once per process and device
/// (later calls return at once). Host backend: nothing.
void preload_step_kernels(const Communicator& comm);

}  // namespace shardopt::detail
