// entry_table.hpp - internal: the device-resident table of a multi-tensor kernel
// (Mxfp8Batch, Mxfp8ShardBatch, Nvfp4Batch, Nvfp4ShardBatch): its entries uploaded
// once, the backend and the CUDA device it belongs to, the check every call makes
// against them, the moved-from check of the batch that owns it, and the check that the
// tensors' outputs do not overlap.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/memory.hpp"
#include "shardopt/backend.hpp"
#include "shardopt/error.hpp"

namespace shardopt::detail {

/// `count` entries in the memory of `backend` (on CUDA: of the device current when it
/// was built). Owned (RAII); the upload is complete when the constructor returns.
class EntryTable {
 public:
  EntryTable() = default;
  /// Uploads `bytes` bytes of host entries and waits for the copy.
  EntryTable(Backend backend, const void* entries, std::size_t bytes, int count);
  template <class Entry>
  EntryTable(Backend backend, const std::vector<Entry>& entries)
      : EntryTable(backend, entries.data(), entries.size() * sizeof(Entry), static_cast<int>(entries.size())) {}

  Backend backend() const noexcept { return backend_; }
  int count() const noexcept { return count_; }
  template <class Entry>
  const Entry* entries() const {
    return table_.as<const Entry>();
  }
  /// Throws Error(InvalidArgument) naming `call` when `backend` is not the table's or,
  /// on CUDA, the current device is not the one it was built on.
  void require_call(Backend backend, const char* call) const;

 private:
  Backend backend_ = Backend::Host;
  DeviceBuffer table_;
  int count_ = 0;
  int device_ = 0;  // CUDA: the device the table lives on
};

/// Memory a batch's tensor writes: the bytes [begin, end), the tensor's index and what.
struct Extent {
  std::uintptr_t begin, end;
  std::size_t tensor;
  const char* what;
};

/// Throws Error(InvalidArgument) naming the batch `type` and the first two extents that
/// overlap (of two tensors or of one).
void require_disjoint(std::vector<Extent> extents, const char* type);

/// The state behind a batch's `impl` pointer (a struct holding `table`); throws
/// Error(InvalidState) naming the batch `type` when the batch was moved from. (A
/// template: it never names the batch's private Impl.)
template <class ImplPtr>
const auto& live_batch(const ImplPtr& impl, const char* type) {
  SHARDOPT_REQUIRE(impl != nullptr, ErrorCode::InvalidState,
                   std::string("this ") + type + " was moved from; use the batch it was moved to");
  return *impl;
}

/// live_batch, checked against the call's backend and (CUDA) current device.
template <class ImplPtr>
const auto& batch_for_call(const ImplPtr& impl, const char* type, Backend backend, const char* call) {
  const auto& im = live_batch(impl, type);
  im.table.require_call(backend, call);
  return im;
}

}  // namespace shardopt::detail
