// entry_table.cpp - EntryTable: upload and the backend / device check of a call.
#include "kernels/common/entry_table.hpp"

#include <algorithm>
#include <string>

#include "core/device_guard.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {

EntryTable::EntryTable(Backend backend, const void* entries, std::size_t bytes, int count)
    : backend_(backend), table_(backend, bytes), count_(count) {
  copy_async(backend, table_.data(), entries, bytes, nullptr);
  synchronize(backend, nullptr);
  if (backend == Backend::Cuda) device_ = current_device();
}

void EntryTable::require_call(Backend backend, const char* call) const {
  SHARDOPT_REQUIRE(backend == backend_, ErrorCode::InvalidArgument,
                   std::string(call) + ": the batch was built for Backend::" + to_string(backend_) +
                       " and is called with Backend::" + to_string(backend) + "; build it for the backend you run on");
  if (backend == Backend::Cuda) {
    const int device = current_device();
    SHARDOPT_REQUIRE(device == device_, ErrorCode::InvalidArgument,
                     std::string(call) + ": the batch was built on CUDA device " + std::to_string(device_) +
                         " but device " + std::to_string(device) + " is current; make device " +
                         std::to_string(device_) + " current (cudaSetDevice) or build a batch on this one");
  }
}

void require_disjoint(std::vector<Extent> extents, const char* type) {
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) { return a.begin < b.begin; });
  for (std::size_t k = 1; k < extents.size(); ++k) {
    const Extent& a = extents[k - 1];
    const Extent& b = extents[k];
    SHARDOPT_REQUIRE(b.begin >= a.end, ErrorCode::InvalidArgument,
                     std::string(type) + " tensor " + std::to_string(b.tensor) + ": its " + b.what + " overlaps the " +
                         a.what + " of tensor " + std::to_string(a.tensor) + "; give every tensor its own output memory");
  }
}

}  // namespace shardopt::detail
