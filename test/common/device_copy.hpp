// device_copy.hpp - the copies between host memory and device (or host-backend) memory
// that every test makes: bytes_to_device, bytes_to_host and their vector forms. The one
// place of the rule that a host -> device copy has landed before the work that reads it.
#pragma once

#include <cstring>
#include <vector>

#include "common/cuda_ops.hpp"
#include "shardopt/backend.hpp"

namespace shardopt::test {

/// Copies `bytes` between host memory and device (or host-backend) memory, either way;
/// the bytes are there when it returns. On CUDA it first waits for all device work
/// (nothing still reads or writes `dst`, and `src` is final), then for the copy itself:
/// a pageable host -> device cudaMemcpy may return before its DMA lands, and the work that
/// reads the bytes runs on non-blocking streams. Every test copy goes through here.
inline void copy_bytes(Backend b, void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  if (b == Backend::Host) {
    std::memcpy(dst, src, bytes);
    return;
  }
  cuda::copy_landed(dst, src, bytes);
}

/// Host memory `src` -> device memory `dst` (copy_bytes).
inline void bytes_to_device(Backend b, void* dst, const void* src, std::size_t bytes) { copy_bytes(b, dst, src, bytes); }
/// Device memory `src` -> host memory `dst` (copy_bytes).
inline void bytes_to_host(Backend b, void* dst, const void* src, std::size_t bytes) { copy_bytes(b, dst, src, bytes); }

/// `count` elements of device memory as a vector (bytes_to_host).
template <class T>
std::vector<T> to_host(Backend b, const void* src, std::size_t count) {
  std::vector<T> out(count);
  bytes_to_host(b, out.data(), src, count * sizeof(T));
  return out;
}

/// Copies a vector into device memory (bytes_to_device).
template <class T>
void from_host(Backend b, void* dst, const std::vector<T>& v) {
  bytes_to_device(b, dst, v.data(), v.size() * sizeof(T));
}

}  // namespace shardopt::test
