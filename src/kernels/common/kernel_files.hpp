// kernel_files.hpp - every CUDA kernel of src/kernels, listed file by file, and their
// loading before the first collective. CUDA (12.2 and later, by default) loads a kernel
// at its first launch, and that load waits for the kernels running on the device: behind
// NCCL kernels spinning on a dead peer, the first launch of a kernel never returns and no
// deadline is checked (docs/faults.md). Loading every kernel up front removes that wait.
#pragma once

#include <functional>
#include <vector>

#include "shardopt/backend.hpp"

namespace shardopt::kernels {

/// Called with the host symbol (the launch stub's address) of one kernel.
using KernelVisitor = std::function<void(const void* kernel)>;
/// Calls the visitor on every kernel of one .cu file (taking a symbol loads nothing).
using KernelFile = void (*)(const KernelVisitor& visit);

/// The symbol of a kernel, as cudaFuncGetAttributes and cudaGetFuncBySymbol take it.
template <class Kernel>
const void* kernel_symbol(Kernel* kernel) {
  return reinterpret_cast<const void*>(kernel);
}

/// Every .cu file of src/kernels with kernels (a CUDA build; empty without CUDA).
std::vector<KernelFile> kernel_files_cuda();

/// Loads every kernel `file` visits into the current device's context (cudaFuncGetAttributes
/// on each, which makes the runtime load it now), once per process, file and device:
/// thread-safe, and later calls for a device already done return at once. Host backend:
/// nothing. Error(Cuda) when a load fails.
void load_kernel_file(KernelFile file, Backend backend);

/// load_kernel_file for every file of kernel_files_cuda(): callers that put kernels
/// behind a collective call it before their first collective.
void load_step_kernels(Backend backend);

/// The driver's handle (a CUfunction) of one of this library's kernels, for a test that
/// asks the driver about it: the library links the CUDA runtime statically, so only its
/// own copy of the runtime knows its kernels. Getting the handle loads that kernel.
/// Error(Cuda) when the symbol is not a kernel; Error(Unsupported) without CUDA.
void* kernel_function_cuda(const void* kernel);

// One per .cu file (defined at the end of that file).
void adam_kernels_cuda(const KernelVisitor& visit);
void adam_q8_kernels_cuda(const KernelVisitor& visit);
void convert_kernels_cuda(const KernelVisitor& visit);
void grad_norm_kernels_cuda(const KernelVisitor& visit);
void step_control_kernels_cuda(const KernelVisitor& visit);
void piece_sum_kernels_cuda(const KernelVisitor& visit);
void byte_copies_kernels_cuda(const KernelVisitor& visit);
void mxfp8_kernels_cuda(const KernelVisitor& visit);
void mxfp8_batch_kernels_cuda(const KernelVisitor& visit);
void mxfp8_shard_kernels_cuda(const KernelVisitor& visit);
void mxfp8_decode_kernels_cuda(const KernelVisitor& visit);
void nvfp4_kernels_cuda(const KernelVisitor& visit);
void nvfp4_shard_kernels_cuda(const KernelVisitor& visit);
void nvfp4_decode_kernels_cuda(const KernelVisitor& visit);

}  // namespace shardopt::kernels
