// registered_ranges.hpp - the byte ranges a communicator registered with its backend
// (Communicator::register_buffer), so that a call can ask whether a buffer lies in one.
//
// Why: NCCL makes a send/recv with a registered buffer on one side and an unregistered
// one on the other undefined behaviour (its buffer-registration guide), and above 16 KiB
// a piece its registered zero-copy path starts. The NCCL all-to-all asks these ranges
// and refuses the mix (issue 31: the F32Accumulate store sent registered gradients into
// an unregistered receive buffer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace shardopt::detail {

/// Registered ranges keyed by the backend's registration handle. Thread-safe.
class RegisteredRanges {
 public:
  /// Records that [data, data + bytes) is registered under `handle` (not null).
  void add(const void* handle, const void* data, std::size_t bytes);
  /// Forgets the range of `handle` (nothing when unknown).
  void remove(const void* handle) noexcept;
  /// True when [data, data + bytes) lies inside one registered range (bytes > 0).
  bool covers(const void* data, std::size_t bytes) const;

 private:
  struct Entry {
    const void* handle;
    std::uintptr_t begin, end;
  };
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
};

}  // namespace shardopt::detail
