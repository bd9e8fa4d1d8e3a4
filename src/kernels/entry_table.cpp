// entry_table.cpp - EntryTable: upload and the backend / device check of a call.
#include "kernels/entry_table.hpp"

#include <string>

#include "shardopt/error.hpp"
#include "shardopt_config.h"

#if SHARDOPT_HAVE_CUDA
#include <cuda_runtime.h>

#include "core/check.hpp"
#endif

namespace shardopt::detail {

EntryTable::EntryTable(Backend backend, const void* entries, std::size_t bytes, int count)
    : backend_(backend), table_(backend, bytes), count_(count) {
  copy_async(backend, table_.data(), entries, bytes, nullptr);
  synchronize(backend, nullptr);
#if SHARDOPT_HAVE_CUDA
  if (backend == Backend::Cuda) SHARDOPT_CUDA_CHECK(cudaGetDevice(&device_));
#endif
}

void EntryTable::require_call(Backend backend, const char* call) const {
  SHARDOPT_REQUIRE(backend == backend_, ErrorCode::InvalidArgument,
                   std::string(call) + ": the batch was built for Backend::" + to_string(backend_) +
                       " and is called with Backend::" + to_string(backend) + "; build it for the backend you run on");
#if SHARDOPT_HAVE_CUDA
  if (backend == Backend::Cuda) {
    int device = 0;
    SHARDOPT_CUDA_CHECK(cudaGetDevice(&device));
    SHARDOPT_REQUIRE(device == device_, ErrorCode::InvalidArgument,
                     std::string(call) + ": the batch was built on CUDA device " + std::to_string(device_) +
                         " but device " + std::to_string(device) + " is current; make device " +
                         std::to_string(device_) + " current (cudaSetDevice) or build a batch on this one");
  }
#endif
}

}  // namespace shardopt::detail
