// memory.hpp - RAII allocations for both backends, and stream-ordered fill and copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "shardopt/backend.hpp"

namespace shardopt {

/// How an allocation is made.
enum class MemoryKind {
  Device,      ///< cudaMalloc
  NcclDevice,  ///< ncclMemAlloc (eligible for NCCL buffer registration)
  Pinned,      ///< cudaMallocHost: page-locked host memory a captured copy can read
  Host,        ///< 256-byte aligned host memory (the host backend's "device" memory)
};

/// One allocation, freed by its destructor. On the host backend every kind is Host.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Allocates `bytes` (0 allowed: no memory). Throws Error(OutOfMemory) naming the bytes
  /// when the device, the driver's page-locking or the host refuses them, and
  /// Error(Cuda/Nccl/Unsupported) for other failures.
  DeviceBuffer(Backend backend, std::size_t bytes, MemoryKind kind = MemoryKind::Device);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const noexcept { return ptr_; }
  template <class T> T* as() const noexcept { return static_cast<T*>(ptr_); }
  std::size_t bytes() const noexcept { return bytes_; }
  Backend backend() const noexcept { return backend_; }
  MemoryKind kind() const noexcept { return kind_; }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }

 private:
  void release() noexcept;
  void allocate(MemoryKind kind);  // the allocation itself, for the constructor
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  Backend backend_ = Backend::Host;
  MemoryKind kind_ = MemoryKind::Host;
  bool pinned_ = false;  // asked for as MemoryKind::Pinned (counted against the pinned limit)
};

namespace detail {
/// The most pinned host memory (MemoryKind::Pinned, on either backend) the process may
/// hold at once, as a locked-memory limit would set it; a request beyond it throws
/// Error(OutOfMemory), as a refused cudaMallocHost does. nullopt (the default): no limit
/// of shardopt's own. For tests of what a refused pinned allocation does.
void set_pinned_limit(std::optional<std::size_t> bytes) noexcept;
/// Pinned host memory (MemoryKind::Pinned) the process's DeviceBuffers hold now.
std::size_t pinned_bytes() noexcept;
}  // namespace detail

/// Bytes the allocation behind `buffer` really takes for `requested` bytes (0 for 0),
/// the allocator's rounding included: host allocations round up to 256 bytes; on CUDA
/// the driver's address range of the allocation (cuMemGetAddressRange), or `requested`
/// when the driver cannot tell.
std::size_t allocation_extent(const DeviceBuffer& buffer, std::size_t requested);

/// Stream-ordered memset to zero.
void fill_zero_async(Backend backend, void* ptr, std::size_t bytes, Stream stream);
/// Stream-ordered copy between any two allocations of the backend (device, pinned).
void copy_async(Backend backend, void* dst, const void* src, std::size_t bytes, Stream stream);

}  // namespace shardopt
